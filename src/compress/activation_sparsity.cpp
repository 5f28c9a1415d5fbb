#include "compress/activation_sparsity.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/error.h"
#include "core/stats.h"
#include "models/hparams.h"

namespace tern {

namespace {

// Layer of "blk.N.ffn_down.weight", or -1.
int64_t ffn_down_layer(const std::string& weight) {
  constexpr std::string_view kPrefix = "blk.", kSuffix = ".ffn_down.weight";
  if (weight.size() <= kPrefix.size() + kSuffix.size() || weight.compare(0, kPrefix.size(), kPrefix) != 0 ||
      weight.compare(weight.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0)
    return -1;
  int64_t il = 0;
  for (size_t i = kPrefix.size(); i < weight.size() - kSuffix.size(); ++i) {
    if (weight[i] < '0' || weight[i] > '9') return -1;
    il = il * 10 + (weight[i] - '0');
  }
  return il;
}

class ActivityCounter final : public SequenceObserver {
 public:
  ActivityCounter(FfnActivity& a, float threshold) : a_(a), threshold_(threshold) {}
  void on_linear_input(const std::string& weight, const float* x, int64_t n_tokens, int64_t n_in) override {
    const int64_t il = ffn_down_layer(weight);
    if (il < 0 || il >= a_.n_layer()) return;
    if (a_.n_ff[size_t(il)] == 0) {
      a_.n_ff[size_t(il)] = n_in;
      a_.active[size_t(il)].assign(size_t(n_in), 0);
    }
    if (a_.n_ff[size_t(il)] != n_in)
      fail("activation sparsity: layer ", il, "'s ffn_down input has ", n_in, " channels, earlier ", a_.n_ff[size_t(il)]);
    int64_t* act = a_.active[size_t(il)].data();
    int64_t zeros = 0;
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* row = x + t * n_in;
      for (int64_t j = 0; j < n_in; ++j) {
        const bool on = std::fabs(row[j]) > threshold_;
        act[j] += on;
        zeros += !on;
      }
    }
    a_.zeros[size_t(il)] += zeros;
  }

 private:
  FfnActivity& a_;
  float threshold_;
};

}  // namespace

double FfnActivity::sparsity(int64_t il) const {
  const int64_t F = n_ff.at(size_t(il));
  return F > 0 && n_tokens > 0 ? double(zeros[size_t(il)]) / (double(F) * double(n_tokens)) : 0.0;
}

double FfnActivity::mean_sparsity() const {
  double z = 0, all = 0;
  for (int64_t il = 0; il < n_layer(); ++il) {
    z += double(zeros[size_t(il)]);
    all += double(n_ff[size_t(il)]) * double(n_tokens);
  }
  return all > 0 ? z / all : 0.0;
}

double FfnActivity::hot_fraction(int64_t il, double share) const {
  std::vector<int64_t> counts = active.at(size_t(il));
  if (counts.empty()) return 0.0;
  std::sort(counts.begin(), counts.end(), std::greater<>());
  double total = 0;
  for (int64_t c : counts) total += double(c);
  if (total <= 0) return 0.0;
  double covered = 0;
  for (size_t k = 0; k < counts.size(); ++k) {
    covered += double(counts[k]);
    if (covered >= share * total) return double(k + 1) / double(counts.size());
  }
  return 1.0;
}

FfnActivity measure_ffn_activity(std::shared_ptr<const GgufFile> model, const CalibOptions& opts, float threshold) {
  const int64_t t0 = now_ns();
  const HParams hp = read_hparams(*model);
  FfnActivity a;
  a.n_ff.assign(size_t(hp.n_layer), 0);
  a.active.resize(size_t(hp.n_layer));
  a.zeros.assign(size_t(hp.n_layer), 0);
  const CalibRun run = run_calibration_text(model, opts, [&](ThreadPool&, int64_t) {
    return std::make_unique<ActivityCounter>(a, threshold);
  });
  a.n_tokens = run.n_tokens;
  if (std::all_of(a.n_ff.begin(), a.n_ff.end(), [](int64_t f) { return f == 0; }))
    fail(model->path(), ": no dense FFN (ffn_down) ran: activation sparsity is measured on dense FFNs");
  a.seconds = double(now_ns() - t0) / 1e9;
  return a;
}

}  // namespace tern
