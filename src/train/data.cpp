#include "train/data.h"

#include <cstring>

#include "core/error.h"
#include "core/read_file.h"
#include "tokenizer/tokenizer.h"
#include "train/rng.h"

namespace tern::train {

std::vector<std::string> split_documents(const std::string& text) {
  std::vector<std::string> docs;
  std::string cur;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    bool blank = true;
    for (char c : line)
      if (c != ' ' && c != '\t' && c != '\r' && c != '\f' && c != '\v') blank = false;
    if (blank) {
      if (!cur.empty()) docs.push_back(std::move(cur));
      cur.clear();
    } else {
      if (!cur.empty()) cur += '\n';
      cur += line;
    }
    pos = end + 1;
  }
  if (!cur.empty()) docs.push_back(std::move(cur));
  return docs;
}

TokenStream tokenize_text(const std::string& text, const Tokenizer& tok, bool add_eos) {
  TokenStream s;
  s.n_bytes = int64_t(text.size());
  for (const std::string& d : split_documents(text)) {
    std::vector<int32_t> ids = tok.encode(d, true, false);
    if (add_eos && tok.eos_id() >= 0) ids.push_back(tok.eos_id());
    s.tokens.insert(s.tokens.end(), ids.begin(), ids.end());
    ++s.n_documents;
  }
  return s;
}

TokenStream tokenize_file(const std::string& path, const Tokenizer& tok, bool add_eos, const std::string& what) {
  const std::string text = read_file_text(path, what + " file");
  TokenStream s = tokenize_text(text, tok, add_eos);
  if (s.n_documents == 0) fail(what, " ", path, ": no text (", text.size(), " bytes, no non-empty line)");
  return s;
}

WindowSampler::WindowSampler(const std::vector<int32_t>* stream, int64_t n_ctx, bool shuffle, uint64_t seed,
                             const std::string& what)
    : stream_(stream), n_ctx_(n_ctx), shuffle_(shuffle), seed_(seed) {
  const int64_t n = int64_t(stream->size());
  n_windows_ = n > 0 ? (n - 1) / n_ctx : 0;
  if (n_windows_ < 1)
    fail(what, ": ", n, " tokens after tokenizing; one training window of --ctx ", n_ctx, " needs at least ", n_ctx + 1,
         " (give more text or a smaller --ctx)");
}

int64_t WindowSampler::window_at(int64_t slot) {
  const int64_t epoch = slot / n_windows_, in_epoch = slot % n_windows_;
  if (!shuffle_) return in_epoch;
  if (epoch != epoch_) {
    order_.resize(size_t(n_windows_));
    for (int64_t i = 0; i < n_windows_; ++i) order_[size_t(i)] = i;
    Rng rng(mix_seed(seed_, 2, uint64_t(epoch)));
    for (int64_t i = n_windows_ - 1; i > 0; --i) std::swap(order_[size_t(i)], order_[rng.below(uint64_t(i + 1))]);
    epoch_ = epoch;
  }
  return order_[size_t(in_epoch)];
}

void WindowSampler::batch(int64_t m, int64_t n_seq, int32_t* out) {
  for (int64_t b = 0; b < n_seq; ++b) {
    const int64_t w = window_at(m * n_seq + b);
    std::memcpy(out + b * (n_ctx_ + 1), window(w), size_t(n_ctx_ + 1) * sizeof(int32_t));
  }
}

}  // namespace tern::train
