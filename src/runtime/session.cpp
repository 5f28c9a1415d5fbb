#include "runtime/session.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace tern {

Session::Session(std::shared_ptr<const GgufFile> file, const SessionConfig& cfg)
    : file_(std::move(file)),
      model_(cfg.load ? cfg.load(file_) : load_model(file_)),
      n_ctx_(cfg.n_ctx > 0 ? cfg.n_ctx : model_->hparams().n_ctx_train),
      n_batch_(std::max<int64_t>(1, std::min(cfg.n_batch, n_ctx_))),
      pool_(cfg.n_threads > 0 ? cfg.n_threads : default_thread_count()) {
  if (n_ctx_ <= 0 || n_ctx_ > (1 << 24)) fail("context size ", n_ctx_, " is out of range");
  check_kv_type(cfg.kv_type, kv_rows(model_->hparams()), model_->hparams().head_dim, file_->path());
  policy_ = cfg.kv_policy;
  capacity_ = n_ctx_;
  if (policy_.evicts()) {
    check_policy_for_model(policy_, *model_, file_->path());
    check_policy_for_kv_type(policy_, cfg.kv_type, file_->path());
    policy_.check_fits(n_ctx_);
    capacity_ = policy_.capacity(n_ctx_);
    // A step's tokens must fit beside the sinks (KvResidency::make_room).
    n_batch_ = std::max<int64_t>(1, std::min(n_batch_, capacity_ - policy_.sinks));
    evicting_ = std::make_unique<EvictingSequence>(policy_, capacity_);
  }
  kv_ = std::make_unique<KvStore>(make_kv_store(model_->hparams(), capacity_, cfg.kv_type));
  slots_.resize(size_t(capacity_));
  std::iota(slots_.begin(), slots_.end(), 0);
  if (evicting_) evicting_->add_slots(slots_);
  model_->reserve(n_batch_);
}

// One step under an evicting policy (runtime/evicting_seq.h).
void Session::forward_evicting(std::span<const int32_t> step, bool all_logits, float* out) {
  SeqBatch sb;
  evicting_->begin_step(sb, n_past(), step, *model_, *kv_);
  sb.all_logits = all_logits;
  sb.lora = lora_.empty() ? nullptr : &lora_;
  model_->forward(std::span<const SeqBatch>(&sb, 1), *kv_, out, pool_);
  evicting_->end_step(*kv_, *model_);
}

const float* Session::eval(std::span<const int32_t> tokens, bool all_logits) {
  const int64_t n = int64_t(tokens.size());
  if (n == 0) fail("eval of an empty token list");
  if (!policy_.evicts() && n_past() + n > n_ctx_)
    fail("the sequence needs ", n_past() + n, " tokens but the context holds ", n_ctx_,
         " (raise --ctx or shorten the prompt)");
  const int64_t V = model_->hparams().n_vocab;
  for (int32_t id : tokens)
    if (id < 0 || id >= V) fail("token id ", id, " is out of range for a vocabulary of ", V);
  const size_t need = size_t(all_logits ? n : 1) * size_t(V);
  if (logits_.size() < need) logits_.resize(need);
  for (int64_t i = 0; i < n; i += n_batch_) {
    const int64_t m = std::min(n_batch_, n - i);
    const int64_t past = n_past();
    float* out = all_logits ? logits_.data() + i * V : logits_.data();
    if (policy_.evicts()) {
      const auto step = tokens.subspan(size_t(i), size_t(m));
      forward_evicting(step, all_logits, out);
      tokens_.insert(tokens_.end(), step.begin(), step.end());
      if (m >= 2 && n_batched_ == past) n_batched_ = past + m;
      continue;
    }
    SeqBatch sb;
    sb.n_past = past;
    sb.tokens = tokens.subspan(size_t(i), size_t(m));
    sb.slots = std::span<const int32_t>(slots_.data(), size_t(past + m));
    sb.all_logits = all_logits;
    sb.lora = lora_.empty() ? nullptr : &lora_;
    if (model_->hparams().recurrent()) sb.state_slot = 0;  // the session's one sequence
    model_->forward(std::span<const SeqBatch>(&sb, 1), *kv_, out, pool_);
    tokens_.insert(tokens_.end(), sb.tokens.begin(), sb.tokens.end());
    if (m >= 2 && n_batched_ == past) n_batched_ = past + m;
  }
  return logits_.data();
}

void Session::set_lora(LoraSet lora) {
  for (const LoraUse& use : lora) {
    TERN_ASSERT(use.adapter);
    use.adapter->check_base(*file_);
    model_->check_lora(*use.adapter);
  }
  lora_ = std::move(lora);
  reset();
}

void Session::truncate(int64_t n) {
  if (n < 0) fail("truncate to ", n, " tokens");
  if (n < n_past() && n > 0 && model_->hparams().recurrent()) {
    // A recurrent state holds the whole prefix in a fixed size and cannot be rolled back to an
    // earlier position: recompute it from the tokens kept (the next eval from 0 zeroes it).
    const std::vector<int32_t> keep(tokens_.begin(), tokens_.begin() + n);
    tokens_.clear();
    n_batched_ = 0;
    eval(keep);
    return;
  }
  if (n < n_past()) {
    tokens_.resize(size_t(n));
    if (evicting_) evicting_->truncate(n, *model_, *kv_);
  }
  n_batched_ = std::min(n_batched_, n_past());
}

}  // namespace tern
