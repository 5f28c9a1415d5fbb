#pragma once
// Activation sparsity of a model's dense FFNs (issue #31, docs/sparsity.md): over a text, how
// often each neuron's activation, the input of ffn_down, is zero. A ReLU-fied model's (ReGLU,
// `tern sparsify --relufy`) zeros are exact: neurons whose gate is <= 0 contribute nothing, and
// a decode that skips them reads fewer weight bytes. The per-neuron counts give the hot/cold
// split (neurons active most often stay resident).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compress/calibrate.h"

namespace tern {

struct FfnActivity {
  int64_t n_tokens = 0;                        // tokens every layer saw
  std::vector<int64_t> n_ff;                   // [n_layer] FFN width (0: no dense FFN)
  std::vector<std::vector<int64_t>> active;    // [n_layer][n_ff] tokens where the neuron was not zero
  std::vector<int64_t> zeros;                  // [n_layer] zero activations over every token and neuron
  double seconds = 0;

  int64_t n_layer() const { return int64_t(n_ff.size()); }
  // Fraction of layer il's activations that were zero.
  double sparsity(int64_t il) const;
  // Over every layer with a dense FFN, weighted by its width.
  double mean_sparsity() const;
  // Fraction of layer il's neurons needed to cover `share` of its non-zero activations, the
  // most active first (how concentrated the activity is: a small hot set serves most tokens).
  double hot_fraction(int64_t il, double share) const;
};

// Runs `model` over opts' text (run_calibration_text) and counts, per layer and neuron, the
// tokens whose FFN activation is not zero (|a| > threshold). Layers without a dense FFN
// (experts, recurrent mixers) keep n_ff 0. Throws tern::Error as calibrate() does, and when the
// model has no dense FFN at all.
FfnActivity measure_ffn_activity(std::shared_ptr<const GgufFile> model, const CalibOptions& opts,
                                 float threshold = 0.0f);

}  // namespace tern
