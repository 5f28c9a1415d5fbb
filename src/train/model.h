#pragma once
// The trainable Llama-family model: every parameter in f32, back to back in one array (so the
// optimizer, the gradient norm and the checkpoint see one flat vector), with a table naming
// each tensor as GGUF does. Written to GGUF it loads in `tern run` and in llama.cpp.
// A frozen base for LoRA (load_frozen_base) may instead keep its f16/bf16/quantized matrices in
// the file's encoding (EncodedTensor), so that a quantized base costs its file size (QLoRA).
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gguf/gguf.h"

namespace tern::train {

struct ModelShape {
  // "llama", or "deci" (llama.cpp's name for Llama with per-layer shapes, which structured
  // pruning writes so that llama.cpp loads it too): the key prefix loaded and saved.
  std::string arch = "llama";
  // n_head, n_head_kv, n_ff: every layer's, or with per-layer values the largest over the layers.
  int64_t n_vocab = 0, n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, n_ff = 0;
  int64_t n_ctx_train = 0;        // written as llama.context_length
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  bool tied_output = false;       // no output.weight: logits use token_embd
  // ReGLU FFN, max(gate, 0) * up, instead of SwiGLU: a ReLU-fied model (tern.ffn_activation
  // "relu", `tern sparsify --relufy`); llama.cpp does not know the key and would run it as SwiGLU.
  bool ffn_relu = false;
  // Layers that differ (a structured-pruned model: compress/structured.h): [n_layer] each, or
  // empty when every layer has n_head / n_head_kv / n_ff (then files keep the scalar keys).
  std::vector<int64_t> n_head_l, n_head_kv_l, n_ff_l;
  // attention.key_length (= value_length) when the file gives one that differs from
  // n_embd / head_count(0); 0: n_embd / head_count(0). Pruning keeps head_dim, not n_embd / n_head.
  int64_t n_embd_head = 0;
  // Per layer 1 where blk.N.attn_output.bias / blk.N.ffn_down.bias (f32 [n_embd], FLaP's bias
  // compensation) exist; empty: none.
  std::vector<uint8_t> attn_out_bias_l, ffn_down_bias_l;

  int64_t head_count(int64_t il) const { return n_head_l.empty() ? n_head : n_head_l[size_t(il)]; }
  int64_t head_count_kv(int64_t il) const { return n_head_kv_l.empty() ? n_head_kv : n_head_kv_l[size_t(il)]; }
  int64_t ff_length(int64_t il) const { return n_ff_l.empty() ? n_ff : n_ff_l[size_t(il)]; }
  bool has_attn_out_bias(int64_t il) const { return !attn_out_bias_l.empty() && attn_out_bias_l[size_t(il)] != 0; }
  bool has_ffn_down_bias(int64_t il) const { return !ffn_down_bias_l.empty() && ffn_down_bias_l[size_t(il)] != 0; }
  int64_t head_dim() const { return n_embd_head > 0 ? n_embd_head : n_embd / head_count(0); }
  int64_t q_width(int64_t il) const { return head_count(il) * head_dim(); }
  int64_t kv_width(int64_t il) const { return head_count_kv(il) * head_dim(); }
  bool uniform_layers() const;    // every layer has the same head counts and FFN width
  // Sets the per-layer values (empty ones: the scalars everywhere), the scalars to the largest,
  // and drops the vectors again when the layers agree (so a uniform shape has empty vectors).
  void set_per_layer(std::vector<int64_t> n_head_per_layer, std::vector<int64_t> n_head_kv_per_layer,
                     std::vector<int64_t> n_ff_per_layer);

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
  static constexpr int64_t kAbsent = INT64_MIN;  // an optional tensor the layer does not have
  int64_t attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
  int64_t bo = kAbsent, b_down = kAbsent;        // attn_output.bias, ffn_down.bias [n_embd]
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
// Per-layer head counts and FFN widths (arrays) and attn_output / ffn_down biases (trained, no
// weight decay) are read; throws tern::Error naming the file and tensor for another
// architecture, a tensor tern does not train (q/k/v biases, q/k norms, rope_freqs...), a
// missing tensor or a wrong shape.
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
// architecture keys llama.cpp's converter writes (head_count, head_count_kv and
// feed_forward_length as i32 arrays when the layers differ, key_length / value_length when
// head_dim is not n_embd / head_count), the tokenizer.* keys copied from `vocab`, and
// `extra` keys (e.g. the training step) after them.
void save_model(const TrainModel& model, const GgufFile& vocab, const std::string& path,
                const std::vector<std::pair<std::string, GgufValue>>& extra = {});

// The shape a GGUF file describes (llama.* keys and the vocabulary size).
ModelShape shape_of(const GgufFile& file);

}  // namespace tern::train
