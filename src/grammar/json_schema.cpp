#include "grammar/json_schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <map>
#include <set>
#include <vector>

#include "core/error.h"

namespace tern::grammar {

namespace {

using nlohmann::json;

// The primitives, each with the rules it uses. `space` is bounded: a model cannot loop on it.
const std::map<std::string, std::pair<std::string, std::vector<std::string>>>& primitives() {
  static const std::map<std::string, std::pair<std::string, std::vector<std::string>>> k = {
      {"space", {R"(| " " | "\n"{1,2} [ \t]{0,20})", {}}},
      {"boolean", {R"(("true" | "false") space)", {"space"}}},
      {"null", {R"("null" space)", {"space"}}},
      {"char", {R"([^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))", {}}},
      {"string", {R"("\"" char* "\"" space)", {"char", "space"}}},
      {"integral-part", {R"([0] | [1-9] [0-9]{0,15})", {}}},
      {"decimal-part", {R"([0-9]{1,16})", {}}},
      // The exponent has at most two digits: with up to 16 integral digits every number stays a
      // finite double (JSON.parse("1e999") is Infinity, which validators such as ajv refuse).
      {"number", {R"(("-"? integral-part) ("." decimal-part)? ([eE] [-+]? [0-9]{1,2})? space)",
                  {"integral-part", "decimal-part", "space"}}},
      {"integer", {R"(("-"? integral-part) space)", {"integral-part", "space"}}},
      {"value", {R"(object | array | string | number | boolean | null)",
                 {"object", "array", "string", "number", "boolean", "null"}}},
      {"object", {R"("{" space ( string ":" space value ("," space string ":" space value)* )? "}" space)",
                  {"string", "value", "space"}}},
      {"array", {R"("[" space ( value ("," space value)* )? "]" space)", {"value", "space"}}},
      {"uuid", {R"("\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"" space)",
                {"space"}}},
      {"date", {R"([0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] ))", {}}},
      {"time", {R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))",
                {}}},
      {"date-time", {R"(date "T" time)", {"date", "time"}}},
      {"date-string", {R"("\"" date "\"" space)", {"date", "space"}}},
      {"time-string", {R"("\"" time "\"" space)", {"time", "space"}}},
      {"date-time-string", {R"("\"" date-time "\"" space)", {"date-time", "space"}}},
  };
  return k;
}

// Keywords that only annotate (never change validity).
const std::set<std::string>& annotations() {
  static const std::set<std::string> k = {"title", "description", "$schema", "$id", "$comment", "default",
                                          "examples", "deprecated", "readOnly", "writeOnly", "$defs",
                                          "definitions", "contentMediaType", "contentEncoding", "$anchor"};
  return k;
}

// Validation keywords the converter knows of but does not support.
const std::set<std::string>& unsupported() {
  static const std::set<std::string> k = {
      "multipleOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "pattern",
      "patternProperties", "propertyNames", "minProperties", "maxProperties", "dependentRequired",
      "dependentSchemas", "dependencies", "if", "then", "else", "not", "contains", "minContains",
      "maxContains", "uniqueItems", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef",
      "$recursiveRef", "additionalItems"};
  return k;
}

// Integers carry at most 16 digits (the `integral-part` rule); a bound at or beyond that
// magnitude leaves its side unbounded.
constexpr int64_t k_max_integer = 9999999999999999;

// An inclusive range of integers; an empty optional is unbounded on that side.
struct IntegerRange {
  std::optional<int64_t> lo, hi;
};

// GBNF for the decimal strings of the integers in [lo, hi], both with `digits` digits (leading
// zeros only where the caller wants them): the first digit where lo and hi differ splits the
// range into lo's tail, a free middle, and hi's tail.
std::string same_length_range(const std::string& lo, const std::string& hi) {
  if (lo.empty()) return "";
  if (lo[0] == hi[0]) {
    const std::string rest = same_length_range(lo.substr(1), hi.substr(1));
    return std::string("[") + lo[0] + "]" + (rest.empty() ? "" : " " + rest);
  }
  const size_t n = lo.size() - 1;
  const std::string any_tail = n ? " [0-9]{" + std::to_string(n) + "}" : "";
  const bool lo_tail_free = lo.find_first_not_of('0', 1) == std::string::npos;
  const bool hi_tail_free = hi.find_first_not_of('9', 1) == std::string::npos;
  std::vector<std::string> alts;
  const char first = lo_tail_free ? lo[0] : char(lo[0] + 1);
  const char last = hi_tail_free ? hi[0] : char(hi[0] - 1);
  if (!lo_tail_free) alts.push_back(std::string("[") + lo[0] + "] (" + same_length_range(lo.substr(1), std::string(n, '9')) + ")");
  if (first <= last) alts.push_back(std::string("[") + first + "-" + last + "]" + any_tail);
  if (!hi_tail_free) alts.push_back(std::string("[") + hi[0] + "] (" + same_length_range(std::string(n, '0'), hi.substr(1)) + ")");
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

// GBNF for the non-negative integers in [lo, hi] (hi <= k_max_integer), written without
// leading zeros: one alternative per digit count.
std::string non_negative_range(int64_t lo, int64_t hi) {
  std::vector<std::string> alts;
  int64_t first_of_length = 0;  // 0, 10, 100, ...
  for (int digits = 1; digits <= 16; ++digits) {
    const int64_t last_of_length = first_of_length == 0 ? 9 : first_of_length * 10 - 1;
    const int64_t a = std::max(lo, first_of_length), b = std::min(hi, last_of_length);
    if (a <= b) alts.push_back(same_length_range(std::to_string(a), std::to_string(b)));
    if (last_of_length >= hi) break;
    first_of_length = first_of_length == 0 ? 10 : first_of_length * 10;
  }
  std::string out;
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + ("(" + alts[i] + ")");
  return out;
}

std::string integer_range_gbnf(const IntegerRange& r) {
  const int64_t lo = r.lo.value_or(-k_max_integer), hi = r.hi.value_or(k_max_integer);
  std::vector<std::string> alts;
  // Negative integers -m with m in [max(1, -hi), -lo].
  if (lo < 0) alts.push_back("\"-\" (" + non_negative_range(std::max<int64_t>(1, -hi), -lo) + ")");
  if (hi >= 0) alts.push_back(non_negative_range(std::max<int64_t>(0, lo), hi));
  std::string out;
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + ("(" + alts[i] + ")");
  return out;
}

// A GBNF string literal matching exactly `bytes` (UTF-8 passes through; quotes, backslashes and
// control bytes escaped).
std::string literal(const std::string& bytes) {
  std::string out = "\"";
  for (unsigned char c : bytes) {
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) {
      static const char* h = "0123456789ABCDEF";
      out += "\\x";
      out += h[c >> 4];
      out += h[c & 15];
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

// One code point as it may appear inside a GBNF character class.
std::string class_char(uint32_t cp) {
  static const char* h = "0123456789ABCDEF";
  std::string out;
  if (cp == '"' || cp == '\\' || cp == ']' || cp == '[' || cp == '-' || cp == '^') {
    out += '\\';
    out += char(cp);
  } else if (cp >= 0x20 && cp < 0x7F) {
    out += char(cp);
  } else {
    out += "\\U";
    for (int i = 7; i >= 0; --i) out += h[(cp >> (4 * i)) & 15];
  }
  return out;
}

std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
    uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < len && i + size_t(k) < s.size(); ++k) v = (v << 6) | (static_cast<unsigned char>(s[i + size_t(k)]) & 0x3F);
    out.push_back(v);
    i += size_t(len);
  }
  return out;
}

class Converter {
 public:
  explicit Converter(const json& root) : root_(root) {}

  std::string run() {
    const std::string root_expr = visit(root_, "schema", "root");
    std::string out = "root ::= " + root_expr + "\n";
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
  }

 private:
  template <class... Args>
  [[noreturn]] static void error(const std::string& path, Args&&... args) {
    fail(path, ": ", std::forward<Args>(args)...);
  }

  std::string use(const std::string& prim) {
    if (rules_.count(prim)) return prim;
    const auto& [body, deps] = primitives().at(prim);
    rules_[prim] = body;
    for (const std::string& d : deps) use(d);
    return prim;
  }

  std::string new_rule(const std::string& hint, const std::string& body) {
    std::string base;
    for (char c : hint) base += (std::isalnum(static_cast<unsigned char>(c)) ? c : '-');
    if (base.empty()) base = "r";
    std::string name = base;
    for (int i = 1; rules_.count(name) || primitives().count(name) || name == "root"; ++i) name = base + "-" + std::to_string(i);
    rules_[name] = body;
    return name;
  }

  static int64_t count_of(const json& s, const char* key, const std::string& path) {
    const json& v = s.at(key);
    if (!v.is_number_integer() && !v.is_number_unsigned()) error(path, "'", key, "' must be a non-negative integer");
    const int64_t n = v.get<int64_t>();
    if (n < 0) error(path, "'", key, "' must be a non-negative integer");
    if (n > 10000) error(path, "'", key, "' = ", n, " is above the supported 10000");
    return n;
  }

  // The integer bounds of `s` (minimum / maximum, and the exclusive forms as numbers, as in
  // draft 2019+), as one inclusive range. A range that holds no integer is refused.
  static IntegerRange integer_range(const json& s, const std::string& path) {
    IntegerRange r;
    // A bound, rounded towards the inside of the range (up for a lower bound); integers are
    // read exactly (a double holds them only up to 2^53). nullopt: absent or beyond 16 digits.
    auto bound = [&](const char* key, bool lower, bool exclusive) -> std::optional<int64_t> {
      if (!s.contains(key)) return std::nullopt;
      const json& v = s.at(key);
      if (!v.is_number()) error(path, "'", key, "' must be a number");
      if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(k_max_integer)) {
        if (lower) error(path, "'", key, "' = ", v.dump(), " is above the largest supported integer ", k_max_integer);
        return std::nullopt;
      }
      int64_t x;
      if (v.is_number_integer()) {
        x = std::clamp<int64_t>(v.get<int64_t>(), -2 * k_max_integer, 2 * k_max_integer);
        if (exclusive) x += lower ? 1 : -1;
      } else {
        const double d = v.get<double>();
        if (!std::isfinite(d)) error(path, "'", key, "' must be finite");
        if (std::fabs(d) > 2.0 * k_max_integer) x = d < 0 ? -2 * k_max_integer : 2 * k_max_integer;
        else x = int64_t(lower ? (exclusive ? std::floor(d) + 1 : std::ceil(d)) : (exclusive ? std::ceil(d) - 1 : std::floor(d)));
      }
      if (lower && x > k_max_integer) error(path, "'", key, "' = ", v.dump(), " is above the largest supported integer ", k_max_integer);
      if (!lower && x < -k_max_integer) error(path, "'", key, "' = ", v.dump(), " is below the smallest supported integer -", k_max_integer);
      if (lower ? x <= -k_max_integer : x >= k_max_integer) return std::nullopt;
      return x;
    };
    for (auto [key, exclusive] : {std::pair{"minimum", false}, std::pair{"exclusiveMinimum", true}})
      if (auto x = bound(key, true, exclusive)) r.lo = r.lo ? std::max(*r.lo, *x) : *x;
    for (auto [key, exclusive] : {std::pair{"maximum", false}, std::pair{"exclusiveMaximum", true}})
      if (auto x = bound(key, false, exclusive)) r.hi = r.hi ? std::min(*r.hi, *x) : *x;
    if (r.lo && r.hi && *r.lo > *r.hi) error(path, "the bounds leave no integer (", *r.lo, " > ", *r.hi, ")");
    return r;
  }

  // Refuses the keywords of `s` not in `allowed` that change validity.
  static void check_keywords(const json& s, const std::string& path, const std::set<std::string>& allowed) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (allowed.count(k) || annotations().count(k)) continue;
      if (unsupported().count(k)) {
        if (k == "uniqueItems" && it.value() == false) continue;
        error(path, "'", k, "' is not supported");
      }
      if (k == "format") error(path, "'format' is only supported on strings");
      if (k == "$ref" || k == "anyOf" || k == "oneOf" || k == "allOf" || k == "enum" || k == "const")
        error(path, "'", k, "' beside other validation keywords is not supported");
      // Any other key is unknown to JSON Schema, which ignores it.
    }
  }

