// The evaluator: runs a parsed template over a set of variables, with Jinja2's scoping (a for
// loop's body and a macro have their own variables; if does not), Python's semantics for the
// operators, and the filters, tests and methods listed in docs/server.md.
#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "jinja/ast.h"
#include "jinja/template.h"

namespace tern::jinja {

namespace {

using namespace ast;

// ---- UTF-8 and Python's str helpers ----

// Start offsets of the code points of s, and s.size() last (invalid bytes count as one each).
std::vector<size_t> cp_offsets(const std::string& s) {
  std::vector<size_t> out;
  out.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    out.push_back(i);
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + n > s.size()) n = 1;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) n = 1;
    i += n;
  }
  out.push_back(s.size());
  return out;
}

uint32_t decode_at(const std::string& s, size_t b, size_t e) {
  const unsigned char c = static_cast<unsigned char>(s[b]);
  if (e - b == 1) return c;
  uint32_t cp = c & (0xFF >> (e - b + 1));
  for (size_t k = b + 1; k < e; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[k]) & 0x3F);
  return cp;
}

bool py_space(uint32_t c) {  // str.isspace()
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// str.strip / lstrip / rstrip: chars == nullptr strips whitespace.
Text py_strip(const Text& t, const std::string* chars, bool left, bool right) {
  const std::string& s = t.str();
  const std::vector<size_t> off = cp_offsets(s);
  std::vector<uint32_t> set;
  if (chars) {
    const std::vector<size_t> co = cp_offsets(*chars);
    for (size_t k = 0; k + 1 < co.size(); ++k) set.push_back(decode_at(*chars, co[k], co[k + 1]));
  }
  const auto strip_it = [&](uint32_t c) { return chars ? std::find(set.begin(), set.end(), c) != set.end() : py_space(c); };
  size_t b = 0, e = off.size() - 1;
  if (left)
    while (b < e && strip_it(decode_at(s, off[b], off[b + 1]))) ++b;
  if (right)
    while (e > b && strip_it(decode_at(s, off[e - 1], off[e]))) --e;
  return t.substr(off[b], off[e]);
}

char ascii_upper(char c) { return c >= 'a' && c <= 'z' ? char(c - 32) : c; }
char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? char(c + 32) : c; }

// Case mapping of ASCII letters (other bytes unchanged): the lengths stay, so do the marks.
Text map_case(const Text& t, int mode) {  // 0 upper, 1 lower, 2 title, 3 capitalize
  std::string s = t.str();
  bool prev_letter = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const bool letter = std::isalpha(c) || c >= 0x80;
    switch (mode) {
      case 0: s[i] = ascii_upper(s[i]); break;
      case 1: s[i] = ascii_lower(s[i]); break;
      case 2: s[i] = prev_letter ? ascii_lower(s[i]) : ascii_upper(s[i]); break;
      default: s[i] = i == 0 ? ascii_upper(s[i]) : ascii_lower(s[i]);
    }
    prev_letter = letter;
  }
  Text r;
  size_t pos = 0;
  for (const auto& [b, e] : t.marks()) {
    r.append(std::string_view(s).substr(pos, b - pos));
    r.append(std::string_view(s).substr(b, e - b), true);
    pos = e;
  }
  r.append(std::string_view(s).substr(pos));
  return r;
}

Text py_replace(const Text& t, const Text& old, const Text& rep, int64_t count) {
  const std::string& s = t.str();
  Text out;
  size_t pos = 0;
  int64_t n = 0;
  if (old.empty()) {
    const std::vector<size_t> off = cp_offsets(s);
    for (size_t k = 0; k + 1 < off.size(); ++k) {
      if (count < 0 || n < count) {
        out.append(rep);
        ++n;
      }
      out.append(t.substr(off[k], off[k + 1]));
    }
    if (count < 0 || n < count) out.append(rep);
    return out;
  }
  for (size_t hit; (count < 0 || n < count) && (hit = s.find(old.str(), pos)) != std::string::npos; ++n) {
    out.append(t.substr(pos, hit));
    out.append(rep);
    pos = hit + old.size();
  }
  out.append(t.substr(pos, s.size()));
  return out;
}

// str.split(sep, maxsplit) (sep == nullptr: runs of whitespace, no empty parts).
Array py_split(const Text& t, const std::string* sep, int64_t maxsplit) {
  Array out;
  const std::string& s = t.str();
  if (sep) {
    if (sep->empty()) fail("split: empty separator");
    size_t pos = 0;
    for (size_t hit; (maxsplit < 0 || int64_t(out.size()) < maxsplit) && (hit = s.find(*sep, pos)) != std::string::npos;) {
      out.push_back(Value(t.substr(pos, hit)));
      pos = hit + sep->size();
    }
    out.push_back(Value(t.substr(pos, s.size())));
    return out;
  }
  const std::vector<size_t> off = cp_offsets(s);
  size_t k = 0;
  const size_t n = off.size() - 1;
  while (k < n) {
    while (k < n && py_space(decode_at(s, off[k], off[k + 1]))) ++k;
    if (k == n) break;
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      size_t e = n;
      while (e > k && py_space(decode_at(s, off[e - 1], off[e]))) --e;
      out.push_back(Value(t.substr(off[k], off[e])));
      break;
    }
    const size_t b = k;
    while (k < n && !py_space(decode_at(s, off[k], off[k + 1]))) ++k;
    out.push_back(Value(t.substr(off[b], off[k])));
  }
  return out;
}

// Python's slice.indices + the index sequence of [start:stop:step].
std::vector<int64_t> slice_indices(int64_t len, const Value& start, const Value& stop, const Value& step) {
  const auto as_i = [](const Value& v, const char* what) -> int64_t {
    if (!v.is_int() && !v.is_bool()) fail("slice ", what, " must be an integer or none, not ", v.type_name());
    return v.as_int();
  };
  const bool no_step = step.is_undefined() || step.is_none();
  const int64_t st = no_step ? 1 : as_i(step, "step");
  if (st == 0) fail("slice step cannot be zero");
  int64_t lo, hi;
  if (start.is_undefined() || start.is_none()) {
    lo = st < 0 ? len - 1 : 0;
  } else {
    lo = as_i(start, "start");
    if (lo < 0) lo = std::max<int64_t>(lo + len, st < 0 ? -1 : 0);
    else lo = std::min<int64_t>(lo, st < 0 ? len - 1 : len);
  }
  if (stop.is_undefined() || stop.is_none()) {
    hi = st < 0 ? -1 : len;
  } else {
    hi = as_i(stop, "stop");
    if (hi < 0) hi = std::max<int64_t>(hi + len, st < 0 ? -1 : 0);
    else hi = std::min<int64_t>(hi, st < 0 ? len - 1 : len);
  }
  std::vector<int64_t> idx;
  if (st > 0)
    for (int64_t i = lo; i < hi; i += st) idx.push_back(i);
  else
    for (int64_t i = lo; i > hi; i += st) idx.push_back(i);
  return idx;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

enum class Flow { Normal, Break, Continue };

struct Scope {
  std::unordered_map<std::string, Value> vars;
  bool barrier = false;  // a macro's: names below it (but the root) are not visible
};

}  // namespace

