#include "server/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "server/api_error.h"

namespace tern::server {

using nlohmann::json;

namespace {

// A field that is absent or null counts as not given: OpenAI's clients send null for unset
// optional parameters.
const json* field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

[[noreturn]] void wrong_type(const std::string& param, const char* expected, const json& got) {
  bad_request(param, "Invalid type for '", param, "': expected ", expected, ", but got ", got.type_name(),
              " instead.");
}

bool get_bool(const json& v, const std::string& param) {
  if (!v.is_boolean()) wrong_type(param, "a boolean", v);
  return v.get<bool>();
}

// Integers; a float with an integral value (16.0, as some JSON writers print) is accepted too.
int64_t get_int(const json& v, const std::string& param, int64_t lo, int64_t hi) {
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max()))
      bad_request(param, "'", param, "' is out of range: ", u, " (allowed: ", lo, "..", hi, ").");
    x = int64_t(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15) wrong_type(param, "an integer", v);
    x = int64_t(d);
  } else {
    wrong_type(param, "an integer", v);
  }
  if (x < lo || x > hi) bad_request(param, "'", param, "' must be in [", lo, ", ", hi, "], got ", x, ".");
  return x;
}

double get_number(const json& v, const std::string& param, double lo, double hi) {
  if (!v.is_number()) wrong_type(param, "a number", v);
  const double x = v.get<double>();
  // !(x >= lo) rejects NaN too (it cannot come from JSON text, but costs nothing to be sure).
  if (!(x >= lo && x <= hi)) bad_request(param, "'", param, "' must be in [", lo, ", ", hi, "], got ", x, ".");
  return x;
}

const std::string& get_string(const json& v, const std::string& param) {
  if (!v.is_string()) wrong_type(param, "a string", v);
  return v.get_ref<const std::string&>();
}

std::vector<int64_t> get_token_array(const json& v, const std::string& param) {
  std::vector<int64_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    ids.push_back(get_int(v[i], param + "[" + std::to_string(i) + "]", 0, std::numeric_limits<int32_t>::max()));
  return ids;
}

std::vector<Prompt> parse_prompt(const json& v, const ParseLimits& limits) {
  std::vector<Prompt> out;
  if (v.is_string()) {
    out.push_back({false, v.get<std::string>(), {}});
    return out;
  }
  if (!v.is_array()) wrong_type("prompt", "a string or an array", v);
  if (v.empty()) bad_request("prompt", "'prompt' must not be an empty array.");
  // Four shapes (OpenAI): string, [string...], [int...], [[int...]...]; not mixed.
  if (v[0].is_number()) {
    out.push_back({true, {}, get_token_array(v, "prompt")});
    return out;
  }
  if (v.size() > size_t(limits.max_prompts))
    bad_request("prompt", "at most ", limits.max_prompts, " prompts per request, got ", v.size(), ".");
  const bool strings = v[0].is_string();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = "prompt[" + std::to_string(i) + "]";
    if (strings) {
      out.push_back({false, get_string(v[i], p), {}});
    } else {
      if (!v[i].is_array()) wrong_type(p, "an array of token ids", v[i]);
      if (v[i].empty()) bad_request(p, "'", p, "' must not be empty.");
      out.push_back({true, {}, get_token_array(v[i], p)});
    }
  }
  return out;
}

std::vector<std::string> parse_stop(const json& v, const ParseLimits& limits) {
  std::vector<std::string> stops;
  if (v.is_string()) {
    if (!v.get_ref<const std::string&>().empty()) stops.push_back(v.get<std::string>());
    return stops;
  }
  if (!v.is_array()) wrong_type("stop", "a string or an array of strings", v);
  if (v.size() > size_t(limits.max_stop))
    bad_request("stop", "at most ", limits.max_stop, " stop sequences, got ", v.size(), ".");
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string& s = get_string(v[i], "stop[" + std::to_string(i) + "]");
    // An empty stop string would match at once; OpenAI ignores it, so do we.
    if (!s.empty()) stops.push_back(s);
  }
  return stops;
}

