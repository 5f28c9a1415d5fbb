// Mamba-2 ("mamba2": state-spaces/mamba2-130m ... 2.7b, Mamba-Codestral), llama.cpp's layout and
// arithmetic (build_mamba2_layer). No attention and no FFN; per layer x += mixer(RMSNorm(x)), the
// mixer being models/ssm2_block.h (which states its arithmetic); then the output norm and
// projection (tied to token_embd when `output` is absent).
//
// A sequence's state (per layer: the conv window's last d_conv - 1 inputs of every conv
// channel, then the heads' [head_dim][d_state] states) lives in the KvStore's state slot
// SeqBatch::state_slot and is zeroed when the sequence starts (n_past == 0). A step runs the
// matmuls over every token at once, the conv over channels and the scan over heads in parallel;
// the scan takes its chunked "SSD" form (small matrix products per chunk of 64 tokens) for a
// sequence's prefill of 8 tokens or more and the recurrence token by token otherwise (decode),
// see models/ssm2_block.h. The two agree to float rounding, not bit for bit: a prompt in one
// step, in chunks or token by token gives the same greedy ids and logits within ~1e-5 relative
// (TERN_SSM_SCAN=recurrent: the recurrence everywhere, the same bits).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "models/linear.h"
#include "models/recurrent_step.h"
#include "models/registry.h"
#include "models/ssm2_block.h"
#include "models/tensor_names.h"
#include "models/weight_loader.h"
#include "ops/ops.h"

namespace tern {
namespace {

struct Ssm2Layer {
  const float* norm = nullptr;  // [n_embd]
  Ssm2Weights mix;
};

class Mamba2Model final : public Model {
 public:
  Mamba2Model(const ArchSpec& spec, std::shared_ptr<const GgufFile> file) : file_(std::move(file)) {
    (void)spec;
    hp_ = read_hparams(*file_);
    WeightLoader ld(file_);
    bind(ld);
    ld.start_loading();
    bind(ld);
    arena_ = ld.take_arena();
    extra_ = ld.take_extra();
    for (const auto& t : file_->tensors()) weight_bytes_ += int64_t(t.n_bytes);
    for (const Ssm2Layer& L : layers_)
      for (const Linear* l : {&L.mix.in, &L.mix.out})
        decode_weight_memory_.emplace_back(static_cast<const uint8_t*>(l->w.data), size_t(l->w.n_out * l->w.row_bytes()));
    decode_weight_memory_.emplace_back(static_cast<const uint8_t*>(output_.w.data),
                                       size_t(output_.w.n_out * output_.w.row_bytes()));
  }

  void check_lora(const LoraAdapter& adapter) const override {
    fail(adapter.path(), ": LoRA adapters on ", hp_.arch, " (state-space) models are not supported yet");
  }
  // Evicting keys means nothing to a recurrent state; and a pipeline / tensor split is refused.
  bool can_evict_kv() const override { return false; }

  void reserve(int64_t n_tokens) override {
    if (n_tokens <= max_tokens_) return;
    max_tokens_ = n_tokens;
    const size_t T = size_t(n_tokens), E = size_t(hp_.n_embd);
    x_.assign(T * E, 0.0f);
    xn_.assign(T * E, 0.0f);
    mixer_.reserve(hp_, n_tokens);
    out_rows_.assign(T * E, 0.0f);
  }
  int64_t max_step_tokens() const override { return max_tokens_; }

  void forward(std::span<const SeqBatch> seqs, KvStore& kv, float* logits, ThreadPool& pool) override;

 private:
  void bind(WeightLoader& ld);
  void ssm_layer(const Ssm2Layer& L, int64_t il, std::span<const SeqBatch> seqs, KvStore& kv, int64_t T,
                 ThreadPool& pool);

  std::shared_ptr<const GgufFile> file_;
  HugeBuffer arena_;
  std::vector<HugeBuffer> extra_;
  WeightView tok_embd_;
  Linear output_;
  const float* output_norm_ = nullptr;
  std::vector<Ssm2Layer> layers_;
  int64_t max_tokens_ = 0;
  LinearHooks hooks_;
  // Scratch sized by reserve(); T = the step's tokens.
  std::vector<float> x_;         // [T, n_embd] residual stream
  std::vector<float> xn_;        // [T, n_embd] a layer's normalised input, then its output
  Ssm2Block mixer_;              // the Mamba-2 mixer's scratch
  std::vector<float> out_rows_;  // [rows needing logits, n_embd]
};

void Mamba2Model::bind(WeightLoader& ld) {
  const int64_t E = hp_.n_embd, V = hp_.n_vocab;
  output_norm_ = ld.vector(tensor_name(Tensor::OutputNorm), E, "norm weights");
  if (ld.has(tensor_name(Tensor::Output))) {
    tok_embd_ = ld.rows(tensor_name(Tensor::TokenEmbd), E, V);
    output_ = Linear{tensor_name(Tensor::Output), ld.matmul(tensor_name(Tensor::Output), E, V)};
  } else {
    tok_embd_ = ld.matmul(tensor_name(Tensor::TokenEmbd), E, V);  // tied (see decoder.cpp)
    output_ = Linear{tensor_name(Tensor::TokenEmbd), tok_embd_};
  }
  layers_.assign(size_t(hp_.n_layer), Ssm2Layer{});
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    Ssm2Layer& L = layers_[size_t(il)];
    L.norm = ld.vector(tensor_name(Tensor::AttnNorm, il), E, "norm weights");
    L.mix = bind_ssm2(ld, hp_, il, file_->path());
  }
}

void Mamba2Model::forward(std::span<const SeqBatch> seqs, KvStore& kv, float* logits, ThreadPool& pool) {
  const int64_t E = hp_.n_embd, V = hp_.n_vocab;
  const int64_t T = begin_recurrent_step(seqs, kv, tok_embd_, V, E, max_tokens_, x_.data());
  if (T == 0) return;
  hooks_ = LinearHooks{observer_, nullptr};
  for (int64_t il = 0; il < hp_.n_layer; ++il) ssm_layer(layers_[size_t(il)], il, seqs, kv, T, pool);

  // The rows that need logits (every token's, or each sequence's last), through the output norm.
  const int64_t rows = gather_logit_rows(seqs, x_.data(), E, out_rows_.data(), [&](const float* in, float* out,
                                                                                    int64_t n) {
    rms_norm(in, output_norm_, out, n, E, hp_.rms_eps, pool);
  });
  rms_norm(out_rows_.data(), output_norm_, out_rows_.data(), rows, E, hp_.rms_eps, pool);
  apply_linear(output_, out_rows_.data(), E, rows, logits, V, pool, hooks_);
}

void Mamba2Model::ssm_layer(const Ssm2Layer& L, int64_t il, std::span<const SeqBatch> seqs, KvStore& kv, int64_t T,
                            ThreadPool& pool) {
  const int64_t E = hp_.n_embd;
  rms_norm(x_.data(), L.norm, xn_.data(), T, E, hp_.rms_eps, pool);
  mixer_.run(L.mix, hp_, il, seqs, kv, xn_.data(), xn_.data(), T, pool, hooks_);
  add_inplace(x_.data(), xn_.data(), T * E);
}

}  // namespace

std::unique_ptr<Model> make_mamba2(const ArchSpec& spec, std::shared_ptr<const GgufFile> file) {
  return std::make_unique<Mamba2Model>(spec, std::move(file));
}

}  // namespace tern
