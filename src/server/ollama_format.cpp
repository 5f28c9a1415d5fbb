#include "server/ollama_format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "server/api_error.h"
#include "server/json_field.h"

namespace tern::server::ollama {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

namespace {

template <class J>
const J* field(const J& obj, const char* name) { return json_field(obj, name); }

template <class J>
[[noreturn]] void wrong_type(const std::string& param, const char* expected, const J& got) {
  bad_request(param, "invalid \"", param, "\": must be ", expected, ", got ", got.type_name());
}

template <class J>
const std::string& get_string(const J& v, const std::string& param) {
  if (!v.is_string()) wrong_type(param, "a string", v);
  return v.template get_ref<const std::string&>();
}

template <class J>
bool get_bool(const J& v, const std::string& param) {
  if (!v.is_boolean()) wrong_type(param, "a boolean", v);
  return v.template get<bool>();
}

// An integer, or a float with an integral value (some JSON writers print 40.0). nullopt when
// the value is not one.
template <class J>
std::optional<int64_t> as_integer(const J& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.template get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return int64_t(u);
  }
  if (v.is_number_integer()) return v.template get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.template get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15) return std::nullopt;
    return int64_t(d);
  }
  return std::nullopt;
}

std::string index_param(const std::string& base, size_t i) { return base + "[" + std::to_string(i) + "]"; }

// ---------------------------------------------------------------------------------------------
// keep_alive: a JSON number of seconds, or a Go duration string. Named apart from
// model_catalog's parse_duration_seconds on purpose: this file must not depend on that one's
// implementation (and its tern::Error) to link and to be tested.

// Go's time.ParseDuration grammar: [-+]? (decimal [. decimal]? unit)+ with units ns, us (µs,
// μs), ms, s, m, h; "0" alone needs no unit. Ollama also accepts a bare number of seconds from
// its environment (OLLAMA_KEEP_ALIVE=-1), which clients copy into requests: taken here too.
std::optional<double> parse_go_duration_seconds(const std::string& text, std::string& why) {
  std::string_view s = text;
  double sign = 1.0;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    if (s[0] == '-') sign = -1.0;
    s.remove_prefix(1);
  }
  if (s.empty()) {
    why = "empty duration";
    return std::nullopt;
  }
  // A bare number: seconds.
  {
    const std::string rest(s);
    size_t used = 0;
    const bool digits_only = std::all_of(rest.begin(), rest.end(), [](char c) { return (c >= '0' && c <= '9') || c == '.'; });
    if (digits_only && std::count(rest.begin(), rest.end(), '.') <= 1 && rest != ".") {
      const double x = std::stod(rest, &used);
      if (used == rest.size()) return sign * x;
    }
  }
  // Go reads the unit as the run of characters up to the next number and looks it up whole.
  static const std::pair<std::string_view, double> units[] = {
      {"ns", 1e-9}, {"us", 1e-6}, {"\xC2\xB5s", 1e-6}, {"\xCE\xBCs", 1e-6}, {"ms", 1e-3}, {"s", 1.0}, {"m", 60.0}, {"h", 3600.0}};
  double total = 0.0;
  while (!s.empty()) {
    size_t n = 0;
    bool any_digit = false;
    while (n < s.size() && s[n] >= '0' && s[n] <= '9') ++n, any_digit = true;
    if (n < s.size() && s[n] == '.') {
      ++n;
      while (n < s.size() && s[n] >= '0' && s[n] <= '9') ++n, any_digit = true;
    }
    if (!any_digit) {
      why = "invalid duration \"" + text + "\"";
      return std::nullopt;
    }
    const double value = std::stod(std::string(s.substr(0, n)));
    s.remove_prefix(n);
    size_t unit_end = 0;
    while (unit_end < s.size() && !(s[unit_end] >= '0' && s[unit_end] <= '9') && s[unit_end] != '.') ++unit_end;
    const std::string_view unit = s.substr(0, unit_end);
    if (unit.empty()) {
      why = "missing unit in duration \"" + text + "\"";
      return std::nullopt;
    }
    double scale = 0.0;
    for (const auto& [name, seconds] : units)
      if (unit == name) scale = seconds;
    if (scale == 0.0) {
      why = "unknown unit \"" + std::string(unit) + "\" in duration \"" + text + "\"";
      return std::nullopt;
    }
    s.remove_prefix(unit_end);
    total += value * scale;
  }
  return sign * total;
}

