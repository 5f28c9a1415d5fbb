#pragma once
// A single sequence with a contiguous KV cache: what `tern run` and `tern ppl` drive.
// The serving engine uses the same Model::forward with paged slots instead.
//
// Owns the model, its KV store, the thread pool and the logits buffer; not thread-safe.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_policy.h"
#include "runtime/evicting_seq.h"
#include "models/model.h"

namespace tern {

struct SessionConfig {
  int64_t n_ctx = 0;       // 0: the model's training context
  int n_threads = 0;       // 0: all cores
  int64_t n_batch = 512;   // most new tokens per forward pass (longer prompts are chunked)
  KvType kv_type = KvType::F32;  // element type of the KV cache (--kv-type)
  // Eviction (--kv-policy): the arena holds kv_policy.capacity(n_ctx) tokens and the sequence may
  // grow past n_ctx, the policy choosing which tokens stay (kv/kv_policy.h).
  KvPolicy kv_policy;
  // Builds the model from the file (default: load_model); a parallel layout's (dist/) loads
  // this rank's part and runs steps over every rank.
  std::function<std::unique_ptr<Model>(std::shared_ptr<const GgufFile>)> load;
};

class Session {
 public:
  Session(std::shared_ptr<const GgufFile> file, const SessionConfig& cfg);

  // Appends `tokens` to the sequence (chunked by n_batch) and returns the logits of the last
  // one: [n_vocab]. With all_logits, returns every token's logits: [tokens.size(), n_vocab].
  // Throws tern::Error when the sequence would exceed n_ctx (without an evicting policy; with
  // one, prompts are chunked to what the cache can take beside its sinks, and the sequence
  // has no length limit).
  const float* eval(std::span<const int32_t> tokens, bool all_logits = false);
  void reset() { truncate(0); }
  // Runs every later eval() with these adapters (empty: the base model), each checked against
  // the model first (tern::Error naming the adapter file and tensor). The cache holds K/V of
  // the old adapters, so the sequence is reset.
  void set_lora(LoraSet lora);
  const LoraSet& lora() const { return lora_; }
  // Keeps the first n tokens' K/V and forgets the rest (n >= n_past: nothing changes); the next
  // eval() continues at position n, as a conversation that reuses its common prefix does.
  void truncate(int64_t n);

  // The sequence's tokens, positions 0 .. n_past-1 (with an evicting policy some of them are no
  // longer in the cache: n_resident()).
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int64_t n_past() const { return int64_t(tokens_.size()); }
  int64_t n_resident() const { return evicting_ ? evicting_->n_resident() : n_past(); }
  int64_t n_evicted() const { return evicting_ ? evicting_->n_evicted() : 0; }
  const KvPolicy& kv_policy() const { return policy_; }
  // Tokens the cache holds at most: n_ctx, or the policy's capacity.
  int64_t kv_capacity() const { return capacity_; }
  // Whether the sequence may grow past n_ctx (an evicting policy keeps its cache bounded).
  bool unbounded() const { return policy_.evicts(); }
  // Leading positions computed in forward passes of two tokens or more (prefill), not by
  // single-token decode steps: a caller that needs a continuation's logits to equal a fresh
  // prefill's bits re-evaluates the positions past it (tools/chat_loop.cpp).
  int64_t n_batched() const { return n_batched_; }
  int n_threads() const { return pool_.size(); }
  int64_t n_ctx() const { return n_ctx_; }
  Model& model() { return *model_; }
  const HParams& hparams() const { return model_->hparams(); }
  const GgufFile& file() const { return *file_; }
  ThreadPool& pool() { return pool_; }
  int64_t kv_bytes() const { return kv_->bytes(); }
  const KvStore& kv() const { return *kv_; }
  KvType kv_type() const { return kv_->type(); }

 private:
  void forward_evicting(std::span<const int32_t> step, bool all_logits, float* out);

  std::shared_ptr<const GgufFile> file_;
  std::unique_ptr<Model> model_;
  int64_t n_ctx_;
  int64_t n_batch_;
  ThreadPool pool_;
  std::unique_ptr<KvStore> kv_;
  std::vector<int32_t> slots_;   // [n_ctx] position -> slot (identity for one sequence)
  // With an evicting policy: the resident tokens over every slot of the arena.
  KvPolicy policy_;
  int64_t capacity_ = 0;
  std::unique_ptr<EvictingSequence> evicting_;
  std::vector<float> logits_;    // [n_batch, n_vocab] or [n_tokens, n_vocab] with all_logits
  std::vector<int32_t> tokens_;  // [n_past] the tokens in the cache
  int64_t n_batched_ = 0;
  LoraSet lora_;                 // the adapters every forward runs with
};

}  // namespace tern