std::string message_content(const json& v, const std::string& param, const std::string& role) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array()) {
    // Content parts: only text can be served by a text model.
    std::string text;
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string p = param + "[" + std::to_string(i) + "]";
      const json& part = v[i];
      if (!part.is_object()) wrong_type(p, "an object", part);
      const json* type = field(part, "type");
      if (!type) bad_request(p + ".type", "Missing required parameter: '", p, ".type'.");
      const std::string& t = get_string(*type, p + ".type");
      if (t != "text") bad_request(p + ".type", "content part type '", t, "' is not supported: this model takes text only.");
      const json* txt = field(part, "text");
      if (!txt) bad_request(p + ".text", "Missing required parameter: '", p, ".text'.");
      if (!text.empty()) text += "\n";
      text += get_string(*txt, p + ".text");
    }
    return text;
  }
  if (v.is_null() && role == "assistant") return "";
  wrong_type(param, "a string or an array of content parts", v);
}

}  // namespace

nlohmann::json parse_json_object(std::string_view body, int max_depth) {
  // Depth pre-scan: brackets outside strings. Escapes inside strings are skipped so "\"" does
  // not end a string early.
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) bad_request("", "The request body nests deeper than ", max_depth, " levels.");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    bad_request("", "We could not parse the JSON body of your request. (The body must be valid JSON.)");
  if (!j.is_object()) bad_request("", "The request body must be a JSON object, got ", j.type_name(), ".");
  return j;
}

std::vector<ChatMessage> parse_messages(const json& v, const ParseLimits& limits) {
  if (!v.is_array()) wrong_type("messages", "an array", v);
  if (v.empty()) bad_request("messages", "'messages' must contain at least one message.");
  if (v.size() > limits.max_messages)
    bad_request("messages", "at most ", limits.max_messages, " messages, got ", v.size(), ".");
  std::vector<ChatMessage> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = "messages[" + std::to_string(i) + "]";
    const json& m = v[i];
    if (!m.is_object()) wrong_type(p, "an object", m);
    const json* role = field(m, "role");
    if (!role) bad_request(p + ".role", "Missing required parameter: '", p, ".role'.");
    std::string r = get_string(*role, p + ".role");
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant")
      bad_request(p + ".role", "Invalid value for '", p, ".role': '", r,
                  "'. Supported values are: 'system', 'developer', 'user' and 'assistant'.");
    if (const json* tc = field(m, "tool_calls"); tc && !(tc->is_array() && tc->empty()))
      bad_request(p + ".tool_calls", "tool calls are not supported by this server.");
    auto c = m.find("content");
    if (c == m.end()) bad_request(p + ".content", "Missing required parameter: '", p, ".content'.");
    out.push_back({r, message_content(*c, p + ".content", r)});
  }
  return out;
}

OpenAiRequest parse_openai_request(std::string_view body, ApiKind kind, const ParseLimits& limits) {
  return parse_openai_json(parse_json_object(body, limits.max_json_depth), kind, limits);
}