template <class J>
double parse_keep_alive(const J& v) {
  double seconds = 0.0;
  if (v.is_number()) {
    seconds = v.template get<double>();
  } else if (v.is_string()) {
    std::string why;
    const std::optional<double> parsed = parse_go_duration_seconds(v.template get<std::string>(), why);
    if (!parsed) bad_request("keep_alive", "invalid keep_alive: ", why, " (use seconds or a duration like \"5m\", \"1h30m\", \"-1\")");
    seconds = *parsed;
  } else {
    wrong_type("keep_alive", "a number of seconds or a duration string", v);
  }
  if (!std::isfinite(seconds)) bad_request("keep_alive", "invalid keep_alive: not a finite duration");
  // Every negative value means the same (never unload): one spelling for the server.
  return seconds < 0 ? -1.0 : seconds;
}

ojson parse_body(std::string_view body, int max_json_depth) { return parse_json_object(body, max_json_depth); }

RequestCommon parse_common(const ojson& j) {
  RequestCommon c;
  const ojson* model = field(j, "model");
  if (!model) bad_request("model", "model is required");
  c.model = get_string(*model, "model");
  if (c.model.empty()) bad_request("model", "model is required");
  if (const ojson* v = field(j, "stream")) c.stream = get_bool(*v, "stream");
  if (const ojson* v = field(j, "keep_alive")) c.keep_alive_s = parse_keep_alive(*v);
  return c;
}

// "format": null / "" none, "json", or a schema object. The schema itself is checked by the
// OpenAI parser (validate_* below), which knows the keywords the grammar engine supports.
ojson parse_format(const ojson& j) {
  const ojson* v = field(j, "format");
  if (!v) return nullptr;
  if (v->is_string()) {
    const std::string& s = v->get_ref<const std::string&>();
    if (s.empty()) return nullptr;
    if (s == "json") return s;
    bad_request("format", "invalid format \"", s, "\": must be \"json\" or a JSON schema object");
  }
  if (v->is_object()) return *v;
  bad_request("format", "invalid format: must be \"json\" or a JSON schema object, got ", v->type_name());
}

ojson parse_options_object(const ojson& j) {
  const ojson* v = field(j, "options");
  if (!v) return ojson::object();
  if (!v->is_object()) wrong_type("options", "an object", *v);
  return *v;
}

void check_think(const ojson& j) {
  // Thinking models are not told apart here; the field is accepted so that clients that always
  // send it work, and it changes nothing.
  if (const ojson* v = field(j, "think"); v && !v->is_boolean() && !v->is_string())
    wrong_type("think", "a boolean or a string (\"high\", \"medium\", \"low\")", *v);
}

void refuse_images(const ojson& obj, const std::string& param) {
  const ojson* v = field(obj, "images");
  if (!v) return;
  if (!v->is_array()) wrong_type(param, "an array", *v);
  if (!v->empty()) bad_request(param, "images are not supported: this server runs text models");
}

// ---------------------------------------------------------------------------------------------
// Chat history: Ollama's messages -> OpenAI's.

struct PendingCall {
  std::string id;
  std::string name;
  bool answered = false;
};

// The id a tool message answers. Ollama's tool messages carry the function's name (tool_name)
// at most, OpenAI's the call's id: the earliest unanswered call of that name, else the
// earliest unanswered call, else (more answers than calls) the last call of that name or the
// last call at all, so that every accepted history has ids the OpenAI parser takes.
const PendingCall& match_call(std::vector<PendingCall>& calls, const std::string& tool_name) {
  if (!tool_name.empty()) {
    for (PendingCall& c : calls)
      if (!c.answered && c.name == tool_name) {
        c.answered = true;
        return c;
      }
  }
  for (PendingCall& c : calls)
    if (!c.answered) {
      c.answered = true;
      return c;
    }
  if (!tool_name.empty()) {
    for (auto it = calls.rbegin(); it != calls.rend(); ++it)
      if (it->name == tool_name) return *it;
  }
  return calls.back();
}

ojson translate_tool_calls(const ojson& v, const std::string& param, int& next_call_id,
                           std::vector<PendingCall>& pending) {
  if (!v.is_array()) wrong_type(param, "an array", v);
  ojson out = ojson::array();
  pending.clear();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = index_param(param, i);
    const ojson& call = v[i];
    if (!call.is_object()) wrong_type(p, "an object", call);
    const ojson* f = field(call, "function");
    if (!f) bad_request(p + ".function", "missing \"", p, ".function\"");
    if (!f->is_object()) wrong_type(p + ".function", "an object", *f);
    const ojson* name = field(*f, "name");
    if (!name) bad_request(p + ".function.name", "missing \"", p, ".function.name\"");
    const std::string& fname = get_string(*name, p + ".function.name");
    if (fname.empty()) bad_request(p + ".function.name", "\"", p, ".function.name\" must not be empty");
    // Ollama sends arguments as an object; a string (JSON text, OpenAI's form) is passed on
    // for the OpenAI parser to check; absent means no arguments.
    std::string arguments = "{}";
    if (const ojson* a = field(*f, "arguments")) {
      if (a->is_object()) arguments = a->dump();
      else if (a->is_string()) arguments = a->get<std::string>();
      else wrong_type(p + ".function.arguments", "an object", *a);
    }
    // Newer Ollama versions give calls an id; keep it so that a tool_call_id can refer to it.
    std::string id;
    if (const ojson* given = field(call, "id")) id = get_string(*given, p + ".id");
    if (id.empty()) id = "call_" + std::to_string(next_call_id++);
    pending.push_back({id, fname, false});
    out.push_back(ojson{{"id", id}, {"type", "function"}, {"function", {{"name", fname}, {"arguments", arguments}}}});
  }
  return out;
}

