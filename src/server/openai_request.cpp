#include "server/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "prompt/compress.h"
#include "server/api_error.h"
#include "server/json_field.h"

namespace tern::server {

using ojson = nlohmann::ordered_json;  // keeps the order of keys as sent

namespace {

const ojson* field(const ojson& obj, const char* name) { return json_field(obj, name); }

[[noreturn]] void wrong_type(const std::string& param, const char* expected, const ojson& got) {
  bad_request(param, "Invalid type for '", param, "': expected ", expected, ", but got ", got.type_name(),
              " instead.");
}

bool get_bool(const ojson& v, const std::string& param) {
  if (!v.is_boolean()) wrong_type(param, "a boolean", v);
  return v.get<bool>();
}

// Integers; a float with an integral value (16.0, as some JSON writers print) is accepted too.
int64_t get_int(const ojson& v, const std::string& param, int64_t lo, int64_t hi) {
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

double get_number(const ojson& v, const std::string& param, double lo, double hi) {
  if (!v.is_number()) wrong_type(param, "a number", v);
  const double x = v.get<double>();
  // !(x >= lo) rejects NaN too (it cannot come from JSON text, but costs nothing to be sure).
  if (!(x >= lo && x <= hi)) bad_request(param, "'", param, "' must be in [", lo, ", ", hi, "], got ", x, ".");
  return x;
}

const std::string& get_string(const ojson& v, const std::string& param) {
  if (!v.is_string()) wrong_type(param, "a string", v);
  return v.get_ref<const std::string&>();
}

std::vector<int64_t> get_token_array(const ojson& v, const std::string& param) {
  std::vector<int64_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    ids.push_back(get_int(v[i], param + "[" + std::to_string(i) + "]", 0, std::numeric_limits<int32_t>::max()));
  return ids;
}

std::vector<Prompt> parse_prompt(const ojson& v, const ParseLimits& limits) {
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

std::vector<std::string> parse_stop(const ojson& v, const ParseLimits& limits) {
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

std::string message_content(const ojson& v, const std::string& param, const std::string& role) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array()) {
    // Content parts: only text can be served by a text model.
    std::string text;
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string p = param + "[" + std::to_string(i) + "]";
      const ojson& part = v[i];
      if (!part.is_object()) wrong_type(p, "an object", part);
      const ojson* type = field(part, "type");
      if (!type) bad_request(p + ".type", "Missing required parameter: '", p, ".type'.");
      const std::string& t = get_string(*type, p + ".type");
      if (t != "text") bad_request(p + ".type", "content part type '", t, "' is not supported: this model takes text only.");
      const ojson* txt = field(part, "text");
      if (!txt) bad_request(p + ".text", "Missing required parameter: '", p, ".text'.");
      if (!text.empty()) text += "\n";
      text += get_string(*txt, p + ".text");
    }
    return text;
  }
  if (v.is_null() && role == "assistant") return "";
  wrong_type(param, "a string or an array of content parts", v);
}

std::string index_param(const std::string& base, size_t i) { return base + "[" + std::to_string(i) + "]"; }

// A JSON schema's shape, checked far enough that a schema the grammar engine or a template
// would choke on is refused here with the path of the offending keyword: the keywords OpenAI's
// structured outputs use, with the types JSON Schema gives them.
void check_schema(const ojson& s, const std::string& param, int depth = 0) {
  if (depth > 48) bad_request(param, "'", param, "' nests too deeply.");
  if (s.is_boolean()) return;
  if (!s.is_object()) bad_request(param, "Invalid schema for '", param, "': a schema must be an object (or a boolean), got ",
                                  s.type_name(), ".");
  static const std::set<std::string> types = {"string", "number", "integer", "boolean", "object", "array", "null"};
  const auto check_type_name = [&](const ojson& t, const std::string& p) {
    if (!t.is_string() || !types.count(t.get<std::string>()))
      bad_request(p, "Invalid schema for '", p, "': ", t.dump(), " is not a JSON schema type (string, number, integer,"
                  " boolean, object, array, null).");
  };
  for (const auto& [key, v] : s.items()) {
    const std::string p = param + "." + key;
    if (key == "type") {
      if (v.is_array()) {
        if (v.empty()) bad_request(p, "Invalid schema for '", p, "': an empty list of types.");
        for (size_t i = 0; i < v.size(); ++i) check_type_name(v[i], index_param(p, i));
      } else {
        check_type_name(v, p);
      }
    } else if (key == "properties" || key == "$defs" || key == "definitions" || key == "patternProperties") {
      if (!v.is_object()) bad_request(p, "Invalid schema for '", p, "': expected an object, got ", v.type_name(), ".");
      for (const auto& [name, sub] : v.items()) check_schema(sub, p + "." + name, depth + 1);
    } else if (key == "items" || key == "additionalProperties" || key == "not" || key == "contains" ||
               key == "additionalItems" || key == "propertyNames") {
      if (key == "items" && v.is_array()) {
        for (size_t i = 0; i < v.size(); ++i) check_schema(v[i], index_param(p, i), depth + 1);
      } else {
        check_schema(v, p, depth + 1);
      }
    } else if (key == "anyOf" || key == "oneOf" || key == "allOf" || key == "prefixItems") {
      if (!v.is_array() || v.empty())
        bad_request(p, "Invalid schema for '", p, "': expected a non-empty array of schemas.");
      for (size_t i = 0; i < v.size(); ++i) check_schema(v[i], index_param(p, i), depth + 1);
    } else if (key == "required") {
      if (!v.is_array()) bad_request(p, "Invalid schema for '", p, "': expected an array of property names.");
      for (size_t i = 0; i < v.size(); ++i)
        if (!v[i].is_string()) bad_request(index_param(p, i), "Invalid schema for '", index_param(p, i), "': expected a string.");
    } else if (key == "enum") {
      if (!v.is_array()) bad_request(p, "Invalid schema for '", p, "': expected an array.");
    } else if (key == "$ref" || key == "pattern" || key == "format") {
      if (!v.is_string()) bad_request(p, "Invalid schema for '", p, "': expected a string.");
    } else if (key == "minLength" || key == "maxLength" || key == "minItems" || key == "maxItems" ||
               key == "minProperties" || key == "maxProperties") {
      if (!v.is_number_integer() || v.get<int64_t>() < 0)
        bad_request(p, "Invalid schema for '", p, "': expected a non-negative integer.");
    } else if (key == "minimum" || key == "maximum" || key == "exclusiveMinimum" || key == "exclusiveMaximum" ||
               key == "multipleOf") {
      if (!v.is_number()) bad_request(p, "Invalid schema for '", p, "': expected a number.");
    }
  }
}

// Brackets outside strings nest at most max_depth deep (JSON text inside a string escapes the
// body's pre-scan, and the templates walk the arguments recursively).
bool depth_within(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

// "arguments" of a call in the history: JSON text of an object (an object is taken as well).
std::string call_arguments(const ojson& v, const std::string& param, int max_depth) {
  if (v.is_object()) return v.dump();
  const std::string& text = get_string(v, param);
  if (!depth_within(text, max_depth)) bad_request(param, "'", param, "' nests deeper than ", max_depth, " levels.");
  const ojson parsed = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object())
    bad_request(param, "'", param, "' must be the JSON text of an object (the function's arguments).");
  return text;
}

std::vector<ToolCall> parse_history_tool_calls(const ojson& v, const std::string& param, const ParseLimits& limits) {
  if (!v.is_array()) wrong_type(param, "an array", v);
  if (v.size() > limits.max_tool_calls)
    bad_request(param, "at most ", limits.max_tool_calls, " tool calls in one message, got ", v.size(), ".");
  std::vector<ToolCall> calls;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = index_param(param, i);
    const ojson& c = v[i];
    if (!c.is_object()) wrong_type(p, "an object", c);
    ToolCall call;
    if (const ojson* id = field(c, "id")) call.id = get_string(*id, p + ".id");
    else bad_request(p + ".id", "Missing required parameter: '", p, ".id'.");
    if (const ojson* t = field(c, "type"); t && get_string(*t, p + ".type") != "function")
      bad_request(p + ".type", "Invalid value for '", p, ".type': only 'function' is supported.");
    const ojson* f = field(c, "function");
    if (!f) bad_request(p + ".function", "Missing required parameter: '", p, ".function'.");
    if (!f->is_object()) wrong_type(p + ".function", "an object", *f);
    const ojson* name = field(*f, "name");
    if (!name) bad_request(p + ".function.name", "Missing required parameter: '", p, ".function.name'.");
    call.name = get_string(*name, p + ".function.name");
    const ojson* args = field(*f, "arguments");
    if (!args) bad_request(p + ".function.arguments", "Missing required parameter: '", p, ".function.arguments'.");
    call.arguments = call_arguments(*args, p + ".function.arguments", limits.max_json_depth);
    calls.push_back(std::move(call));
  }
  return calls;
}

std::vector<ToolDef> parse_tools(const ojson& v, const ParseLimits& limits) {
  if (!v.is_array()) wrong_type("tools", "an array", v);
  if (v.size() > limits.max_tools) bad_request("tools", "at most ", limits.max_tools, " tools, got ", v.size(), ".");
  std::vector<ToolDef> tools;
  std::set<std::string> names;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = index_param("tools", i);
    const ojson& t = v[i];
    if (!t.is_object()) wrong_type(p, "an object", t);
    if (const ojson* type = field(t, "type"); type && get_string(*type, p + ".type") != "function")
      bad_request(p + ".type", "Invalid value for '", p, ".type': only 'function' tools are supported.");
    const ojson* f = field(t, "function");
    if (!f) bad_request(p + ".function", "Missing required parameter: '", p, ".function'.");
    if (!f->is_object()) wrong_type(p + ".function", "an object", *f);
    ToolDef d;
    const ojson* name = field(*f, "name");
    if (!name) bad_request(p + ".function.name", "Missing required parameter: '", p, ".function.name'.");
    d.name = get_string(*name, p + ".function.name");
    if (!valid_tool_name(d.name))
      bad_request(p + ".function.name", "Invalid '", p, ".function.name': '", d.name,
                  "' does not match ^[a-zA-Z0-9_-]{1,64}$.");
    if (!names.insert(d.name).second)
      bad_request(p + ".function.name", "Duplicate tool name '", d.name, "' ('", p, ".function.name').");
    if (const ojson* desc = field(*f, "description")) d.description = get_string(*desc, p + ".function.description");
    if (const ojson* params = field(*f, "parameters")) {
      if (!params->is_object()) wrong_type(p + ".function.parameters", "an object (a JSON schema)", *params);
      check_schema(*params, p + ".function.parameters");
      d.parameters = *params;
    } else {
      d.parameters = ojson{{"type", "object"}, {"properties", ojson::object()}};
    }
    if (const ojson* strict = field(*f, "strict")) d.strict = get_bool(*strict, p + ".function.strict");
    tools.push_back(std::move(d));
  }
  return tools;
}

