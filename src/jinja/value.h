#pragma once
// Values of the Jinja evaluator: Python's types as Jinja2 templates see them (undefined, None,
// bool, int, float, str, list, dict, callables), with Python's semantics where a chat template
// can tell the difference (truthiness, str(), equality, ordering of dict keys).
//
// Strings carry marks: byte ranges that came from marked input (the chat server marks the
// messages' contents). Every string operation keeps the marks of the bytes it copies, so the
// rendered text says which of its bytes the template wrote and which came from the messages.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tern::jinja {

// A byte string with marked ranges [begin, end): sorted, disjoint, never adjacent.
class Text {
 public:
  Text() = default;
  Text(std::string s, bool marked = false) : s_(std::move(s)) {  // NOLINT: implicit on purpose
    if (marked && !s_.empty()) marks_.push_back({0, s_.size()});
  }
  Text(const char* s) : s_(s) {}  // NOLINT

  const std::string& str() const { return s_; }
  size_t size() const { return s_.size(); }
  bool empty() const { return s_.empty(); }
  const std::vector<std::pair<size_t, size_t>>& marks() const { return marks_; }
  bool any_marked() const { return !marks_.empty(); }
  bool marked_at(size_t i) const;

  void append(const Text& t);
  void append(std::string_view s, bool marked = false);
  Text substr(size_t begin, size_t end) const;  // bytes [begin, end), clamped
  void mark_all() {
    marks_.clear();
    if (!s_.empty()) marks_.push_back({0, s_.size()});
  }

 private:
  void add_mark(size_t b, size_t e);
  std::string s_;
  std::vector<std::pair<size_t, size_t>> marks_;
};

class Value;
class Evaluator;
using Array = std::vector<Value>;
struct Object {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, as Python's dict
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(const std::string& key, Value v);
};

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* get(size_t i, std::string_view name) const;  // positional i, else keyword name
};
using NativeFn = std::function<Value(Evaluator&, Args&)>;

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, Array, Object, Callable };

  Value() = default;  // undefined
  static Value none() { Value v; v.kind_ = Kind::None; return v; }
  Value(bool b) : kind_(Kind::Bool), i_(b) {}                      // NOLINT
  Value(int64_t i) : kind_(Kind::Int), i_(i) {}                    // NOLINT
  Value(int i) : kind_(Kind::Int), i_(i) {}                        // NOLINT
  Value(double f) : kind_(Kind::Float), f_(f) {}                   // NOLINT
  Value(Text s) : kind_(Kind::String), s_(std::move(s)) {}         // NOLINT
  Value(std::string s) : kind_(Kind::String), s_(std::move(s)) {}  // NOLINT
  Value(const char* s) : kind_(Kind::String), s_(s) {}             // NOLINT
  static Value array(Array a = {});
  static Value object(Object o = {});
  static Value callable(std::string name, NativeFn fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_object() const { return kind_ == Kind::Object; }
  bool is_callable() const { return kind_ == Kind::Callable; }

  bool as_bool() const { return i_ != 0; }
  int64_t as_int() const { return i_; }
  double as_number() const { return kind_ == Kind::Float ? f_ : double(i_); }
  const Text& text() const { return s_; }
  const std::string& str() const { return s_.str(); }
  Array& arr() const { return *arr_; }
  Object& obj() const { return *obj_; }
  const std::string& fn_name() const { return fn_->first; }
  const NativeFn& fn() const { return fn_->second; }

  bool truthy() const;
  const char* type_name() const;  // Python's: "str", "list", "dict", "NoneType", ...

 private:
  Kind kind_ = Kind::Undefined;
  int64_t i_ = 0;
  double f_ = 0;
  Text s_;
  std::shared_ptr<Array> arr_;
  std::shared_ptr<Object> obj_;
  std::shared_ptr<std::pair<std::string, NativeFn>> fn_;
};

// A JSON document as a value (object keys in document order); strings marked when `mark`.
Value from_json(const nlohmann::ordered_json& j, bool mark = false);

// Python's str(): "None", "True", repr of floats ("1.0", "1e+16"), lists and dicts as their repr.
// The result is marked throughout when any string inside is marked (str of a string is itself).
Text to_text(const Value& v);
// Whether any string inside the value is marked.
bool has_marks(const Value& v);
// Python's repr() of a value (strings quoted), as str() of a list shows its items.
std::string repr(const Value& v);
// Python's float repr: the shortest digits that read back, "1.0", "1e-05", "inf".
std::string float_repr(double d);
// HF's tojson filter: json.dumps(v, ensure_ascii=False, indent=indent) (keys in insertion
// order; indent < 0: one line with ", " and ": "). Throws tern::Error for undefined/callables.
std::string to_json(const Value& v, int indent = -1);

// Python's ==, and the ordering of <, <= ... (numbers, strings, lists); compare() throws
// tern::Error for types Python cannot order.
bool equal(const Value& a, const Value& b);
int compare(const Value& a, const Value& b);

}  // namespace tern::jinja