ojson translate_messages(const ojson& v, bool& has_system) {
  if (!v.is_array()) wrong_type("messages", "an array", v);
  ojson out = ojson::array();
  int next_call_id = 0;
  // The calls of the last assistant message, while only tool messages have followed it.
  std::vector<PendingCall> pending;
  bool pending_open = false;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = index_param("messages", i);
    const ojson& m = v[i];
    if (!m.is_object()) wrong_type(p, "an object", m);
    const ojson* role_v = field(m, "role");
    if (!role_v) bad_request(p + ".role", "missing \"", p, ".role\"");
    const std::string& role = get_string(*role_v, p + ".role");
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      bad_request(p + ".role", "invalid role \"", role, "\" in ", p, ": must be system, user, assistant or tool");
    std::string content;
    if (const ojson* c = field(m, "content")) content = get_string(*c, p + ".content");
    refuse_images(m, p + ".images");
    if (const ojson* t = field(m, "thinking")) (void)get_string(*t, p + ".thinking");  // earlier reasoning: dropped

    ojson msg = ojson::object();
    msg["role"] = role;
    if (role == "system") has_system = true;
    if (role == "tool") {
      if (!pending_open || pending.empty())
        bad_request(p + ".role", "a \"tool\" message (", p, ") must follow an assistant message with tool_calls");
      std::string tool_name;
      if (const ojson* n = field(m, "tool_name")) tool_name = get_string(*n, p + ".tool_name");
      std::string id;
      if (const ojson* given = field(m, "tool_call_id")) id = get_string(*given, p + ".tool_call_id");
      std::string name = tool_name;
      if (!id.empty()) {
        for (PendingCall& c : pending)
          if (c.id == id) {
            c.answered = true;
            if (name.empty()) name = c.name;
          }
      } else {
        const PendingCall& c = match_call(pending, tool_name);
        id = c.id;
        if (name.empty()) name = c.name;
      }
      msg["content"] = content;
      msg["tool_call_id"] = id;
      msg["name"] = name;
      out.push_back(std::move(msg));
      continue;
    }
    ojson calls;
    if (const ojson* tc = field(m, "tool_calls")) {
      if (role != "assistant") bad_request(p + ".tool_calls", "only assistant messages have tool_calls (", p, ")");
      calls = translate_tool_calls(*tc, p + ".tool_calls", next_call_id, pending);
    }
    const bool has_calls = calls.is_array() && !calls.empty();
    pending_open = has_calls;
    if (!has_calls) pending.clear();
    // An assistant turn that only called tools has no text: OpenAI's null content.
    if (has_calls && content.empty()) msg["content"] = nullptr;
    else msg["content"] = content;
    if (has_calls) msg["tool_calls"] = std::move(calls);
    out.push_back(std::move(msg));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Options.

// Below any int64 (as a double): "no lower bound".
constexpr double kNoBound = -1e19;

enum class OptionType { Number, Integer, Boolean, StopList };

struct OptionSpec {
  OptionType type;
  const char* openai;  // the OpenAI field it becomes; nullptr: accepted and ignored
  double lo = 0, hi = 0;  // range of mapped numbers (the OpenAI parser's), named in Ollama's terms
};

const std::map<std::string, OptionSpec, std::less<>>& option_specs() {
  constexpr double int32_max = double(std::numeric_limits<int32_t>::max());
  static const std::map<std::string, OptionSpec, std::less<>> specs = {
      {"temperature", {OptionType::Number, "temperature", 0.0, 2.0}},
      {"top_p", {OptionType::Number, "top_p", 0.0, 1.0}},
      {"top_k", {OptionType::Integer, "top_k", kNoBound, int32_max}},
      {"min_p", {OptionType::Number, "min_p", 0.0, 1.0}},
      {"seed", {OptionType::Integer, "seed", kNoBound, -kNoBound}},
      {"num_predict", {OptionType::Integer, "max_tokens", kNoBound, double(int64_t(1) << 31)}},
      {"stop", {OptionType::StopList, "stop"}},
      {"repeat_penalty", {OptionType::Number, "repetition_penalty", 1e-3, 100.0}},
      {"presence_penalty", {OptionType::Number, "presence_penalty", -2.0, 2.0}},
      {"frequency_penalty", {OptionType::Number, "frequency_penalty", -2.0, 2.0}},
      // tern's own: false opts the request out of speculative decoding (the OpenAI field).
      {"speculative", {OptionType::Boolean, "speculative"}},
      // Known to Ollama, of no use here (load-time settings tern takes from models.json or the
      // command line, and samplers tern does not have):
      {"num_ctx", {OptionType::Integer, nullptr}},
      {"num_batch", {OptionType::Integer, nullptr}},
      {"num_gpu", {OptionType::Integer, nullptr}},
      {"main_gpu", {OptionType::Integer, nullptr}},
      {"num_thread", {OptionType::Integer, nullptr}},
      {"num_keep", {OptionType::Integer, nullptr}},
      {"repeat_last_n", {OptionType::Integer, nullptr}},
      {"mirostat", {OptionType::Integer, nullptr}},
      {"num_gqa", {OptionType::Integer, nullptr}},
      {"tfs_z", {OptionType::Number, nullptr}},
      {"typical_p", {OptionType::Number, nullptr}},
      {"mirostat_tau", {OptionType::Number, nullptr}},
      {"mirostat_eta", {OptionType::Number, nullptr}},
      {"rope_frequency_base", {OptionType::Number, nullptr}},
      {"rope_frequency_scale", {OptionType::Number, nullptr}},
      {"numa", {OptionType::Boolean, nullptr}},
      {"low_vram", {OptionType::Boolean, nullptr}},
      {"f16_kv", {OptionType::Boolean, nullptr}},
      {"logits_all", {OptionType::Boolean, nullptr}},
      {"vocab_only", {OptionType::Boolean, nullptr}},
      {"use_mmap", {OptionType::Boolean, nullptr}},
      {"use_mlock", {OptionType::Boolean, nullptr}},
      {"embedding_only", {OptionType::Boolean, nullptr}},
      {"penalize_newline", {OptionType::Boolean, nullptr}},
  };
  return specs;
}

[[noreturn]] void bad_option(const std::string& name, const std::string& what) {
  bad_request("options." + name, "invalid option \"", name, "\": ", what);
}

std::string range_text(double lo, double hi) {
  if (lo <= kNoBound) return "must be at most " + ojson(hi).dump();
  return "must be in [" + ojson(lo).dump() + ", " + ojson(hi).dump() + "]";
}

// One option's value checked against its type and written into the OpenAI body.
void apply_option(const std::string& name, const ojson& value, const OptionSpec& spec, ojson& body) {
  switch (spec.type) {
    case OptionType::Boolean:
      if (!value.is_boolean()) bad_option(name, "must be a boolean");
      if (spec.openai) body[spec.openai] = value;
      return;
    case OptionType::StopList: {
      ojson stops = ojson::array();
      if (value.is_string()) {
        stops.push_back(value);
      } else if (value.is_array()) {
        for (const ojson& s : value) {
          if (!s.is_string()) bad_option(name, "must be a string or an array of strings");
          stops.push_back(s);
        }
      } else {
        bad_option(name, "must be a string or an array of strings");
      }
      body["stop"] = std::move(stops);
      return;
    }
    case OptionType::Number: {
      if (!value.is_number()) bad_option(name, "must be a number");
      if (!spec.openai) return;
      const double x = value.get<double>();
      if (!(x >= spec.lo && x <= spec.hi)) bad_option(name, range_text(spec.lo, spec.hi) + ", got " + value.dump());
      body[spec.openai] = value;
      return;
    }
    case OptionType::Integer: {
      const std::optional<int64_t> x = as_integer(value);
      if (!x) bad_option(name, "must be an integer");
      if (!spec.openai) return;
      if (!(double(*x) >= spec.lo && double(*x) <= spec.hi))
        bad_option(name, range_text(spec.lo, spec.hi) + ", got " + value.dump());
      if (name == "num_predict") {
        // Ollama: -1 unlimited, -2 fill the context, 0 no limit either (its runner only
        // stops on a positive count). OpenAI's max_tokens is at least 1: absent says all three.
        if (*x > 0) body["max_tokens"] = *x;
      } else if (name == "seed") {
        // Ollama's -1 (its default) asks for a random seed: leave the server's choice.
        if (*x >= 0) body["seed"] = *x;
      } else if (name == "top_k") {
        body["top_k"] = *x < 0 ? 0 : *x;  // Ollama's and llama.cpp's <= 0 is off, as OpenAI's 0
      } else {
        body[spec.openai] = *x;
      }
      return;
    }
  }
}

void apply_format(const ojson& format, ojson& body) {
  if (format.is_null()) return;
  if (format.is_string()) {
    const std::string& s = format.get_ref<const std::string&>();
    if (s.empty()) return;
    if (s == "json") {
      body["response_format"] = ojson{{"type", "json_object"}};
      return;
    }
    bad_request("format", "invalid format \"", s, "\": must be \"json\" or a JSON schema object");
  }
  if (format.is_object()) {
    body["response_format"] =
        ojson{{"type", "json_schema"}, {"json_schema", {{"name", "format"}, {"schema", format}}}};
    return;
  }
  bad_request("format", "invalid format: must be \"json\" or a JSON schema object, got ", format.type_name());
}

// The parsers check everything the OpenAI parser would refuse later, so that a request the
// parser accepted never fails in chat_to_openai / generate_to_openai (only the model's own
// limits remain, checked by the server).
void validate_chat(const ChatRequest& r, int max_json_depth) {
  ChatRequest probe = r;
  if (probe.messages.empty()) probe.messages = ojson::array({ojson{{"role", "user"}, {"content", ""}}});
  ParseLimits limits;
  limits.max_json_depth = max_json_depth;
  (void)parse_openai_json(chat_to_openai(probe, json::object(), ""), ApiKind::Chat, limits);
}

void validate_generate(const GenerateRequest& r, int max_json_depth) {
  ParseLimits limits;
  limits.max_json_depth = max_json_depth;
  (void)parse_openai_json(generate_to_openai(r, {0}, json::object()), ApiKind::Completion, limits);
}

// ---------------------------------------------------------------------------------------------
// Responses.

json durations_fields(json j, const Durations& d) {
  j["total_duration"] = d.total_ns;
  j["load_duration"] = d.load_ns;
  j["prompt_eval_count"] = d.prompt_eval_count;
  j["prompt_eval_duration"] = d.prompt_eval_ns;
  j["eval_count"] = d.eval_count;
  j["eval_duration"] = d.eval_ns;
  return j;
}

json chat_message(const std::string& content, const std::vector<ToolCall>& calls) {
  json m = {{"role", "assistant"}, {"content", content}};
  if (!calls.empty()) {
    json out = json::array();
    for (const ToolCall& c : calls) {
      // Ollama's clients read arguments as an object; text that is not one (a model's broken
      // call) is passed on as the string rather than lost.
      json args = json::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
      if (args.is_discarded() || !args.is_object()) args = c.arguments;
      out.push_back({{"function", {{"name", c.name}, {"arguments", std::move(args)}}}});
    }
    m["tool_calls"] = std::move(out);
  }
  return m;
}

std::string unix_rfc3339(int64_t seconds) {
  return rfc3339(std::chrono::system_clock::time_point(std::chrono::seconds(seconds)));
}

// What /api/ps says of a model kept forever. Ollama adds the largest Go duration (~292 years)
// to the load time, so its clients see a date around 2318; a fixed date there says the same
// (the CLI prints "Forever" for anything over 20 years away) and, unlike a time_point, does not
// overflow the nanosecond clock, which ends in 2262.
constexpr const char* kForeverExpiry = "2318-01-01T00:00:00Z";
// Go's zero time.Time, as Ollama writes a date that was never set.
constexpr const char* kZeroTime = "0001-01-01T00:00:00Z";

std::string expiry_text(const std::optional<std::chrono::system_clock::time_point>& expires) {
  return expires ? rfc3339(*expires) : std::string(kForeverExpiry);
}

// The GGUF's general.license (a string, or a list of them joined by lines, as Ollama joins
// its LICENSE layers); "" without one.
std::string license_text(const json& metadata) {
  if (!metadata.is_object() || !metadata.contains("general.license")) return "";
  const json& v = metadata["general.license"];
  if (v.is_string()) return v.get<std::string>();
  std::string out;
  if (v.is_array())
    for (const json& x : v)
      if (x.is_string()) out += (out.empty() ? "" : "\n") + x.get<std::string>();
  return out;
}

std::string parameter_value(const json& v) {
  // Go's %#v: strings quoted, numbers and booleans as written.
  return v.dump();
}

}  // namespace

