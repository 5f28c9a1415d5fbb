#pragma once
// The training loop: micro-batches with gradient accumulation, AdamW, validation, checkpoints
// and resume.
//
// A checkpoint is two GGUF files written through temporary files and renames (a crash never
// leaves a half-written one): OUT (the model: loads in `tern run` and llama.cpp; it carries
// `tern.train.step`) and OUT.optim (AdamW's moments `<tensor>.adam_m` / `.adam_v`, the step and
// the run's settings). Resuming restores the weights and moments bit for bit, and the data order
// and learning rate are functions of (seed, step), so the losses after a resume equal those of
// an uninterrupted run on the same machine and thread count.
//
// LoRA (the second constructor): the base model is frozen and the adapter's A and B are what
// the optimizer updates; OUT is then the adapter (models/lora.h's GGUF format, with
// `tern.train.step`) and OUT.optim holds the adapter tensors' moments.
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "train/data.h"
#include "train/forward_backward.h"
#include "train/lora.h"
#include "train/model.h"
#include "train/optimizer.h"
#include "train/qat.h"
#include "train/qat_lora.h"

namespace tern {
class ThreadPool;
}

namespace tern::train {

struct TrainConfig {
  int64_t n_seq = 8;          // sequences per micro-batch (--batch)
  int64_t n_ctx = 256;        // tokens per sequence (--ctx)
  int64_t grad_accum = 1;     // micro-batches per optimizer step
  int64_t steps = 100;        // total optimizer steps of the run (the schedule's length)
  int64_t stop_after = 0;     // > 0: stop after this many steps in this invocation (checkpoint written)
  OptimizerConfig opt;
  uint64_t seed = 42;
  bool shuffle = true;
  int64_t val_every = 0;      // steps between validations (0: never; the last step always validates)
  int64_t val_windows = 64;   // windows of the validation stream used (0: all)
  int64_t checkpoint_every = 0;  // steps between checkpoints (0: only at the end / on stop)
  std::string out_path;       // checkpoint (model) path; OUT.optim beside it
  bool keep_zeros = false;    // the model's exact zeros in matrices stay 0 (sparse fine-tuning)
};

struct StepLog {
  int64_t step = 0;           // optimizer steps completed (1-based)
  double loss = 0.0;          // mean over the step's micro-batches, before the update
  double lr = 0.0, grad_norm = 0.0;
  double tok_s = 0.0;         // training tokens per second of this step
  double elapsed_s = 0.0;     // since the run started
  std::optional<double> val_loss;
  bool checkpointed = false;
};

struct TrainResult {
  int64_t first_step = 0, last_step = 0;  // steps run in this invocation: (first, last]
  double tokens = 0.0, seconds = 0.0;
  double train_seconds = 0.0;  // in the steps themselves (no validation, no checkpoints)
  std::optional<double> final_val_loss;
  bool interrupted = false;
};

// The optimizer state file beside a checkpoint.
std::string optimizer_state_path(const std::string& model_path);

class Trainer {
 public:
  // vocab: the GGUF whose tokenizer.* keys the checkpoints carry.
  Trainer(TrainModel& model, const GgufFile& vocab, TrainConfig cfg, ThreadPool* pool);
  // Trains `lora` on the frozen `base` (both must outlive the trainer). The checkpoints are
  // adapters carrying `adapter_keys` and tern.train.step.
  Trainer(TrainModel& base, LoraWeights& lora, const GgufFile& vocab, TrainConfig cfg, ThreadPool* pool,
          std::vector<std::pair<std::string, GgufValue>> adapter_keys = {});

  // Restores AdamW's state and the step from OUT.optim (the model, or the adapter, must already
  // hold OUT's weights). Throws tern::Error when the files do not belong together or the shape differs.
  void resume(const GgufFile& optim_state, int64_t model_step);
  int64_t step() const { return step_; }
  int64_t n_frozen() const { return n_frozen_; }  // keep_zeros: matrix entries held at 0

