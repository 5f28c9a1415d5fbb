#pragma once
// Constrained decoding: a GBNF grammar (llama.cpp's syntax, docs/grammar.md) compiled into a
// flat rule table that a pushdown matcher (grammar/matcher.h) walks over Unicode code points.
//
// Compiled form (what the matcher reads):
//
//   elems: | alt 0 syms ... | Alt | alt 1 syms ... | End |  <- rule r starts at rule_start[r]
//   a sym is Chars (a CharSet id: one code point out of a set) or Ref (a rule id)
//
// Groups "( )" and repetitions become synthetic rules (`name_N`), so every rule is a plain list
// of alternatives. X* becomes `r ::= X r |` (right recursion: the matcher's stacks do not grow
// with the count), X{m,n} m copies of X then n-m nested optionals. Immutable once built; share
// one Grammar between any number of matchers and threads.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tern::grammar {

// Limits that keep a hostile grammar from exhausting memory or the stack (errors name them).
struct Limits {
  size_t max_text_bytes = size_t(4) << 20;   // grammar text
  size_t max_rules = 200000;                 // including the synthetic ones
  size_t max_elems = size_t(4) << 20;        // compiled symbols, all rules together
  uint32_t max_repeat = 10000;               // m and n of {m,n}
  int max_nesting = 256;                     // ( ) nesting depth
};

// One code point out of a set: sorted, disjoint, inclusive ranges, or their complement.
struct CharSet {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  bool negated = false;
  uint64_t ascii[2] = {0, 0};  // membership of code points 0..127, precomputed

  bool contains(uint32_t cp) const {
    if (cp < 128) return (ascii[cp >> 6] >> (cp & 63)) & 1;
    return in_ranges(cp) != negated;
  }
  // True when some code point of [lo, hi] is in the set.
  bool intersects(uint32_t lo, uint32_t hi) const;
  bool in_ranges(uint32_t cp) const;
};

struct Elem {
  enum Type : uint8_t { End, Alt, Ref, Chars };
  Type type;
  uint32_t value;  // Ref: rule id; Chars: CharSet id
};

class Grammar {
 public:
  // Parses GBNF text. Throws tern::Error "grammar line L, column C: ..." naming what was
  // expected; also for an undefined rule, a missing `root`, left recursion (which would make
  // the matcher loop) and the limits above.
  static std::shared_ptr<const Grammar> parse(std::string_view text, const Limits& limits = {});

  std::vector<Elem> elems;
  std::vector<uint32_t> rule_start;               // [n_rules] first elem of each rule
  std::vector<std::vector<uint32_t>> rule_alts;   // [n_rules] first elem of each alternative
  std::vector<std::string> rule_names;            // [n_rules]
  std::vector<CharSet> sets;
  uint32_t root = 0;

  size_t n_rules() const { return rule_start.size(); }
  // The grammar written back as GBNF (synthetic rules included): for errors and tests.
  std::string to_string() const;
};

}  // namespace tern::grammar