// =============================================================================================

json error_body(const std::string& message) { return json{{"error", message}}; }

ChatRequest parse_chat(std::string_view body, int max_json_depth) {
  const ojson j = parse_body(body, max_json_depth);
  ChatRequest r;
  r.common = parse_common(j);
  if (const ojson* m = field(j, "messages")) r.messages = translate_messages(*m, r.has_system);
  if (const ojson* t = field(j, "tools")) {
    if (!t->is_array()) wrong_type("tools", "an array", *t);
    r.tools = *t;
  }
  r.format = parse_format(j);
  r.options = parse_options_object(j);
  check_think(j);
  r.load_only = r.messages.empty();
  r.unload_only = r.load_only && r.common.keep_alive_s && *r.common.keep_alive_s == 0;
  // The options' types and the whole OpenAI body now, with no defaults (a models.json
  // default is the server's concern).
  validate_chat(r, max_json_depth);
  return r;
}

GenerateRequest parse_generate(std::string_view body, int max_json_depth) {
  const ojson j = parse_body(body, max_json_depth);
  GenerateRequest r;
  r.common = parse_common(j);
  if (const ojson* v = field(j, "prompt")) r.prompt = get_string(*v, "prompt");
  if (const ojson* v = field(j, "suffix"); v && !get_string(*v, "suffix").empty())
    bad_request("suffix", "suffix is not supported: tern does not fill in the middle");
  if (const ojson* v = field(j, "system")) r.system = get_string(*v, "system");
  if (const ojson* v = field(j, "template"); v && !get_string(*v, "template").empty())
    bad_request("template", "template is not supported: tern renders the model's chat template");
  if (const ojson* v = field(j, "raw")) r.raw = get_bool(*v, "raw");
  if (const ojson* v = field(j, "context")) {
    if (!v->is_array()) wrong_type("context", "an array of token ids", *v);
    r.context.reserve(v->size());
    for (size_t i = 0; i < v->size(); ++i) {
      const std::optional<int64_t> id = as_integer((*v)[i]);
      if (!id || *id < 0 || *id > std::numeric_limits<int32_t>::max())
        bad_request("context", "invalid \"", index_param("context", i), "\": must be a non-negative integer token id");
      r.context.push_back(*id);
    }
  }
  refuse_images(j, "images");
  r.format = parse_format(j);
  r.options = parse_options_object(j);
  check_think(j);
  r.load_only = r.prompt.empty() && r.context.empty();
  r.unload_only = r.load_only && r.common.keep_alive_s && *r.common.keep_alive_s == 0;
  validate_generate(r, max_json_depth);
  return r;
}

