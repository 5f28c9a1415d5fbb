#pragma once
// How far a run's next-token distributions are from a base run's over the same tokens: the
// comparison llama.cpp's llama-perplexity makes with --kl-divergence-base / --kl-divergence (a
// quantized model against its F16 file, a K/V cache type or eviction policy against the full
// cache). The base run writes every scored position's log-probabilities to a file
// (LogProbWriter); the later run reads them back (LogProbReader) and accumulates, position by
// position, KL(base || this), whether both put the same token on top, and the change in the
// probability of the token that came (KlStats).
//
// The file is tern's own (not llama.cpp's), little-endian:
//   "TERNLOGP" | u32 version (1) | u32 0 | i64 n_vocab | i64 n_positions |
//   per position: i32 the token that came next | f32 log-probabilities [n_vocab]
// (4 * n_vocab + 4 bytes a position: 128 KiB for Llama-2's 32,000-entry vocabulary). The tokens
// let a run over another text, tokenizer or --ctx be refused instead of compared.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tern {

class OutputFile;

// Bytes of a log-probability file of n_positions distributions over n_vocab tokens.
int64_t logprob_file_bytes(int64_t n_vocab, int64_t n_positions);
// The largest base `tern compare` writes in passing for its KLD columns (beyond it, none).
inline constexpr int64_t kCompareKlBaseLimit = int64_t(2) << 30;
// Positions tern ppl scores in a chunk of n_ctx tokens (the second half, less the last).
inline int64_t ppl_scored_per_chunk(int64_t n_ctx) { return n_ctx - 1 - n_ctx / 2; }

// log-softmax of one row of logits (in double, stored as f32) into lp[n_vocab]; tern::Error
// naming `what` and position `at` for non-finite logits.
void log_softmax_row(const float* logits, int64_t n_vocab, float* lp, const std::string& what, int64_t at);

class LogProbWriter {
 public:
  // Opens `path` (written as OutputFile writes: the old file stays until commit()).
  LogProbWriter(const std::string& path, int64_t n_vocab, int64_t n_positions);
  ~LogProbWriter();
  void add(int32_t next, const float* lp);  // lp [n_vocab]
  // Throws when fewer or more positions were added than announced.
  void commit();

 private:
  std::unique_ptr<OutputFile> out_;
  std::string path_;
  int64_t n_vocab_, n_positions_, n_added_ = 0;
};

class LogProbReader {
 public:
  // Opens and checks the header and the size; tern::Error naming the path otherwise (missing,
  // not such a file, another vocabulary, a size that does not match its header).
  LogProbReader(const std::string& path, int64_t n_vocab);
  ~LogProbReader();
  LogProbReader(const LogProbReader&) = delete;
  LogProbReader& operator=(const LogProbReader&) = delete;
  int64_t n_positions() const { return n_positions_; }
  // The next position's log-probabilities [n_vocab]; tern::Error when the file's token there is
  // not `next` (the runs scored different tokens) or the file has no more positions.
  const float* next(int32_t next_token);
  // tern::Error when positions are left unread (the base scored more than this run).
  void expect_end() const;

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  int64_t n_vocab_, n_positions_ = 0, n_read_ = 0;
  std::vector<float> row_;
};

// Per-position comparison with the base, accumulated.
class KlStats {
 public:
  // base_lp, lp: [n_vocab] log-probabilities of the base run and of this one; next: the token
  // that came.
  void add(const float* base_lp, const float* lp, int64_t n_vocab, int32_t next);
  int64_t count() const { return int64_t(kld_.size()); }
  // {"kld": {mean, stderr, median, p99, max}, "same_top_pct", "same_top_stderr_pct", "rms_dp_pct",
  //  "ppl_base", "ppl", "mean_ln_ppl_ratio", "n_positions"}
  nlohmann::json json() const;
  // A few lines for people (what llama-perplexity prints, in its terms).
  std::string summary() const;

 private:
  std::vector<double> kld_;
  int64_t same_top_ = 0;
  double dp2_ = 0, nll_base_ = 0, nll_ = 0;
};

}  // namespace tern
