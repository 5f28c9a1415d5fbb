#pragma once
// A draft model: a smaller model with the target's vocabulary that proposes the next tokens
// (llama.cpp's llama-speculative, vLLM's draft-model speculator). It keeps its own KV cache, one
// contiguous region of n_ctx slots per sequence it drafts for (`regions` of them), and drafts for
// many sequences in one batched forward per drafted token.
//
// What a region caches is a prefix of its sequence's tokens: propose() finds the longest common
// prefix of the cached tokens and the sequence's tokens, computes the rest (the sequence's new
// tokens since the last call, or its whole prompt the first time), then drafts one token per
// forward pass. Rejected drafts need no rollback: the next call's common prefix stops before them.
#include <climits>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "models/model.h"
#include "sampling/sampler.h"

namespace tern {

// Throws tern::Error when `draft` cannot draft for `target` (llama.cpp's rule): another
// tokenizer model, a vocabulary size differing by more than 128, other BOS/EOS ids, or a token
// text that differs among the first min(n_vocab) ids (from id 5 on, as llama.cpp checks). The
// message names both files, the key or token id and both values.
void check_draft_vocab(const GgufFile& target, const GgufFile& draft);

class DraftModel {
 public:
  // n_ctx: the longest sequence drafted for (a longer one gets no drafts); regions: sequences
  // drafted for at once. The KV arena holds n_ctx x regions tokens of kv_type.
  DraftModel(std::shared_ptr<const GgufFile> file, int64_t n_ctx, int64_t regions, KvType kv_type = KvType::F32);

  // One sequence's drafting job.
  struct Job {
    uint64_t key = 0;                    // the sequence (a region is kept per key until release())
    std::span<const int32_t> tokens;     // every token of the sequence so far (prompt + output)
    int n_draft = 0;                     // tokens to propose
    int32_t vocab_limit = INT32_MAX;     // the target's n_vocab: drafting stops before an id >= it
    // Null: greedy drafts (the draft's argmax). Else drafts are drawn with this sampler (built
    // with the DRAFT's n_vocab: it reads the draft's logits rows; the
    // target's sampling parameters, its own RNG) and each draft's distribution is appended to q.
    Sampler* sampler = nullptr;
    std::vector<int32_t>* out = nullptr;        // drafts appended here (fewer when out of context)
    std::vector<TokenDistribution>* q = nullptr;  // with a sampler: one per draft
  };
  // Drafts for every job; a job whose key has no region gets one if one is free, else no drafts.
  // Tokens out of the draft's vocabulary end a job's drafting (the vocabularies may differ in
  // size by up to 128).
  void propose(std::span<Job> jobs, ThreadPool& pool);
  // Frees the key's region (the sequence finished or was preempted).
  void release(uint64_t key);

  const HParams& hparams() const { return model_->hparams(); }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t kv_bytes() const { return kv_->bytes(); }
  int64_t weight_bytes() const { return model_->weight_bytes(); }
  const GgufFile& file() const { return *file_; }

 private:
  struct Region {
    int64_t base = 0;              // first slot
    std::vector<int32_t> cached;   // tokens whose K/V the region holds, positions 0 ..
  };
  std::shared_ptr<const GgufFile> file_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvStore> kv_;
  int64_t n_ctx_, n_regions_;
  std::unordered_map<uint64_t, Region> regions_;
  std::vector<int64_t> free_bases_;
  // Scratch reused across calls.
  std::vector<SeqBatch> batch_;
  std::vector<std::vector<int32_t>> slots_;   // [jobs] slot of every position of the step
  std::vector<std::vector<int32_t>> feed_;    // [jobs] tokens fed this pass
  std::vector<float> logits_;
};

}  // namespace tern
