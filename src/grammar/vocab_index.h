#pragma once
// The vocabulary as a byte trie, built once per tokenizer, so that a grammar's allowed set is
// one walk that drops a whole subtree as soon as its prefix is rejected (grammar/matcher.h).
//
//   nodes in preorder:   [0 root] [1 'a'] [2 'ab'] [3 'abc'] [4 'b'] ...
//   node i's subtree is i .. end-1, its first child is i+1, the next sibling of a child c is
//   nodes[c].end; the tokens whose bytes are exactly node i's path are
//   node_tokens[tok_begin .. tok_end).
//
// Immutable once built: share one between threads and constraints.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tern {
class Tokenizer;
}

namespace tern::grammar {

struct VocabIndex {
  enum Kind : uint8_t {
    Never = 0,  // control / unknown / unused tokens, and tokens with no bytes: never allowed
    Text = 1,   // allowed when the grammar accepts its bytes
    Eog = 2,    // end of generation: allowed when the grammar may end here
  };
  struct Node {
    uint32_t end;        // one past the last node of this subtree
    uint32_t tok_begin;  // node_tokens range
    uint32_t tok_end;
    uint8_t byte;        // the byte on the edge into this node (root: 0)
  };
  int32_t n_vocab = 0;
  std::vector<Node> nodes;
  std::vector<int32_t> node_tokens;
  std::vector<std::string> pieces;  // [n_vocab] the bytes a Text token adds to the output
  std::vector<uint8_t> kind;        // [n_vocab] Kind
  std::vector<int32_t> eog_ids;     // the Eog tokens
};

// Indexes `tok`: each token's bytes are token_to_piece(id) (what generate() appends to the
// text). Thread-safe (reads the tokenizer only).
std::shared_ptr<const VocabIndex> build_vocab_index(const Tokenizer& tok);

// The same from raw data (tests): pieces[id] with kinds[id].
std::shared_ptr<const VocabIndex> build_vocab_index(std::vector<std::string> pieces, std::vector<uint8_t> kinds);

}  // namespace tern::grammar
