#pragma once
// The time a step will take, predicted before it runs (Sarathi-Serve's stall-free batching needs
// it: a step's prefill chunk is sized so that the sequences decoding in the same step still get
// their next token within a time-between-tokens target).
//
// A step's time is modelled as linear in four features of its shape:
//
//   t_ms = c_fixed + c_token * n_tokens + c_sampled * n_sampled + c_attn * attn_kpairs
//
//   c_fixed     per-step cost: reading every weight once (what makes decode memory-bound),
//               thread wake-ups;
//   c_token     per new token: the layers' matmuls (prefill cost per token);
//   c_sampled   per logits row: the output head and sampling (decode cost per sequence);
//   c_attn      per thousand query-key pairs: attention grows with the KV length.
//
// StepCostModel fits the coefficients online by least squares over the most recent steps (plus
// the calibration steps, kept for good), with every coefficient kept >= 0, so the prediction
// never decreases when a token is added to a step (the scheduler's search relies on that).
// Pure logic: no clock, no model; the engine feeds it measured steps.
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tern {

// What a step computes, as the cost model sees it.
struct StepShape {
  int64_t n_seqs = 0;     // sequences in the step
  int64_t n_tokens = 0;   // new tokens, all sequences together
  int64_t n_sampled = 0;  // sequences whose last token gets a logits row
  double attn_kpairs = 0; // query-key pairs attention computes, in thousands

  // One sequence computing positions n_past .. n_past + n_tokens - 1 (causal: token i sees
  // n_past + i + 1 keys).
  void add(int64_t n_past, int64_t n_tokens, bool sampled);
  void remove(int64_t n_past, int64_t n_tokens, bool sampled);
  static double kpairs(int64_t n_past, int64_t n_tokens);
};

// Predicts a step's wall time. The scheduler asks it; tests give it a fake.
class StepCostPredictor {
 public:
  virtual ~StepCostPredictor() = default;
  // Must not decrease when any field of `shape` grows.
  virtual double predict_ms(const StepShape& shape) const = 0;
};

class StepCostModel final : public StepCostPredictor {
 public:
  static constexpr int kFeatures = 4;
  using Coefs = std::array<double, kFeatures>;  // c_fixed, c_token, c_sampled, c_attn

  // window: how many recent steps the fit uses (older ones drop out, so the model follows a
  // machine whose speed changes).
  explicit StepCostModel(int window = 256);

  // A calibration measurement: kept for good (it anchors the fit on shapes that the running
  // load may not produce for a while, e.g. a long prefill chunk).
  void observe_anchor(const StepShape& shape, double ms);
  // A measured step.
  void observe(const StepShape& shape, double ms);

  double predict_ms(const StepShape& shape) const override;
  // Enough measurements of different shapes to predict (false: predict_ms returns 0).
  bool ready() const { return ready_; }
  const Coefs& coefs() const { return coefs_; }
  int64_t n_observed() const { return n_observed_; }
  // |predicted - measured| / measured of the recent steps, as predicted before each one ran
  // (how far the scheduler can trust the model): median and 90th percentile.
  double rel_error_p50() const;
  double rel_error_p90() const;

 private:
  struct Obs {
    std::array<double, kFeatures> x;
    double ms;
  };
  static std::array<double, kFeatures> features(const StepShape& s);
  void refit();

  int window_;
  std::vector<Obs> anchors_;
  std::vector<Obs> recent_;   // ring buffer of `window_` entries
  size_t next_ = 0;           // ring position
  std::vector<double> errors_;  // ring buffer of relative errors, same size as recent_
  size_t next_err_ = 0;
  Coefs coefs_{};
  bool ready_ = false;
  int64_t n_observed_ = 0;
};

}  // namespace tern