EmbedRequest parse_embed(std::string_view body, bool legacy, int max_json_depth) {
  const ojson j = parse_body(body, max_json_depth);
  EmbedRequest r;
  r.legacy = legacy;
  r.common = parse_common(j);
  r.common.stream = false;  // embeddings are one answer whatever the body says
  if (legacy) {
    const ojson* p = field(j, "prompt");
    if (!p) bad_request("prompt", "prompt is required");
    const std::string& text = get_string(*p, "prompt");
    if (text.empty()) bad_request("prompt", "prompt must not be empty");
    r.inputs.push_back(text);
  } else {
    const ojson* in = field(j, "input");
    if (!in) bad_request("input", "input is required");
    if (in->is_string()) {
      if (in->get_ref<const std::string&>().empty()) bad_request("input", "input must not be empty");
      r.inputs.push_back(in->get<std::string>());
    } else if (in->is_array()) {
      if (in->empty()) bad_request("input", "input must not be empty");
      for (size_t i = 0; i < in->size(); ++i) {
        const std::string p = index_param("input", i);
        const std::string& text = get_string((*in)[i], p);
        // An empty text has no tokens to embed (the OpenAI route refuses it the same way).
        if (text.empty()) bad_request(p, "invalid \"", p, "\": must not be an empty string");
        r.inputs.push_back(text);
      }
    } else {
      wrong_type("input", "a string or an array of strings", *in);
    }
    if (const ojson* v = field(j, "truncate")) r.truncate = get_bool(*v, "truncate");
    if (const ojson* v = field(j, "dimensions")) {
      const std::optional<int64_t> d = as_integer(*v);
      if (!d || *d <= 0) bad_request("dimensions", "invalid \"dimensions\": must be a positive integer");
      r.dimensions = *d;
    }
  }
  (void)parse_options_object(j);  // type-checked; no option changes an embedding
  return r;
}

