#pragma once
// The trainable Llama-family model: every parameter in f32, back to back in one array (so the
// optimizer, the gradient norm and the checkpoint see one flat vector), with a table naming
// each tensor as GGUF does. Written to GGUF it loads in `tern run` and in llama.cpp.
// A frozen base for LoRA (load_frozen_base) may instead keep its f16/bf16/quantized matrices in
// the file's encoding (EncodedTensor), so that a quantized base costs its file size (QLoRA).
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
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

// One tensor inside TrainModel::data (or, offset < 0, kept encoded: TrainModel::encoded).
struct ParamInfo {
  std::string name;               // GGUF name: "blk.0.attn_q.weight"
  std::vector<int64_t> ne;        // ggml order: ne[0] is the row length
  int64_t offset = 0, size = 0;   // in floats; offset < 0: TrainModel::encoded[-1 - offset]
  bool decay = false;             // weight decay applies (matrices, not norms)
};

// A matrix of a frozen base kept in its file's encoding (f16, bf16 or a quantized block format:
// load_frozen_base). Nothing dequantizes it as a whole: the training forward and backward
// dequantize a tile of rows at a time into scratch (QLoRA), the embedding lookup a row per token.
struct EncodedTensor {
  DType type = DType::F32;
  const uint8_t* bytes = nullptr;  // into the GgufFile's mapping, which must outlive the model
  int64_t rows = 0, cols = 0;      // cols = ne[0], the row length
  int64_t row_bytes = 0;
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

  // Matrices kept encoded (load_frozen_base only): a param, and a LayerOffsets / tok_embd /
  // output field, whose offset is negative names encoded[-1 - offset] instead of floats in data.
  // Such a model is a frozen base: ForwardBackward runs it with a LoRA adapter only.
  std::vector<EncodedTensor> encoded;

  int64_t n_params() const { return int64_t(data.size()); }  // the floats in data
  int64_t n_elements() const;                                 // every parameter, encoded or not
  int64_t bytes_in_memory() const;                            // data's floats plus the encoded bytes
  static bool is_encoded(int64_t offset) { return offset < 0; }
  const EncodedTensor& encoded_at(int64_t offset) const { return encoded[size_t(-1 - offset)]; }
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

// The same model as a frozen base for LoRA (QLoRA when the file is quantized): the 2-D tensors
// stored as f16, bf16 or a quantized block type stay in the file's encoding (EncodedTensor,
// pointing into `file`'s mapping, so `file` must outlive the model); f32 tensors and the norms go
// to data as load_model puts them (an all-f32 file gives load_model's model). Every encoded row
// is dequantized once here, a row at a time, to refuse non-finite values as load_model does.
// Same errors as load_model.
TrainModel load_frozen_base(const GgufFile& file);

// "q4_k x 14, q6_k x 1: 12.3 MB kept encoded, 0.1 MB f32" (what a frozen base holds in memory).
std::string describe_base_memory(const TrainModel& model);

// Writes the model as an F32 GGUF through GgufWriter (temporary file, then rename): the
// architecture keys llama.cpp's converter writes, the tokenizer.* keys copied from `vocab`, and
// `extra` keys (e.g. the training step) after them.
void save_model(const TrainModel& model, const GgufFile& vocab, const std::string& path,
                const std::vector<std::pair<std::string, GgufValue>>& extra = {});

// The shape a GGUF file describes (llama.* keys and the vocabulary size).
ModelShape shape_of(const GgufFile& file);

}  // namespace tern::train
