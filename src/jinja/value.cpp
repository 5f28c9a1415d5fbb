#include "jinja/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace tern::jinja {

bool Text::marked_at(size_t i) const {
  for (const auto& [b, e] : marks_) {
    if (i < b) return false;
    if (i < e) return true;
  }
  return false;
}

void Text::add_mark(size_t b, size_t e) {
  if (b >= e) return;
  if (!marks_.empty() && marks_.back().second >= b) {
    marks_.back().second = std::max(marks_.back().second, e);
    return;
  }
  marks_.push_back({b, e});
}

void Text::append(const Text& t) {
  const size_t off = s_.size();
  s_ += t.s_;
  for (const auto& [b, e] : t.marks_) add_mark(off + b, off + e);
}

void Text::append(std::string_view s, bool marked) {
  const size_t off = s_.size();
  s_ += s;
  if (marked) add_mark(off, s_.size());
}

Text Text::substr(size_t begin, size_t end) const {
  end = std::min(end, s_.size());
  begin = std::min(begin, end);
  Text out;
  out.s_ = s_.substr(begin, end - begin);
  for (const auto& [b, e] : marks_) {
    const size_t lo = std::max(b, begin), hi = std::min(e, end);
    if (lo < hi) out.add_mark(lo - begin, hi - begin);
  }
  return out;
}

const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}
Value* Object::find(std::string_view key) {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}
void Object::set(const std::string& key, Value v) {
  if (Value* old = find(key)) *old = std::move(v);
  else items.emplace_back(key, std::move(v));
}

const Value* Args::get(size_t i, std::string_view name) const {
  if (i < pos.size()) return &pos[i];
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

Value Value::array(Array a) {
  Value v;
  v.kind_ = Kind::Array;
  v.arr_ = std::make_shared<Array>(std::move(a));
  return v;
}
Value Value::object(Object o) {
  Value v;
  v.kind_ = Kind::Object;
  v.obj_ = std::make_shared<Object>(std::move(o));
  return v;
}
Value Value::callable(std::string name, NativeFn fn) {
  Value v;
  v.kind_ = Kind::Callable;
  v.fn_ = std::make_shared<std::pair<std::string, NativeFn>>(std::move(name), std::move(fn));
  return v;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool:
    case Kind::Int: return i_ != 0;
    case Kind::Float: return f_ != 0;
    case Kind::String: return !s_.empty();
    case Kind::Array: return !arr_->empty();
    case Kind::Object: return !obj_->items.empty();
    case Kind::Callable: return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::Array: return "list";
    case Kind::Object: return "dict";
    case Kind::Callable: return "function";
  }
  return "?";
}

Value from_json(const nlohmann::ordered_json& j, bool mark) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) return Value(double(u));
      return Value(int64_t(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(Text(j.get<std::string>(), mark));
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      for (const auto& x : j) a.push_back(from_json(x, mark));
      return Value::array(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object o;
      for (const auto& [k, x] : j.items()) o.set(k, from_json(x, mark));
      return Value::object(std::move(o));
    }
    default: fail("cannot use a JSON value of this type in a template");
  }
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // The shortest round-trip digits, then Python's layout: fixed for 1e-4 <= |d| < 1e16.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  const int exp = std::stoi(sci.substr(epos + 1));
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(size_t(-exp - 1), '0') + digits;
    } else if (size_t(exp) + 1 >= digits.size()) {
      out = digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1, std::string::npos);
    }
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += e;
  }
  return neg ? "-" + out : out;
}

namespace {

}  // namespace

bool has_marks(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::String: return v.text().any_marked();
    case Value::Kind::Array:
      for (const Value& x : v.arr())
        if (has_marks(x)) return true;
      return false;
    case Value::Kind::Object:
      for (const auto& [k, x] : v.obj().items)
        if (has_marks(x)) return true;
      return false;
    default: return false;
  }
}

namespace {

std::string repr_string(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == q) out += std::string("\\") + char(q);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += char(c);
    }
  }
  return out + q;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

