#include "grammar/grammar.h"

#include <algorithm>
#include <unordered_map>

#include "core/error.h"

namespace tern::grammar {

bool CharSet::in_ranges(uint32_t cp) const {
  // First range whose end is >= cp.
  auto it = std::lower_bound(ranges.begin(), ranges.end(), cp,
                             [](const std::pair<uint32_t, uint32_t>& r, uint32_t c) { return r.second < c; });
  return it != ranges.end() && it->first <= cp;
}

bool CharSet::intersects(uint32_t lo, uint32_t hi) const {
  if (!negated) {
    auto it = std::lower_bound(ranges.begin(), ranges.end(), lo,
                               [](const std::pair<uint32_t, uint32_t>& r, uint32_t c) { return r.second < c; });
    return it != ranges.end() && it->first <= hi;
  }
  // Negated: some code point of [lo, hi] lies outside every range, i.e. the ranges do not
  // cover [lo, hi] whole (they are sorted and disjoint, adjacent ones merged).
  auto it = std::lower_bound(ranges.begin(), ranges.end(), lo,
                             [](const std::pair<uint32_t, uint32_t>& r, uint32_t c) { return r.second < c; });
  if (it == ranges.end() || it->first > lo) return true;
  return it->second < hi;
}

namespace {

using Seq = std::vector<Elem>;  // Ref / Chars symbols of one alternative

struct RuleDef {
  std::vector<Seq> alts;
  bool defined = false;
  size_t def_offset = 0;   // where it was defined (named rules)
  size_t ref_offset = 0;   // first reference, for "undefined rule" errors
  bool referenced = false;
};

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Parser {
 public:
  Parser(std::string_view src, const Limits& lim) : src_(src), lim_(lim) {}

  std::shared_ptr<const Grammar> run() {
    if (src_.size() > lim_.max_text_bytes)
      fail("grammar: the text has ", src_.size(), " bytes, more than the limit of ", lim_.max_text_bytes);
    skip_space(true);
    while (pos_ < src_.size()) {
      parse_rule();
      skip_space(true);
    }
    for (size_t r = 0; r < rules_.size(); ++r)
      if (!rules_[r].defined)
        error_at(rules_[r].ref_offset, "undefined rule '", names_[r], "'");
    auto root = ids_.find("root");
    if (root == ids_.end() || !rules_[root->second].defined)
      fail("grammar: no 'root' rule (the grammar must define `root ::= ...`, where matching starts)");
    auto g = std::make_shared<Grammar>();
    g->root = root->second;
    g->sets = std::move(sets_);
    g->rule_names = names_;
    for (const RuleDef& r : rules_) {
      g->rule_start.push_back(uint32_t(g->elems.size()));
      g->rule_alts.emplace_back();
      for (size_t a = 0; a < r.alts.size(); ++a) {
        g->rule_alts.back().push_back(uint32_t(g->elems.size()));
        g->elems.insert(g->elems.end(), r.alts[a].begin(), r.alts[a].end());
        g->elems.push_back({a + 1 == r.alts.size() ? Elem::End : Elem::Alt, 0});
      }
    }
    check_left_recursion(*g);
    return g;
  }

 private:
  // "line L, column C" of a byte offset (columns count bytes, from 1).
  std::string where(size_t off) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < off && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return str_cat("line ", line, ", column ", col);
  }
  template <class... Args>
  [[noreturn]] void error_at(size_t off, Args&&... args) const {
    fail("grammar ", where(off), ": ", std::forward<Args>(args)...);
  }
  std::string found() const {
    if (pos_ >= src_.size()) return "the end of the grammar";
    const char c = src_[pos_];
    if (c == '\n' || c == '\r') return "the end of the line";
    if (static_cast<unsigned char>(c) < 0x20) return str_cat("byte 0x", std::hex, int(c));
    return str_cat("'", c, "'");
  }

