#pragma once
// Training text: documents, their tokens packed into one stream, and the windows the batches
// are cut from.
//
// A document is a maximal run of non-empty lines (a line of only whitespace counts as empty),
// joined with "\n"; each is tokenized with BOS first (EOS last with add_eos), and the
// documents' tokens are concatenated in file order into one stream S. Window w is
// S[w T, w T + T] (T + 1 tokens: inputs and next-token targets), w < (|S| - 1) / T.
// Micro-batch m (m = step * grad_accum + a) holds windows order[(m B + b) mod n_windows] for
// b < B, where order is the identity (no shuffle) or, per pass over the data (epoch e), a
// Fisher-Yates permutation from Rng(mix_seed(seed, 2, e)): so the windows of any step are a
// function of (seed, step) alone, which is what makes --resume exact.
#include <cstdint>
#include <string>
#include <vector>

namespace tern {
class Tokenizer;
}

namespace tern::train {

// Splits text into documents (see above).
std::vector<std::string> split_documents(const std::string& text);

struct TokenStream {
  std::vector<int32_t> tokens;
  int64_t n_documents = 0;
  int64_t n_bytes = 0;
};

// Tokenizes every document of the file (what = "--data" for messages). Throws tern::Error for an
// unreadable or empty file.
TokenStream tokenize_file(const std::string& path, const Tokenizer& tok, bool add_eos, const std::string& what);
TokenStream tokenize_text(const std::string& text, const Tokenizer& tok, bool add_eos);

class WindowSampler {
 public:
  // Throws tern::Error (naming `what`, the token count and what is needed) when the stream
  // holds less than one window of n_ctx + 1 tokens.
  WindowSampler(const std::vector<int32_t>* stream, int64_t n_ctx, bool shuffle, uint64_t seed,
                const std::string& what);

  int64_t n_windows() const { return n_windows_; }
  // The window index at position `slot` of the whole run's sequence of windows.
  int64_t window_at(int64_t slot);
  // Copies micro-batch m's n_seq windows into out [n_seq][n_ctx + 1].
  void batch(int64_t m, int64_t n_seq, int32_t* out);
  // The window w's tokens.
  const int32_t* window(int64_t w) const { return stream_->data() + w * n_ctx_; }

 private:
  const std::vector<int32_t>* stream_;
  int64_t n_ctx_, n_windows_;
  bool shuffle_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;
};

}  // namespace tern::train
