#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/stats.h"
#include "core/thread_pool.h"
#include "train/rng.h"

namespace tern::train {
namespace {

// The run settings an exact resume depends on, stored in OUT.optim and compared on --resume.
struct RunKey {
  const char* key;
  int64_t TrainConfig::*field;
};
constexpr RunKey kRunKeys[] = {
    {"train.batch", &TrainConfig::n_seq},
    {"train.ctx", &TrainConfig::n_ctx},
    {"train.grad_accum", &TrainConfig::grad_accum},
};

}  // namespace

std::string optimizer_state_path(const std::string& model_path) { return model_path + ".optim"; }

Trainer::Trainer(TrainModel& model, const GgufFile& vocab, TrainConfig cfg, ThreadPool* pool)
    : Trainer(model, nullptr, vocab, std::move(cfg), pool, {}) {}

Trainer::Trainer(TrainModel& base, LoraWeights& lora, const GgufFile& vocab, TrainConfig cfg, ThreadPool* pool,
                 std::vector<std::pair<std::string, GgufValue>> adapter_keys)
    : Trainer(base, &lora, vocab, std::move(cfg), pool, std::move(adapter_keys)) {}

Trainer::Trainer(TrainModel& model, LoraWeights* lora, const GgufFile& vocab, TrainConfig cfg, ThreadPool* pool,
                 std::vector<std::pair<std::string, GgufValue>> adapter_keys)
    : model_(model), lora_(lora), vocab_(vocab), cfg_(std::move(cfg)), pool_(pool),
      fb_(model.shape, cfg_.n_seq, cfg_.n_ctx, pool),
      opt_(cfg_.opt, lora ? lora->n_params() : model.n_params()),
      grads_(size_t(lora ? lora->n_params() : model.n_params()), 0.0f),
      batch_(size_t(cfg_.n_seq * (cfg_.n_ctx + 1)), 0), adapter_keys_(std::move(adapter_keys)) {
  if (cfg_.grad_accum < 1) fail("--grad-accum must be at least 1 (got ", cfg_.grad_accum, ")");
  if (cfg_.steps < 0) fail("--steps must not be negative (got ", cfg_.steps, ")");
  cfg_.opt.total_steps = cfg_.steps;
  opt_.set_config(cfg_.opt);
  if (lora_ != nullptr) {
    fb_.set_lora(lora_);
    fb_.prepare(model_);  // the frozen base: once
  }
  if (cfg_.keep_zeros) {
    if (lora_ != nullptr) fail("keep_zeros is for full fine-tuning: an adapter's update is dense");
    n_frozen_ = opt_.freeze_zeros(model_.params, model_.data);
  }
}

void Trainer::set_qat(QatModel* qat, LoraMerge* merge) {
  if (lora_ == nullptr) {
    if (merge != nullptr) fail("QAT: a merged adapter without an adapter to train");
    qat_ = qat;
    return;
  }
  if (qat == nullptr) {  // back to plain LoRA on the frozen base
    qat_ = nullptr;
    merge_ = nullptr;
    model_grads_.clear();
    fb_.set_trained_weights({});
    fb_.set_lora(lora_);
    fb_.prepare(model_);
    return;
  }
  if (merge == nullptr) fail("QAT of an adapter runs on the base with the adapter merged in: give its LoraMerge");
  if (lora_->dropout > 0.0f)
    fail("QAT of a LoRA fine-tune merges the adapter into the weights, where dropout on its input has no place "
         "(give --dropout 0; it was ", lora_->dropout, ")");
  if (qat->quantized().params.size() != model_.params.size())
    fail("QAT of an adapter: the quantizer was made for another model (", qat->quantized().params.size(),
         " tensors, the base has ", model_.params.size(), ")");
  // The backward needs dW of the adapted matrices, and with LSQ of every matrix whose scales are
  // learned (their gradient comes from dL/dW_q); the rest of the base stays without gradients.
  std::vector<int64_t> trained = merge->adapted_offsets();
  for (size_t i = 0; i < model_.params.size(); ++i)
    if (qat->scale_offset(i) >= 0) trained.push_back(model_.params[i].offset);
  fb_.set_lora(nullptr);
  fb_.set_trained_weights(std::move(trained));
  model_grads_.assign(size_t(model_.n_params()), 0.0f);
  qat_ = qat;
  merge_ = merge;
  prepare();  // the forward's weights (and its FLOP count) for the quantized merged model
}

const TrainModel& Trainer::qat_latent() {
  if (merge_ == nullptr) return model_;
  merge_->update();
  return merge_->merged();
}

void Trainer::prepare() {
  if (qat_ != nullptr) {
    qat_->update(qat_latent());  // W_q from the latent weights (or adapter) the optimizer just changed
    fb_.prepare(qat_->quantized());
  } else if (lora_ != nullptr) {
    fb_.prepare_lora();
  } else {
    fb_.prepare(model_);
  }
}

void Trainer::finish_gradients(float* g) {
  if (qat_ != nullptr) qat_->straight_through(g);
  if (merge_ != nullptr) merge_->backward(g, grads_.data());
}

double Trainer::gradient(const int32_t* windows, uint64_t dropout_seed, float* g) {
  prepare();
  float* mg = micro_batch_grads();
  std::fill(mg, mg + (merge_ != nullptr ? model_grads_.size() : grads_.size()), 0.0f);
  fb_.set_dropout_seed(dropout_seed);
  const double loss = fb_.forward_backward(forward_model(), windows, mg, 1.0f, loss_ ? &loss_ : nullptr);
  finish_gradients(mg);
  std::copy(grads_.begin(), grads_.end(), g);
  return loss;
}

void Trainer::resume(const GgufFile& st, int64_t model_step) {
  const int64_t step = int64_t(st.get_uint("train.step"));
  if (step != model_step)
    fail(st.path(), " is at step ", step, " but its model checkpoint is at step ", model_step,
         ": a checkpoint write was interrupted between the two files; restart from an older copy");
  const uint64_t n_params = st.get_uint("train.n_params");
  if (int64_t(n_params) != n_trainable())
    fail(st.path(), ": optimizer state for ", n_params, " parameters, the ", lora_ ? "adapter" : "model", " has ",
         n_trainable());
  if (st.get_uint("train.seed") != cfg_.seed)
    fail("--resume: the run was started with --seed ", st.get_uint("train.seed"), ", not ", cfg_.seed,
         " (the data order would differ)");
  for (const RunKey& k : kRunKeys) {
    const int64_t was = int64_t(st.get_uint(k.key));
    if (was != cfg_.*k.field)
      fail("--resume: the run was started with ", std::string(k.key).substr(6), " ", was, ", not ", cfg_.*k.field,
           " (the losses would not continue the run; give the same value)");
  }
  if ((st.get_uint("train.shuffle") != 0) != cfg_.shuffle)
    fail("--resume: the run was started ", cfg_.shuffle ? "with --no-shuffle" : "with shuffling", "; give the same");
  // A QAT run's latent weights only make sense under the same quantizers (older files: no QAT).
  const std::string qat_was = st.get_string("train.qat", "none");
  const std::string qat_now = qat_ ? qat_->describe() : "none";
  if (qat_was != qat_now)
    fail("--resume: the run was started with QAT ", qat_was == "none" ? "off" : qat_was, ", not ",
         qat_now == "none" ? "off" : qat_now, " (give the same --qat and --qat-lsq)");
  for (const ParamInfo& p : trainable_params()) {
    for (int which = 0; which < 2; ++which) {
      const std::string name = p.name + (which == 0 ? ".adam_m" : ".adam_v");
      const GgufTensorInfo* t = st.find_tensor(name);
      if (t == nullptr) fail(st.path(), ": missing optimizer tensor ", name);
      if (t->type != DType::F32 || t->n_elements() != p.size)
        fail(st.path(), ": optimizer tensor ", name, " has shape ", t->shape_string(), ", expected ", p.size, " f32");
      std::memcpy((which == 0 ? opt_.m() : opt_.v()).data() + p.offset, t->data, size_t(p.size) * sizeof(float));
    }
  }
  if (qat_ != nullptr && qat_->lsq()) {
    const int64_t n = int64_t(qat_->scales().size());
    std::vector<float> log_scales(static_cast<size_t>(n));
    const std::pair<const char*, std::vector<float>*> lsq_state[] = {
        {"qat.log_scales", &log_scales},
        {"qat.scales.adam_m", &qat_->scale_optimizer().m()},
        {"qat.scales.adam_v", &qat_->scale_optimizer().v()}};
    for (const auto& [name, dst] : lsq_state) {
      const GgufTensorInfo* t = st.find_tensor(name);
      if (t == nullptr || t->type != DType::F32 || t->n_elements() != n)
        fail(st.path(), ": LSQ state ", name, " is missing or not ", n, " f32 values");
      std::memcpy(dst->data(), t->data, size_t(n) * sizeof(float));
    }
    qat_->set_log_scales(log_scales);
    qat_->update(qat_latent());
  }
  step_ = step;
  last_checkpoint_step_ = step;
}

void Trainer::save_checkpoint() {
  // The optimizer state first: a crash between the two renames leaves a newer .optim beside an
  // older model, which resume() detects by the step both carry.
  GgufWriter w(3);
  w.set("general.architecture", GgufValue::string("tern-optimizer-state"));
  w.set("train.step", GgufValue::u64(uint64_t(step_)));
  w.set("train.total_steps", GgufValue::u64(uint64_t(cfg_.steps)));
  w.set("train.n_params", GgufValue::u64(uint64_t(n_trainable())));
  w.set("train.seed", GgufValue::u64(cfg_.seed));
  w.set("train.shuffle", GgufValue::u32(cfg_.shuffle ? 1 : 0));
  for (const RunKey& k : kRunKeys) w.set(k.key, GgufValue::u64(uint64_t(cfg_.*k.field)));
  w.set("train.lr", GgufValue::f32(cfg_.opt.lr));
  w.set("train.min_lr", GgufValue::f32(cfg_.opt.min_lr));
  w.set("train.warmup", GgufValue::u64(uint64_t(cfg_.opt.warmup)));
  w.set("train.weight_decay", GgufValue::f32(cfg_.opt.weight_decay));
  w.set("train.beta1", GgufValue::f32(cfg_.opt.beta1));
  w.set("train.beta2", GgufValue::f32(cfg_.opt.beta2));
  w.set("train.eps", GgufValue::f32(cfg_.opt.eps));
  w.set("train.clip", GgufValue::f32(cfg_.opt.clip));
  w.set("train.qat", GgufValue::string(qat_ ? qat_->describe() : "none"));
  for (const ParamInfo& p : trainable_params()) {
    w.add_tensor(p.name + ".adam_m", DType::F32, {p.size}, opt_.m().data() + p.offset, uint64_t(p.size) * 4);
    w.add_tensor(p.name + ".adam_v", DType::F32, {p.size}, opt_.v().data() + p.offset, uint64_t(p.size) * 4);
  }
  if (qat_ != nullptr && qat_->lsq()) {
    // LSQ's scales and their moments: state of the run, as the latent weights are.
    const int64_t n = int64_t(qat_->scales().size());
    w.add_tensor("qat.log_scales", DType::F32, {n}, qat_->log_scales().data(), uint64_t(n) * 4);
    w.add_tensor("qat.scales.adam_m", DType::F32, {n}, qat_->scale_optimizer().m().data(), uint64_t(n) * 4);
    w.add_tensor("qat.scales.adam_v", DType::F32, {n}, qat_->scale_optimizer().v().data(), uint64_t(n) * 4);
  }
  if (checkpoint_extra_) checkpoint_extra_(w);
  w.write(optimizer_state_path(cfg_.out_path));
  if (lora_ != nullptr) {
    std::vector<std::pair<std::string, GgufValue>> keys = adapter_keys_;
    keys.emplace_back("tern.train.step", GgufValue::u64(uint64_t(step_)));
    save_lora(*lora_, model_.shape.arch, cfg_.out_path, keys);
  } else {
    save_model(model_, vocab_, cfg_.out_path, {{"tern.train.step", GgufValue::u64(uint64_t(step_))}});
  }
  last_checkpoint_step_ = step_;
}

double Trainer::validate(WindowSampler& val) {
  const int64_t want = cfg_.val_windows > 0 ? std::min(cfg_.val_windows, val.n_windows()) : val.n_windows();
  const int64_t n_batches = (want + cfg_.n_seq - 1) / cfg_.n_seq;
  prepare();
  double sum = 0.0;
  for (int64_t b = 0; b < n_batches; ++b) {
    // Windows in file order; the last batch wraps around to the first windows when `want` is not
    // a multiple of the batch (so every batch is full and the mean stays a mean of windows).
    for (int64_t s = 0; s < cfg_.n_seq; ++s) {
      const int64_t w = (b * cfg_.n_seq + s) % want;
      std::memcpy(batch_.data() + s * (cfg_.n_ctx + 1), val.window(w), size_t(cfg_.n_ctx + 1) * sizeof(int32_t));
    }
    sum += fb_.forward_loss(forward_model(), batch_.data());
  }
  return sum / double(n_batches);
}

TrainResult Trainer::run(WindowSampler& data, WindowSampler* val, const std::function<void(const StepLog&)>& on_step,
                         const std::atomic<bool>* stop) {
  TrainResult r;
  r.first_step = step_;
  const int64_t t_start = now_ns();
  const int64_t tokens_per_step = cfg_.grad_accum * cfg_.n_seq * cfg_.n_ctx;
  const float micro_scale = 1.0f / float(cfg_.grad_accum);
  int64_t run_steps = 0;
  while (step_ < cfg_.steps) {
    if (stop != nullptr && stop->load()) {
      r.interrupted = true;
      break;
    }
    if (cfg_.stop_after > 0 && run_steps >= cfg_.stop_after) break;
    const int64_t t0 = now_ns();
    prepare();
    float* g = micro_batch_grads();
    if (merge_ != nullptr) std::fill(model_grads_.begin(), model_grads_.end(), 0.0f);
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    double loss = 0.0;
    for (int64_t a = 0; a < cfg_.grad_accum; ++a) {
      const int64_t m = step_ * cfg_.grad_accum + a;
      data.batch(m, cfg_.n_seq, batch_.data());
      fb_.set_dropout_seed(mix_seed(cfg_.seed, 7, uint64_t(m)));  // LoRA dropout: a function of (seed, micro-batch)
      if (before_batch_) before_batch_(batch_.data(), cfg_.n_seq, cfg_.n_ctx);
      loss += fb_.forward_backward(forward_model(), batch_.data(), g, micro_scale, loss_ ? &loss_ : nullptr);
    }
    finish_gradients(g);
    loss /= double(cfg_.grad_accum);
    const double norm = global_norm(grads_.data(), int64_t(grads_.size()));
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      const std::string kept = last_checkpoint_step_ >= 0
                                   ? str_cat("the last checkpoint (step ", last_checkpoint_step_, ") is kept in ",
                                             cfg_.out_path)
                                   : std::string("no checkpoint had been written; nothing was saved");
      fail("training diverged: ", !std::isfinite(loss) ? "the loss" : "the gradient norm", " is ",
           !std::isfinite(loss) ? loss : norm, " at step ", step_ + 1, "; ", kept,
           " (try a lower --lr, a longer --warmup or --clip)");
    }
    StepLog log;
    log.lr = learning_rate(opt_.config(), step_);
    log.grad_norm = opt_.step(trainable_params(), trainable_data(), grads_.data(), step_, pool_);
    if (qat_ != nullptr && qat_->lsq()) qat_->step_scales(opt_.config(), step_);  // LSQ: the scales too
    ++step_;
    ++run_steps;
    log.step = step_;
    log.loss = loss;
    const int64_t t1 = now_ns();
    log.tok_s = double(tokens_per_step) / (double(t1 - t0) / 1e9);
    r.tokens += double(tokens_per_step);
    r.train_seconds += double(t1 - t0) / 1e9;
    const bool last = step_ == cfg_.steps;
    if (val != nullptr && ((cfg_.val_every > 0 && step_ % cfg_.val_every == 0) || last)) {
      log.val_loss = validate(*val);
      if (last) r.final_val_loss = log.val_loss;
    }
    if (cfg_.checkpoint_every > 0 && step_ % cfg_.checkpoint_every == 0 && !last) {
      save_checkpoint();
      log.checkpointed = true;
    }
    log.elapsed_s = double(now_ns() - t_start) / 1e9;
    if (on_step) on_step(log);
  }
  if (last_checkpoint_step_ != step_ || step_ == 0) save_checkpoint();
  r.last_step = step_;
  r.seconds = double(now_ns() - t_start) / 1e9;
  return r;
}

}  // namespace tern::train