class Evaluator {
 public:
  explicit Evaluator(const RenderOptions& opt) : opt_(opt) {}

  Text run(const Node& root, const Object& vars) {
    scopes_.emplace_back();
    install_globals();
    for (const auto& [k, v] : vars.items) scopes_[0].vars[k] = v;
    Text out;
    out_ = &out;
    exec(root);
    return out;
  }

 private:
  // ---- variables ----

  Value lookup(const std::string& name) const {
    for (size_t i = scopes_.size(); i-- > 0;) {
      const auto it = scopes_[i].vars.find(name);
      if (it != scopes_[i].vars.end()) return it->second;
      if (scopes_[i].barrier) {
        const auto r = scopes_[0].vars.find(name);
        return r == scopes_[0].vars.end() ? Value() : r->second;
      }
    }
    return Value();
  }
  void assign(const std::string& name, Value v) { scopes_.back().vars[name] = std::move(v); }

  void install_globals() {
    auto& g = scopes_[0].vars;
    g["range"] = Value::callable("range", [this](Evaluator&, Args& a) {
      if (a.pos.empty() || a.pos.size() > 3) fail("range() takes 1 to 3 arguments");
      for (const Value& v : a.pos)
        if (!v.is_int()) fail("range() arguments must be integers, not ", v.type_name());
      int64_t start = 0, stop, step = 1;
      if (a.pos.size() == 1) stop = a.pos[0].as_int();
      else {
        start = a.pos[0].as_int();
        stop = a.pos[1].as_int();
        if (a.pos.size() == 3) step = a.pos[2].as_int();
      }
      if (step == 0) fail("range() step must not be zero");
      Array out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (out.size() >= opt_.limits.max_items) fail("range() longer than ", opt_.limits.max_items, " items");
        out.push_back(Value(i));
      }
      return Value::array(std::move(out));
    });
    const auto make_dict = [](Evaluator&, Args& a) {
      Object o;
      for (const Value& p : a.pos) {
        if (!p.is_object()) fail("dict()/namespace() takes a mapping or keyword arguments");
        for (const auto& [k, v] : p.obj().items) o.set(k, v);
      }
      for (auto& [k, v] : a.kw) o.set(k, v);
      return Value::object(std::move(o));
    };
    g["namespace"] = Value::callable("namespace", make_dict);
    g["dict"] = Value::callable("dict", make_dict);
    g["raise_exception"] = Value::callable("raise_exception", [](Evaluator&, Args& a) -> Value {
      // Re-thrown by the Call with its position (see eval).
      throw TemplateError(0, 0, a.pos.empty() ? std::string("raise_exception()") : to_text(a.pos[0]).str(), true);
    });
    g["strftime_now"] = Value::callable("strftime_now", [this](Evaluator&, Args& a) {
      if (a.pos.size() != 1 || !a.pos[0].is_string()) fail("strftime_now() takes one format string");
      const std::time_t t = opt_.now ? *opt_.now : std::time(nullptr);
      std::tm tm{};
      localtime_r(&t, &tm);
      char buf[512];
      const size_t n = std::strftime(buf, sizeof buf, a.pos[0].str().c_str(), &tm);
      return Value(std::string(buf, n));
    });
  }

  // ---- statements ----

  void emit(const Text& t) {
    if (out_->size() + t.size() > opt_.limits.max_output)
      fail("the output is larger than ", opt_.limits.max_output, " bytes");
    out_->append(t);
  }

  void step() {
    if (++steps_ > opt_.limits.max_steps)
      fail("the template ran more than ", opt_.limits.max_steps, " steps (an endless or huge loop?)");
  }

  Flow exec(const Node& n) {
    step();
    switch (n.kind) {
      case NodeKind::Body:
        for (const auto& k : n.kids)
          if (Flow f = exec(*k); f != Flow::Normal) return f;
        return Flow::Normal;
      case NodeKind::Text: emit(Text(n.text)); return Flow::Normal;
      case NodeKind::Output: {
        const Value v = eval(*n.expr);
        emit(to_text(v));
        return Flow::Normal;
      }
      case NodeKind::If:
        for (size_t i = 0; i < n.conds.size(); ++i)
          if (eval(*n.conds[i]).truthy()) return exec(*n.kids[i]);
        if (n.kids.size() > n.conds.size()) return exec(*n.kids.back());
        return Flow::Normal;
      case NodeKind::For: return exec_for(n);
      case NodeKind::Set: {
        Value v;
        if (n.expr) {
          v = eval(*n.expr);
        } else {
          Text body;
          Text* saved = out_;
          out_ = &body;
          try {
            exec(*n.kids[0]);
          } catch (...) {
            out_ = saved;
            throw;
          }
          out_ = saved;
          v = Value(std::move(body));
        }
        if (!n.attr.empty()) {
          const Value ns = lookup(n.targets[0]);
          if (!ns.is_object())
            throw TemplateError(n.line, n.col, str_cat("cannot set '", n.attr, "' on '", n.targets[0], "': not a namespace"));
          ns.obj().set(n.attr, std::move(v));
        } else if (n.targets.size() == 1) {
          assign(n.targets[0], std::move(v));
        } else {
          unpack(n, n.targets, v);
        }
        return Flow::Normal;
      }
      case NodeKind::Macro: {
        const Node* m = &n;
        assign(n.name, Value::callable(n.name, [m](Evaluator& ev, Args& a) { return ev.call_macro(*m, a); }));
        return Flow::Normal;
      }
      case NodeKind::Break: return Flow::Break;
      case NodeKind::Continue: return Flow::Continue;
    }
    return Flow::Normal;
  }

  void unpack(const Node& n, const std::vector<std::string>& targets, const Value& v) {
    if (!v.is_array() || v.arr().size() != targets.size())
      throw TemplateError(n.line, n.col, str_cat("cannot unpack ", v.type_name(), " into ", targets.size(), " variables"));
    for (size_t i = 0; i < targets.size(); ++i) assign(targets[i], v.arr()[i]);
  }

  Array iterate(const Value& v) const {
    switch (v.kind()) {
      case Value::Kind::Undefined: return {};
      case Value::Kind::Array: return v.arr();
      case Value::Kind::Object: {
        Array keys;
        for (const auto& [k, x] : v.obj().items) keys.push_back(Value(k));
        return keys;
      }
      case Value::Kind::String: {
        Array out;
        const std::vector<size_t> off = cp_offsets(v.str());
        for (size_t k = 0; k + 1 < off.size(); ++k) out.push_back(Value(v.text().substr(off[k], off[k + 1])));
        return out;
      }
      default: fail("'", v.type_name(), "' object is not iterable");
    }
  }

  Flow exec_for(const Node& n) {
    Array items = iterate(eval(*n.expr));
    if (n.cond) {
      Array kept;
      for (Value& it : items) {
        scopes_.emplace_back();
        if (n.targets.size() == 1) assign(n.targets[0], it);
        else unpack(n, n.targets, it);
        const bool keep = eval(*n.cond).truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(std::move(it));
      }
      items = std::move(kept);
    }
    const int64_t len = int64_t(items.size());
    for (int64_t i = 0; i < len; ++i) {
      Object loop;
      loop.set("index", Value(i + 1));
      loop.set("index0", Value(i));
      loop.set("revindex", Value(len - i));
      loop.set("revindex0", Value(len - i - 1));
      loop.set("first", Value(i == 0));
      loop.set("last", Value(i == len - 1));
      loop.set("length", Value(len));
      loop.set("previtem", i > 0 ? items[size_t(i - 1)] : Value());
      loop.set("nextitem", i + 1 < len ? items[size_t(i + 1)] : Value());
      loop.set("cycle", Value::callable("cycle", [i](Evaluator&, Args& a) {
        if (a.pos.empty()) fail("loop.cycle() needs at least one value");
        return a.pos[size_t(i) % a.pos.size()];
      }));
      scopes_.emplace_back();
      assign("loop", Value::object(std::move(loop)));
      if (n.targets.size() == 1) assign(n.targets[0], items[size_t(i)]);
      else unpack(n, n.targets, items[size_t(i)]);
      Flow f;
      try {
        f = exec(*n.kids[0]);
      } catch (...) {
        scopes_.pop_back();
        throw;
      }
      scopes_.pop_back();
      if (f == Flow::Break) break;
    }
    if (len == 0 && n.kids.size() > 1) return exec(*n.kids[1]);
    return Flow::Normal;
  }

 public:
  Value call_macro(const Node& m, Args& a) {
    if (depth_ >= opt_.limits.max_depth) fail("macro calls nested deeper than ", opt_.limits.max_depth);
    if (a.pos.size() > m.params.size()) fail("macro '", m.name, "' takes ", m.params.size(), " arguments, got ", a.pos.size());
    for (const auto& [k, v] : a.kw)
      if (std::find(m.params.begin(), m.params.end(), k) == m.params.end())
        fail("macro '", m.name, "' has no parameter '", k, "'");
    Scope s;
    s.barrier = true;
    scopes_.push_back(std::move(s));
    Text body;
    Text* saved = out_;
    ++depth_;
    try {
      for (size_t i = 0; i < m.params.size(); ++i) {
        const Value* v = a.get(i, m.params[i]);
        assign(m.params[i], v ? *v : (m.defaults[i] ? eval(*m.defaults[i]) : Value()));
      }
      out_ = &body;
      exec(*m.kids[0]);
    } catch (...) {
      out_ = saved;
      --depth_;
      scopes_.pop_back();
      throw;
    }
    out_ = saved;
    --depth_;
    scopes_.pop_back();
    return Value(std::move(body));
  }

 private:
  // ---- expressions ----

  Value eval(const Expr& e) {
    step();
    try {
      return eval_inner(e);
    } catch (const TemplateError& t) {
      if (t.line() == 0) throw TemplateError(e.line, e.col, t.message(), t.raised());
      throw;
    } catch (const Error& x) {
      throw TemplateError(e.line, e.col, x.what());
    }
  }

  Args eval_args(const Expr& e, size_t first) {
    Args a;
    for (size_t i = first; i < e.kids.size(); ++i) {
      Value v = eval(*e.kids[i]);
      const std::string& k = e.kw[i - first];
      if (k.empty()) a.pos.push_back(std::move(v));
      else a.kw.emplace_back(k, std::move(v));
    }
    return a;
  }

  Value eval_inner(const Expr& e) {
    switch (e.kind) {
      case ExprKind::Literal: return e.value;
      case ExprKind::Name: return lookup(e.name);
      case ExprKind::List:
      case ExprKind::Tuple: {
        Array a;
        for (const auto& k : e.kids) a.push_back(eval(*k));
        return Value::array(std::move(a));
      }
      case ExprKind::Dict: {
        Object o;
        for (size_t i = 0; i + 1 < e.kids.size(); i += 2) {
          const Value k = eval(*e.kids[i]);
          o.set(to_text(k).str(), eval(*e.kids[i + 1]));
        }
        return Value::object(std::move(o));
      }
      case ExprKind::Attr: return get_attr(eval(*e.kids[0]), e.name);
      case ExprKind::Index: return get_item(eval(*e.kids[0]), eval(*e.kids[1]));
      case ExprKind::Slice: {
        const Value obj = eval(*e.kids[0]);
        const Value a = e.kids[1] ? eval(*e.kids[1]) : Value();
        const Value b = e.kids[2] ? eval(*e.kids[2]) : Value();
        const Value c = e.kids[3] ? eval(*e.kids[3]) : Value();
        return slice(obj, a, b, c);
      }
      case ExprKind::Call: {
        const Expr& callee = *e.kids[0];
        if (callee.kind == ExprKind::Attr) {
          Value obj = eval(*callee.kids[0]);
          if (obj.is_string() || obj.is_array() || (obj.is_object() && !obj.obj().find(callee.name))) {
            Args a = eval_args(e, 1);
            return call_method(obj, callee.name, a);
          }
          const Value f = get_attr(obj, callee.name);
          Args a = eval_args(e, 1);
          return call(f, callee.name, a);
        }
        const Value f = eval(callee);
        Args a = eval_args(e, 1);
        return call(f, callee.kind == ExprKind::Name ? callee.name : std::string("expression"), a);
      }
      case ExprKind::Filter: {
        const Value v = eval(*e.kids[0]);
        Args a = eval_args(e, 1);
        return filter(e.name, v, a);
      }
      case ExprKind::Test: {
        const Value v = eval(*e.kids[0]);
        Args a = eval_args(e, 1);
        const bool r = test(e.name, v, a);
        return Value(e.negate ? !r : r);
      }
      case ExprKind::Unary: {
        const Value v = eval(*e.kids[0]);
        if (e.name == "not") return Value(!v.truthy());
        if (!v.is_number() && !v.is_bool()) fail("bad operand type for unary ", e.name, ": '", v.type_name(), "'");
        if (e.name == "+") return v.is_float() ? v : Value(v.as_int());
        if (v.is_float()) return Value(-v.as_number());
        if (v.as_int() == INT64_MIN) fail("integer overflow");
        return Value(-v.as_int());
      }
      case ExprKind::Binary: return binary(e);
      case ExprKind::Cond:
        if (eval(*e.kids[0]).truthy()) return eval(*e.kids[1]);
        return e.kids[2] ? eval(*e.kids[2]) : Value();
    }
    return Value();
  }

  Value call(const Value& f, const std::string& name, Args& a) {
    if (!f.is_callable()) fail(f.is_undefined() ? str_cat("'", name, "' is undefined") : str_cat("'", name, "' is not callable"));
    return f.fn()(*this, a);
  }

  Value get_attr(const Value& obj, const std::string& name) const {
    if (obj.is_object()) {
      const Value* v = obj.obj().find(name);
      return v ? *v : Value();
    }
    return Value();
  }

  Value get_item(const Value& obj, const Value& key) const {
    if (obj.is_object()) {
      if (!key.is_string()) return Value();
      const Value* v = obj.obj().find(key.str());
      return v ? *v : Value();
    }
    if (obj.is_array() || obj.is_string()) {
      if (!key.is_int()) {
        if (key.is_string() || key.is_undefined()) return Value();
        fail("indices must be integers, not ", key.type_name());
      }
      if (obj.is_array()) {
        const int64_t n = int64_t(obj.arr().size());
        int64_t i = key.as_int();
        if (i < 0) i += n;
        return i >= 0 && i < n ? obj.arr()[size_t(i)] : Value();
      }
      const std::vector<size_t> off = cp_offsets(obj.str());
      const int64_t n = int64_t(off.size()) - 1;
      int64_t i = key.as_int();
      if (i < 0) i += n;
      return i >= 0 && i < n ? Value(obj.text().substr(off[size_t(i)], off[size_t(i) + 1])) : Value();
    }
    return Value();
  }

  Value slice(const Value& obj, const Value& a, const Value& b, const Value& c) const {
    if (obj.is_array()) {
      Array out;
      for (int64_t i : slice_indices(int64_t(obj.arr().size()), a, b, c)) out.push_back(obj.arr()[size_t(i)]);
      return Value::array(std::move(out));
    }
    if (obj.is_string()) {
      const std::vector<size_t> off = cp_offsets(obj.str());
      Text out;
      for (int64_t i : slice_indices(int64_t(off.size()) - 1, a, b, c))
        out.append(obj.text().substr(off[size_t(i)], off[size_t(i) + 1]));
      return Value(std::move(out));
    }
    if (obj.is_undefined()) return Value();
    fail("'", obj.type_name(), "' object is not subscriptable");
  }

  static int64_t add(int64_t a, int64_t b) {
    int64_t r = 0;
    if (__builtin_add_overflow(a, b, &r)) fail("integer overflow");
    return r;
  }
  static int64_t sub(int64_t a, int64_t b) {
    int64_t r = 0;
    if (__builtin_sub_overflow(a, b, &r)) fail("integer overflow");
    return r;
  }
  static int64_t mul(int64_t a, int64_t b) {
    int64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) fail("integer overflow");
    return r;
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value a = eval(*e.kids[0]);
      return a.truthy() ? eval(*e.kids[1]) : a;
    }
    if (op == "or") {
      Value a = eval(*e.kids[0]);
      return a.truthy() ? a : eval(*e.kids[1]);
    }
    const Value a = eval(*e.kids[0]);
    const Value b = eval(*e.kids[1]);
    if (op == "==") return Value(equal(a, b));
    if (op == "!=") return Value(!equal(a, b));
    if (op == "<") return Value(compare(a, b) < 0);
    if (op == ">") return Value(compare(a, b) > 0);
    if (op == "<=") return Value(compare(a, b) <= 0);
    if (op == ">=") return Value(compare(a, b) >= 0);
    if (op == "in") return Value(contains(b, a));
    if (op == "not in") return Value(!contains(b, a));
    if (op == "~") {
      Text t = to_text(a);
      t.append(to_text(b));
      check_size(t.size());
      return Value(std::move(t));
    }
    const bool an = a.is_number() || a.is_bool(), bn = b.is_number() || b.is_bool();
    const auto bad = [&]() -> Value {
      fail("unsupported operand type(s) for ", op, ": '", a.type_name(), "' and '", b.type_name(), "'");
    };
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        check_size(a.text().size() + b.text().size());
        Text t = a.text();
        t.append(b.text());
        return Value(std::move(t));
      }
      if (a.is_array() && b.is_array()) {
        if (a.arr().size() + b.arr().size() > opt_.limits.max_items) fail("list longer than ", opt_.limits.max_items, " items");
        Array r = a.arr();
        r.insert(r.end(), b.arr().begin(), b.arr().end());
        return Value::array(std::move(r));
      }
      if (!an || !bn) return bad();
      if (a.is_float() || b.is_float()) return Value(a.as_number() + b.as_number());
      return Value(add(a.as_int(), b.as_int()));
    }
    if (op == "*" && ((a.is_string() || a.is_array()) && (b.is_int() || b.is_bool()))) return repeat(a, b.as_int());
    if (op == "*" && ((b.is_string() || b.is_array()) && (a.is_int() || a.is_bool()))) return repeat(b, a.as_int());
    if (op == "%" && a.is_string()) fail("printf-style string formatting ('%') is not supported");
    if (!an || !bn) return bad();
    const bool fl = a.is_float() || b.is_float();
    const double x = a.as_number(), y = b.as_number();
    if (op == "-") {
      if (fl) return Value(x - y);
      return Value(sub(a.as_int(), b.as_int()));
    }
    if (op == "*") {
      if (fl) return Value(x * y);
      return Value(mul(a.as_int(), b.as_int()));
    }
    if (op == "/") {
      if (y == 0) fail("division by zero");
      return Value(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) fail(op == "%" ? "modulo by zero" : "division by zero");
      if (fl) {
        const double q = std::floor(x / y);
        return op == "//" ? Value(q) : Value(x - q * y);
      }
      const int64_t p = a.as_int(), q = b.as_int();
      if (p == INT64_MIN && q == -1) fail("integer overflow");
      int64_t d = p / q, m = p % q;
      if (m != 0 && ((m < 0) != (q < 0))) {
        --d;
        m += q;
      }
      return op == "//" ? Value(d) : Value(m);
    }
    if (op == "**") {
      if (fl || b.as_int() < 0) return Value(std::pow(x, y));
      int64_t r = 1;
      for (int64_t k = 0; k < b.as_int(); ++k) {
        r = mul(r, a.as_int());
        if (r == 0 || r == 1) break;
      }
      return Value(r);
    }
    return bad();
  }

  void check_size(size_t n) const {
    if (n > opt_.limits.max_output) fail("a string longer than ", opt_.limits.max_output, " bytes");
  }

  Value repeat(const Value& v, int64_t n) const {
    if (n <= 0) return v.is_string() ? Value(std::string()) : Value::array();
    if (v.is_string()) {
      if (v.text().size() * uint64_t(n) > opt_.limits.max_output) check_size(opt_.limits.max_output + 1);
      Text t;
      for (int64_t i = 0; i < n; ++i) t.append(v.text());
      return Value(std::move(t));
    }
    if (v.arr().size() * uint64_t(n) > opt_.limits.max_items) fail("list longer than ", opt_.limits.max_items, " items");
    Array r;
    for (int64_t i = 0; i < n; ++i) r.insert(r.end(), v.arr().begin(), v.arr().end());
    return Value::array(std::move(r));
  }

  bool contains(const Value& hay, const Value& needle) const {
    switch (hay.kind()) {
      case Value::Kind::String:
        if (!needle.is_string()) fail("'in <string>' requires a string as left operand, not ", needle.type_name());
        return hay.str().find(needle.str()) != std::string::npos;
      case Value::Kind::Array:
        return std::any_of(hay.arr().begin(), hay.arr().end(), [&](const Value& x) { return equal(x, needle); });
      case Value::Kind::Object: return needle.is_string() && hay.obj().find(needle.str()) != nullptr;
      case Value::Kind::Undefined: return false;
      default: fail("argument of type '", hay.type_name(), "' is not iterable");
    }
  }

  // ---- methods of str, dict and list ----

  static const std::string* opt_str(const Args& a, size_t i, const char* name) {
    const Value* v = a.get(i, name);
    if (!v || v->is_none()) return nullptr;
    if (!v->is_string()) fail(name, " must be a string, not ", v->type_name());
    return &v->str();
  }
  static int64_t opt_int(const Args& a, size_t i, const char* name, int64_t dflt) {
    const Value* v = a.get(i, name);
    if (!v || v->is_none()) return dflt;
    if (!v->is_int()) fail(name, " must be an integer, not ", v->type_name());
    return v->as_int();
  }
  static const Value& need(const Args& a, size_t i, const char* name, const char* method) {
    const Value* v = a.get(i, name);
    if (!v) fail(method, "() is missing its argument '", name, "'");
    return *v;
  }

  Value call_method(Value& obj, const std::string& m, Args& a) {
    if (obj.is_string()) {
      const Text& t = obj.text();
      const std::string& s = t.str();
      if (m == "startswith" || m == "endswith") {
        const Value& p = need(a, 0, "prefix", m.c_str());
        const auto one = [&](const Value& x) {
          if (!x.is_string()) fail(m, "() argument must be a string or a tuple of strings");
          const std::string& q = x.str();
          if (q.size() > s.size()) return false;
          return m == "startswith" ? s.compare(0, q.size(), q) == 0 : s.compare(s.size() - q.size(), q.size(), q) == 0;
        };
        if (p.is_array()) return Value(std::any_of(p.arr().begin(), p.arr().end(), one));
        return Value(one(p));
      }
      if (m == "strip" || m == "lstrip" || m == "rstrip")
        return Value(py_strip(t, opt_str(a, 0, "chars"), m != "rstrip", m != "lstrip"));
      if (m == "split") return Value::array(py_split(t, opt_str(a, 0, "sep"), opt_int(a, 1, "maxsplit", -1)));
      if (m == "upper") return Value(map_case(t, 0));
      if (m == "lower") return Value(map_case(t, 1));
      if (m == "title") return Value(map_case(t, 2));
      if (m == "capitalize") return Value(map_case(t, 3));
      if (m == "replace") {
        const Value& o = need(a, 0, "old", "replace");
        const Value& n = need(a, 1, "new", "replace");
        if (!o.is_string() || !n.is_string()) fail("replace() arguments must be strings");
        Text r = py_replace(t, o.text(), n.text(), opt_int(a, 2, "count", -1));
        check_size(r.size());
        return Value(std::move(r));
      }
      if (m == "find" || m == "rfind" || m == "count" || m == "index") {
        const Value& sub = need(a, 0, "sub", m.c_str());
        if (!sub.is_string()) fail(m, "() argument must be a string");
        if (m == "count") {
          if (sub.str().empty()) return Value(int64_t(cp_offsets(s).size()));
          int64_t n = 0;
          for (size_t p = s.find(sub.str()); p != std::string::npos; p = s.find(sub.str(), p + sub.str().size())) ++n;
          return Value(n);
        }
        const size_t p = m == "rfind" ? s.rfind(sub.str()) : s.find(sub.str());
        if (p == std::string::npos) {
          if (m == "index") fail("substring not found");
          return Value(int64_t(-1));
        }
        const std::vector<size_t> off = cp_offsets(s);
        return Value(int64_t(std::lower_bound(off.begin(), off.end(), p) - off.begin()));
      }
      if (m == "join") {
        const Value& items = need(a, 0, "iterable", "join");
        Text r;
        bool first = true;
        for (const Value& x : iterate(items)) {
          if (!first) r.append(t);
          first = false;
          r.append(to_text(x));
          check_size(r.size());
        }
        return Value(std::move(r));
      }
      if (m == "splitlines") {
        Array out;
        size_t pos = 0;
        while (pos < s.size()) {
          size_t e = s.find_first_of("\r\n", pos);
          if (e == std::string::npos) {
            out.push_back(Value(t.substr(pos, s.size())));
            break;
          }
          out.push_back(Value(t.substr(pos, e)));
          pos = e + (s.compare(e, 2, "\r\n") == 0 ? 2 : 1);
        }
        return Value::array(std::move(out));
      }
      if (m == "isdigit" || m == "isalpha" || m == "isspace" || m == "isalnum" || m == "islower" || m == "isupper") {
        if (s.empty()) return Value(false);
        bool any_cased = false;
        for (unsigned char c : s) {
          bool ok;
          if (m == "isdigit") ok = std::isdigit(c);
          else if (m == "isalpha") ok = std::isalpha(c);
          else if (m == "isalnum") ok = std::isalnum(c);
          else if (m == "isspace") ok = std::isspace(c);
          else if (m == "islower") ok = !std::isupper(c);
          else ok = !std::islower(c);
          any_cased = any_cased || std::isalpha(c);
          if (!ok) return Value(false);
        }
        return Value(m == "islower" || m == "isupper" ? any_cased : true);
      }
      fail("str has no method '", m, "'");
    }
    if (obj.is_object()) {
      Object& o = obj.obj();
      if (m == "get") {
        const Value& k = need(a, 0, "key", "get");
        const Value* v = k.is_string() ? o.find(k.str()) : nullptr;
        if (v) return *v;
        const Value* d = a.get(1, "default");
        return d ? *d : Value::none();
      }
      if (m == "items") {
        Array out;
        for (const auto& [k, v] : o.items) out.push_back(Value::array({Value(k), v}));
        return Value::array(std::move(out));
      }
      if (m == "keys") {
        Array out;
        for (const auto& [k, v] : o.items) out.push_back(Value(k));
        return Value::array(std::move(out));
      }
      if (m == "values") {
        Array out;
        for (const auto& [k, v] : o.items) out.push_back(v);
        return Value::array(std::move(out));
      }
      if (m == "update") {
        for (const Value& p : a.pos)
          if (p.is_object())
            for (const auto& [k, v] : p.obj().items) o.set(k, v);
        for (auto& [k, v] : a.kw) o.set(k, v);
        return Value::none();
      }
      fail("dict has no method '", m, "'");
    }
    Array& arr = obj.arr();
    if (m == "append") {
      if (arr.size() >= opt_.limits.max_items) fail("list longer than ", opt_.limits.max_items, " items");
      arr.push_back(need(a, 0, "object", "append"));
      return Value::none();
    }
    if (m == "extend") {
      const Array more = iterate(need(a, 0, "iterable", "extend"));
      if (arr.size() + more.size() > opt_.limits.max_items) fail("list longer than ", opt_.limits.max_items, " items");
      arr.insert(arr.end(), more.begin(), more.end());
      return Value::none();
    }
    if (m == "pop") {
      if (arr.empty()) fail("pop from empty list");
      int64_t i = opt_int(a, 0, "index", -1);
      if (i < 0) i += int64_t(arr.size());
      if (i < 0 || i >= int64_t(arr.size())) fail("pop index out of range");
      Value v = arr[size_t(i)];
      arr.erase(arr.begin() + i);
      return v;
    }
    if (m == "index") {
      const Value& x = need(a, 0, "value", "index");
      for (size_t i = 0; i < arr.size(); ++i)
        if (equal(arr[i], x)) return Value(int64_t(i));
      fail("value is not in the list");
    }
    fail("list has no method '", m, "'");
  }

  // ---- filters ----

  Value attribute_path(const Value& v, const std::string& path) const {
    Value cur = v;
    size_t pos = 0;
    for (;;) {
      const size_t dot = path.find('.', pos);
      const std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
      const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      cur = digits && cur.is_array() ? get_item(cur, Value(int64_t(std::stoll(part)))) : get_attr(cur, part);
      if (dot == std::string::npos) return cur;
      pos = dot + 1;
    }
  }

  Value filter(const std::string& f, const Value& v, Args& a) {
    const auto str_of = [&](const char* fn) -> const Text& {
      if (!v.is_string()) fail(fn, " expects a string, not ", v.type_name());
      return v.text();
    };
    if (f == "trim") return Value(py_strip(v.is_string() ? v.text() : to_text(v), opt_str(a, 0, "chars"), true, true));
    if (f == "upper") return Value(map_case(to_text(v), 0));
    if (f == "lower") return Value(map_case(to_text(v), 1));
    if (f == "title") return Value(map_case(to_text(v), 2));
    if (f == "capitalize") return Value(map_case(to_text(v), 3));
    if (f == "length" || f == "count") {
      if (v.is_string()) return Value(int64_t(cp_offsets(v.str()).size() - 1));
      if (v.is_array()) return Value(int64_t(v.arr().size()));
      if (v.is_object()) return Value(int64_t(v.obj().items.size()));
      if (v.is_undefined()) return Value(int64_t(0));
      fail("object of type '", v.type_name(), "' has no len()");
    }
    if (f == "default" || f == "d") {
      const Value* b = a.get(1, "boolean");
      const bool use = v.is_undefined() || (b && b->truthy() && !v.truthy());
      if (!use) return v;
      const Value* d = a.get(0, "default_value");
      return d ? *d : Value(std::string());
    }
    if (f == "items") {
      if (v.is_undefined()) return Value::array();
      if (!v.is_object()) fail("items expects a mapping, not ", v.type_name());
      Value copy = v;
      Args none;
      return call_method(copy, "items", none);
    }
    if (f == "join") {
      const std::string* attr = opt_str(a, 1, "attribute");
      const Value* sepv = a.get(0, "d");
      const Text sep = sepv ? to_text(*sepv) : Text();
      Text r;
      bool first = true;
      for (const Value& x : iterate(v)) {
        if (!first) r.append(sep);
        first = false;
        r.append(to_text(attr ? attribute_path(x, *attr) : x));
        check_size(r.size());
      }
      return Value(std::move(r));
    }
    if (f == "string") return Value(to_text(v));
    if (f == "list") return Value::array(iterate(v));
    if (f == "first" || f == "last") {
      if (v.is_string()) {
        const std::vector<size_t> off = cp_offsets(v.str());
        if (off.size() < 2) return Value();
        return f == "first" ? Value(v.text().substr(off[0], off[1])) : Value(v.text().substr(off[off.size() - 2], off.back()));
      }
      const Array items = iterate(v);
      if (items.empty()) return Value();
      return f == "first" ? items.front() : items.back();
    }
    if (f == "replace") {
      const Text& t = str_of("replace");
      const Value& o = need(a, 0, "old", "replace");
      const Value& n = need(a, 1, "new", "replace");
      Text r = py_replace(t, to_text(o), to_text(n), opt_int(a, 2, "count", -1));
      check_size(r.size());
      return Value(std::move(r));
    }
    if (f == "safe") return v;
    if (f == "escape" || f == "e") {
      const Text t = to_text(v);
      return Value(Text(html_escape(t.str()), t.any_marked()));
    }
    if (f == "tojson") {
      const Value* ind = a.get(0, "indent");
      int indent = -1;
      if (ind && !ind->is_none()) {
        if (!ind->is_int() || ind->as_int() < 0 || ind->as_int() > 64) fail("tojson: indent must be an integer 0..64");
        indent = int(ind->as_int());
      }
      std::string j = to_json(v, indent);
      check_size(j.size());
      return Value(Text(std::move(j), has_marks(v)));
    }
    if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
      const bool by_attr = f == "selectattr" || f == "rejectattr";
      const bool keep_if = f == "selectattr" || f == "select";
      size_t i = 0;
      std::string attr;
      if (by_attr) {
        if (a.pos.empty() || !a.pos[0].is_string()) fail(f, " needs an attribute name");
        attr = a.pos[0].str();
        i = 1;
      }
      std::string test_name;
      if (i < a.pos.size()) {
        if (!a.pos[i].is_string()) fail(f, ": the test name must be a string");
        test_name = a.pos[i].str();
        ++i;
      }
      Args targs;
      targs.pos.assign(a.pos.begin() + std::ptrdiff_t(std::min(i, a.pos.size())), a.pos.end());
      Array out;
      for (const Value& x : iterate(v)) {
        const Value subject = by_attr ? attribute_path(x, attr) : x;
        const bool r = test_name.empty() ? subject.truthy() : test(test_name, subject, targs);
        if (r == keep_if) out.push_back(x);
      }
      return Value::array(std::move(out));
    }
    if (f == "map") {
      Array out;
      const Value* attr = nullptr;
      for (const auto& [k, x] : a.kw)
        if (k == "attribute") attr = &x;
      if (attr) {
        if (!attr->is_string()) fail("map: attribute must be a string");
        const Value* dflt = nullptr;
        for (const auto& [k, x] : a.kw)
          if (k == "default") dflt = &x;
        for (const Value& x : iterate(v)) {
          Value r = attribute_path(x, attr->str());
          out.push_back(r.is_undefined() && dflt ? *dflt : r);
        }
        return Value::array(std::move(out));
      }
      if (a.pos.empty() || !a.pos[0].is_string()) fail("map needs a filter name or attribute=");
      const std::string name = a.pos[0].str();
      Args fargs;
      fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
      fargs.kw = a.kw;
      for (const Value& x : iterate(v)) {
        Args copy = fargs;
        out.push_back(filter(name, x, copy));
      }
      return Value::array(std::move(out));
    }
    if (f == "int") {
      const int64_t d = opt_int(a, 0, "default", 0);
      if (v.is_int() || v.is_bool()) return Value(v.as_int());
      if (v.is_float()) return std::isfinite(v.as_number()) ? Value(int64_t(v.as_number())) : Value(d);
      if (v.is_string()) {
        const std::string s = py_strip(v.text(), nullptr, true, true).str();
        char* end = nullptr;
        errno = 0;
        const long long r = std::strtoll(s.c_str(), &end, 10);
        if (!s.empty() && end && *end == '\0' && errno == 0) return Value(int64_t(r));
        const double x = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == '\0' && std::isfinite(x)) return Value(int64_t(x));
      }
      return Value(d);
    }
    if (f == "float") {
      if (v.is_number() || v.is_bool()) return Value(v.as_number());
      if (v.is_string()) {
        const std::string s = py_strip(v.text(), nullptr, true, true).str();
        char* end = nullptr;
        const double x = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == '\0') return Value(x);
      }
      const Value* d = a.get(0, "default");
      return d ? *d : Value(0.0);
    }
    if (f == "abs") {
      if (v.is_float()) return Value(std::fabs(v.as_number()));
      if (v.is_int() || v.is_bool()) {
        if (v.as_int() == INT64_MIN) fail("integer overflow");
        return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
      }
      fail("bad operand type for abs(): '", v.type_name(), "'");
    }
    if (f == "round") {
      if (!v.is_number()) fail("round expects a number");
      const int64_t prec = opt_int(a, 0, "precision", 0);
      const std::string* method = opt_str(a, 1, "method");
      const double p = std::pow(10.0, double(prec));
      const double x = v.as_number() * p;
      const double r = !method || *method == "common" ? std::round(x) : (*method == "floor" ? std::floor(x) : std::ceil(x));
      return Value(r / p);
    }
    if (f == "reverse") {
      if (v.is_string()) return slice(v, Value(), Value(), Value(int64_t(-1)));
      Array items = iterate(v);
      std::reverse(items.begin(), items.end());
      return Value::array(std::move(items));
    }
    if (f == "sort" || f == "unique" || f == "min" || f == "max") {
      Array items = iterate(v);
      const std::string* attr = nullptr;
      bool reverse = false, case_sensitive = false;
      for (const auto& [k, x] : a.kw) {
        if (k == "attribute" && x.is_string()) attr = &x.str();
        if (k == "reverse") reverse = x.truthy();
        if (k == "case_sensitive") case_sensitive = x.truthy();
      }
      if (f == "sort" && !a.pos.empty()) reverse = a.pos[0].truthy();
      const auto key = [&](const Value& x) {
        Value k = attr ? attribute_path(x, *attr) : x;
        if (!case_sensitive && k.is_string()) return Value(map_case(k.text(), 1));
        return k;
      };
      if (f == "unique") {
        Array out;
        for (const Value& x : items)
          if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(key(x), key(y)); })) out.push_back(x);
        return Value::array(std::move(out));
      }
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) { return compare(key(x), key(y)) < 0; });
      if (f == "min") return items.empty() ? Value() : items.front();
      if (f == "max") return items.empty() ? Value() : items.back();
      if (reverse) std::reverse(items.begin(), items.end());
      return Value::array(std::move(items));
    }
    if (f == "dictsort") {
      if (!v.is_object()) fail("dictsort expects a mapping");
      Value copy = v;
      Args none;
      Array items = call_method(copy, "items", none).arr();
      std::stable_sort(items.begin(), items.end(), [](const Value& x, const Value& y) { return compare(x.arr()[0], y.arr()[0]) < 0; });
      return Value::array(std::move(items));
    }
    if (f == "sum") {
      const std::string* attr = opt_str(a, 0, "attribute");
      const Value* startv = a.get(1, "start");
      Value acc = startv ? *startv : Value(int64_t(0));
      for (const Value& x : iterate(v)) {
        const Value y = attr ? attribute_path(x, *attr) : x;
        if (!(acc.is_number() || acc.is_bool()) || !(y.is_number() || y.is_bool())) fail("sum: the items must be numbers");
        if (acc.is_float() || y.is_float()) acc = Value(acc.as_number() + y.as_number());
        else acc = Value(add(acc.as_int(), y.as_int()));
      }
      return acc;
    }
    if (f == "indent") {
      const Value* w = a.get(0, "width");
      Text pad = w ? (w->is_string() ? w->text() : Text(std::string(size_t(std::clamp<int64_t>(w->is_int() ? w->as_int() : 4, 0, 256)), ' ')))
                   : Text(std::string(4, ' '));
      const Value* first = a.get(1, "first");
      const Value* blank = a.get(2, "blank");
      const Text t = to_text(v);
      const std::string& s = t.str();
      Text r;
      size_t pos = 0;
      bool line0 = true;
      while (pos <= s.size()) {
        size_t e = s.find('\n', pos);
        const size_t end = e == std::string::npos ? s.size() : e;
        const bool empty_line = end == pos;
        if ((!line0 || (first && first->truthy())) && (!empty_line || (blank && blank->truthy()))) r.append(pad);
        r.append(t.substr(pos, end));
        if (e == std::string::npos) break;
        r.append(std::string_view("\n"));
        pos = e + 1;
        line0 = false;
        check_size(r.size());
      }
      return Value(std::move(r));
    }
    if (f == "attr") {
      const Value& n = need(a, 0, "name", "attr");
      return n.is_string() ? get_attr(v, n.str()) : Value();
    }
    if (f == "wordcount") {
      return Value(int64_t(py_split(to_text(v), nullptr, -1).size()));
    }
    fail("unknown filter '", f, "'");
  }

  // ---- tests ----

  bool test(const std::string& t, const Value& v, const Args& a) {
    const auto arg = [&]() -> const Value& {
      if (a.pos.empty()) fail("test '", t, "' needs an argument");
      return a.pos[0];
    };
    if (t == "defined") return !v.is_undefined();
    if (t == "undefined") return v.is_undefined();
    if (t == "none") return v.is_none();
    if (t == "string") return v.is_string();
    if (t == "mapping") return v.is_object();
    if (t == "iterable") return v.is_string() || v.is_array() || v.is_object() || v.is_undefined();
    if (t == "sequence") return v.is_string() || v.is_array() || v.is_object();
    if (t == "number") return v.is_number() || v.is_bool();
    if (t == "integer") return v.is_int();
    if (t == "float") return v.is_float();
    if (t == "boolean") return v.is_bool();
    if (t == "true") return v.is_bool() && v.as_bool();
    if (t == "false") return v.is_bool() && !v.as_bool();
    if (t == "callable") return v.is_callable();
    if (t == "odd" || t == "even" || t == "divisibleby") {
      if (!v.is_int()) fail("test '", t, "' expects an integer");
      if (t == "divisibleby") {
        const Value& d = arg();
        if (!d.is_int() || d.as_int() == 0) fail("divisibleby needs a non-zero integer");
        return v.as_int() % d.as_int() == 0;
      }
      return (v.as_int() % 2 != 0) == (t == "odd");
    }
    if (t == "eq" || t == "equalto" || t == "==") return equal(v, arg());
    if (t == "ne" || t == "!=") return !equal(v, arg());
    if (t == "lt" || t == "lessthan" || t == "<") return compare(v, arg()) < 0;
    if (t == "gt" || t == "greaterthan" || t == ">") return compare(v, arg()) > 0;
    if (t == "le" || t == "<=") return compare(v, arg()) <= 0;
    if (t == "ge" || t == ">=") return compare(v, arg()) >= 0;
    if (t == "in") return contains(arg(), v);
    if (t == "sameas") {
      const Value& o = arg();
      if (v.kind() != o.kind()) return false;
      if (v.is_array()) return &v.arr() == &o.arr();
      if (v.is_object()) return &v.obj() == &o.obj();
      return equal(v, o);
    }
    if (t == "lower" || t == "upper") {
      if (!v.is_string()) return false;
      const std::string& s = v.str();
      bool cased = false;
      for (unsigned char c : s) {
        if (t == "lower" ? std::isupper(c) : std::islower(c)) return false;
        cased = cased || std::isalpha(c);
      }
      return cased;
    }
    fail("unknown test '", t, "'");
  }

  const RenderOptions& opt_;
  std::vector<Scope> scopes_;
  Text* out_ = nullptr;
  uint64_t steps_ = 0;
  int depth_ = 0;
};

Template Template::parse(std::string_view source, const Limits& limits) {
  Template t;
  t.root_ = parse_tree(source, limits);
  return t;
}

Text Template::render(const Object& vars, const RenderOptions& options) const {
  if (!root_) throw TemplateError(1, 1, "the template was not parsed");
  Evaluator ev(options);
  try {
    return ev.run(*root_, vars);
  } catch (const TemplateError&) {
    throw;
  } catch (const Error& e) {
    throw TemplateError(1, 1, e.what());
  }
}

}  // namespace tern::jinja
