#pragma once
// A pushdown recognizer of a Grammar over Unicode code points, fed bytes (a token can end in
// the middle of a UTF-8 sequence; the partial code point is carried to the next token).
//
// The state is a set of stacks, as llama.cpp's grammar has: each stack is the path of
// continuations from the rule being matched up to root, its top a character set to match
// next. Stacks are persistent linked lists of hash-consed nodes (a node = position + parent,
// one id per distinct pair), so equal stacks are equal ids and a stack set is a sorted id list:
//
//   root ::= "{" ws obj "}"     after "{":  top [ws chars] -> parent (obj, .) -> ("}", .) -> bottom
//
// Stack sets are interned too, and the transitions between them cached as they are met (a DFA
// built lazily: ASCII in a 128-entry table per set, other code points in a hash map). Inside a
// JSON string every ordinary character leads back to the same set, so walking the vocabulary
// trie costs about one table lookup per trie node. The empty stack ("the text may end here")
// is a flag of the set. The caches are dropped (keeping the current state) when they outgrow
// k_max_cached_sets. Not thread-safe: one Matcher per sequence; copy it to fork a sequence.
#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/vocab_index.h"

namespace tern::grammar {

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> g);

  // Advances by `bytes` when the grammar accepts them (a trailing incomplete UTF-8 sequence is
  // accepted when some allowed code point starts with it); returns false and leaves the state
  // unchanged otherwise. Throws tern::Error when the grammar is too ambiguous to follow (more
  // than k_max_work expansion steps for one code point).
  bool accept_bytes(std::string_view bytes);
  // Whether accept_bytes(bytes) would succeed, without advancing (only the caches change).
  bool accepts(std::string_view bytes);
  // The text so far is a complete match (no partial code point pending).
  bool is_complete() const { return sets_[size_t(cur_)].accept && partial_.need == 0; }
  // Some non-empty continuation exists.
  bool can_continue() const { return sets_[size_t(cur_)].heads_end > sets_[size_t(cur_)].heads_begin; }

  // allowed[id] = 1 for every Text token of `vocab` whose bytes the grammar accepts next (the
  // others are left as they are: the caller zeroes the array). One walk of the vocabulary
  // trie, pruned at the first rejected byte; the result is kept per state (a bitset, up to
  // k_max_cached_masks of them), as generation often returns to a state (every token inside a
  // JSON string leaves the state as it was).
  void fill_allowed(const VocabIndex& vocab, uint8_t* allowed);

  const Grammar& grammar() const { return *g_; }
  // Stacks in the current state (the empty one included).
  size_t n_stacks() const;

  static constexpr size_t k_max_work = size_t(1) << 20;
  static constexpr size_t k_max_cached_sets = 1 << 15;
  static constexpr size_t k_max_cached_masks = 256;

 private:
  struct Node {
    uint32_t pos;    // elems index: a Chars to match (a head) or where to continue (a parent)
    int32_t parent;  // -1: the bottom of the stack
  };
  struct Set {
    uint32_t heads_begin, heads_end;  // set_heads_ range: sorted node ids
    bool accept;                      // the empty stack is in the set
    int32_t table;                    // offset of its 128 ASCII transitions in ascii_, -1: none yet
  };
  struct Partial {
    uint32_t value = 0;  // bits of the code point so far
    uint8_t need = 0;    // continuation bytes still expected
    uint8_t len = 0;     // length of the whole sequence
  };
  static constexpr int32_t k_unknown = -2;  // transition not computed yet
  static constexpr int32_t k_reject = -1;

  int32_t node(uint32_t pos, int32_t parent);
  // Expands (pos, parent) into heads_scratch_; sets *accept when a stack empties.
  void expand(uint32_t pos, int32_t parent, bool* accept);
  // Interns heads_scratch_ (sorted, unique) with `accept` as a set; k_reject when empty.
  int32_t intern_set(bool accept);
  int32_t compute_next(int32_t s, uint32_t cp);
  int32_t next(int32_t s, uint32_t cp) {
    if (cp < 128) {
      const int32_t t = sets_[size_t(s)].table;
      if (t >= 0 && ascii_[size_t(t) + cp] != k_unknown) return ascii_[size_t(t) + cp];
    }
    return compute_next(s, cp);
  }
  // Some head of set s accepts a code point of [lo, hi].
  bool any_head_intersects(int32_t s, uint32_t lo, uint32_t hi) const;
  // One byte from set s with partial p: the next set (k_reject when the byte is rejected).
  int32_t step(int32_t s, Partial& p, uint8_t byte);
  void walk(const VocabIndex& vocab, uint32_t trie_node, int32_t s, Partial p, uint8_t* allowed);
  // Drops every cache, keeping the current state.
  void reset_caches();

  std::shared_ptr<const Grammar> g_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;       // (pos, parent + 1) -> node id
  std::vector<Set> sets_;
  std::vector<int32_t> set_heads_;
  std::unordered_multimap<uint64_t, int32_t> set_ids_;   // hash of a set -> its id(s)
  std::vector<int32_t> ascii_;                           // [128 per tabled set] transitions
  std::unordered_map<uint64_t, int32_t> cp_next_;        // (set, code point) -> next set
  std::unordered_map<uint64_t, uint32_t> mask_ids_;     // (set, partial) -> masks_ index
  std::vector<std::vector<uint64_t>> masks_;             // [n_vocab bits] allowed sets
  const VocabIndex* mask_vocab_ = nullptr;               // the vocabulary masks_ are for
  int32_t cur_ = 0;                                      // the current set
  Partial partial_;
  // Scratch, reused across calls.
  std::vector<int32_t> heads_scratch_;
  std::vector<std::pair<uint32_t, int32_t>> work_;
};

}  // namespace tern::grammar