  // Spaces, tabs and comments; newlines too when newline_ok (inside ( ), after ::= and |).
  void skip_space(bool newline_ok) {
    while (pos_ < src_.size()) {
      const char c = src_[pos_];
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < src_.size() && src_[pos_] != '\n' && src_[pos_] != '\r') ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
    return std::string(src_.substr(start, pos_ - start));
  }

  uint32_t rule_id(const std::string& name, size_t off) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const uint32_t id = new_rule(name);
    rules_[id].ref_offset = off;
    ids_.emplace(name, id);
    return id;
  }
  uint32_t new_rule(const std::string& name) {
    if (rules_.size() >= lim_.max_rules)
      error_at(pos_, "more than ", lim_.max_rules, " rules (synthetic ones for groups and repetitions included)");
    rules_.emplace_back();
    names_.push_back(name);
    return uint32_t(rules_.size() - 1);
  }
  uint32_t new_synthetic(const std::string& base, std::vector<Seq> alts) {
    std::string name;
    do {
      name = str_cat(base, "_", ++synth_counter_);
    } while (ids_.count(name));
    const uint32_t id = new_rule(name);
    ids_.emplace(name, id);
    rules_[id].alts = std::move(alts);
    rules_[id].defined = true;
    rules_[id].def_offset = pos_;
    return id;
  }
  void count(size_t n) {
    total_elems_ += n;
    if (total_elems_ > lim_.max_elems)
      error_at(pos_, "the grammar expands to more than ", lim_.max_elems,
               " symbols (large repetition counts multiply the repeated item)");
  }

  void parse_rule() {
    const size_t start = pos_;
    const std::string name = parse_name();
    if (name.empty()) error_at(pos_, "expected a rule name, found ", found());
    skip_space(false);
    if (src_.substr(pos_, 3) != "::=") error_at(pos_, "expected '::=' after rule name '", name, "', found ", found());
    pos_ += 3;
    skip_space(true);
    const uint32_t id = rule_id(name, start);
    if (rules_[id].defined) error_at(start, "rule '", name, "' is defined twice (first at ", where(rules_[id].def_offset), ")");
    rules_[id].defined = true;
    rules_[id].def_offset = start;
    rules_[id].alts = parse_alternates(name, false);
    if (pos_ < src_.size() && src_[pos_] != '\n' && src_[pos_] != '\r')
      error_at(pos_, "expected the end of the line after rule '", name, "', found ", found());
  }

  std::vector<Seq> parse_alternates(const std::string& base, bool nested) {
    std::vector<Seq> alts;
    alts.push_back(parse_sequence(base, nested));
    while (pos_ < src_.size() && src_[pos_] == '|') {
      ++pos_;
      skip_space(true);
      alts.push_back(parse_sequence(base, nested));
    }
    return alts;
  }

