#pragma once
// Internals of the tokenizer layer: the validated vocabulary, the machinery both tokenizers
// share (piece lookup, special-token partitioning, the pair-merge loop) and the two concrete
// tokenizers. Not part of the public API; include tokenizer/tokenizer.h instead.
#include <cstdint>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace tern::detail {

// How a byte-level BPE vocabulary splits text into words before merging
// (tokenizer.ggml.pre, resolved by from_gguf; see pretokenizer_from_name).
enum class PreTokenizer : uint8_t {
  Gpt2,        // GPT-2's regex (gpt-2, mpt, olmo, ... and files without the key)
  DigitsGpt2,  // every digit on its own, then GPT-2's regex (starcoder, refact, ...)
  Llama3,      // Llama 3's regex: numbers in groups of up to three digits
  Qwen2,       // Llama 3's regex with one digit per number (Qwen2, Qwen2.5, Qwen3)
};

// Everything from_gguf read and validated; ids are -1 when absent.
struct VocabData {
  std::string model;
  PreTokenizer pre = PreTokenizer::Gpt2;
  // BPE: a word that is itself a vocabulary piece is that token, whatever the merges would
  // make of it (Hugging Face's ignore_merges; llama.cpp sets it for Llama 3).
  bool ignore_merges = false;
  // [n_vocab] or empty: 1 where whitespace after the token's text is dropped when the token
  // is split out of the text (llama.cpp's RSTRIP attribute, set for Phi-3's special tokens).
  std::vector<uint8_t> rstrip;
  std::vector<std::string> tokens;
  std::vector<float> scores;   // empty or n_vocab
  std::vector<int32_t> types;  // n_vocab (TokenType values)
  std::vector<std::string> merges;
  int32_t bos = -1, eos = -1, eot = -1, unk = -1;
  bool add_bos = false, add_eos = false, add_space_prefix = false;
  std::vector<int32_t> eog;
};

// A run of the input: either raw text [off, off + len) or an already decided token.
struct Fragment {
  int32_t token;  // -1 for raw text
  size_t off, len;
};

class VocabTokenizer : public Tokenizer {
 public:
  explicit VocabTokenizer(VocabData d);
  // Lookup tables hold views into tokens_, so the object must stay where it was built.
  VocabTokenizer(const VocabTokenizer&) = delete;
  VocabTokenizer& operator=(const VocabTokenizer&) = delete;

  std::vector<int32_t> encode(std::string_view text, bool add_bos,
                              bool parse_special) const override;

 protected:
  // Appends the tokens of one raw-text fragment. `after_special` is true when the fragment
  // starts the input or follows a special token (SPM adds its dummy space prefix then).
  virtual void encode_text(std::string_view text, bool after_special,
                           std::vector<int32_t>& out) const = 0;

  TokenType type_of(int32_t id) const { return static_cast<TokenType>(types_[id]); }
  void check_id(int32_t id) const;
  // Id of the plain-text piece `s`, or -1. Control and unknown tokens are excluded: their
  // texts appearing in input are ordinary text unless parse_special splits them out first.
  int32_t text_piece_id(std::string_view s) const {
    auto it = piece_to_id_.find(s);
    return it == piece_to_id_.end() ? -1 : it->second;
  }

 private:
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;

  std::unordered_map<std::string_view, int32_t> piece_to_id_;
  // Control / user-defined / unknown tokens with non-empty text, longest text first.
  std::vector<int32_t> special_ids_;
  std::vector<uint8_t> rstrip_;  // see VocabData::rstrip
  // A byte trie over the texts of special_ids_ (node 0 is the root, an edge is keyed by
  // node << 8 | byte), so that partition() looks for only the texts that occur in its input:
  // vocabularies such as Gemma's have thousands of added tokens.
  std::unordered_map<uint64_t, uint32_t> trie_edges_;
  std::vector<uint32_t> special_node_;  // [special_ids_.size()] trie node of each text
  uint32_t trie_nodes_ = 1;
};

// SentencePiece-style BPE over piece scores ("llama").
class SpmTokenizer final : public VocabTokenizer {
 public:
  explicit SpmTokenizer(VocabData d);
  std::string token_to_piece(int32_t id, bool render_special) const override;

 protected:
  void encode_text(std::string_view text, bool after_special,
                   std::vector<int32_t>& out) const override;

