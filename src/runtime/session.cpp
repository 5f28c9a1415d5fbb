#include "runtime/session.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace tern {

Session::Session(std::shared_ptr<const GgufFile> file, const SessionConfig& cfg)
    : file_(std::move(file)),
      model_(load_model(file_)),
      n_ctx_(cfg.n_ctx > 0 ? cfg.n_ctx : model_->hparams().n_ctx_train),
      n_batch_(std::max<int64_t>(1, std::min(cfg.n_batch, n_ctx_))),
      pool_(cfg.n_threads > 0 ? cfg.n_threads : default_thread_count()) {
  if (n_ctx_ <= 0 || n_ctx_ > (1 << 24)) fail("context size ", n_ctx_, " is out of range");
  if (cfg.kv_type != KvType::F32 && cfg.kv_type != KvType::F16) fail("unknown KV cache type");
  kv_ = std::make_unique<KvStore>(model_->hparams(), n_ctx_, cfg.kv_type);
  slots_.resize(size_t(n_ctx_));
  std::iota(slots_.begin(), slots_.end(), 0);
  model_->reserve(n_batch_);
}

const float* Session::eval(std::span<const int32_t> tokens, bool all_logits) {
  const int64_t n = int64_t(tokens.size());
  if (n == 0) fail("eval of an empty token list");
  if (n_past() + n > n_ctx_)
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
    SeqBatch sb;
    sb.n_past = past;
    sb.tokens = tokens.subspan(size_t(i), size_t(m));
    sb.slots = std::span<const int32_t>(slots_.data(), size_t(past + m));
    sb.all_logits = all_logits;
    sb.lora = lora_.empty() ? nullptr : &lora_;
    float* out = all_logits ? logits_.data() + i * V : logits_.data();
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
  if (n < n_past()) tokens_.resize(size_t(n));
  n_batched_ = std::min(n_batched_, n_past());
}

}  // namespace tern
