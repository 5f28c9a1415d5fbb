#pragma once
// The GGUF format of a sparsity predictor (Deja Vu; issue #31, docs/sparsity.md "Predictor"):
// per layer of a ReLU-fied (ReGLU) model, a low-rank guess of which FFN neurons a token makes
// active, so that a sparse FFN computes those rows alone. `tern predictor train`
// (compress/ffn_predictor.h) writes it into a copy of the model; the runtime reads it here.
//
//   blk.{il}.ffn_pred_a.weight  F32, ne [n_embd, rank]: h = A xn       (xn: the FFN's normalised input)
//   blk.{il}.ffn_pred_b.weight  F32, ne [rank, n_ff]:   score = B h
//   tern.ffn_predictor.rank       u32
//   tern.ffn_predictor.threshold  f32 array [n_layer]: neuron j of layer il is predicted active
//                                 when score_j > threshold[il]
//   tern.ffn_predictor.recall     f32 array [n_layer]: the recall that threshold gave on
//                                 held-out tokens (fraction of truly active neurons predicted)
//   tern.ffn_predictor.model      string: ffn_gate_fingerprint() of the model it was trained on
//   blk.{il}.ffn_act_freq         F32, ne [n_ff], optional: the fraction of the calibration tokens
//                                 on which neuron j was active (hot / cold placement under
//                                 --ram-budget keeps the most frequent resident; models/neuron_store.h)
//
// Layers without a dense gated FFN (experts, recurrent mixers, n_ff 0) have no tensors; their
// threshold and recall entries are 0.
#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace tern {

inline constexpr const char* kFfnPredictorRankKey = "tern.ffn_predictor.rank";
inline constexpr const char* kFfnPredictorThresholdKey = "tern.ffn_predictor.threshold";
inline constexpr const char* kFfnPredictorRecallKey = "tern.ffn_predictor.recall";
inline constexpr const char* kFfnPredictorModelKey = "tern.ffn_predictor.model";

// "blk.{il}.ffn_pred_a.weight", "blk.{il}.ffn_pred_b.weight".
std::string ffn_pred_a_name(int64_t il);
std::string ffn_pred_b_name(int64_t il);
// "blk.{il}.ffn_act_freq".
std::string ffn_act_freq_name(int64_t il);
// True for a predictor tensor's name (a rewrite of the model drops the old predictor's).
bool is_ffn_predictor_tensor(const std::string& name);

// Identifies a model's FFN gates: FNV-1a (64-bit) over, for every layer in order that has
// blk.{il}.ffn_gate.weight, the layer index, the tensor's type, its shape and its bytes (taken
// 8 at a time as little-endian words, the tail byte by byte: 8 times faster than per byte, and
// the gates are most of what a load reads anyway). 16 hex digits.
// `release_pages`: each gate's pages go back to the kernel once hashed (GgufFile::
// release_pages_around), so that the hash does not leave the gates resident (--ram-budget).
std::string ffn_gate_fingerprint(const GgufFile& model, bool release_pages = false);

struct FfnPredictorLayer {
  int64_t n_ff = 0;         // 0: the layer has no predictor (no dense FFN)
  const float* a = nullptr;  // [rank][n_embd] into the predictor file's mapping
  const float* b = nullptr;  // [n_ff][rank]
  const float* freq = nullptr;  // [n_ff] activation frequencies, nullptr when the file has none
};

struct FfnPredictor {
  int64_t n_embd = 0, rank = 0;
  std::vector<float> threshold, recall;  // [n_layer]
  std::vector<FfnPredictorLayer> layers;  // [n_layer]
  std::string fingerprint;                // of the model it was made for

  int64_t n_layer() const { return int64_t(layers.size()); }
  bool has_layer(int64_t il) const { return layers[size_t(il)].n_ff > 0; }
};

// True when `f` holds a predictor (its rank key).
bool has_ffn_predictor(const GgufFile& f);

// Reads the predictor of `f` (often the model file itself) for `model`: every dense layer of
// the model (blk.{il}.ffn_gate.weight present) must have both tensors, F32, of the shapes above
// for the model's n_embd and ff_length(il); the arrays must have n_layer entries; the
// fingerprint must be `model`'s. Throws tern::Error naming the file, the key or tensor and the
// shape; a fingerprint mismatch says "a predictor made for another model". The layers' pointers
// are into f's mapping: f must outlive the result.
// `release_pages` as ffn_gate_fingerprint's.
FfnPredictor read_ffn_predictor(const GgufFile& f, const GgufFile& model, bool release_pages = false);

}  // namespace tern
