#pragma once
// Token-level knowledge distillation losses (Hinton et al.; MiniLLM for the reverse KL): the
// student's logits against a teacher's at every position, on temperature-softened
// distributions, mixed with the hard-label cross-entropy:
//
//   loss_row = hard_weight * CE(softmax(z), target) + (1 - hard_weight) * T^2 * D
//   D = KL(t || s)                      forward KL ("mean-seeking")
//     | KL(s || t)                      reverse KL ("mode-seeking")
//     | mix * KL(t || s) + (1 - mix) * KL(s || t)
//   s = softmax(z / T), t = softmax(z_teacher / T)
//
// (T^2 keeps the soft term's gradient on the scale of the hard one as T grows.) Gradients with
// respect to z: forward T (s - t); reverse T s_j (log s_j - log t_j - KL(s || t)); CE softmax(z) - onehot.
#include <cstdint>
#include <string>

namespace tern {
class ThreadPool;
}

namespace tern::train {

enum class KdDivergence { None, Forward, Reverse, Mix };

// "fkl", "rkl", "mix", "none"; throws tern::Error naming the choices otherwise.
KdDivergence parse_kd_divergence(const std::string& name);
const char* kd_divergence_name(KdDivergence d);

struct KdConfig {
  KdDivergence divergence = KdDivergence::Forward;
  double temperature = 2.0;
  double mix = 0.5;          // weight of the forward KL in Mix
  double hard_weight = 0.1;  // weight of the hard-label cross-entropy
};

// student [n][n_vocab] logits in, d(grad_scale * sum of row losses)/d(logits) out (in place);
// teacher [n][n_vocab]; targets [n] (< 0: the hard term is skipped at that row). Returns the
// sum of the row losses. Instantiated for float and double (the tests' finite differences).
template <class T>
double kd_loss_fused(ThreadPool* pool, const KdConfig& c, int64_t n, int64_t n_vocab, T* student, const T* teacher,
                     const int32_t* targets, T grad_scale);
// The loss alone (student untouched).
template <class T>
double kd_loss(ThreadPool* pool, const KdConfig& c, int64_t n, int64_t n_vocab, const T* student, const T* teacher,
               const int32_t* targets);

}  // namespace tern::train
