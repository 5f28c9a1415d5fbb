#include "server/tool_calls.h"

#include <algorithm>
#include <cstring>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "jinja/value.h"
#include "sampling/sampler.h"
#include "server/api_error.h"

namespace tern::server {

using ojson = nlohmann::ordered_json;

namespace {

// Detection order: the most specific markers first (a Llama 3.1 template never says
// <tool_call>; a hermes one may mention "parameters").
const ToolFormatTraits kFormats[] = {
    {ToolFormat::Hermes, "hermes", {{"<tool_call>", false, false}}, "</tool_call>", false, {"arguments", "parameters"},
     {"<tool_call>"}, "<tool_call>\n", "\n</tool_call>\n<tool_call>\n", "\n</tool_call>", "call_", 24},
    {ToolFormat::Mistral, "mistral", {{"[TOOL_CALLS]", false, false}, {"[{\"name\"", true, true}}, "", true,
     {"arguments", "parameters"}, {"[TOOL_CALLS]"}, "[TOOL_CALLS] [", ", ", "]", "", 9},
    {ToolFormat::Llama3, "llama3",
     {{"<|python_tag|>", false, false}, {"{\"name\"", true, true}, {"{ \"name\"", true, true}}, "", false,
     {"parameters", "arguments"}, {"<|python_tag|>", "\"parameters\": ", "Environment: ipython"}, "", "\n", "",
     "call_", 24},
    {ToolFormat::Generic, "generic", {{"<tool_call>", false, false}}, "</tool_call>", false, {"arguments", "parameters"},
     {}, "<tool_call>\n", "\n</tool_call>\n<tool_call>\n", "\n</tool_call>", "call_", 24},
};

constexpr int kMaxCallDepth = 64;

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool all_ws(std::string_view s) { return std::all_of(s.begin(), s.end(), is_ws); }

std::string_view trim_ws(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

std::string dump_compact(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

// Python's json.dumps (", " and ": " separators, ensure_ascii=False): what templates' tojson
// writes, and so what models have seen.
std::string py_json(const ojson& j) { return jinja::to_json(jinja::from_json(j), -1); }

}  // namespace

const ToolFormatTraits& tool_format_traits(ToolFormat f) {
  for (const auto& t : kFormats)
    if (t.format == f) return t;
  return kFormats[std::size(kFormats) - 1];
}

const char* tool_format_name(ToolFormat f) { return tool_format_traits(f).name; }

std::optional<ToolFormat> tool_format_from_name(std::string_view name) {
  if (name == "qwen") return ToolFormat::Hermes;
  if (name == "llama-3") return ToolFormat::Llama3;
  for (const auto& t : kFormats)
    if (name == t.name) return t.format;
  return std::nullopt;
}

ToolFormat detect_tool_format(std::string_view text) {
  for (const auto& t : kFormats)
    for (const char* m : t.markers)
      if (text.find(m) != std::string_view::npos) return t.format;
  return ToolFormat::Generic;
}

std::string generic_tools_prompt(const std::vector<ToolDef>& tools) {
  std::string out =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
  for (const ToolDef& t : tools) {
    ojson fn = ojson::object();
    fn["name"] = t.name;
    if (!t.description.empty()) fn["description"] = t.description;
    fn["parameters"] = t.parameters;
    out += "\n";
    out += py_json(ojson{{"type", "function"}, {"function", fn}});
  }
  out +=
      "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
      "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
      "<args-json-object>}\n</tool_call>";
  return out;
}

std::string new_tool_call_id(std::mt19937_64& rng, ToolFormat format) {
  static const char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  const ToolFormatTraits& t = tool_format_traits(format);
  std::string id = t.id_prefix;
  std::uniform_int_distribution<int> pick(0, 61);
  for (int i = 0; i < t.id_length; ++i) id += kAlnum[pick(rng)];
  return id;
}

// ---- the streaming parser ----

ToolCallParser::ToolCallParser(ToolFormat format, ToolParserOptions options)
    : traits_(tool_format_traits(format)), options_(std::move(options)) {
  rng_.seed(options_.id_seed ? options_.id_seed : (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}());
}

std::vector<ToolCallEvent> ToolCallParser::feed(std::string_view delta) {
  std::vector<ToolCallEvent> out;
  buf_.append(delta);
  scan(out, false);
  return out;
}

ToolParseResult ToolCallParser::finish() {
  ToolParseResult r;
  scan(r.events, true);
  r.content = content_;
  r.calls = calls_;
  return r;
}

void ToolCallParser::emit_content(std::vector<ToolCallEvent>& out, std::string_view text) {
  if (text.empty()) return;
  if (!all_ws(text)) seen_text_ = true;
  content_ += text;
  if (!out.empty() && out.back().kind == ToolCallEvent::Kind::Content) {
    out.back().text += text;
  } else {
    ToolCallEvent e;
    e.text = std::string(text);
    out.push_back(std::move(e));
  }
}

// Text outside calls: emitted up to its last non-whitespace byte; trailing whitespace is held
// (dropped when a call follows, emitted when more text does), so where the text was split does
// not change what is content.
void ToolCallParser::emit_text(std::vector<ToolCallEvent>& out, std::string_view text) {
  size_t e = text.size();
  while (e > 0 && is_ws(text[e - 1])) --e;
  if (e > 0) {
    emit_content(out, held_ws_ + std::string(text.substr(0, e)));
    held_ws_.clear();
  }
  held_ws_.append(text.substr(e));
}

void ToolCallParser::scan(std::vector<ToolCallEvent>& out, bool at_end) {
  while (mode_ == Mode::Text ? scan_text(out, at_end) : scan_call(out, at_end)) {
  }
}

// Text: finds the first opener in buf_; returns true when a call region opened (scan again).
bool ToolCallParser::scan_text(std::vector<ToolCallEvent>& out, bool at_end) {
  size_t best = std::string::npos;
  const ToolCallOpener* opener = nullptr;
  for (const ToolCallOpener& o : traits_.openers) {
    const size_t pos = buf_.find(o.text);
    if (pos == std::string::npos || pos >= best) continue;
    if (o.at_start_only && (seen_text_ || !all_ws(std::string_view(buf_).substr(0, pos)))) continue;
    best = pos;
    opener = &o;
  }
  if (opener) {
    emit_text(out, std::string_view(buf_).substr(0, best));
    const size_t len = std::strlen(opener->text);
    region_ = buf_.substr(best, len);
    payload_begin_ = opener->in_payload ? 0 : len;
    scanned_ = payload_begin_;
    depth_ = 0;
    in_string_ = escape_ = started_ = outer_is_array_ = false;
    last_element_end_ = 0;
    buf_.erase(0, best + len);
    mode_ = Mode::Call;
    return true;
  }
  // Hold back a tail that could still become an opener (an at_start_only one only while
  // nothing but whitespace came before it).
  size_t hold = 0;
  if (!at_end) {
    std::vector<std::string> anywhere, at_start;
    for (const ToolCallOpener& o : traits_.openers) (o.at_start_only ? at_start : anywhere).push_back(o.text);
    hold = stop_holdback(buf_, anywhere);
    if (!seen_text_) {
      const size_t h = stop_holdback(buf_, at_start);
      if (h > hold && all_ws(std::string_view(buf_).substr(0, buf_.size() - h))) hold = h;
    }
  }
  emit_text(out, std::string_view(buf_).substr(0, buf_.size() - hold));
  buf_.erase(0, buf_.size() - hold);
  if (at_end) {
    // Whitespace after the last call is not content; an answer without calls keeps all of it.
    if (calls_.empty()) emit_content(out, held_ws_);
    held_ws_.clear();
  }
  return false;
}

// Call: looks for the region's end; returns true when it closed (scan the rest as text).
bool ToolCallParser::scan_call(std::vector<ToolCallEvent>& out, bool at_end) {
  region_ += buf_;
  buf_.clear();
  if (*traits_.close) {
    const size_t close_len = std::strlen(traits_.close);
    const size_t from = std::max(payload_begin_, scanned_ >= close_len ? scanned_ - close_len + 1 : payload_begin_);
    const size_t q = region_.find(traits_.close, from);
    if (q != std::string::npos) {
      buf_ = region_.substr(q + close_len);
      region_.resize(q + close_len);
      close_region(out, q);
      return true;
    }
    scanned_ = region_.size();
  } else {
    // The payload is one JSON value: its end is where its outermost bracket closes.
    for (size_t i = scanned_; i < region_.size(); ++i) {
      const char c = region_[i];
      if (!started_) {
        if (is_ws(c)) continue;
        if (c != (traits_.payload_is_array ? '[' : '{') && !(c == '{' && traits_.payload_is_array)) {
          // Not a call after all: the opener and what follows are text.
          buf_ = region_.substr(i);
          region_.resize(i);
          close_region(out, std::string::npos);
          return true;
        }
        started_ = true;
        outer_is_array_ = c == '[';
      }
      if (in_string_) {
        if (escape_) escape_ = false;
        else if (c == '\\') escape_ = true;
        else if (c == '"') in_string_ = false;
        continue;
      }
      if (c == '"') {
        in_string_ = true;
      } else if (c == '{' || c == '[') {
        ++depth_;
      } else if (c == '}' || c == ']') {
        if (--depth_ == 1 && outer_is_array_) last_element_end_ = i + 1;
        if (depth_ == 0) {
          buf_ = region_.substr(i + 1);
          region_.resize(i + 1);
          close_region(out, i + 1);
          return true;
        }
      }
    }
    scanned_ = region_.size();
  }
  if (at_end) {
    // An array of calls cut short (max_tokens while the model kept adding calls): its complete
    // elements are still calls, when they parse as such; the unfinished rest is text.
    if (last_element_end_ > payload_begin_) {
      std::vector<ToolCall> calls;
      const std::string closed =
          region_.substr(payload_begin_, last_element_end_ - payload_begin_) + "]";
      if (parse_region(closed, calls)) {
        // The rest, less the separator before it, is text.
        std::string_view rest = std::string_view(region_).substr(last_element_end_);
        while (!rest.empty() && is_ws(rest.front())) rest.remove_prefix(1);
        if (!rest.empty() && rest.front() == ',') rest.remove_prefix(1);
        buf_ = std::string(trim_ws(rest));
        region_ = region_.substr(0, payload_begin_) + closed;
        close_region(out, region_.size());
        return true;
      }
    }
    // No closing marker: a complete call is still a call (models stop at end-of-generation
    // instead of </tool_call> often enough); an unfinished JSON value is text.
    close_region(out, *traits_.close ? region_.size() : std::string::npos);
    return true;
  }
  return false;
}

// The region is complete: parsed into calls, or returned as text when it does not parse
// (payload_end npos: it cannot be a call).
void ToolCallParser::close_region(std::vector<ToolCallEvent>& out, size_t payload_end) {
  std::vector<ToolCall> calls;
  const bool ok = payload_end != std::string::npos && payload_end >= payload_begin_ &&
                  parse_region(std::string_view(region_).substr(payload_begin_, payload_end - payload_begin_), calls);
  mode_ = Mode::Text;
  if (!ok) {
    emit_content(out, held_ws_ + region_);
    held_ws_.clear();
    region_.clear();
    return;
  }
  held_ws_.clear();
  region_.clear();
  for (ToolCall& c : calls) {
    c.id = new_tool_call_id(rng_, traits_.format);
    const int index = int(calls_.size());
    ToolCallEvent start;
    start.kind = ToolCallEvent::Kind::CallStart;
    start.index = index;
    start.id = c.id;
    start.name = c.name;
    out.push_back(std::move(start));
    ToolCallEvent args;
    args.kind = ToolCallEvent::Kind::CallArguments;
    args.index = index;
    args.text = c.arguments;
    out.push_back(std::move(args));
    calls_.push_back(std::move(c));
  }
}

bool ToolCallParser::parse_region(std::string_view payload, std::vector<ToolCall>& calls) const {
  payload = trim_ws(payload);
  // Bounded nesting (what a request's body may have): the JSON is walked recursively after.
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < payload.size(); ++i) {
    const char c = payload[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxCallDepth) return false;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  const ojson j = ojson::parse(payload.begin(), payload.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return false;
  std::vector<const ojson*> objects;
  if (j.is_array()) {
    if (j.empty()) return false;
    for (const ojson& x : j) objects.push_back(&x);
  } else {
    objects.push_back(&j);
  }
  for (const ojson* o : objects) {
    if (!o->is_object()) return false;
    auto name = o->find("name");
    if (name == o->end() || !name->is_string()) return false;
    ToolCall c;
    c.name = name->get<std::string>();
    if (!valid_tool_name(c.name)) return false;
    if (!options_.tool_names.empty() &&
        std::find(options_.tool_names.begin(), options_.tool_names.end(), c.name) == options_.tool_names.end())
      return false;
    const ojson* args = nullptr;
    for (const char* key : traits_.arguments_keys) {
      auto it = o->find(key);
      if (it != o->end()) {
        args = &*it;
        break;
      }
    }
    if (!args || args->is_null()) {
      c.arguments = "{}";
    } else if (args->is_object()) {
      c.arguments = dump_compact(*args);
    } else if (args->is_string()) {
      // Some models write the arguments as a JSON string holding the object.
      const ojson inner = ojson::parse(args->get_ref<const std::string&>(), nullptr, false);
      if (inner.is_discarded() || !inner.is_object()) return false;
      c.arguments = dump_compact(inner);
    } else {
      return false;
    }
    calls.push_back(std::move(c));
  }
  return true;
}

ToolParserOptions tool_parser_options(const OpenAiRequest& r) {
  ToolParserOptions o;
  for (const ToolDef& t : r.tools) o.tool_names.push_back(t.name);
  o.parallel = r.parallel_tool_calls;
  return o;
}

ToolParseResult parse_tool_calls(ToolFormat format, std::string_view text, const ToolParserOptions& options) {
  ToolCallParser p(format, options);
  std::vector<ToolCallEvent> events = p.feed(text);
  ToolParseResult r = p.finish();
  events.insert(events.end(), std::make_move_iterator(r.events.begin()), std::make_move_iterator(r.events.end()));
  r.events = std::move(events);
  return r;
}

// ---- grammars ----

namespace {

bool gbnf_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

// A GBNF string literal for text.
std::string gbnf_literal(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default: out += c;
    }
  }
  return out + "\"";
}

nlohmann::json to_plain_json(const ojson& j) { return nlohmann::json::parse(j.dump()); }

// The converted grammar of one schema, its rules prefixed; its start rule is prefix + "root".
std::string converted(const ojson& schema, const std::string& prefix, const std::string& param,
                      const SchemaToGbnf& schema_to_gbnf) {
  std::string g;
  try {
    g = schema_to_gbnf ? schema_to_gbnf(to_plain_json(schema)) : grammar::json_schema_to_gbnf(to_plain_json(schema));
  } catch (const ApiError&) {
    throw;
  } catch (const std::exception& e) {  // tern::Error naming the schema path (or a JSON type error)
    bad_request(param, "Invalid schema for '", param, "': ", e.what());
  }
  return prefix_gbnf_rules(g, prefix);
}

}  // namespace

std::string prefix_gbnf_rules(std::string_view g, std::string_view prefix) {
  // Words outside literals, classes, comments, {m,n} counts and <token> references, with
  // whether each is a rule definition (followed by ::=).
  struct Word {
    size_t begin, end;
  };
  std::vector<Word> words;
  std::vector<std::string> defined;
  for (size_t i = 0; i < g.size();) {
    const char c = g[i];
    if (c == '#') {
      while (i < g.size() && g[i] != '\n') ++i;
    } else if (c == '"' || c == '[') {
      const char end = c == '"' ? '"' : ']';
      for (++i; i < g.size() && g[i] != end; ++i)
        if (g[i] == '\\') ++i;
      ++i;
    } else if (c == '{' || c == '<') {
      const char end = c == '{' ? '}' : '>';
      while (i < g.size() && g[i] != end) ++i;
      ++i;
    } else if (gbnf_word_char(c)) {
      const size_t b = i;
      while (i < g.size() && gbnf_word_char(g[i])) ++i;
      words.push_back({b, i});
      size_t k = i;
      while (k < g.size() && (g[k] == ' ' || g[k] == '\t')) ++k;
      if (g.substr(k, 3) == "::=") defined.emplace_back(g.substr(b, i - b));
    } else {
      ++i;
    }
  }
  std::sort(defined.begin(), defined.end());
  std::string out;
  size_t pos = 0;
  for (const Word& w : words) {
    const std::string_view word = g.substr(w.begin, w.end - w.begin);
    if (!std::binary_search(defined.begin(), defined.end(), word)) continue;
    out.append(g.substr(pos, w.begin - pos));
    out.append(prefix);
    out.append(word);
    pos = w.end;
  }
  out.append(g.substr(pos));
  return out;
}

std::string tool_call_grammar(ToolFormat format, const std::vector<ToolDef>& tools, const ToolChoice& choice,
                              bool parallel, const SchemaToGbnf& schema_to_gbnf) {
  if (choice.mode != ToolChoiceMode::Required && choice.mode != ToolChoiceMode::Named) return "";
  if (tools.empty()) bad_request("tool_choice", "a forced tool call needs 'tools'.");
  const ToolFormatTraits& t = tool_format_traits(format);
  std::string rules, alternatives;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ToolDef& d = tools[i];
    if (choice.mode == ToolChoiceMode::Named && d.name != choice.name) continue;
    const std::string prefix = "tool" + std::to_string(i) + "-";
    rules += converted(d.parameters, prefix, "tools[" + std::to_string(i) + "].function.parameters", schema_to_gbnf);
    rules += "\n";
    const std::string head = str_cat("{\"name\": \"", d.name, "\", \"", t.arguments_keys[0], "\": ");
    rules += str_cat("call", i, " ::= ", gbnf_literal(head), " ", prefix, "root ", gbnf_literal("}"), "\n");
    alternatives += str_cat(alternatives.empty() ? "" : " | ", "call", i);
  }
  if (alternatives.empty()) bad_request("tool_choice", "no function named '", choice.name, "' in 'tools'.");
  std::string root = "root ::= ";
  if (*t.call_open) root += gbnf_literal(t.call_open) + " ";
  root += "call";
  if (parallel) root += " (" + gbnf_literal(t.call_separator) + " call)*";
  if (*t.call_close) root += " " + gbnf_literal(t.call_close);
  return root + "\ncall ::= " + alternatives + "\n" + rules;
}

std::string request_grammar(const OpenAiRequest& r, ToolFormat format, const SchemaToGbnf& schema_to_gbnf) {
  const auto whole = [&](const ojson& schema, const std::string& param) {
    // The converted grammar as it is: its start rule is root already.
    return converted(schema, "", param, schema_to_gbnf);
  };
  const bool forced = r.tool_choice.mode == ToolChoiceMode::Required || r.tool_choice.mode == ToolChoiceMode::Named;
  const bool other = !r.grammar.empty() || r.json_schema || r.response_format.kind != ResponseFormatKind::Text;
  if (forced && other)
    bad_request("tool_choice", "a forced tool call cannot be combined with 'response_format', 'grammar' or 'json_schema'.");
  if (!r.grammar.empty()) {
    try {
      (void)grammar::Grammar::parse(r.grammar);
    } catch (const Error& e) {
      bad_request("grammar", "'grammar' is not valid GBNF: ", e.what());
    }
    return r.grammar;
  }
  if (r.json_schema) return whole(*r.json_schema, "json_schema");
  if (r.response_format.kind == ResponseFormatKind::JsonSchema)
    return whole(r.response_format.schema, "response_format.json_schema.schema");
  if (r.response_format.kind == ResponseFormatKind::JsonObject) return grammar::json_object_gbnf();
  if (forced) return tool_call_grammar(format, r.tools, r.tool_choice, r.parallel_tool_calls, schema_to_gbnf);
  return "";
}

}  // namespace tern::server
