#include "compress/calibrate.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/read_file.h"
#include "core/stats.h"
#include "models/model.h"
#include "runtime/session.h"
#include "tokenizer/tokenizer.h"

namespace tern {
namespace {

// Collects the statistics as the forward pass reports linear-layer inputs.
class Collector final : public SequenceObserver {
 public:
  Collector(CalibStats& stats, const CalibOptions& opts, ThreadPool& pool, int64_t total_tokens)
      : stats_(stats), opts_(opts), pool_(pool), total_tokens_(total_tokens) {}

  void on_linear_input(const std::string& weight, const float* x, int64_t n_tokens, int64_t n_in) override {
    // Consecutive calls with the same input buffer read one site (attn_q/k/v, ffn_gate/up).
    if (x == last_x_ && n_tokens == last_t_ && n_in == last_n_ && last_site_ != nullptr) {
      if (stats_.site_of.emplace(weight, size_t(last_site_ - stats_.sites.data())).second)
        last_site_->weights.push_back(weight);
      return;
    }
    SiteStats& s = site(weight, n_in);
    last_x_ = x;
    last_t_ = n_tokens;
    last_n_ = n_in;
    last_site_ = &s;
    accumulate(s, x, n_tokens);
  }

  void begin_sequence(int64_t first_token) override { first_token_ = first_token; }

 private:
  SiteStats& site(const std::string& weight, int64_t n_in) {
    auto it = stats_.site_of.find(weight);
    if (it != stats_.site_of.end()) return stats_.sites[it->second];
    // Sites are created during the first forward pass; later passes find them by name, so the
    // vector never reallocates under a pointer in use across sequences.
    SiteStats s;
    s.name = weight;
    s.weights = {weight};
    s.n_in = n_in;
    s.absmax.assign(size_t(n_in), 0.0f);
    s.sum.assign(size_t(n_in), 0.0);
    s.sum_abs.assign(size_t(n_in), 0.0);
    s.sum_sq.assign(size_t(n_in), 0.0);
    if (opts_.hessian) s.hessian.assign(size_t(n_in * n_in), 0.0);
    s.samples.reserve(size_t(std::min(opts_.max_samples, total_tokens_) * n_in));
    stats_.sites.push_back(std::move(s));
    stats_.site_of[weight] = stats_.sites.size() - 1;
    last_site_ = nullptr;
    return stats_.sites.back();
  }

  void accumulate(SiteStats& s, const float* x, int64_t n_tokens) {
    const int64_t n_in = s.n_in;
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x + t * n_in;
      for (int64_t j = 0; j < n_in; ++j) {
        const float a = std::fabs(xt[j]);
        s.absmax[size_t(j)] = std::max(s.absmax[size_t(j)], a);
        s.sum[size_t(j)] += xt[j];
        s.sum_abs[size_t(j)] += a;
        s.sum_sq[size_t(j)] += double(xt[j]) * xt[j];
      }
      // Evenly spaced samples: token index i of the whole run is kept when it crosses the next
      // multiple of total/max_samples.
      const int64_t i = first_token_ + t;
      const int64_t keep = std::min(opts_.max_samples, total_tokens_);
      if (keep > 0 && s.n_samples < keep && i * keep / total_tokens_ != (i + 1) * keep / total_tokens_) {
        s.samples.insert(s.samples.end(), xt, xt + n_in);
        ++s.n_samples;
      }
    }
    s.n_tokens += n_tokens;
    if (!s.hessian.empty()) {
      // H += X^T X over the rows of H, split across the pool; f64 accumulation per row: the
      // Hessian's small eigenvalues matter to GPTQ's Cholesky.
      pool_.parallel_for(n_in, [&](int64_t r0, int64_t r1, int) {
        for (int64_t a = r0; a < r1; ++a) {
          double* h = s.hessian.data() + a * n_in;
          for (int64_t t = 0; t < n_tokens; ++t) {
            const float* xt = x + t * n_in;
            const double xa = xt[a];
            if (xa == 0.0) continue;
            for (int64_t b = 0; b < n_in; ++b) h[b] += xa * double(xt[b]);
          }
        }
      });
    }
  }

  CalibStats& stats_;
  const CalibOptions& opts_;
  ThreadPool& pool_;
  int64_t total_tokens_;
  int64_t first_token_ = 0;
  const float* last_x_ = nullptr;
  int64_t last_t_ = -1, last_n_ = -1;
  SiteStats* last_site_ = nullptr;
};

}  // namespace

const SiteStats& CalibStats::of(const std::string& weight) const {
  auto it = site_of.find(weight);
  if (it == site_of.end()) fail("calibration saw no input of ", weight);
  return sites[it->second];
}

CalibRun run_calibration_text(std::shared_ptr<const GgufFile> model, const CalibOptions& opts,
                              const ObserverFactory& make_observer) {
  const std::string text = opts.text_file.empty() ? opts.text : read_file_text(opts.text_file, "calibration text");
  if (opts.n_tokens < 16) fail("--calib-tokens ", opts.n_tokens, " is too few (at least 16)");

  const auto tok = Tokenizer::from_gguf(*model);
  const std::vector<int32_t> ids = tok->encode(text, /*add_bos=*/false);
  if (int64_t(ids.size()) < opts.n_tokens)
    fail("calibration text ", opts.text_file.empty() ? "(given)" : opts.text_file, " is too short: ", ids.size(), " tokens, --calib-tokens asks for ",
         opts.n_tokens, " (give a longer text or fewer tokens)");

  SessionConfig cfg;
  const HParams hp = read_hparams(*model);
  const int64_t seq = std::max<int64_t>(2, std::min(opts.seq_len, hp.n_ctx_train > 0 ? hp.n_ctx_train : opts.seq_len));
  cfg.n_ctx = seq;
  cfg.n_batch = seq;
  cfg.n_threads = opts.n_threads;
  Session session(model, cfg);

  // Sequences of BOS + (seq - 1) text tokens covering n_tokens text tokens.
  const int64_t per = seq - 1;
  const int64_t start = opts.from_end ? int64_t(ids.size()) - opts.n_tokens : 0;
  const int64_t n_seq = (opts.n_tokens + per - 1) / per;
  const int64_t total = opts.n_tokens + n_seq;  // BOS included: every forward token is seen
  std::unique_ptr<SequenceObserver> observer = make_observer(session.pool(), total);
  session.model().set_observer(observer.get());
  std::vector<int32_t> chunk;
  int64_t seen = 0;
  for (int64_t s = 0; s < n_seq; ++s) {
    const int64_t b = start + s * per, e = std::min(start + opts.n_tokens, b + per);
    chunk.assign(1, tok->bos_id());
    chunk.insert(chunk.end(), ids.begin() + b, ids.begin() + e);
    session.reset();
    observer->begin_sequence(seen);
    session.eval(chunk, /*all_logits=*/false);
    seen += int64_t(chunk.size());
    if (opts.progress) opts.progress(s + 1, n_seq, "calibration");
  }
  session.model().set_observer(nullptr);
  return {seen, n_seq};
}

CalibStats calibrate(std::shared_ptr<const GgufFile> model, const CalibOptions& opts) {
  const int64_t t0 = now_ns();
  CalibStats stats;
  const CalibRun run = run_calibration_text(model, opts, [&](ThreadPool& pool, int64_t total) {
    return std::make_unique<Collector>(stats, opts, pool, total);
  });
  stats.n_tokens = run.n_tokens;
  stats.n_sequences = run.n_sequences;
  stats.seconds = double(now_ns() - t0) / 1e9;
  return stats;
}

}  // namespace tern