ToolChoice parse_tool_choice(const ojson& v, const std::vector<ToolDef>& tools) {
  ToolChoice c;
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s == "none") c.mode = ToolChoiceMode::None;
    else if (s == "auto") c.mode = ToolChoiceMode::Auto;
    else if (s == "required") c.mode = ToolChoiceMode::Required;
    else bad_request("tool_choice", "Invalid value for 'tool_choice': '", s, "'. Supported values are: 'none', 'auto',"
                     " 'required' and {\"type\": \"function\", \"function\": {\"name\": ...}}.");
  } else if (v.is_object()) {
    if (const ojson* t = field(v, "type"); !t || get_string(*t, "tool_choice.type") != "function")
      bad_request("tool_choice.type", "Invalid value for 'tool_choice.type': expected 'function'.");
    const ojson* f = field(v, "function");
    if (!f) bad_request("tool_choice.function", "Missing required parameter: 'tool_choice.function'.");
    if (!f->is_object()) wrong_type("tool_choice.function", "an object", *f);
    const ojson* name = field(*f, "name");
    if (!name) bad_request("tool_choice.function.name", "Missing required parameter: 'tool_choice.function.name'.");
    c.mode = ToolChoiceMode::Named;
    c.name = get_string(*name, "tool_choice.function.name");
    if (std::none_of(tools.begin(), tools.end(), [&](const ToolDef& d) { return d.name == c.name; }))
      bad_request("tool_choice", "Invalid value for 'tool_choice': no function named '", c.name, "' in 'tools'.");
  } else {
    wrong_type("tool_choice", "a string or an object", v);
  }
  if (tools.empty() && c.mode != ToolChoiceMode::None)
    bad_request("tool_choice", "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.");
  return c;
}