OpenAiRequest parse_openai_json(const json& j, ApiKind kind, const ParseLimits& limits) {
  if (!j.is_object()) bad_request("", "The request body must be a JSON object, got ", j.type_name(), ".");
  OpenAiRequest r;
  r.kind = kind;
  const bool chat = kind == ApiKind::Chat;

  if (const json* v = field(j, "model")) r.model = get_string(*v, "model");

  if (chat) {
    const json* m = field(j, "messages");
    if (!m) bad_request("messages", "Missing required parameter: 'messages'.");
    r.messages = parse_messages(*m, limits);
  } else {
    const json* p = field(j, "prompt");
    if (!p) bad_request("prompt", "Missing required parameter: 'prompt'.");
    r.prompts = parse_prompt(*p, limits);
  }

  // max_completion_tokens replaces max_tokens in OpenAI's chat API; when both are sent, the
  // newer name wins.
  if (const json* v = field(j, "max_tokens")) r.max_tokens = get_int(*v, "max_tokens", 1, int64_t(1) << 31);
  if (const json* v = field(j, "max_completion_tokens"))
    r.max_tokens = get_int(*v, "max_completion_tokens", 1, int64_t(1) << 31);

  if (const json* v = field(j, "n")) r.n = int(get_int(*v, "n", 1, limits.max_n));
  const size_t n_prompts = chat ? 1 : r.prompts.size();
  if (n_prompts * size_t(r.n) > size_t(limits.max_choices))
    bad_request("n", "prompts x n must be at most ", limits.max_choices, ", got ", n_prompts * size_t(r.n), ".");
  if (const json* v = field(j, "best_of")) {
    const int64_t best_of = get_int(*v, "best_of", 1, limits.max_n);
    if (best_of != r.n) bad_request("best_of", "best_of other than n is not supported.");
  }

  if (const json* v = field(j, "stream")) r.stream = get_bool(*v, "stream");
  if (const json* v = field(j, "stream_options")) {
    if (!r.stream) bad_request("stream_options", "The 'stream_options' parameter is only allowed when 'stream' is enabled.");
    if (!v->is_object()) wrong_type("stream_options", "an object", *v);
    if (const json* u = field(*v, "include_usage")) r.include_usage = get_bool(*u, "stream_options.include_usage");
  }

  if (const json* v = field(j, "stop")) r.stop = parse_stop(*v, limits);

  // OpenAI's defaults (temperature 1, top_p 1, no top-k / min-p / penalties), not the CLI's:
  // a client written for the API gets the distribution it asked for.
  SamplingParams& s = r.sampling;
  s.temperature = 1.0f;
  s.top_p = 1.0f;
  s.top_k = 0;
  s.min_p = 0.0f;
  s.repeat_penalty = 1.0f;
  s.frequency_penalty = 0.0f;
  s.presence_penalty = 0.0f;
  s.penalty_last_n = -1;  // OpenAI's penalties count every token generated so far
  if (const json* v = field(j, "temperature")) s.temperature = float(get_number(*v, "temperature", 0.0, 2.0));
  if (const json* v = field(j, "top_p")) s.top_p = float(get_number(*v, "top_p", 0.0, 1.0));
  if (const json* v = field(j, "top_k")) {
    // -1 is vLLM's spelling of "off", 0 llama.cpp's.
    const int64_t k = get_int(*v, "top_k", -1, std::numeric_limits<int32_t>::max());
    s.top_k = k < 0 ? 0 : int32_t(k);
  }
  if (const json* v = field(j, "min_p")) s.min_p = float(get_number(*v, "min_p", 0.0, 1.0));
  if (const json* v = field(j, "presence_penalty")) s.presence_penalty = float(get_number(*v, "presence_penalty", -2.0, 2.0));
  if (const json* v = field(j, "frequency_penalty"))
    s.frequency_penalty = float(get_number(*v, "frequency_penalty", -2.0, 2.0));
  if (const json* v = field(j, "repetition_penalty"))
    s.repeat_penalty = float(get_number(*v, "repetition_penalty", 1e-3, 100.0));
  if (const json* v = field(j, "seed")) {
    // Any 64-bit integer: negative seeds are folded into the unsigned range.
    if (v->is_number_unsigned()) r.seed = v->get<uint64_t>();
    else r.seed = uint64_t(get_int(*v, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
    s.seed = *r.seed;
  }

  if (chat) {
    bool logprobs = false;
    if (const json* v = field(j, "logprobs")) logprobs = get_bool(*v, "logprobs");
    if (const json* v = field(j, "top_logprobs")) {
      const int top = int(get_int(*v, "top_logprobs", 0, limits.max_logprobs));
      if (!logprobs) bad_request("top_logprobs", "'top_logprobs' requires 'logprobs' to be true.");
      r.n_logprobs = top;
    } else if (logprobs) {
      r.n_logprobs = 0;
    }
  } else {
    if (const json* v = field(j, "logprobs")) r.n_logprobs = int(get_int(*v, "logprobs", 0, limits.max_logprobs));
    if (const json* v = field(j, "echo")) r.echo = get_bool(*v, "echo");
    if (r.echo && r.n_logprobs >= 0)
      bad_request("echo", "echo together with logprobs (prompt logprobs) is not supported.");
    if (const json* v = field(j, "suffix"); v && !get_string(*v, "suffix").empty())
      bad_request("suffix", "'suffix' (insertion) is not supported by this model.");
  }

  if (const json* v = field(j, "ignore_eos")) r.ignore_eos = get_bool(*v, "ignore_eos");
  if (const json* v = field(j, "priority")) r.priority = int(get_int(*v, "priority", -1000000, 1000000));
  if (const json* v = field(j, "user")) r.user = get_string(*v, "user");

  // {"token id": bias}: the ids are checked against the vocabulary by the server.
  if (const json* v = field(j, "logit_bias")) {
    if (!v->is_object()) wrong_type("logit_bias", "an object", *v);
    if (v->size() > 1024) bad_request("logit_bias", "'logit_bias' has more than 1024 entries.");
    for (const auto& [key, bias] : v->items()) {
      const bool digits = !key.empty() && key.size() <= 9 &&
                          std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!digits) bad_request("logit_bias", "'logit_bias' keys must be token ids (decimal integers), got '", key, "'.");
      r.sampling.logit_bias.emplace_back(int32_t(std::stol(key)),
                                         float(get_number(bias, "logit_bias", -100.0, 100.0)));
    }
  }

  // Known OpenAI features this server cannot honour: refuse rather than silently ignore.
  for (const char* name : {"tools", "functions"}) {
    if (const json* v = field(j, name); v && !(v->is_array() && v->empty()))
      bad_request(name, "'", name, "' (tool calling) is not supported by this server.");
  }
  if (const json* v = field(j, "response_format")) {
    if (!v->is_object()) wrong_type("response_format", "an object", *v);
    const json* t = field(*v, "type");
    if (t && get_string(*t, "response_format.type") != "text")
      bad_request("response_format", "only response_format {\"type\": \"text\"} is supported.");
  }
  return r;
}

TokenizeRequest parse_tokenize_request(std::string_view body, const ParseLimits& limits) {
  const json j = parse_json_object(body, limits.max_json_depth);
  TokenizeRequest r;
  if (const json* v = field(j, "model")) r.model = get_string(*v, "model");
  if (const json* v = field(j, "messages")) {
    r.has_messages = true;
    r.messages = parse_messages(*v, limits);
  } else if (const json* p = field(j, "prompt")) {
    r.text = get_string(*p, "prompt");
  } else if (const json* c = field(j, "content")) {
    r.text = get_string(*c, "content");
  } else {
    bad_request("prompt", "Missing required parameter: 'prompt' (or 'messages').");
  }
  if (const json* v = field(j, "add_special_tokens")) r.add_special = get_bool(*v, "add_special_tokens");
  if (const json* v = field(j, "add_special")) r.add_special = get_bool(*v, "add_special");
  if (const json* v = field(j, "with_pieces")) r.with_pieces = get_bool(*v, "with_pieces");
  return r;
}

DetokenizeRequest parse_detokenize_request(std::string_view body, const ParseLimits& limits) {
  const json j = parse_json_object(body, limits.max_json_depth);
  DetokenizeRequest r;
  if (const json* v = field(j, "model")) r.model = get_string(*v, "model");
  const json* t = field(j, "tokens");
  if (!t) bad_request("tokens", "Missing required parameter: 'tokens'.");
  if (!t->is_array()) wrong_type("tokens", "an array of token ids", *t);
  r.tokens = get_token_array(*t, "tokens");
  return r;
}

}  // namespace tern::server
