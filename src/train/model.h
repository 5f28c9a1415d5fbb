#pragma once
// The trainable Llama-family model: every parameter in f32, back to back in one array (so the
// optimizer, the gradient norm and the checkpoint see one flat vector), with a table naming
// each tensor as GGUF does. Written to GGUF it loads in `tern run` and in llama.cpp.
#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace tern::train {

struct ModelShape {
  int64_t n_vocab = 0, n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, n_ff = 0;
  int64_t n_ctx_train = 0;        // written as llama.context_length
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  bool tied_output = false;       // no output.weight: logits use token_embd

  int64_t head_dim() const { return n_embd / n_head; }
  // Throws tern::Error naming the first inconsistent field (what = where it came from).
  void validate(const std::string& what) const;
  std::string describe() const;   // "n_embd 64, n_layer 5, ..."
  bool same_architecture(const ModelShape& o) const;  // every field but n_ctx_train
};

// One tensor inside TrainModel::data.
struct ParamInfo {
  std::string name;               // GGUF name: "blk.0.attn_q.weight"
  std::vector<int64_t> ne;        // ggml order: ne[0] is the row length
  int64_t offset = 0, size = 0;   // in floats
  bool decay = false;             // weight decay applies (matrices, not norms)
};

// Offsets (in floats, into data or into a gradient array of the same layout) of a layer's tensors.
struct LayerOffsets {
  int64_t attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
};

struct TrainModel {
  ModelShape shape;
  std::vector<ParamInfo> params;  // in GGUF order
  std::vector<float> data;        // every parameter
  int64_t tok_embd = 0, output_norm = 0, output = 0;  // offsets; output == tok_embd when tied
  std::vector<LayerOffsets> layers;

  int64_t n_params() const { return int64_t(data.size()); }
  const ParamInfo* find(const std::string& name) const;
};

// The parameter table of a shape (data sized, zero).
TrainModel make_model(const ModelShape& shape);

// A new model: matrices N(0, 0.02^2), the projections back into the residual stream (attn_output,
// ffn_down) scaled by 1 / sqrt(2 n_layer) (GPT-2's rule, so the residual's variance does not grow
// with depth), norms 1. The same seed gives the same weights on every machine (own PRNG).
TrainModel init_model(const ModelShape& shape, uint64_t seed);

// A Llama-architecture GGUF's weights as f32 (f16, bf16 and quantized tensors are dequantized).
// Throws tern::Error naming the file and tensor for another architecture, a tensor tern does not
// train (biases, q/k norms, rope_freqs...), a missing tensor or a wrong shape.
TrainModel load_model(const GgufFile& file);

// Writes the model as an F32 GGUF through GgufWriter (temporary file, then rename): the
// architecture keys llama.cpp's converter writes, the tokenizer.* keys copied from `vocab`, and
// `extra` keys (e.g. the training step) after them.
void save_model(const TrainModel& model, const GgufFile& vocab, const std::string& path,
                const std::vector<std::pair<std::string, GgufValue>>& extra = {});

// The shape a GGUF file describes (llama.* keys and the vocabulary size).
ModelShape shape_of(const GgufFile& file);

}  // namespace tern::train