  // Quantization-aware training from now on (nullptr: off): every forward and validation runs on
  // qat->quantized(), the gradients pass back to the model's latent weights through the clipped
  // straight-through estimator, and the checkpoints keep the latent weights (so --resume continues
  // the run). `qat` must outlive the trainer's runs.
  // With an adapter (QAT of a LoRA fine-tune, train/qat_lora.h), `qat` quantizes merge->merged()
  // (the base with the adapter merged in) and `merge` is required: the forward runs the quantized
  // merged model and the straight-through gradient reaches A and B by the chain rule. The
  // adapter's dropout must be 0 (merged into the weights, its input is the layer's).
  void set_qat(QatModel* qat, LoraMerge* merge = nullptr);
  QatModel* qat() const { return qat_; }
  // The model QAT quantizes, up to date: the model itself, or the merged one (brought up to the
  // adapter's current values first).
  const TrainModel& qat_latent();

  // More run state for OUT.optim (a distillation projection and its moments): called by every
  // save_checkpoint with the writer before it writes; what it adds must stay alive until then.
  void set_checkpoint_extra(std::function<void(GgufWriter&)> f) { checkpoint_extra_ = std::move(f); }

  // d(loss)/d(trainable parameters) of one micro-batch at the current weights (what a step with
  // grad_accum 1 uses: under QAT through the straight-through estimator, and for QAT of an
  // adapter the chain rule to A and B) into g (n_trainable(), overwritten); dropout from
  // dropout_seed. Returns the loss.
  double gradient(const int32_t* windows, uint64_t dropout_seed, float* g);

  // Custom loss on the logits (distillation); called for each micro-batch after before_batch.
  void set_loss(LossFn loss) { loss_ = std::move(loss); }
  void set_before_batch(std::function<void(const int32_t* windows, int64_t n_seq, int64_t n_ctx)> f) {
    before_batch_ = std::move(f);
  }

  // Trains until cfg.steps (or stop_after more steps, or *stop becomes true: then the checkpoint
  // is written and result.interrupted is set). on_step sees every step. A non-finite loss or
  // gradient stops with a tern::Error that names the step and the last checkpoint kept.
  TrainResult run(WindowSampler& data, WindowSampler* val, const std::function<void(const StepLog&)>& on_step,
                  const std::atomic<bool>* stop);

  // Mean cross-entropy over the sampler's first val_windows windows (all when 0).
  double validate(WindowSampler& val);

  // Writes the checkpoint pair for the current step.
  void save_checkpoint();

  ForwardBackward& forward_backward() { return fb_; }
  // What the optimizer updates: the model's tensors, or the adapter's.
  const std::vector<ParamInfo>& trainable_params() const { return lora_ ? lora_->params : model_.params; }
  std::vector<float>& trainable_data() { return lora_ ? lora_->data : model_.data; }
  int64_t n_trainable() const { return lora_ ? lora_->n_params() : model_.n_params(); }
  bool lora() const { return lora_ != nullptr; }

 private:
  Trainer(TrainModel& model, LoraWeights* lora, const GgufFile& vocab, TrainConfig cfg, ThreadPool* pool,
          std::vector<std::pair<std::string, GgufValue>> adapter_keys);
  void prepare();  // the forward's copies of what changed (every weight, or the adapter's)
  // After a step's micro-batches: the straight-through estimator and, for QAT of an adapter, the
  // chain rule from the merged weights' gradient (model_grads_) to the adapter's (grads_).
  void finish_gradients(float* g);
  float* micro_batch_grads() { return merge_ != nullptr ? model_grads_.data() : grads_.data(); }
  // The model the forward runs: the fake-quantized twin under QAT, else the model.
  const TrainModel& forward_model() const { return qat_ ? qat_->quantized() : model_; }

  TrainModel& model_;
  LoraWeights* lora_;
  const GgufFile& vocab_;
  TrainConfig cfg_;
  ThreadPool* pool_;
  ForwardBackward fb_;
  AdamW opt_;
  std::vector<float> grads_;
  std::vector<int32_t> batch_;
  int64_t step_ = 0;
  int64_t last_checkpoint_step_ = -1;
  int64_t n_frozen_ = 0;  // keep_zeros: matrix entries held at 0
  LossFn loss_;
  QatModel* qat_ = nullptr;
  LoraMerge* merge_ = nullptr;     // QAT of an adapter: the merged model
  std::vector<float> model_grads_;  // QAT of an adapter: d(loss)/d(merged weights)
  std::function<void(GgufWriter&)> checkpoint_extra_;
  std::function<void(const int32_t*, int64_t, int64_t)> before_batch_;
  std::vector<std::pair<std::string, GgufValue>> adapter_keys_;
};

}  // namespace tern::train