 private:
  int32_t byte_to_id_[256];     // <0xNN> tokens, -1 when missing
  std::vector<int16_t> byte_of_;  // [n_vocab] byte value of Byte tokens, else -1
  // ASCII bytes that occur in no piece longer than one byte (e.g. '\n' in Llama's vocab):
  // no merge can cross them, so the text is merged in independent segments between them.
  // Same result, but a small priority queue per line instead of one over a whole document.
  bool barrier_[128];
};

// Byte-level BPE with ranked merges and a regex pre-tokenizer ("gpt2").
class BpeTokenizer final : public VocabTokenizer {
 public:
  explicit BpeTokenizer(VocabData d);
  std::string token_to_piece(int32_t id, bool render_special) const override;

 protected:
  void encode_text(std::string_view text, bool after_special,
                   std::vector<int32_t>& out) const override;

 private:
  void encode_word(std::string_view word, std::string& mapped, std::string& key,
                   std::vector<int32_t>& out) const;

  PreTokenizer pre_;
  bool ignore_merges_;
  std::unordered_map<std::string_view, int32_t> merge_rank_;  // "left right" -> rank
  std::string byte_to_utf8_[256];  // GPT-2 byte -> printable code point, as UTF-8
  int16_t cp_to_byte_[512];        // inverse (all mapped code points are < 512), -1 if none
};

// Splits `text` the way the GPT-2 pre-tokenizer regex does
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// and calls emit(offset, length) for each piece, in order, covering every byte.
void gpt2_pretokenize(std::string_view text, const std::function<void(size_t, size_t)>& emit);

// Splits `text` the way Llama 3's pre-tokenizer regex does (max_digits 3; Qwen2's is the
// same with max_digits 1):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// (contractions case-insensitive for ASCII letters, as llama.cpp spells it).
void llama3_pretokenize(std::string_view text, size_t max_digits,
                        const std::function<void(size_t, size_t)>& emit);

// Runs the pre-tokenizer `pre` over `text` (emit as above).
void pretokenize(PreTokenizer pre, std::string_view text,
                 const std::function<void(size_t, size_t)>& emit);

// The pre-tokenizer llama.cpp uses for tokenizer.ggml.pre = `name` (empty: the key is
// absent), or std::nullopt when tern does not implement that one. ignore_merges is set for
// the names llama.cpp turns it on for.
std::optional<PreTokenizer> pretokenizer_from_name(std::string_view name, bool& ignore_merges);
// Comma-separated names pretokenizer_from_name accepts (for error messages and docs).
const char* supported_pretokenizer_names();

// ---- the pair-merge loop shared by SPM and BPE ----------------------------------------------

struct MergeSymbol {
  uint32_t off, len;    // bytes of the text this symbol covers
  int32_t prev, next;   // neighbours in the chain, -1 at the ends; len 0 = merged away
};

// Repeatedly merges the adjacent pair with the highest priority (ties: the leftmost pair)
// until no adjacent pair has one. priority(left, right) returns std::nullopt when the pair
// may not merge. Symbols must be contiguous in `text` and chained in order.
// O(n log n): each merge pushes at most two new candidates; stale ones are skipped on pop.
template <class PriorityFn>
void merge_symbols(std::string_view text, std::vector<MergeSymbol>& syms, PriorityFn&& priority) {
  struct Candidate {
    double priority;
    int32_t left, right;
    uint32_t len;  // left.len + right.len when queued; differs once either side changed
  };
  struct Lower {
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.priority < b.priority || (a.priority == b.priority && a.left > b.left);
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, Lower> queue;
  auto try_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const MergeSymbol& a = syms[l];
    const MergeSymbol& b = syms[r];
    std::optional<double> p = priority(text.substr(a.off, a.len), text.substr(b.off, b.len));
    if (p) queue.push({*p, l, r, a.len + b.len});
  };
  for (size_t i = 1; i < syms.size(); ++i)
    try_add(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    MergeSymbol& a = syms[c.left];
    MergeSymbol& b = syms[c.right];
    // A symbol only grows by absorbing its right neighbour or disappears, so equal total
    // length with both alive means neither side changed since the candidate was queued.
    if (a.len == 0 || b.len == 0 || a.len + b.len != c.len) continue;
    a.len += b.len;
    b.len = 0;
    a.next = b.next;
    if (b.next >= 0) syms[b.next].prev = c.left;
    try_add(a.prev, c.left);
    try_add(c.left, a.next);
  }
}

}  // namespace tern::detail
