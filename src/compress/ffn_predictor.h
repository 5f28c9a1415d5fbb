#pragma once
// Training a sparsity predictor (Deja Vu; issue #31, docs/sparsity.md "Predictor") for a
// ReLU-fied (ReGLU) model: per dense layer, a low-rank map score = B (A xn) of the FFN's
// normalised input that says which neurons the token makes active (gate > 0), so that a sparse
// FFN computes only those rows of ffn_gate, ffn_up and ffn_down. The format it is written in
// (tensors, keys, the model fingerprint) is models/ffn_predictor_format.h.
//
// Why the map has no bias: the neuron is active when its gate row's dot product with xn is
// positive, itself a linear function of xn without bias; a rank-r factorisation of the gate
// rows (the initialization here) already is such a predictor, and training sharpens it where
// the signs are decided.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compress/calibrate.h"
#include "gguf/gguf.h"

namespace tern {

struct PredictorTrainOptions {
  CalibOptions calib;        // text, tokens (every 10th held out), sequence length, threads
  int64_t rank = 32;         // 1 .. n_embd
  double recall = 0.99;      // (0, 1]: each layer's threshold keeps at least this recall on held-out tokens
  int epochs = 8;            // passes of Adam over the training tokens (0: the factorisation alone)
  float lr = 2e-3f;          // Adam's step
  int64_t batch = 256;       // tokens per minibatch
  double pos_weight = 1.0;   // active neurons' loss weight, times the balanced (1 - rate) / rate
  uint64_t seed = 1;         // minibatch order (the result is the same for any thread count)
  ProgressFn progress;
};

struct PredictorLayerReport {
  int64_t layer = 0, n_ff = 0;
  double true_active = 0;       // fraction of held-out (token, neuron) activations that are not zero
  double predicted_active = 0;  // fraction predicted active: the rows a sparse FFN computes
  double recall = 0;            // of the truly active, the fraction predicted active (held out)
  float threshold = 0;
  double loss_init = 0, loss = 0;  // held-out weighted cross-entropy before and after training
  int64_t predictor_bytes = 0, ffn_bytes = 0;  // A and B (f32) against ffn_gate + ffn_up + ffn_down
};

struct PredictorTrainReport {
  int64_t rank = 0, n_train = 0, n_eval = 0;  // tokens (BOS included) trained on and held out
  std::string fingerprint;
  std::vector<PredictorLayerReport> layers;  // dense layers only
  double calib_seconds = 0, train_seconds = 0;
};

// The trained predictor before it is written: per layer [n_layer], empty for layers without a
// dense FFN.
struct TrainedPredictor {
  int64_t n_embd = 0, rank = 0;
  std::vector<std::vector<float>> a;  // [n_layer][rank][n_embd]
  std::vector<std::vector<float>> b;  // [n_layer][n_ff][rank]
  std::vector<float> threshold, recall;  // [n_layer]
  // [n_layer][n_ff]: the fraction of all calibration tokens (held-out ones too) on which each
  // neuron was active; written as blk.{il}.ffn_act_freq (empty: not written).
  std::vector<std::vector<float>> freq;
  PredictorTrainReport report;
};

// Runs `model` over opts.calib's text, collects each dense layer's (xn, active mask) pairs,
// trains A and B and picks the thresholds. Throws tern::Error when the model is not ReGLU
// (tern.ffn_activation relu), the rank or recall is out of range, the text is too short
// (calibrate's error), or no dense FFN ran.
TrainedPredictor train_ffn_predictor(std::shared_ptr<const GgufFile> model, const PredictorTrainOptions& opts);

// Runs the predictor stored in `model` (read_ffn_predictor against the model itself) over
// calib's text and measures, over every token, each dense layer's recall, predicted-active and
// truly active fractions at the stored thresholds: how the thresholds hold on text they were not
// picked on. Throws as read_ffn_predictor and run_calibration_text do.
std::vector<PredictorLayerReport> evaluate_ffn_predictor(std::shared_ptr<const GgufFile> model, const CalibOptions& calib);

// Writes `out`: every key and tensor of `model` unchanged (a predictor it had is replaced),
// then the predictor's tensors and keys.
void write_with_ffn_predictor(const GgufFile& model, const TrainedPredictor& p, const std::string& out);

}  // namespace tern
