#pragma once
// Feature- and relation-based distillation (tern distill --loss): losses on the student's hidden
// states against the teacher's, next to the response-based (logit) loss of train/distill.h.
//
//   loss = w_response * KD(logits) + w_feature * mean over feature pairs of F
//        + w_relation * mean over relation pairs of R + w_attention * mean over attention pairs of A
//
// Feature (FitNets / TinyBERT's hidden-state loss), per pair (student layer s, teacher layer t):
//   F = sum over tokens i of (1 / n_embd_t) |W h_s,i + b - h_t,i|^2
// h = a layer's residual-stream output. W [n_embd_t][n_embd_s] and b [n_embd_t] are a learned
// projection, trained with the student (its own AdamW on the same schedule), when the widths
// differ; with equal widths there is none (W = I, b = 0). The projection lives in HiddenDistill
// (the distill command's memory): it is not part of the student and not in its GGUF, but it is
// run state like the optimizer's moments, so a checkpoint's OUT.optim holds it (and its own
// moments) and --resume continues it bit for bit (save_state / restore_state).
//
// Relation (MiniLM's self-attention relation, on the states themselves), per pair:
//   R = sum over tokens i of (1 / (i + 1)) sum over j <= i in i's sequence of (cos_s(i, j) - cos_t(i, j))^2
// cos(i, j) = h_i . h_j / (|h_i| |h_j|), |h| = sqrt(h . h + eps): causal (a position relates to
// itself and the positions before it, as the model's attention sees them), per sequence, so the
// matrices are n_ctx x n_ctx whatever the widths and need no projection. Cosine rather than a
// softmax of dot products: the residual stream's norm grows with depth and differs between the
// models, which would make a softmax's sharpness (and a KL between rows) depend on it.
//
// Attention (TinyBERT's / MiniLM's attention transfer), per pair: the layers' causal attention
// probabilities P_h(i, .) = softmax over j <= i of q_h,i . k_h,j / sqrt(head_dim), after RoPE:
//   A = sum over tokens i of (1 / H) sum over heads h of KL(P_t,h(i, .) || P_s,h(i, .))   equal head counts
//     = sum over tokens i of KL(mean_h P_t,h(i, .) || mean_h P_s,h(i, .))                 otherwise
// (head_dim may differ: the distributions are over positions). Its gradient enters the student's
// backward at the layer's dq, dk (ForwardBackward::set_attention_loss).
//
// Every loss writes grad_scale * its gradient; the sums are per token so that ForwardBackward's
// mean (over the scored tokens) puts them on the cross-entropy's scale.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "train/forward_backward.h"
#include "train/model.h"
#include "train/optimizer.h"

namespace tern {
class ThreadPool;
}

namespace tern::train {

// The --loss terms' weights.
struct DistillLossWeights {
  double response = 1.0, feature = 0.0, relation = 0.0, attention = 0.0;
  bool hidden() const { return feature > 0.0 || relation > 0.0 || attention > 0.0; }
};

// "response=1,feature=0.5,relation=0.5,attention=0.5": comma-separated term=weight, each term at most once,
// weights finite and >= 0, at least one > 0; a term left out weighs 0. Throws tern::Error naming
// the bad part and the terms.
DistillLossWeights parse_distill_loss(const std::string& spec);

struct LayerPair {
  int64_t student = 0, teacher = 0;  // 0-based layers whose outputs are compared
};

// "S:T,S:T,..." (0-based layers; "-1" is the last one); throws tern::Error naming `option`, the
// bad pair and the valid range.
std::vector<LayerPair> parse_layer_pairs(const std::string& spec, int64_t n_layer_student, int64_t n_layer_teacher,
                                         const std::string& option);
// min(n_s, n_t) pairs evenly spaced through both models, the last pairing the last layers:
// pair k (1..n) is student layer round(k n_s / n) - 1 with teacher layer round(k n_t / n) - 1.
std::vector<LayerPair> default_feature_pairs(int64_t n_layer_student, int64_t n_layer_teacher);
std::string describe_pairs(const std::vector<LayerPair>& pairs);  // "1:2,3:5"

// F of one pair summed over the n rows (w == nullptr: no projection, e_s == e_t). Adds
// grad_scale times dF/d(hs), dF/dW, dF/db to d_hs, d_w, d_b (each nullptr: not wanted).
template <class T>
double feature_mse(ThreadPool* pool, int64_t n, int64_t e_s, int64_t e_t, const T* hs, const T* ht, const T* w,
                   const T* b, T* d_hs, T* d_w, T* d_b, T grad_scale);

// R of one pair over n_seq sequences of n_ctx rows; adds grad_scale * dR/d(hs) to d_hs (nullptr: none).
template <class T>
double relation_cos_mse(ThreadPool* pool, int64_t n_seq, int64_t n_ctx, int64_t e_s, int64_t e_t, const T* hs,
                        const T* ht, T* d_hs, T grad_scale);

// A layer's attention heads, for attention_kl.
struct HeadShape {
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0;
};

// A of one pair over n_seq sequences of n_ctx rows: student queries qs [n][n_head * head_dim],
// keys ks [n][n_head_kv * head_dim], the teacher's likewise; adds grad_scale * dA/d(qs), dA/d(ks)
// to dqs, dks (nullptr: none).
template <class T>
double attention_kl(ThreadPool* pool, int64_t n_seq, int64_t n_ctx, const HeadShape& hs, const T* qs, const T* ks,
                    const HeadShape& ht, const T* qt, const T* kt, T* dqs, T* dks, T grad_scale);

struct HiddenDistillConfig {
  double feature_weight = 0.0, relation_weight = 0.0, attention_weight = 0.0;
  std::vector<LayerPair> feature_pairs, relation_pairs, attention_pairs;
  OptimizerConfig opt;     // the projections' (the student's settings)
  int64_t grad_accum = 1;  // micro-batches per optimizer step
  int64_t first_step = 0;  // the step the run starts at (a resume's)
  uint64_t seed = 42;      // the projections' initialisation
};

// The teacher side and the projections of feature/relation distillation.
//
// The teacher runs as a train::TrainModel forward-only (load_model: its weights dequantized to
// f32) rather than as the inference runtime's Session: the training forward keeps every layer's
// residual-stream output (ForwardBackward::layer_output), which the runtime's fused decode path
// does not expose, so no hook in src/runtime or src/models is needed; and its logits serve the
// response term too, so the teacher runs once per micro-batch. The cost: the teacher must be a
// Llama-family model that tern trains (load_model's architectures).
class HiddenDistill {
 public:
  HiddenDistill(HiddenDistillConfig cfg, TrainModel teacher, const ModelShape& student, int64_t n_seq, int64_t n_ctx,
                ThreadPool* pool);