ResponseFormat parse_response_format(const ojson& v) {
  if (!v.is_object()) wrong_type("response_format", "an object", v);
  const ojson* t = field(v, "type");
  if (!t) bad_request("response_format.type", "Missing required parameter: 'response_format.type'.");
  const std::string& type = get_string(*t, "response_format.type");
  ResponseFormat f;
  if (type == "text") return f;
  if (type == "json_object") {
    f.kind = ResponseFormatKind::JsonObject;
    return f;
  }
  if (type != "json_schema")
    bad_request("response_format.type", "Invalid value for 'response_format.type': '", type,
                "'. Supported values are: 'text', 'json_object' and 'json_schema'.");
  f.kind = ResponseFormatKind::JsonSchema;
  const ojson* js = field(v, "json_schema");
  if (!js) bad_request("response_format.json_schema", "Missing required parameter: 'response_format.json_schema'.");
  if (!js->is_object()) wrong_type("response_format.json_schema", "an object", *js);
  if (const ojson* name = field(*js, "name")) {
    f.name = get_string(*name, "response_format.json_schema.name");
    if (!valid_tool_name(f.name))
      bad_request("response_format.json_schema.name", "Invalid 'response_format.json_schema.name': '", f.name,
                  "' does not match ^[a-zA-Z0-9_-]{1,64}$.");
  }
  if (const ojson* d = field(*js, "description")) (void)get_string(*d, "response_format.json_schema.description");
  if (const ojson* schema = field(*js, "schema")) {
    if (!schema->is_object()) wrong_type("response_format.json_schema.schema", "an object (a JSON schema)", *schema);
    check_schema(*schema, "response_format.json_schema.schema");
    f.schema = *schema;
  } else {
    f.schema = ojson::object();
  }
  if (const ojson* strict = field(*js, "strict")) f.strict = get_bool(*strict, "response_format.json_schema.strict");
  return f;
}

}  // namespace

