// KL divergence against a base run's log-probabilities (kl_divergence.h).
#include "tools/kl_divergence.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/output_file.h"
#include "core/stats.h"

namespace tern {

namespace {

constexpr char kLogProbMagic[8] = {'T', 'E', 'R', 'N', 'L', 'O', 'G', 'P'};
constexpr uint32_t kLogProbVersion = 1;

struct LogProbHeader {
  char magic[8];
  uint32_t version;
  uint32_t reserved;
  int64_t n_vocab;
  int64_t n_positions;
};
static_assert(sizeof(LogProbHeader) == 32);

int64_t logp_position_bytes(int64_t n_vocab) { return int64_t(sizeof(int32_t)) + n_vocab * int64_t(sizeof(float)); }

}  // namespace

int64_t logprob_file_bytes(int64_t n_vocab, int64_t n_positions) {
  return int64_t(sizeof(LogProbHeader)) + n_positions * logp_position_bytes(n_vocab);
}

void log_softmax_row(const float* logits, int64_t n_vocab, float* lp, const std::string& what, int64_t at) {
  float mx = logits[0];
  for (int64_t v = 1; v < n_vocab; ++v) mx = std::max(mx, logits[v]);
  double sum = 0;
  for (int64_t v = 0; v < n_vocab; ++v) sum += std::exp(double(logits[v]) - double(mx));
  const double log_sum = std::log(sum);
  if (!std::isfinite(mx) || !std::isfinite(log_sum))
    fail(what, " gave non-finite logits (NaN or Inf) at position ", at, ": its weights or activations overflow");
  for (int64_t v = 0; v < n_vocab; ++v) lp[v] = float(double(logits[v]) - double(mx) - log_sum);
}

LogProbWriter::LogProbWriter(const std::string& path, int64_t n_vocab, int64_t n_positions)
    : out_(std::make_unique<OutputFile>(path)), path_(path), n_vocab_(n_vocab), n_positions_(n_positions) {
  LogProbHeader h{};
  std::memcpy(h.magic, kLogProbMagic, sizeof kLogProbMagic);
  h.version = kLogProbVersion;
  h.n_vocab = n_vocab;
  h.n_positions = n_positions;
  out_->write(&h, sizeof h);
}

LogProbWriter::~LogProbWriter() = default;

void LogProbWriter::add(int32_t next, const float* lp) {
  if (n_added_ >= n_positions_) fail(path_, ": more positions than the ", n_positions_, " announced");
  out_->write(&next, sizeof next);
  out_->write(lp, size_t(n_vocab_) * sizeof(float));
  ++n_added_;
}

void LogProbWriter::commit() {
  if (n_added_ != n_positions_) fail(path_, ": ", n_added_, " positions written of the ", n_positions_, " announced");
  out_->commit();
}

LogProbReader::LogProbReader(const std::string& path, int64_t n_vocab) : path_(path), n_vocab_(n_vocab) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) fail("cannot open the KL-divergence base ", path, ": ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("the KL-divergence base ", path, " is not a regular file");
  f_ = std::fopen(path.c_str(), "rb");
  if (!f_) fail("cannot open the KL-divergence base ", path, ": ", std::strerror(errno));
  LogProbHeader h{};
  if (std::fread(&h, sizeof h, 1, f_) != 1 || std::memcmp(h.magic, kLogProbMagic, sizeof kLogProbMagic) != 0)
    fail(path, " is not a log-probability file of tern ppl --kl-divergence-base");
  if (h.version != kLogProbVersion) fail(path, ": log-probability file version ", h.version, ", this tern reads ", kLogProbVersion);
  if (h.n_vocab != n_vocab)
    fail(path, " holds distributions over ", h.n_vocab, " tokens, this model's vocabulary has ", n_vocab,
         ": compare runs of the same vocabulary");
  if (h.n_positions < 0 || h.n_positions > (int64_t(st.st_size) - int64_t(sizeof h)) / logp_position_bytes(n_vocab) ||
      int64_t(sizeof h) + h.n_positions * logp_position_bytes(n_vocab) != int64_t(st.st_size))
    fail(path, " is ", st.st_size, " bytes, not what its header announces (", h.n_positions, " positions of ",
         n_vocab, " log-probabilities): truncated or not written whole");
  n_positions_ = h.n_positions;
  row_.resize(size_t(n_vocab));
}