std::string parse_model_name(std::string_view body, int max_json_depth) {
  const ojson j = parse_body(body, max_json_depth);
  const ojson* v = field(j, "model");
  const char* param = "model";
  if (!v) {
    v = field(j, "name");
    param = "name";
  }
  if (!v) bad_request("model", "model is required");
  const std::string& name = get_string(*v, param);
  if (name.empty()) bad_request(param, "model is required");
  return name;
}

void apply_options(const ojson& options, const json& default_options, const ojson& format, ojson& body) {
  // Precedence per option: the request's, then the model's defaults, then Ollama's own.
  std::map<std::string, ojson> merged;
  if (default_options.is_object())
    for (const auto& [name, value] : default_options.items())
      if (!value.is_null()) merged[name] = ojson(value);
  if (options.is_object())
    for (const auto& [name, value] : options.items())
      if (!value.is_null()) merged[name] = value;
  merged.try_emplace("temperature", 0.8);
  merged.try_emplace("top_k", 40);
  merged.try_emplace("top_p", 0.9);

  const auto& specs = option_specs();
  for (const auto& [name, value] : merged) {
    auto spec = specs.find(name);
    if (spec == specs.end()) continue;  // unknown: Ollama only logs a warning
    apply_option(name, value, spec->second, body);
  }
  apply_format(format, body);
}