ojson parse_json_object(std::string_view body, int max_depth) {
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
  ojson j = ojson::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    bad_request("", "We could not parse the JSON body of your request. (The body must be valid JSON.)");
  if (!j.is_object()) bad_request("", "The request body must be a JSON object, got ", j.type_name(), ".");
  return j;
}

std::vector<ChatMessage> parse_messages(const ojson& v, const ParseLimits& limits) {
  if (!v.is_array()) wrong_type("messages", "an array", v);
  if (v.empty()) bad_request("messages", "'messages' must contain at least one message.");
  if (v.size() > limits.max_messages)
    bad_request("messages", "at most ", limits.max_messages, " messages, got ", v.size(), ".");
  std::vector<ChatMessage> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = "messages[" + std::to_string(i) + "]";
    const ojson& m = v[i];
    if (!m.is_object()) wrong_type(p, "an object", m);
    const ojson* role = field(m, "role");
    if (!role) bad_request(p + ".role", "Missing required parameter: '", p, ".role'.");
    std::string r = get_string(*role, p + ".role");
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      bad_request(p + ".role", "Invalid value for '", p, ".role': '", r,
                  "'. Supported values are: 'system', 'developer', 'user', 'assistant' and 'tool'.");
    ChatMessage msg;
    msg.role = r;
    if (const ojson* tc = field(m, "tool_calls")) {
      if (r != "assistant") bad_request(p + ".tool_calls", "only assistant messages have 'tool_calls' ('", p, "').");
      msg.tool_calls = parse_history_tool_calls(*tc, p + ".tool_calls", limits);
    }
    if (r == "tool") {
      // OpenAI requires the id, and a tool message must answer the calls of the assistant
      // message before it (after other tool messages).
      const ojson* id = field(m, "tool_call_id");
      if (!id) bad_request(p + ".tool_call_id", "Missing required parameter: '", p, ".tool_call_id'.");
      msg.tool_call_id = get_string(*id, p + ".tool_call_id");
      size_t k = out.size();
      while (k > 0 && out[k - 1].role == "tool") --k;
      if (k == 0 || out[k - 1].tool_calls.empty())
        bad_request(p + ".role", "Invalid parameter: messages with role 'tool' must be a response to a preceding message"
                    " with 'tool_calls' ('", p, "').");
      if (const ojson* name = field(m, "name")) msg.name = get_string(*name, p + ".name");
    }
    auto c = m.find("content");
    if (c == m.end() || c->is_null()) {
      if (r == "assistant" && !msg.tool_calls.empty()) msg.content_null = true;
      else if (c == m.end()) bad_request(p + ".content", "Missing required parameter: '", p, ".content'.");
    }
    if (!msg.content_null) msg.content = message_content(*c, p + ".content", r);
    out.push_back(std::move(msg));
  }
  return out;
}

OpenAiRequest parse_openai_request(std::string_view body, ApiKind kind, const ParseLimits& limits) {
  return parse_openai_json(parse_json_object(body, limits.max_json_depth), kind, limits);
}

bool valid_tool_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