LogProbReader::~LogProbReader() {
  if (f_) std::fclose(f_);
}

const float* LogProbReader::next(int32_t next_token) {
  if (n_read_ >= n_positions_)
    fail(path_, " ends after ", n_positions_, " positions and this run scores more: the base scored another text, "
         "--ctx, --chunks or --long");
  int32_t tok = 0;
  if (std::fread(&tok, sizeof tok, 1, f_) != 1 || std::fread(row_.data(), sizeof(float), row_.size(), f_) != row_.size())
    fail("cannot read ", path_, " at position ", n_read_, ": ", std::strerror(errno));
  if (tok != next_token)
    fail(path_, " scored token ", tok, " at position ", n_read_, " where this run scores ", next_token,
         ": the base ran over another text, tokenizer, --ctx, --chunks or --long");
  ++n_read_;
  return row_.data();
}

void LogProbReader::expect_end() const {
  if (n_read_ != n_positions_)
    fail(path_, " holds ", n_positions_, " positions and this run scored ", n_read_,
         ": the base scored another text, --ctx, --chunks or --long");
}

void KlStats::add(const float* base_lp, const float* lp, int64_t n_vocab, int32_t next) {
  double kld = 0;
  int64_t top_base = 0, top = 0;
  for (int64_t v = 0; v < n_vocab; ++v) {
    const double b = base_lp[v];
    kld += std::exp(b) * (b - double(lp[v]));
    if (base_lp[v] > base_lp[top_base]) top_base = v;
    if (lp[v] > lp[top]) top = v;
  }
  kld_.push_back(std::max(0.0, kld));  // (a sum of rounded terms can fall a hair below 0)
  same_top_ += top == top_base;
  const double dp = std::exp(double(lp[next])) - std::exp(double(base_lp[next]));
  dp2_ += dp * dp;
  nll_base_ -= base_lp[next];
  nll_ -= lp[next];
}

nlohmann::json KlStats::json() const {
  const double n = double(kld_.size());
  if (kld_.empty()) return {{"n_positions", 0}};
  const double m = mean(kld_);
  double var = 0;
  for (double k : kld_) var += (k - m) * (k - m);
  const double stderr_kld = kld_.size() > 1 ? std::sqrt(var / (n - 1) / n) : 0.0;
  const double top = double(same_top_) / n;
  return {{"kld",
           {{"mean", m},
            {"stderr", stderr_kld},
            {"median", percentile(kld_, 50)},
            {"p99", percentile(kld_, 99)},
            {"max", *std::max_element(kld_.begin(), kld_.end())}}},
          {"same_top_pct", 100.0 * top},
          {"same_top_stderr_pct", kld_.size() > 1 ? 100.0 * std::sqrt(top * (1 - top) / (n - 1)) : 0.0},
          {"rms_dp_pct", 100.0 * std::sqrt(dp2_ / n)},
          {"ppl_base", std::exp(nll_base_ / n)},
          {"ppl", std::exp(nll_ / n)},
          {"mean_ln_ppl_ratio", (nll_ - nll_base_) / n},
          {"n_positions", int64_t(kld_.size())}};
}

std::string KlStats::summary() const {
  const nlohmann::json j = json();
  if (kld_.empty()) return "KL divergence: no positions\n";
  const auto& k = j["kld"];
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "KL divergence from the base, %lld positions:\n"
                "  mean KLD                 %.6f +/- %.6f\n"
                "  median / p99 / max KLD   %.6f / %.6f / %.6f\n"
                "  same top token           %.3f +/- %.3f %%\n"
                "  RMS delta p              %.3f %%\n"
                "  PPL base / this          %.4f / %.4f   (mean ln ratio %+.6f)\n",
                static_cast<long long>(kld_.size()), k["mean"].get<double>(), k["stderr"].get<double>(),
                k["median"].get<double>(), k["p99"].get<double>(), k["max"].get<double>(),
                j["same_top_pct"].get<double>(), j["same_top_stderr_pct"].get<double>(), j["rms_dp_pct"].get<double>(),
                j["ppl_base"].get<double>(), j["ppl"].get<double>(), j["mean_ln_ppl_ratio"].get<double>());
  return buf;
}

}  // namespace tern
