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
#include "core/error.h"
#include "kv/kv_store.h"
#include "models/partition.h"
#include "ops/attention_iface.h"

namespace tern {

// The K/V arena (kv/kv_store.h) for this model's layers: check_kv_type's error (naming the
// architecture and shape) when `type` cannot store its rows.
std::vector<int64_t> kv_rows(const HParams& hp);
// A recurrent model's store also holds n_state_slots sequence states (KvStore::set_state_rows).
KvStore make_kv_store(const HParams& hp, int64_t n_slots, KvType type = KvType::F32, int64_t n_state_slots = 1);
int64_t kv_bytes_per_token(const HParams& hp, KvType type);

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
  // Keys of this sequence already in the KV cache: slots[0 .. n_past) are theirs, in position
  // order. Without eviction they are positions 0 .. n_past-1; a cache policy that evicts
  // (kv/kv_policy.h) leaves fewer keys than positions, and `pos` says where the new tokens are.
  int64_t n_past = 0;
  std::span<const int32_t> tokens;    // new tokens, at positions first_pos() .. first_pos()+n-1
  std::span<const int32_t> slots;     // [n_past + n] KV slot of each cached key, then of each new token
  bool all_logits = false;            // logits for every new token (perplexity) or the last only
  // When set: receives the final hidden state of every new token, [n_tokens, n_embd] f32: the
  // residual stream after the output norm, before the output projection (what llama.cpp's
  // embeddings of a decoder model are; logits = softcap(hidden x output^T)). Besides the
  // logits, which are computed as usual; written on every forward path, the same bits on each.
  float* hidden = nullptr;
  // The adapters this sequence runs with (nullptr or empty: the base model). Not owned; checked
  // against the model by Model::check_lora before use.
  const LoraSet* lora = nullptr;
  // When set (H2O): key_mass[j] += key j's attention probability (j < n_past + n, slots order),
  // summed over layers, query heads and the new tokens. Not cleared.
  float* key_mass = nullptr;
  // RoPE position of the first new token; -1: n_past (nothing evicted). Evicted positions are
  // simply absent from `slots`; the kept keys keep the rotations of their original positions.
  int64_t pos = -1;
  // Recurrent models (HParams::recurrent()): the sequence's state slot in the KvStore, which the
  // model zeroes when n_past == 0 and carries from step to step; -1 for a transformer.
  int32_t state_slot = -1;
  int64_t first_pos() const { return pos >= 0 ? pos : n_past; }
};

// Rows of logits a step produces: sum over seqs of (all_logits ? n_tokens : 1).
int64_t n_logit_rows(std::span<const SeqBatch> seqs);

struct SparseFfnConfig;
class SparseFfn;

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
  // One pipeline stage's share of a step, for a model loaded as a part (models/partition.h,
  // dist/): the first stage embeds the tokens, a later one reads its input from x [T, n_embd];
  // the stage runs its layers (K/V into `kv`, which holds its layers); the last stage writes the
  // logits as forward() does, an earlier one its output into x. Hidden states and key masses are
  // not produced.
  virtual void forward_stage(std::span<const SeqBatch> seqs, KvStore& kv, float* x, float* logits, ThreadPool& pool) {
    (void)seqs, (void)kv, (void)x, (void)logits, (void)pool;
    TERN_ASSERT_MSG(false, "this model does not run as pipeline stages");
  }
  // Copies n K/V slots from src to dst in every layer (copy-on-write of a shared block). A model
  // spread over processes (dist/) copies them on every rank.
  virtual void copy_kv_slots(KvStore& kv, int64_t src, int64_t dst, int64_t n) { kv.copy_slots(src, dst, n); }
  // What a model spread over processes (dist/) may not provide: the final hidden states
  // (SeqBatch::hidden: embeddings) and KV eviction (key masses, re-rotated keys).
  virtual bool has_hidden_states() const { return true; }
  virtual bool can_evict_kv() const { return true; }
  // Sizes the activation scratch for steps of up to n_tokens new tokens (allocates once).
  virtual void reserve(int64_t n_tokens) = 0;
  virtual int64_t max_step_tokens() const = 0;
  // Installs (or clears, with nullptr) an observer of linear-layer inputs. Not owned.
  void set_observer(ForwardObserver* observer) { observer_ = observer; }
  // Throws tern::Error naming the adapter and tensor when `adapter` has a pair this model does
  // not apply (LoraAdapter::check_base checks shapes against the file first).
  virtual void check_lora(const LoraAdapter& adapter) const = 0;
  // Decodes with the predicted-sparse FFN from now on (models/sparse_ffn_runtime.h, --sparse-ffn):
  // a dense ReGLU decoder with a predictor. Throws tern::Error naming the model and what it
  // lacks otherwise (this default: every model that is not such a decoder).
  virtual void enable_sparse_ffn(const SparseFfnConfig& cfg);
  // The sparse FFN enabled above (its counts and bytes), nullptr when off.
  virtual SparseFfn* sparse_ffn() { return nullptr; }
  // Rotates stored keys of layer il as if they sat `delta` positions later: k is [n_rows,
  // n_embd_kv(il)] as the cache holds them (RoPE applied). RoPE's rotations compose, so
  // R(delta) R(p) k = R(p + delta) k. False (k untouched) when this model's rotary embedding is
  // not a pure rotation (YaRN scales its magnitude) or it has none.
  virtual bool rotate_keys(int64_t il, float* k, int64_t n_rows, int64_t delta) const {
    (void)il, (void)k, (void)n_rows, (void)delta;
    return false;
  }
  // StreamingLLM's sinks that follow the window (runtime/evicting_seq.h), on this model's cache:
  // keep the keys stored in `slot` as they are now (KvStore::pin_keys), store them rotated
  // `shift` positions later from that copy (rotate_keys; V untouched), and forget the copy. A
  // model spread over processes (dist/) does each on every rank's part of the cache.
  virtual void keep_sink_keys(KvStore& kv, int32_t slot) const { kv.pin_keys(slot); }
  virtual void place_sink_keys(KvStore& kv, int32_t slot, int64_t shift) const;
  virtual void drop_sink_keys(KvStore& kv, int32_t slot) const { kv.unpin_keys(slot); }

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
// The part of it `part` names (models/partition.h): a tensor-parallel shard and/or pipeline stage.
std::unique_ptr<Model> load_model(std::shared_ptr<const GgufFile> file, const ModelPartition& part);

// Whether the file starts with GGUF's magic. What a file is comes from its bytes, not its name:
// a GGUF renamed .bin is still a GGUF. False when it cannot be read (the loader that runs next
// reports why).
bool has_gguf_magic(const std::string& path);

// Opens MODEL (GGUF, or a llama2.c .bin when tokenizer_bin is given) and builds it.
std::shared_ptr<const GgufFile> open_model_file(const std::string& path,
                                                const std::string& tokenizer_bin = "");

}  // namespace tern