  const json& resolve(const std::string& ref, const std::string& path) {
    std::string name;
    const json* defs = nullptr;
    if (ref.rfind("#/$defs/", 0) == 0) {
      name = ref.substr(8);
      if (root_.contains("$defs")) defs = &root_.at("$defs");
    } else if (ref.rfind("#/definitions/", 0) == 0) {
      name = ref.substr(14);
      if (root_.contains("definitions")) defs = &root_.at("definitions");
    } else if (ref == "#") {
      return root_;
    } else {
      error(path, "'$ref' \"", ref, "\" is not supported (only #, #/$defs/NAME and #/definitions/NAME)");
    }
    if (!defs || !defs->is_object() || !defs->contains(name)) error(path, "'$ref' \"", ref, "\" names no definition");
    return defs->at(name);
  }

  std::string visit(const json& s, const std::string& path, const std::string& hint) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) error(path, "the schema 'false' matches nothing");
      return use("value");
    }
    if (!s.is_object()) error(path, "a schema must be an object or a boolean");
    if (s.contains("$ref")) {
      check_keywords(s, path, {"$ref"});
      const std::string ref = s.at("$ref").is_string() ? s.at("$ref").get<std::string>() : "";
      if (ref.empty()) error(path, "'$ref' must be a string");
      auto it = refs_.find(ref);
      if (it != refs_.end()) return it->second;
      const json& target = resolve(ref, path);
      // The rule is named before its body is built, so a recursive schema refers to itself.
      const std::string name = new_rule("ref-" + ref.substr(ref.rfind('/') + 1), "");
      refs_[ref] = name;
      const std::string target_path = ref == "#" ? std::string("schema") : "schema" + ref.substr(1);
      std::string body = visit(target, target_path, name);
      rules_[name] = body;
      return name;
    }
    if (s.contains("const")) {
      check_keywords(s, path, {"const"});
      return literal(s.at("const").dump()) + " " + use("space");
    }
    if (s.contains("enum")) {
      check_keywords(s, path, {"enum", "type"});
      const json& e = s.at("enum");
      if (!e.is_array() || e.empty()) error(path, "'enum' must be a non-empty array");
      std::string alts;
      for (const json& v : e) alts += (alts.empty() ? "" : " | ") + literal(v.dump());
      return "(" + alts + ") " + use("space");
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      check_keywords(s, path, {key});
      const json& list = s.at(key);
      if (!list.is_array() || list.empty()) error(path, "'", key, "' must be a non-empty array");
      std::string alts;
      for (size_t i = 0; i < list.size(); ++i)
        alts += (i ? " | " : "") + visit(list[i], path + "." + key + "[" + std::to_string(i) + "]", hint + "-" + std::to_string(i));
      return new_rule(hint, alts);
    }
    if (s.contains("allOf")) return visit_all_of(s, path, hint);

    if (s.contains("type") && s.at("type").is_array()) {
      const json& types = s.at("type");
      if (types.empty()) error(path, "'type' is an empty array");
      std::string alts;
      for (size_t i = 0; i < types.size(); ++i) {
        json one = s;
        one["type"] = types[i];
        alts += (i ? " | " : "") + visit(one, path, hint);
      }
      return "(" + alts + ")";
    }
    std::string type;
    if (s.contains("type")) {
      if (!s.at("type").is_string()) error(path, "'type' must be a string or an array of strings");
      type = s.at("type").get<std::string>();
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      type = "object";
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) {
      type = "array";
    } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("format")) {
      type = "string";
    }
    if (type.empty()) {
      check_keywords(s, path, {});
      return use("value");
    }
    if (type == "boolean" || type == "null") {
      check_keywords(s, path, {"type"});
      return use(type);
    }
    if (type == "number") {
      check_keywords(s, path, {"type"});
      return use("number");
    }
    if (type == "integer") {
      check_keywords(s, path, {"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"});
      const IntegerRange range = integer_range(s, path);
      if (!range.lo && !range.hi) return use("integer");
      return new_rule(hint.empty() ? "int" : hint + "-int", integer_range_gbnf(range)) + " " + use("space");
    }
    if (type == "string") return visit_string(s, path);
    if (type == "array") return visit_array(s, path, hint);
    if (type == "object") return visit_object(s, path, hint);
    error(path, "unknown 'type' \"", type, "\"");
  }

  std::string visit_string(const json& s, const std::string& path) {
    check_keywords(s, path, {"type", "minLength", "maxLength", "format"});
    if (s.contains("format")) {
      if (s.contains("minLength") || s.contains("maxLength")) error(path, "'format' with minLength/maxLength is not supported");
      const std::string f = s.at("format").is_string() ? s.at("format").get<std::string>() : "";
      if (f == "uuid") return use("uuid");
      if (f == "date") return use("date-string");
      if (f == "time") return use("time-string");
      if (f == "date-time") return use("date-time-string");
      error(path, "'format' \"", f, "\" is not supported (supported: date, time, date-time, uuid)");
    }
    if (!s.contains("minLength") && !s.contains("maxLength")) return use("string");
    const int64_t min = s.contains("minLength") ? count_of(s, "minLength", path) : 0;
    const int64_t max = s.contains("maxLength") ? count_of(s, "maxLength", path) : -1;
    if (max >= 0 && max < min) error(path, "'maxLength' is below 'minLength'");
    use("char");
    const std::string rep = max < 0 ? "{" + std::to_string(min) + ",}" : "{" + std::to_string(min) + "," + std::to_string(max) + "}";
    return "\"\\\"\" char" + rep + " \"\\\"\" " + use("space");
  }

  std::string visit_array(const json& s, const std::string& path, const std::string& hint) {
    check_keywords(s, path, {"type", "items", "prefixItems", "minItems", "maxItems"});
    const std::string sp = use("space");
    const json* prefix = nullptr;
    if (s.contains("prefixItems")) prefix = &s.at("prefixItems");
    else if (s.contains("items") && s.at("items").is_array()) prefix = &s.at("items");  // draft 4 tuples
    if (prefix) {
      if (!prefix->is_array()) error(path, "'prefixItems' must be an array");
      if (s.contains("minItems") || s.contains("maxItems")) error(path, "'minItems'/'maxItems' with 'prefixItems' is not supported");
      std::string seq = "\"[\" " + sp;
      for (size_t i = 0; i < prefix->size(); ++i) {
        if (i) seq += " \",\" " + sp;
        seq += " " + visit((*prefix)[i], path + ".prefixItems[" + std::to_string(i) + "]", hint + "-" + std::to_string(i));
      }
      if (s.contains("prefixItems") && s.contains("items") && s.at("items") != false) {
        const std::string item = visit(s.at("items"), path + ".items", hint + "-item");
        seq += prefix->empty() ? " (" + item + " (\",\" " + sp + " " + item + ")*)?" : " (\",\" " + sp + " " + item + ")*";
      }
      return new_rule(hint, seq + " \"]\" " + sp);
    }
    const std::string item = s.contains("items") ? visit(s.at("items"), path + ".items", hint + "-item") : use("value");
    const int64_t min = s.contains("minItems") ? count_of(s, "minItems", path) : 0;
    const int64_t max = s.contains("maxItems") ? count_of(s, "maxItems", path) : -1;
    if (max >= 0 && max < min) error(path, "'maxItems' is below 'minItems'");
    std::string body;
    const std::string more = "(\",\" " + sp + " " + item + ")";
    if (max == 0) {
      body = "\"[\" " + sp + " \"]\" " + sp;
    } else if (min == 0) {
      body = "\"[\" " + sp + " (" + item + " " + more + (max < 0 ? "*" : "{0," + std::to_string(max - 1) + "}") + ")? \"]\" " + sp;
    } else {
      body = "\"[\" " + sp + " " + item + " " + more +
             (max < 0 ? "{" + std::to_string(min - 1) + ",}" : "{" + std::to_string(min - 1) + "," + std::to_string(max - 1) + "}") +
             " \"]\" " + sp;
    }
    return new_rule(hint, body);
  }

  std::string visit_all_of(const json& s, const std::string& path, const std::string& hint) {
    check_keywords(s, path, {"allOf"});
    const json& list = s.at("allOf");
    if (!list.is_array() || list.empty()) error(path, "'allOf' must be a non-empty array");
    // Only objects merge: their properties and required lists are united.
    json merged = {{"type", "object"}, {"properties", json::object()}, {"required", json::array()}};
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string p = path + ".allOf[" + std::to_string(i) + "]";
      const json* part = &list[i];
      std::set<std::string> seen;
      while (part->is_object() && part->contains("$ref")) {
        const std::string ref = part->at("$ref").is_string() ? part->at("$ref").get<std::string>() : "";
        if (!seen.insert(ref).second) error(p, "'$ref' cycle in 'allOf'");
        part = &resolve(ref, p);
      }
      if (!part->is_object() || (part->contains("type") && part->at("type") != "object") ||
          (!part->contains("properties") && !part->contains("required")))
        error(p, "'allOf' is only supported over object schemas (with properties / required)");
      check_keywords(*part, p, {"type", "properties", "required", "additionalProperties"});
      if (part->contains("additionalProperties")) error(p, "'additionalProperties' inside 'allOf' is not supported");
      if (part->contains("properties"))
        for (auto it = part->at("properties").begin(); it != part->at("properties").end(); ++it) {
          if (merged["properties"].contains(it.key()))
            error(p, "property '", it.key(), "' appears in two 'allOf' parts, which is not supported");
          merged["properties"][it.key()] = it.value();
        }
      if (part->contains("required"))
        for (const json& r : part->at("required")) merged["required"].push_back(r);
    }
    return visit_object(merged, path, hint);
  }

  // The rule for a key that is a JSON string but none of `keys` (additional properties must
  // not repeat a declared one: JSON.parse would keep the last value).
  std::string other_key(const std::vector<std::string>& keys, const std::string& hint, const std::string& path) {
    struct TrieNode {
      std::map<uint32_t, size_t> children;
      bool end = false;
    };
    std::vector<TrieNode> trie(1);
    for (const std::string& k : keys) {
      size_t n = 0;
      for (uint32_t cp : code_points(k)) {
        if (cp == '"' || cp == '\\' || cp < 0x20 || cp == 0x7F)
          error(path, "additional properties beside a property name that needs JSON escapes are not supported");
        auto it = trie[n].children.find(cp);
        if (it == trie[n].children.end()) {
          trie.emplace_back();
          trie[n].children[cp] = trie.size() - 1;
          n = trie.size() - 1;
        } else {
          n = it->second;
        }
      }
      trie[n].end = true;
    }
    const std::string ch = use("char"), sp = use("space");
    // node n -> rule name; built children first.
    std::vector<std::string> names(trie.size());
    for (size_t n = trie.size(); n-- > 0;) {
      std::string body;
      std::string rejected = "\"\\\\\\x7F\\x00-\\x1F";
      for (const auto& [cp, child] : trie[n].children) {
        body += (body.empty() ? "" : " | ") + std::string("[") + class_char(cp) + "] " + names[child];
        rejected += class_char(cp);
      }
      body += (body.empty() ? "" : " | ") + std::string("[^") + rejected + "] " + ch + "* \"\\\"\" " + sp;
      body += " | [\\\\] ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) " + ch + "* \"\\\"\" " + sp;
      if (!trie[n].end) body += " | \"\\\"\" " + sp;
      names[n] = new_rule(hint + "-other-key", body);
    }
    return "\"\\\"\" " + names[0];
  }

  std::string visit_object(const json& s, const std::string& path, const std::string& hint) {
    check_keywords(s, path, {"type", "properties", "required", "additionalProperties"});
    const std::string sp = use("space");
    const json empty = json::object();
    const json& props = s.contains("properties") ? s.at("properties") : empty;
    if (!props.is_object()) error(path, "'properties' must be an object");
    std::vector<std::string> required;
    if (s.contains("required")) {
      if (!s.at("required").is_array()) error(path, "'required' must be an array of names");
      for (const json& r : s.at("required")) {
        if (!r.is_string()) error(path, "'required' must be an array of names");
        const std::string name = r.get<std::string>();
        if (std::find(required.begin(), required.end(), name) != required.end()) continue;
        if (!props.contains(name)) error(path, "required property '", name, "' is not in 'properties' (not supported)");
        required.push_back(name);
      }
    }
    // No properties and no additionalProperties: any object.
    if (props.empty() && !s.contains("additionalProperties") && required.empty()) return use("object");
    std::string additional;  // the kv rule of extra keys, empty when none are allowed
    if (s.contains("additionalProperties") && s.at("additionalProperties") != false) {
      const json& ap = s.at("additionalProperties");
      const std::string value = ap == true ? use("value") : visit(ap, path + ".additionalProperties", hint + "-additional");
      std::vector<std::string> keys;
      for (auto it = props.begin(); it != props.end(); ++it) keys.push_back(it.key());
      const std::string key = keys.empty() ? use("string") : other_key(keys, hint, path);
      additional = new_rule(hint + "-additional-kv", key + " \":\" " + sp + " " + value);
    }
    std::vector<std::string> optional;
    for (auto it = props.begin(); it != props.end(); ++it)
      if (std::find(required.begin(), required.end(), it.key()) == required.end()) optional.push_back(it.key());
    auto kv = [&](const std::string& name) {
      const std::string value = visit(props.at(name), path + ".properties." + name, hint + "-" + name);
      return new_rule(hint + "-" + name + "-kv", literal(json(name).dump()) + " " + sp + " \":\" " + sp + " " + value);
    };
    std::vector<std::string> req_kv, opt_kv;
    for (const std::string& r : required) req_kv.push_back(kv(r));
    for (const std::string& o : optional) opt_kv.push_back(kv(o));
    // tail[i]: optional properties i.. (in order, each present or not), then any additional ones.
    std::vector<std::string> tail(opt_kv.size() + 1);
    tail[opt_kv.size()] = additional.empty() ? "" : "(\",\" " + sp + " " + additional + ")*";
    for (size_t i = opt_kv.size(); i-- > 0;) {
      const std::string body = "(\",\" " + sp + " " + opt_kv[i] + ")? " + tail[i + 1];
      tail[i] = new_rule(hint + "-tail", body);
    }
    std::string members;
    if (!req_kv.empty()) {
      members = req_kv[0];
      for (size_t i = 1; i < req_kv.size(); ++i) members += " \",\" " + sp + " " + req_kv[i];
      members += " " + tail[0];
    } else {
      std::string alts;
      for (size_t i = 0; i < opt_kv.size(); ++i) alts += (alts.empty() ? "" : " | ") + opt_kv[i] + " " + tail[i + 1];
      if (!additional.empty()) alts += (alts.empty() ? "" : " | ") + additional + " " + tail[opt_kv.size()];
      members = alts.empty() ? "" : "(" + alts + ")?";
    }
    return new_rule(hint, "\"{\" " + sp + " " + members + " \"}\" " + sp);
  }

  const json& root_;
  std::map<std::string, std::string> rules_;
  std::map<std::string, std::string> refs_;
};

}  // namespace

std::string json_schema_to_gbnf(const json& schema) { return Converter(schema).run(); }

const std::string& json_object_gbnf() {
  static const std::string k = [] {
    std::string out = "root ::= object\n";
    for (const char* name : {"object", "value", "array", "string", "char", "number", "integral-part", "decimal-part",
                             "boolean", "null", "space"})
      out += std::string(name) + " ::= " + primitives().at(name).first + "\n";
    return out;
  }();
  return k;
}

}  // namespace tern::grammar