namespace {

// "organize": "none" | "skeleton" | {"type", "points", "max_points", "min_points",
// "point_max_tokens", "skeleton_max_tokens"}; nullopt for none.
std::optional<OrganizeRequest> parse_organize(const ojson& v) {
  constexpr int kMaxPoints = 32;  // each point is one engine request running beside the others
  const auto type_of = [](const std::string& t, const std::string& param) -> bool {
    if (t == "none") return false;
    if (t == "skeleton") return true;
    bad_request(param, "'", param, "' must be \"none\" or \"skeleton\", not '", t, "'.");
  };
  if (v.is_string()) {
    if (!type_of(v.get<std::string>(), "organize")) return std::nullopt;
    return OrganizeRequest{};
  }
  if (!v.is_object()) wrong_type("organize", "a string (\"none\", \"skeleton\") or an object", v);
  const ojson* type = field(v, "type");
  if (!type) bad_request("organize.type", "'organize' needs a 'type': \"none\" or \"skeleton\".");
  const bool skeleton = type_of(get_string(*type, "organize.type"), "organize.type");
  OrganizeRequest o;
  bool max_given = false;
  for (const auto& [key, value] : v.items()) {
    if (key == "type") continue;
    if (key == "points") {
      const std::string param = "organize.points";
      if (!value.is_array()) wrong_type(param, "an array of strings", value);
      if (value.empty() || value.size() > size_t(kMaxPoints))
        bad_request(param, "'", param, "' must have 1 to ", kMaxPoints, " points, got ", value.size(), ".");
      for (size_t i = 0; i < value.size(); ++i) {
        const std::string p = index_param(param, i);
        const std::string& text = get_string(value[i], p);
        if (text.find_first_not_of(" \t\r\n") == std::string::npos) bad_request(p, "'", p, "' is empty.");
        o.points.push_back(text);
      }
    } else if (key == "max_points") {
      o.max_points = int(get_int(value, "organize.max_points", 2, kMaxPoints));
      max_given = true;
    } else if (key == "min_points") {
      o.min_points = int(get_int(value, "organize.min_points", 1, kMaxPoints));
    } else if (key == "point_max_tokens") {
      o.point_max_tokens = get_int(value, "organize.point_max_tokens", 1, int64_t(1) << 31);
    } else if (key == "skeleton_max_tokens") {
      o.skeleton_max_tokens = get_int(value, "organize.skeleton_max_tokens", 1, int64_t(1) << 31);
    } else {
      bad_request("organize", "'organize' has an unknown field '", key,
                  "' (type, points, max_points, min_points, point_max_tokens, skeleton_max_tokens).");
    }
  }
  if (o.min_points > o.max_points)
    bad_request("organize.min_points", "'organize.min_points' (", o.min_points, ") must be at most max_points (",
                o.max_points, ").");
  // Given points are all expanded: max_points only cuts a skeleton the model writes, unless the
  // client set it below the points it gave.
  if (!o.points.empty()) {
    if (max_given && int(o.points.size()) > o.max_points)
      bad_request("organize.points", "'organize.points' has ", o.points.size(), " points, more than max_points (",
                  o.max_points, ").");
    o.max_points = std::max(o.max_points, int(o.points.size()));
  }
  if (!skeleton) return std::nullopt;
  return o;
}

}  // namespace