ojson chat_to_openai(const ChatRequest& r, const json& default_options, const std::string& default_system) {
  ojson body = ojson::object();
  ojson messages = ojson::array();
  if (!r.has_system && !default_system.empty())
    messages.push_back(ojson{{"role", "system"}, {"content", default_system}});
  for (const ojson& m : r.messages) messages.push_back(m);
  body["messages"] = std::move(messages);
  if (r.tools.is_array()) body["tools"] = r.tools;
  apply_options(r.options, default_options, r.format, body);
  return body;
}

ojson generate_to_openai(const GenerateRequest& r, const std::vector<int32_t>& prompt_ids, const json& default_options) {
  ojson body = ojson::object();
  body["prompt"] = prompt_ids;
  apply_options(r.options, default_options, r.format, body);
  return body;
}

std::string rfc3339(std::chrono::system_clock::time_point t) {
  using namespace std::chrono;
  const auto ns = duration_cast<nanoseconds>(t.time_since_epoch());
  const auto day = floor<days>(ns);
  const year_month_day ymd{sys_days(day)};
  const auto in_day = ns - day;
  const auto h = duration_cast<hours>(in_day);
  const auto m = duration_cast<minutes>(in_day - h);
  const auto s = duration_cast<seconds>(in_day - h - m);
  const int64_t frac = (in_day - h - m - s).count();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02u-%02uT%02d:%02d:%02d", int(ymd.year()), unsigned(ymd.month()),
                unsigned(ymd.day()), int(h.count()), int(m.count()), int(s.count()));
  std::string out = buf;
  if (frac != 0) {
    // Go's RFC3339Nano: up to nine digits, trailing zeros dropped.
    char digits[16];
    std::snprintf(digits, sizeof digits, "%09lld", static_cast<long long>(frac));
    std::string f = digits;
    while (!f.empty() && f.back() == '0') f.pop_back();
    out += "." + f;
  }
  return out + "Z";
}

json chat_chunk(const std::string& model, const std::string& created_at, const std::string& content,
                const std::vector<ToolCall>& calls, const Durations& so_far) {
  json j = {{"model", model},
            {"created_at", created_at},
            {"message", chat_message(content, calls)},
            {"done", false},
            {"done_reason", ""}};
  return durations_fields(std::move(j), so_far);
}

json chat_final(const std::string& model, const std::string& created_at, const std::string& content,
                const std::vector<ToolCall>& calls, const std::string& done_reason, const Durations& d) {
  json j = {{"model", model},
            {"created_at", created_at},
            {"message", chat_message(content, calls)},
            {"done", true},
            {"done_reason", done_reason}};
  return durations_fields(std::move(j), d);
}

json generate_chunk(const std::string& model, const std::string& created_at, const std::string& response,
                    const Durations& so_far) {
  json j = {{"model", model}, {"created_at", created_at}, {"response", response},
            {"done", false},  {"done_reason", ""},        {"context", json::array()}};
  return durations_fields(std::move(j), so_far);
}

json generate_final(const std::string& model, const std::string& created_at, const std::string& response,
                    const std::string& done_reason, const Durations& d, const std::vector<int32_t>& context) {
  json j = {{"model", model},         {"created_at", created_at}, {"response", response},
            {"done", true},           {"done_reason", done_reason}, {"context", context}};
  return durations_fields(std::move(j), d);
}

std::vector<float> embedding_vector(std::vector<float> v, std::optional<int64_t> dimensions) {
  const auto normalize = [](std::vector<float>& x) {
    double sum = 0;
    for (const float f : x) {
      if (!std::isfinite(f)) throw ApiError(500, "server_error", "", "", "embedding contains NaN or Inf values");
      sum += double(f) * f;
    }
    // A zero vector stays zero (Ollama divides by max(norm, 1e-12)).
    const float scale = float(1.0 / std::max(std::sqrt(sum), 1e-12));
    for (float& f : x) f *= scale;
  };
  normalize(v);
  if (dimensions && *dimensions > 0 && size_t(*dimensions) < v.size()) {
    v.resize(size_t(*dimensions));
    normalize(v);
  }
  return v;
}

json embed_response(const std::string& model, const std::vector<std::vector<float>>& vectors, const Durations& d) {
  json embeddings = json::array();
  for (const auto& v : vectors) embeddings.push_back(v);
  return json{{"model", model},
              {"embeddings", std::move(embeddings)},
              {"total_duration", d.total_ns},
              {"load_duration", d.load_ns},
              {"prompt_eval_count", d.prompt_eval_count}};
}

json legacy_embedding_response(const std::vector<float>& vector) { return json{{"embedding", vector}}; }