  // Runs the teacher on a micro-batch (windows as ForwardBackward's); call before the student's
  // forward_backward on the same windows.
  void teacher_forward(const int32_t* windows);
  // The teacher's logits of the last teacher_forward, [n_seq * n_ctx][n_vocab].
  const float* teacher_logits() const { return teacher_fb_.logits(); }
  const ModelShape& teacher_shape() const { return teacher_.shape; }

  // Installs the loss on the student's ForwardBackward (set_hidden_loss). Every
  // cfg.grad_accum-th call of the loss (the last micro-batch of a step) updates the projections.
  void attach(ForwardBackward& student);

  // The weighted feature, relation and attention losses of the last micro-batch, per token (for logs).
  double last_feature() const { return last_feature_; }
  double last_relation() const { return last_relation_; }
  double last_attention() const { return last_attention_; }
  // The projections (empty when the widths agree): "distill.proj.S_T.weight" [n_embd_t][n_embd_s], ".bias".
  const std::vector<ParamInfo>& projection_params() const { return proj_params_; }
  std::vector<float>& projection_data() { return proj_data_; }

  // The projections' run state, for OUT.optim: per projection tensor "<name>" (its values) and
  // "<name>.adam_m" / ".adam_v" (its moments), shaped as the tensor. save_state adds them to w
  // (pointing into this object, which must be unchanged until w writes); restore_state copies
  // them back and throws tern::Error naming the tensor and both shapes when the checkpoint's
  // projections differ from this run's (another --feature-layers, another width, a projection
  // missing or left over).
  void save_state(GgufWriter& w);
  void restore_state(const GgufFile& optim_state);

  // The losses themselves (what attach() installs), public for the tests.
  double loss(const std::vector<const float*>& states, const std::vector<float*>& grads, int64_t n_tok, int64_t n_embd,
              float grad_scale);
  double attention_loss(const std::vector<const float*>& q, const std::vector<const float*>& k,
                        const std::vector<float*>& dq, const std::vector<float*>& dk, float grad_scale);

 private:
  HiddenDistillConfig cfg_;
  TrainModel teacher_;
  ModelShape student_;
  int64_t n_seq_, n_ctx_;
  ThreadPool* pool_;
  ForwardBackward teacher_fb_;
  std::vector<int64_t> layers_;            // the student layers the loss reads, in states[] order
  std::vector<int64_t> attn_layers_;       // the student layers attention_loss reads, in q[] order
  std::vector<ParamInfo> proj_params_;     // per feature pair: weight, bias (none when widths agree)
  std::vector<float> proj_data_, proj_grad_;
  std::unique_ptr<AdamW> proj_opt_;
  int64_t n_calls_ = 0;
  double last_feature_ = 0.0, last_relation_ = 0.0, last_attention_ = 0.0;
};

}  // namespace tern::train