  // One code point of a literal or class: an escape or a UTF-8 sequence.
  uint32_t parse_char() {
    if (pos_ >= src_.size()) error_at(pos_, "unexpected end of the grammar");
    const unsigned char c = static_cast<unsigned char>(src_[pos_]);
    if (c == '\\') {
      const size_t esc = pos_;
      ++pos_;
      if (pos_ >= src_.size()) error_at(esc, "unfinished escape at the end of the grammar");
      const char e = src_[pos_++];
      int digits = 0;
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': case '/': return uint32_t(e);
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default: error_at(esc, "unknown escape '\\", e, "' (known: \\n \\r \\t \\\\ \\\" \\[ \\] \\xHH \\uHHHH \\UHHHHHHHH)");
      }
      uint32_t v = 0;
      for (int i = 0; i < digits; ++i) {
        const int h = pos_ < src_.size() ? hex_value(src_[pos_]) : -1;
        if (h < 0) error_at(pos_, "expected ", digits, " hex digits after '\\", e, "', found ", found());
        v = v * 16 + uint32_t(h);
        ++pos_;
      }
      if (v > 0x10FFFF) error_at(esc, "code point 0x", std::hex, v, " is beyond U+10FFFF");
      return v;
    }
    // UTF-8
    int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || pos_ + size_t(len) > src_.size()) error_at(pos_, "invalid UTF-8 in the grammar text");
    uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < len; ++i) {
      const unsigned char d = static_cast<unsigned char>(src_[pos_ + size_t(i)]);
      if ((d & 0xC0) != 0x80) error_at(pos_, "invalid UTF-8 in the grammar text");
      v = (v << 6) | (d & 0x3F);
    }
    pos_ += size_t(len);
    return v;
  }

  uint32_t add_set(CharSet s) {
    std::sort(s.ranges.begin(), s.ranges.end());
    std::vector<std::pair<uint32_t, uint32_t>> merged;
    for (const auto& r : s.ranges) {
      if (!merged.empty() && r.first <= merged.back().second + 1)
        merged.back().second = std::max(merged.back().second, r.second);
      else
        merged.push_back(r);
    }
    s.ranges = std::move(merged);
    for (uint32_t cp = 0; cp < 128; ++cp)
      if (s.in_ranges(cp) != s.negated) s.ascii[cp >> 6] |= uint64_t(1) << (cp & 63);
    sets_.push_back(std::move(s));
    return uint32_t(sets_.size() - 1);
  }
  Elem single_char(uint32_t cp) {
    auto it = single_.find(cp);
    if (it != single_.end()) return {Elem::Chars, it->second};
    CharSet s;
    s.ranges.push_back({cp, cp});
    const uint32_t id = add_set(std::move(s));
    single_.emplace(cp, id);
    return {Elem::Chars, id};
  }

  uint32_t parse_count() {
    const size_t start = pos_;
    uint64_t v = 0;
    while (pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '9') {
      v = v * 10 + uint64_t(src_[pos_] - '0');
      if (v > lim_.max_repeat) error_at(start, "repetition count above the limit of ", lim_.max_repeat);
      ++pos_;
    }
    if (pos_ == start) error_at(pos_, "expected a number in '{m,n}', found ", found());
    return uint32_t(v);
  }

  // Replaces seq[from..] (the last item) by its repetition min..max times (max < 0: unbounded).
  void repeat(Seq& seq, size_t from, const std::string& base, uint32_t min, int64_t max) {
    Seq item(seq.begin() + std::ptrdiff_t(from), seq.end());
    seq.resize(from);
    if (item.empty()) return;  // "" repeated is still ""
    if (item.size() > 1) item = {Elem{Elem::Ref, new_synthetic(base, {item})}};
    const Elem x = item[0];
    count(size_t(min) + 2);
    for (uint32_t i = 0; i < min; ++i) seq.push_back(x);
    if (max < 0) {
      // r ::= x r |
      const uint32_t id = new_synthetic(base, {});
      rules_[id].alts = {Seq{x, Elem{Elem::Ref, id}}, Seq{}};
      seq.push_back({Elem::Ref, id});
    } else if (max > int64_t(min)) {
      // o_k ::= x o_(k-1) |   (n - m nested optionals)
      uint32_t prev = 0;
      for (int64_t k = 0; k < max - int64_t(min); ++k) {
        count(3);
        Seq first{x};
        if (k > 0) first.push_back({Elem::Ref, prev});
        prev = new_synthetic(base, {first, Seq{}});
      }
      seq.push_back({Elem::Ref, prev});
    }
  }

  Seq parse_sequence(const std::string& base, bool nested) {
    Seq seq;
    size_t last = std::string::npos;  // where the last item's symbols start
    while (pos_ < src_.size()) {
      const size_t start = pos_;
      const char c = src_[pos_];
      if (c == '"') {
        ++pos_;
        last = seq.size();
        while (true) {
          if (pos_ >= src_.size()) error_at(start, "unterminated string literal (expected a closing '\"')");
          if (src_[pos_] == '"') break;
          if (src_[pos_] == '\n' || src_[pos_] == '\r')
            error_at(pos_, "newline inside a string literal (write \\n), literal started at ", where(start));
          seq.push_back(single_char(parse_char()));
          count(1);
        }
        ++pos_;
      } else if (c == '[') {
        ++pos_;
        CharSet s;
        if (pos_ < src_.size() && src_[pos_] == '^') {
          s.negated = true;
          ++pos_;
        }
        while (true) {
          if (pos_ >= src_.size()) error_at(start, "unterminated character class (expected ']')");
          if (src_[pos_] == ']') break;
          const uint32_t lo = parse_char();
          uint32_t hi = lo;
          if (pos_ + 1 < src_.size() && src_[pos_] == '-' && src_[pos_ + 1] != ']') {
            ++pos_;
            const size_t hi_at = pos_;
            hi = parse_char();
            if (hi < lo) error_at(hi_at, "character range ends below its start");
          }
          s.ranges.push_back({lo, hi});
        }
        ++pos_;
        if (s.ranges.empty() && !s.negated) error_at(start, "empty character class '[]' matches nothing");
        last = seq.size();
        seq.push_back({Elem::Chars, add_set(std::move(s))});
        count(1);
      } else if (c == '.') {
        ++pos_;
        last = seq.size();
        if (!any_set_) {
          CharSet s;
          s.negated = true;
          any_set_ = add_set(std::move(s)) + 1;
        }
        seq.push_back({Elem::Chars, any_set_ - 1});
        count(1);
      } else if (is_name_char(c)) {
        const std::string name = parse_name();
        last = seq.size();
        const uint32_t id = rule_id(name, start);
        seq.push_back({Elem::Ref, id});
        count(1);
        // `name ::=` here means the previous rule did not end where intended.
        size_t p = pos_;
        while (p < src_.size() && (src_[p] == ' ' || src_[p] == '\t')) ++p;
        if (src_.substr(p, 3) == "::=")
          error_at(start, "unexpected rule definition '", name, " ::=' inside a rule (missing ')'?)");
      } else if (c == '(') {
        ++pos_;
        if (++depth_ > lim_.max_nesting) error_at(start, "groups nested deeper than ", lim_.max_nesting);
        skip_space(true);
        std::vector<Seq> alts = parse_alternates(base, true);
        if (pos_ >= src_.size() || src_[pos_] != ')')
          error_at(pos_, "expected ')' to close the group opened at ", where(start), ", found ", found());
        ++pos_;
        --depth_;
        last = seq.size();
        seq.push_back({Elem::Ref, new_synthetic(base, std::move(alts))});
        count(1);
      } else if (c == '*' || c == '+' || c == '?') {
        if (last == std::string::npos) error_at(start, "expected an item before '", c, "'");
        ++pos_;
        repeat(seq, last, base, c == '+' ? 1 : 0, c == '?' ? 1 : -1);
        last = std::string::npos;
      } else if (c == '{') {
        if (last == std::string::npos) error_at(start, "expected an item before '{'");
        ++pos_;
        skip_space(nested);
        const uint32_t min = parse_count();
        int64_t max = min;
        skip_space(nested);
        if (pos_ < src_.size() && src_[pos_] == ',') {
          ++pos_;
          skip_space(nested);
          max = (pos_ < src_.size() && src_[pos_] == '}') ? -1 : int64_t(parse_count());
          skip_space(nested);
        }
        if (pos_ >= src_.size() || src_[pos_] != '}') error_at(pos_, "expected '}' to close '{m,n}', found ", found());
        ++pos_;
        if (max >= 0 && max < int64_t(min)) error_at(start, "repetition {", min, ",", max, "} has max below min");
        repeat(seq, last, base, min, max);
        last = std::string::npos;
      } else {
        break;
      }
      skip_space(nested);
    }
    return seq;
  }

  // A rule that can reach itself through leftmost symbols (with only nullable symbols before)
  // would make the matcher's expansion loop forever: refuse it, naming the cycle.
  static void check_left_recursion(const Grammar& g) {
    const size_t n = g.n_rules();
    std::vector<char> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (uint32_t a : g.rule_alts[r]) {
          bool all = true;
          for (uint32_t p = a; g.elems[p].type == Elem::Ref || g.elems[p].type == Elem::Chars; ++p) {
            if (g.elems[p].type == Elem::Chars || !nullable[g.elems[p].value]) {
              all = false;
              break;
            }
          }
          if (all) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    std::vector<std::vector<uint32_t>> edges(n);
    for (size_t r = 0; r < n; ++r)
      for (uint32_t a : g.rule_alts[r])
        for (uint32_t p = a; g.elems[p].type == Elem::Ref; ++p) {
          edges[r].push_back(g.elems[p].value);
          if (!nullable[g.elems[p].value]) break;
        }
    // Iterative DFS (a grammar may have 10^5 rules): 0 new, 1 on the path, 2 done.
    std::vector<char> color(n, 0);
    std::vector<std::pair<uint32_t, size_t>> stack;
    for (size_t s = 0; s < n; ++s) {
      if (color[s]) continue;
      stack.push_back({uint32_t(s), 0});
      color[s] = 1;
      while (!stack.empty()) {
        auto& [r, i] = stack.back();
        if (i == edges[r].size()) {
          color[r] = 2;
          stack.pop_back();
          continue;
        }
        const uint32_t t = edges[r][i++];
        if (color[t] == 1) {
          std::string cycle;
          size_t k = 0;
          while (stack[k].first != t) ++k;
          for (; k < stack.size(); ++k) cycle += g.rule_names[stack[k].first] + " -> ";
          cycle += g.rule_names[t];
          fail("grammar: rule '", g.rule_names[t], "' is left-recursive (", cycle,
               "), which the matcher cannot run; rewrite it with repetition (e.g. `expr ::= term (\"+\" term)*`). "
               "A repetition of something that can match the empty string loops the same way.");
        }
        if (color[t] == 0) {
          color[t] = 1;
          stack.push_back({t, 0});
        }
      }
    }
  }

  std::string_view src_;
  Limits lim_;
  size_t pos_ = 0;
  int depth_ = 0;
  size_t total_elems_ = 0;
  int synth_counter_ = 0;
  uint32_t any_set_ = 0;  // id + 1 of the '.' set, 0 until made
  std::vector<RuleDef> rules_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::unordered_map<uint32_t, uint32_t> single_;
  std::vector<CharSet> sets_;
};