json model_details(const ModelEntry& e) {
  json families = json::array();
  if (!e.architecture.empty()) families.push_back(e.architecture);
  return json{{"parent_model", e.parent},
              {"format", "gguf"},
              {"family", e.architecture},
              {"families", std::move(families)},
              {"parameter_size", e.parameter_size},
              {"quantization_level", e.file_type}};
}

json tags_response(const std::vector<ModelEntry>& entries, const std::vector<LoadedRow>& loaded) {
  json models = json::array();
  for (const ModelEntry& e : entries) {
    if (!e.usable()) continue;
    // expires_at and size_vram are /api/ps's, but the client's ModelResponse, which both
    // routes share, declares them: a loaded model's expiry, else Go's zero time.
    // A variant (models.json "from") goes with its base's engine.
    std::string expires = kZeroTime;
    const std::string& engine_name = e.parent.empty() ? e.name : e.parent;
    for (const LoadedRow& row : loaded)
      if (row.entry && row.entry->name == engine_name) expires = expiry_text(row.expires);
    models.push_back({{"name", e.name},
                      {"model", e.name},
                      {"modified_at", unix_rfc3339(e.modified_unix)},
                      {"size", e.file_bytes},
                      {"digest", e.digest},
                      {"details", model_details(e)},
                      {"expires_at", expires},
                      {"size_vram", 0}});
  }
  return json{{"models", std::move(models)}};
}

json ps_response(const std::vector<LoadedRow>& rows) {
  json models = json::array();
  for (const LoadedRow& row : rows) {
    if (!row.entry) continue;
    const ModelEntry& e = *row.entry;
    models.push_back({{"name", e.name},
                      {"model", e.name},
                      {"size", row.size_bytes},
                      {"digest", e.digest},
                      {"details", model_details(e)},
                      {"expires_at", expiry_text(row.expires)},
                      {"size_vram", 0},
                      {"modified_at", unix_rfc3339(e.modified_unix)},
                      {"context_length", row.context_length}});
  }
  return json{{"models", std::move(models)}};
}

json show_response(const ModelEntry& e, const std::string& chat_template_text, const json& metadata,
                   const std::vector<std::string>& capabilities) {
  // parameters: one "name value" line per default option (Ollama pads names to 30 columns and
  // writes a list one line per element).
  std::string parameters;
  std::string modelfile_parameters;
  if (e.defaults.options.is_object()) {
    for (const auto& [name, value] : e.defaults.options.items()) {
      const auto add = [&](const json& v) {
        char padded[64];
        std::snprintf(padded, sizeof padded, "%-30s", name.c_str());
        if (!parameters.empty()) parameters += "\n";
        parameters += std::string(padded) + " " + parameter_value(v);
        modelfile_parameters += "PARAMETER " + name + " " + parameter_value(v) + "\n";
      };
      if (value.is_array()) {
        for (const json& v : value) add(v);
      } else if (!value.is_null()) {
        add(value);
      }
    }
  }
  std::string modelfile = "# Modelfile generated by tern\nFROM " + e.path.string() + "\n";
  if (!chat_template_text.empty()) modelfile += "TEMPLATE \"\"\"" + chat_template_text + "\"\"\"\n";
  if (!e.defaults.system_prompt.empty()) modelfile += "SYSTEM \"\"\"" + e.defaults.system_prompt + "\"\"\"\n";
  modelfile += modelfile_parameters;
  // Ollama's ADAPTER has no scale; a scale other than 1 is said in a comment above it.
  for (const AdapterSpec& a : e.defaults.adapters) {
    if (a.scale != 1.0f) modelfile += "# tern: adapter scale " + parameter_value(json(a.scale)) + "\n";
    modelfile += "ADAPTER " + a.path.string() + "\n";
  }

  // model_info: the header's scalar keys under their GGUF names (arrays, e.g. the vocabulary,
  // are megabytes; Ollama leaves them out unless asked for verbose output).
  json model_info = json::object();
  if (metadata.is_object())
    for (const auto& [key, value] : metadata.items())
      if (!value.is_array() && !value.is_object()) model_info[key] = value;
  if (!e.architecture.empty() && !model_info.contains("general.architecture"))
    model_info["general.architecture"] = e.architecture;
  if (e.n_params > 0 && !model_info.contains("general.parameter_count")) model_info["general.parameter_count"] = e.n_params;

  json j = {{"modelfile", modelfile},
            {"parameters", parameters},
            {"template", chat_template_text},
            {"details", model_details(e)},
            {"model_info", std::move(model_info)},
            {"capabilities", capabilities},
            {"modified_at", unix_rfc3339(e.modified_unix)},
            // Ollama leaves these three out when empty; the client's ShowResponse declares them.
            {"license", license_text(metadata)},
            {"system", e.defaults.system_prompt},
            {"messages", json::array()}};
  return j;
}

json version_response(const std::string& version) { return json{{"version", version}}; }

}  // namespace tern::server::ollama
