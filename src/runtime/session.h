#pragma once
// A single sequence with a contiguous KV cache: what `tern run` and `tern ppl` drive.
// The serving engine uses the same Model::forward with paged slots instead.
//
// Owns the model, its KV store, the thread pool and the logits buffer; not thread-safe.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "models/model.h"

namespace tern {

struct SessionConfig {
  int64_t n_ctx = 0;       // 0: the model's training context
  int n_threads = 0;       // 0: all cores
  int64_t n_batch = 512;   // most new tokens per forward pass (longer prompts are chunked)
  KvType kv_type = KvType::F32;  // element type of the KV cache (--kv-type)
};

class Session {
 public:
  Session(std::shared_ptr<const GgufFile> file, const SessionConfig& cfg);

  // Appends `tokens` to the sequence (chunked by n_batch) and returns the logits of the last
  // one: [n_vocab]. With all_logits, returns every token's logits: [tokens.size(), n_vocab].
  // Throws tern::Error when the sequence would exceed n_ctx.
  const float* eval(std::span<const int32_t> tokens, bool all_logits = false);
  void reset() { n_past_ = 0; }

  int64_t n_past() const { return n_past_; }
  int64_t n_ctx() const { return n_ctx_; }
  Model& model() { return *model_; }
  const HParams& hparams() const { return model_->hparams(); }
  const GgufFile& file() const { return *file_; }
  ThreadPool& pool() { return pool_; }
  int64_t kv_bytes() const { return kv_->bytes(); }
  KvType kv_type() const { return kv_->type(); }

 private:
  std::shared_ptr<const GgufFile> file_;
  std::unique_ptr<Model> model_;
  int64_t n_ctx_;
  int64_t n_batch_;
  ThreadPool pool_;
  std::unique_ptr<KvStore> kv_;
  std::vector<int32_t> slots_;   // [n_ctx] position -> slot (identity for one sequence)
  std::vector<float> logits_;    // [n_batch, n_vocab] or [n_tokens, n_vocab] with all_logits
  int64_t n_past_ = 0;
};

}  // namespace tern