void append_cp(std::string& out, uint32_t cp) {
  auto hex = [&](uint32_t v, int digits) {
    static const char* k = "0123456789ABCDEF";
    for (int i = digits - 1; i >= 0; --i) out += k[(v >> (4 * i)) & 15];
  };
  if (cp == '\n') out += "\\n";
  else if (cp == '\r') out += "\\r";
  else if (cp == '\t') out += "\\t";
  else if (cp == '\\' || cp == '"' || cp == ']' || cp == '[' || cp == '-' || cp == '^') {
    out += '\\';
    out += char(cp);
  } else if (cp < 0x20 || cp == 0x7F) {
    out += "\\x";
    hex(cp, 2);
  } else if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x10000) {
    out += "\\u";
    hex(cp, 4);
  } else {
    out += "\\U";
    hex(cp, 8);
  }
}

}  // namespace

std::shared_ptr<const Grammar> Grammar::parse(std::string_view text, const Limits& limits) {
  return Parser(text, limits).run();
}

std::string Grammar::to_string() const {
  std::string out;
  for (size_t r = 0; r < n_rules(); ++r) {
    out += rule_names[r] + " ::=";
    for (size_t a = 0; a < rule_alts[r].size(); ++a) {
      if (a) out += " |";
      for (uint32_t p = rule_alts[r][a]; elems[p].type == Elem::Ref || elems[p].type == Elem::Chars; ++p) {
        out += ' ';
        if (elems[p].type == Elem::Ref) {
          out += rule_names[elems[p].value];
          continue;
        }
        const CharSet& s = sets[elems[p].value];
        out += s.negated ? "[^" : "[";
        for (const auto& [lo, hi] : s.ranges) {
          append_cp(out, lo);
          if (hi != lo) {
            out += '-';
            append_cp(out, hi);
          }
        }
        out += ']';
      }
    }
    out += '\n';
  }
  return out;
}

}  // namespace tern::grammar
