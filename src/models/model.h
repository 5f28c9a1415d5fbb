#pragma once
// The model interface every architecture implements, and the data a forward pass consumes.
//
// A forward pass runs one *step*: a ragged batch of sequences, each contributing some new
// tokens at its own position (a whole prompt, a prefill chunk, one decode token, or a few
// speculative tokens: one mechanism). K/V are read and written through a slot mapping
// (position -> KV slot), so the same forward serves a contiguous cache and a paged one.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "kernels/matmul.h"
#include "models/hparams.h"
#include "models/lora.h"
#include "ops/attention_iface.h"

namespace tern {

// K/V storage for every layer: layer il holds [n_slots, n_head_kv(il) * head_dim] elements of
// `type` (f32, or IEEE half: llama.cpp's default, half the bytes) for K and for V. Sized once;
// slots are handed out by whoever owns the cache (runtime or kv/ block tables). New rows are
// written through store(), which converts to the store's type (round to nearest even, the same
// bits on every ISA); the attention kernels read the layer arenas k(il) / v(il) with
// kv_type = type() and rows of row(il) elements.
class KvStore {
 public:
  KvStore(const HParams& hp, int64_t n_slots, KvType type = KvType::F32);
  KvType type() const { return type_; }
  // Layer il's arenas: n_slots rows of row(il) elements of type().
  const void* k(int64_t il) const { return data_.data() + layer_offset_[size_t(il)]; }
  const void* v(int64_t il) const { return data_.data() + layer_offset_[size_t(il)] + layer_bytes(il); }
  // K and V of one slot, columns [c0, c0 + n) of its row, in layer il, from f32.
  void store(int64_t il, int64_t slot, int64_t c0, const float* k, const float* v, int64_t n);
  // Copies n slots starting at src to dst, every layer (copy-on-write of a shared block).
  void copy_slots(int64_t src, int64_t dst, int64_t n);
  int64_t n_slots() const { return n_slots_; }
  int64_t row(int64_t il = 0) const { return rows_[size_t(il)]; }
  int64_t bytes() const { return int64_t(data_.size()); }
  // Bytes one token takes: K and V, every layer.
  static int64_t bytes_per_token(const HParams& hp, KvType type);

 private:
  int64_t layer_bytes(int64_t il) const { return n_slots_ * rows_[size_t(il)] * elem_bytes_; }
  KvType type_;
  int64_t n_slots_, elem_bytes_;
  std::vector<int64_t> rows_;          // [n_layer] elements per slot and layer
  std::vector<int64_t> layer_offset_;  // [n_layer] byte offset of the layer's K arena (V follows)
  std::vector<uint8_t> data_;  // per layer: [K, V][n_slots][row(il)] elements of type_
};

// "f32" / "f16"; kv_type_from_name throws tern::Error naming the accepted values otherwise.
const char* kv_type_name(KvType type);
KvType kv_type_from_name(const std::string& name);

// Sees the input of every linear layer during forward (calibration for GPTQ, AWQ,
// SmoothQuant, LLM.int8() outlier detection). `weight` names the GGUF tensor about to be
// applied ("blk.3.attn_q.weight"); x is [n_tokens, n_in]. Called on the forward's thread.
class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  virtual void on_linear_input(const std::string& weight, const float* x, int64_t n_tokens, int64_t n_in) = 0;
};

// One sequence's share of a step.
struct SeqBatch {
  int64_t n_past = 0;                 // tokens of this sequence already in the KV cache
  std::span<const int32_t> tokens;    // new tokens, at positions n_past .. n_past+n-1
  std::span<const int32_t> slots;     // KV slot of every position 0 .. n_past+n-1
  bool all_logits = false;            // logits for every new token (perplexity) or the last only
  // When set: receives the final hidden state of every new token, [n_tokens, n_embd] f32: the
  // residual stream after the output norm, before the output projection (what llama.cpp's
  // embeddings of a decoder model are; logits = softcap(hidden x output^T)). Besides the
  // logits, which are computed as usual; written on every forward path, the same bits on each.
  float* hidden = nullptr;
  // The adapters this sequence runs with (nullptr or empty: the base model). Not owned; checked
  // against the model by Model::check_lora before use.
  const LoraSet* lora = nullptr;
};

// Rows of logits a step produces: sum over seqs of (all_logits ? n_tokens : 1).
int64_t n_logit_rows(std::span<const SeqBatch> seqs);

class Model {
 public:
  virtual ~Model() = default;
  const HParams& hparams() const { return hp_; }
  // Bytes of all weight tensors as stored (what a decode step streams).
  int64_t weight_bytes() const { return weight_bytes_; }
  // Where the matrices a decode step streams live (mapped file or interleaved copies), one span
  // per matrix, in the order a step reads them: what a bandwidth probe for the decode roofline
  // should read (the same bytes, where they are; tern bench).
  const std::vector<std::span<const uint8_t>>& decode_weight_memory() const { return decode_weight_memory_; }

  // Runs one step. logits: [n_logit_rows(seqs), n_vocab], rows in the order of `seqs`.
  // Writes the new tokens' K/V into `kv` at their slots, and the hidden states of the
  // sequences that ask for them (SeqBatch::hidden). max_tokens of the scratch bounds the total
  // new tokens of a step (see reserve()).
  virtual void forward(std::span<const SeqBatch> seqs, KvStore& kv, float* logits,
                       ThreadPool& pool) = 0;
  // Sizes the activation scratch for steps of up to n_tokens new tokens (allocates once).
  virtual void reserve(int64_t n_tokens) = 0;
  virtual int64_t max_step_tokens() const = 0;
  // Installs (or clears, with nullptr) an observer of linear-layer inputs. Not owned.
  void set_observer(ForwardObserver* observer) { observer_ = observer; }
  // Throws tern::Error naming the adapter and tensor when `adapter` has a pair this model does
  // not apply (LoraAdapter::check_base checks shapes against the file first).
  virtual void check_lora(const LoraAdapter& adapter) const = 0;

 protected:
  HParams hp_;
  int64_t weight_bytes_ = 0;
  std::vector<std::span<const uint8_t>> decode_weight_memory_;
  ForwardObserver* observer_ = nullptr;
};

// A loaded model keeps its file (and so the weight mapping) alive.
struct LoadedModel {
  std::shared_ptr<const GgufFile> file;
  std::unique_ptr<Model> model;
};

// Reads hyper-parameters of a GGUF model (any registered architecture); throws on missing or
// inconsistent keys.
HParams read_hparams(const GgufFile& file);
// Builds the architecture named by general.architecture; throws for unknown ones.
std::unique_ptr<Model> load_model(std::shared_ptr<const GgufFile> file);

// Whether the file starts with GGUF's magic. What a file is comes from its bytes, not its name:
// a GGUF renamed .bin is still a GGUF. False when it cannot be read (the loader that runs next
// reports why).
bool has_gguf_magic(const std::string& path);

// Opens MODEL (GGUF, or a llama2.c .bin when tokenizer_bin is given) and builds it.
std::shared_ptr<const GgufFile> open_model_file(const std::string& path,
                                                const std::string& tokenizer_bin = "");

}  // namespace tern