void json_dump(std::string& out, const Value& v, int indent, int level) {
  const auto newline = [&](int lvl) {
    if (indent < 0) return;
    out += '\n';
    out.append(size_t(indent) * size_t(lvl), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.as_int()); return;
    case Value::Kind::Float: {
      const double d = v.as_number();
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d > 0 ? "Infinity" : "-Infinity";
      else out += float_repr(d);
      return;
    }
    case Value::Kind::String: json_string(out, v.str()); return;
    case Value::Kind::Array: {
      if (v.arr().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (const Value& x : v.arr()) {
        if (!first) out += indent < 0 ? ", " : ",";
        first = false;
        newline(level + 1);
        json_dump(out, x, indent, level + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::Object: {
      if (v.obj().items.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [k, x] : v.obj().items) {
        if (!first) out += indent < 0 ? ", " : ",";
        first = false;
        newline(level + 1);
        json_string(out, k);
        out += ": ";
        json_dump(out, x, indent, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    case Value::Kind::Undefined: fail("tojson: the value is undefined");
    case Value::Kind::Callable: fail("tojson: a function is not JSON serializable");
  }
}

}  // namespace

std::string repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::String: return repr_string(v.str());
    case Value::Kind::Array: {
      std::string out = "[";
      for (size_t i = 0; i < v.arr().size(); ++i) out += (i ? ", " : "") + repr(v.arr()[i]);
      return out + "]";
    }
    case Value::Kind::Object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.obj().items) {
        out += (first ? "" : ", ") + repr_string(k) + ": " + repr(x);
        first = false;
      }
      return out + "}";
    }
    default: return to_text(v).str();
  }
}

Text to_text(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return Text();
    case Value::Kind::None: return Text("None");
    case Value::Kind::Bool: return Text(v.as_bool() ? "True" : "False");
    case Value::Kind::Int: return Text(std::to_string(v.as_int()));
    case Value::Kind::Float: return Text(float_repr(v.as_number()));
    case Value::Kind::String: return v.text();
    case Value::Kind::Array:
    case Value::Kind::Object: return Text(repr(v), has_marks(v));
    case Value::Kind::Callable: return Text("<function " + v.fn_name() + ">");
  }
  return Text();
}

std::string to_json(const Value& v, int indent) {
  std::string out;
  json_dump(out, v, indent, 0);
  return out;
}

bool equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  const bool an = a.is_number() || a.is_bool(), bn = b.is_number() || b.is_bool();
  if (an && bn) {
    if (a.is_float() || b.is_float()) return a.as_number() == b.as_number();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::Undefined:
    case K::None: return true;
    case K::String: return a.str() == b.str();
    case K::Array: {
      if (a.arr().size() != b.arr().size()) return false;
      for (size_t i = 0; i < a.arr().size(); ++i)
        if (!equal(a.arr()[i], b.arr()[i])) return false;
      return true;
    }
    case K::Object: {
      if (a.obj().items.size() != b.obj().items.size()) return false;
      for (const auto& [k, x] : a.obj().items) {
        const Value* y = b.obj().find(k);
        if (!y || !equal(x, *y)) return false;
      }
      return true;
    }
    case K::Callable: return &a.fn() == &b.fn();
    default: return false;
  }
}

int compare(const Value& a, const Value& b) {
  const bool an = a.is_number() || a.is_bool(), bn = b.is_number() || b.is_bool();
  if (an && bn) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_number(), y = b.as_number();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    return a.as_int() < b.as_int() ? -1 : (a.as_int() > b.as_int() ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_array() && b.is_array()) {
    for (size_t i = 0; i < a.arr().size() && i < b.arr().size(); ++i)
      if (int c = compare(a.arr()[i], b.arr()[i])) return c;
    return a.arr().size() < b.arr().size() ? -1 : (a.arr().size() > b.arr().size() ? 1 : 0);
  }
  fail("'<' is not supported between instances of '", a.type_name(), "' and '", b.type_name(), "'");
}

}  // namespace tern::jinja