OpenAiRequest parse_openai_json(const ojson& j, ApiKind kind, const ParseLimits& limits) {
  if (!j.is_object()) bad_request("", "The request body must be a JSON object, got ", j.type_name(), ".");
  OpenAiRequest r;
  r.kind = kind;
  const bool chat = kind == ApiKind::Chat;

  if (const ojson* v = field(j, "model")) r.model = get_string(*v, "model");

  if (chat) {
    const ojson* m = field(j, "messages");
    if (!m) bad_request("messages", "Missing required parameter: 'messages'.");
    r.messages = parse_messages(*m, limits);
  } else {
    const ojson* p = field(j, "prompt");
    if (!p) bad_request("prompt", "Missing required parameter: 'prompt'.");
    r.prompts = parse_prompt(*p, limits);
  }

  // max_completion_tokens replaces max_tokens in OpenAI's chat API; when both are sent, the
  // newer name wins.
  // 0 is read here and refused below unless the request only scores its prompt (completions
  // with echo and logprobs).
  const char* max_param = nullptr;
  if (const ojson* v = field(j, "max_tokens")) {
    r.max_tokens = get_int(*v, "max_tokens", 0, int64_t(1) << 31);
    max_param = "max_tokens";
  }
  if (const ojson* v = field(j, "max_completion_tokens")) {
    r.max_tokens = get_int(*v, "max_completion_tokens", 0, int64_t(1) << 31);
    max_param = "max_completion_tokens";
  }

  if (const ojson* v = field(j, "n")) r.n = int(get_int(*v, "n", 1, limits.max_n));
  const size_t n_prompts = chat ? 1 : r.prompts.size();
  if (n_prompts * size_t(r.n) > size_t(limits.max_choices))
    bad_request("n", "prompts x n must be at most ", limits.max_choices, ", got ", n_prompts * size_t(r.n), ".");
  if (const ojson* v = field(j, "best_of")) {
    const int64_t best_of = get_int(*v, "best_of", 1, limits.max_n);
    if (best_of != r.n) bad_request("best_of", "best_of other than n is not supported.");
  }

  if (const ojson* v = field(j, "stream")) r.stream = get_bool(*v, "stream");
  if (const ojson* v = field(j, "stream_options")) {
    if (!r.stream) bad_request("stream_options", "The 'stream_options' parameter is only allowed when 'stream' is enabled.");
    if (!v->is_object()) wrong_type("stream_options", "an object", *v);
    if (const ojson* u = field(*v, "include_usage")) r.include_usage = get_bool(*u, "stream_options.include_usage");
  }

  if (const ojson* v = field(j, "stop")) r.stop = parse_stop(*v, limits);

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
  if (const ojson* v = field(j, "temperature")) s.temperature = float(get_number(*v, "temperature", 0.0, 2.0));
  if (const ojson* v = field(j, "top_p")) s.top_p = float(get_number(*v, "top_p", 0.0, 1.0));
  if (const ojson* v = field(j, "top_k")) {
    // -1 is vLLM's spelling of "off", 0 llama.cpp's.
    const int64_t k = get_int(*v, "top_k", -1, std::numeric_limits<int32_t>::max());
    s.top_k = k < 0 ? 0 : int32_t(k);
  }
  if (const ojson* v = field(j, "min_p")) s.min_p = float(get_number(*v, "min_p", 0.0, 1.0));
  if (const ojson* v = field(j, "presence_penalty")) s.presence_penalty = float(get_number(*v, "presence_penalty", -2.0, 2.0));
  if (const ojson* v = field(j, "frequency_penalty"))
    s.frequency_penalty = float(get_number(*v, "frequency_penalty", -2.0, 2.0));
  if (const ojson* v = field(j, "repetition_penalty"))
    s.repeat_penalty = float(get_number(*v, "repetition_penalty", 1e-3, 100.0));
  if (const ojson* v = field(j, "seed")) {
    // Any 64-bit integer: negative seeds are folded into the unsigned range.
    if (v->is_number_unsigned()) r.seed = v->get<uint64_t>();
    else r.seed = uint64_t(get_int(*v, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
    s.seed = *r.seed;
  }

  if (chat) {
    bool logprobs = false;
    if (const ojson* v = field(j, "logprobs")) logprobs = get_bool(*v, "logprobs");
    if (const ojson* v = field(j, "top_logprobs")) {
      const int top = int(get_int(*v, "top_logprobs", 0, limits.max_logprobs));
      if (!logprobs) bad_request("top_logprobs", "'top_logprobs' requires 'logprobs' to be true.");
      r.n_logprobs = top;
    } else if (logprobs) {
      r.n_logprobs = 0;
    }
  } else {
    if (const ojson* v = field(j, "logprobs")) r.n_logprobs = int(get_int(*v, "logprobs", 0, limits.max_logprobs));
    if (const ojson* v = field(j, "echo")) r.echo = get_bool(*v, "echo");
    if (const ojson* v = field(j, "suffix"); v && !get_string(*v, "suffix").empty())
      bad_request("suffix", "'suffix' (insertion) is not supported by this model.");
  }

  // Chat has no echo: its prompt is the template's rendering, not text the client sent.
  if (const ojson* v = field(j, "echo"); chat && v && get_bool(*v, "echo"))
    bad_request("echo", "'echo' is a /v1/completions parameter: chat completions do not echo the prompt (its "
                "scores: 'prompt_logprobs').");
  // vLLM's extension: each prompt token's logprob with that many alternatives.
  if (const ojson* v = field(j, "prompt_logprobs"); v && !v->is_null())
    r.prompt_logprobs = int(get_int(*v, "prompt_logprobs", 0, limits.max_logprobs));
  if (r.max_tokens == 0) {
    // A pure scoring request (lm-evaluation-harness's loglikelihood): the prompt's logprobs and
    // nothing generated. It must ask for them as OpenAI did, by echo with logprobs.
    if (chat)
      bad_request(max_param, "'", max_param, "' must be in [1, 2147483648], got 0 (0 only scores a prompt: "
                  "/v1/completions with echo and logprobs; chat has no echo).");
    if (!(r.echo && r.n_logprobs >= 0))
      bad_request(max_param, "'", max_param, "' must be in [1, 2147483648], got 0 (0 only scores the prompt, with "
                  "echo: true and logprobs set).");
  }

  if (const ojson* v = field(j, "ignore_eos")) r.ignore_eos = get_bool(*v, "ignore_eos");
  if (const ojson* v = field(j, "priority")) r.priority = int(get_int(*v, "priority", -1000000, 1000000));
  if (const ojson* v = field(j, "speculative")) r.speculative = get_bool(*v, "speculative");
  if (const ojson* v = field(j, "user")) r.user = get_string(*v, "user");
  if (const ojson* v = field(j, "kv_policy")) {
    if (!v->is_object()) wrong_type("kv_policy", "an object", *v);
    for (const auto& [key, value] : v->items())
      if (key != "type" && key != "sinks" && key != "window" && key != "budget")
        bad_request("kv_policy", "'kv_policy' has an unknown field '", key, "' (type, sinks, window, budget).");
    const ojson* type = field(*v, "type");
    if (!type) bad_request("kv_policy", "'kv_policy' needs a 'type': none, streaming or h2o.");
    const std::string kind = get_string(*type, "kv_policy.type");
    const int64_t sinks = field(*v, "sinks") ? get_int(*field(*v, "sinks"), "kv_policy.sinks", 0, 1 << 20) : 4;
    const int64_t window = field(*v, "window") ? get_int(*field(*v, "window"), "kv_policy.window", 1, 1 << 24) : 0;
    std::string budget;
    if (const ojson* b = field(*v, "budget"))
      budget = b->is_string() ? b->get<std::string>() : std::to_string(get_int(*b, "kv_policy.budget", 1, 1 << 24));
    try {
      r.kv_policy = make_kv_policy(kind, sinks, window, budget);
    } catch (const Error& e) {
      bad_request("kv_policy", "'kv_policy': ", e.what());
    }
  }

  if (const ojson* v = field(j, "prompt_compression")) {
    if (!v->is_object()) wrong_type("prompt_compression", "an object", *v);
    PromptCompressionRequest pc;
    for (const auto& [key, value] : v->items()) {
      if (key == "ratio") pc.ratio = get_number(value, "prompt_compression.ratio", 1.0, 1e6);
      else if (key == "method") pc.method = get_string(value, "prompt_compression.method");
      else if (key == "unit") pc.unit = get_string(value, "prompt_compression.unit");
      else if (key == "keep_numbers") pc.keep_numbers = get_bool(value, "prompt_compression.keep_numbers");
      else if (key == "keep_names") pc.keep_names = get_bool(value, "prompt_compression.keep_names");
      else
        bad_request("prompt_compression", "'prompt_compression' has an unknown field '", key,
                    "' (ratio, method, unit, keep_numbers, keep_names).");
    }
    if (!prompt::method_from_name(pc.method))
      bad_request("prompt_compression", "'prompt_compression.method' must be one of ", prompt::method_names(), ", not '",
                  pc.method, "'.");
    if (!prompt::unit_from_name(pc.unit))
      bad_request("prompt_compression", "'prompt_compression.unit' must be token, word or sentence, not '", pc.unit, "'.");
    r.prompt_compression = pc;
  }

  // {"token id": bias}: the ids are checked against the vocabulary by the server.
  if (const ojson* v = field(j, "logit_bias")) {
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

  // Tool calling (chat only).
  if (const ojson* v = field(j, "tools")) {
    if (chat) r.tools = parse_tools(*v, limits);
    else if (!(v->is_array() && v->empty())) bad_request("tools", "'tools' is a chat completions parameter.");
  }
  r.tool_choice.mode = r.tools.empty() ? ToolChoiceMode::None : ToolChoiceMode::Auto;
  if (const ojson* v = field(j, "tool_choice"); v && chat) r.tool_choice = parse_tool_choice(*v, r.tools);
  if (const ojson* v = field(j, "parallel_tool_calls")) r.parallel_tool_calls = get_bool(*v, "parallel_tool_calls");
  // The deprecated functions API: not served (tools are).
  if (const ojson* v = field(j, "functions"); v && !(v->is_array() && v->empty()))
    bad_request("functions", "'functions' (the deprecated function calling API) is not supported; use 'tools'.");
  if (field(j, "function_call"))
    bad_request("function_call", "'function_call' (the deprecated function calling API) is not supported; use 'tool_choice'.");

  // Structured output: one constraint at most.
  const char* constraint = nullptr;
  const auto one_constraint = [&](const char* name) {
    if (constraint)
      bad_request(name, "'", name, "' cannot be combined with '", constraint, "': give one of 'response_format' (json),"
                  " 'grammar' and 'json_schema'.");
    constraint = name;
  };
  if (const ojson* v = field(j, "response_format")) {
    r.response_format = parse_response_format(*v);
    if (r.response_format.kind != ResponseFormatKind::Text) one_constraint("response_format");
  }
  if (const ojson* v = field(j, "grammar")) {
    r.grammar = get_string(*v, "grammar");
    if (!r.grammar.empty()) one_constraint("grammar");
  }
  if (const ojson* v = field(j, "json_schema")) {
    if (!v->is_object()) wrong_type("json_schema", "an object (a JSON schema)", *v);
    check_schema(*v, "json_schema");
    one_constraint("json_schema");
    r.json_schema = *v;
  }
  if (constraint && (r.tool_choice.mode == ToolChoiceMode::Required || r.tool_choice.mode == ToolChoiceMode::Named))
    bad_request("tool_choice", "a forced tool call ('tool_choice' required or a function) cannot be combined with '",
                constraint, "'.");

  if (const ojson* v = field(j, "truncate_prompt_tokens")) {
    const int64_t t = get_int(*v, "truncate_prompt_tokens", -1, int64_t(1) << 31);
    if (t == 0) bad_request("truncate_prompt_tokens", "'truncate_prompt_tokens' must be -1 or at least 1, got 0.");
    r.truncate_prompt_tokens = t;
  }

  if (const ojson* v = field(j, "organize")) {
    r.organize = parse_organize(*v);
    if (r.organize && !chat)
      bad_request("organize", "organize is a chat-completions extension (/v1/chat/completions); /v1/completions takes "
                  "only \"none\".");
  }
  if (r.organize) {
    // Skeleton-of-Thought answers with one text assembled from many requests: nothing that
    // shapes a single answer's tokens can hold for the whole.
    const auto conflict = [](const std::string& what) {
      bad_request("organize", "'organize' (Skeleton-of-Thought) cannot be combined with ", what, ".");
    };
    if (r.n > 1) conflict(str_cat("n > 1 (got ", r.n, "): it gives one answer"));
    if (r.tool_choice.mode != ToolChoiceMode::None)
      conflict("tools (the answer is text; set tool_choice \"none\" or leave out tools)");
    if (constraint) conflict(str_cat("'", constraint, "' (structured output constrains one answer, not its points)"));
    if (r.n_logprobs >= 0) conflict("logprobs");
    if (r.prompt_logprobs >= 0) conflict("prompt_logprobs (its points are scored on prompts of their own)");
    if (r.truncate_prompt_tokens) conflict("truncate_prompt_tokens (its prompts are built from the messages)");
  }
  return r;
}

TokenizeRequest parse_tokenize_request(std::string_view body, const ParseLimits& limits) {
  const ojson j = parse_json_object(body, limits.max_json_depth);
  TokenizeRequest r;
  if (const ojson* v = field(j, "model")) r.model = get_string(*v, "model");
  if (const ojson* v = field(j, "messages")) {
    r.has_messages = true;
    r.messages = parse_messages(*v, limits);
  } else if (const ojson* p = field(j, "prompt")) {
    r.text = get_string(*p, "prompt");
  } else if (const ojson* c = field(j, "content")) {
    r.text = get_string(*c, "content");
  } else {
    bad_request("prompt", "Missing required parameter: 'prompt' (or 'messages').");
  }
  if (const ojson* v = field(j, "add_special_tokens")) r.add_special = get_bool(*v, "add_special_tokens");
  if (const ojson* v = field(j, "add_special")) r.add_special = get_bool(*v, "add_special");
  if (const ojson* v = field(j, "with_pieces")) r.with_pieces = get_bool(*v, "with_pieces");
  return r;
}

DetokenizeRequest parse_detokenize_request(std::string_view body, const ParseLimits& limits) {
  const ojson j = parse_json_object(body, limits.max_json_depth);
  DetokenizeRequest r;
  if (const ojson* v = field(j, "model")) r.model = get_string(*v, "model");
  const ojson* t = field(j, "tokens");
  if (!t) bad_request("tokens", "Missing required parameter: 'tokens'.");
  if (!t->is_array()) wrong_type("tokens", "an array of token ids", *t);
  r.tokens = get_token_array(*t, "tokens");
  return r;
}

}  // namespace tern::server
