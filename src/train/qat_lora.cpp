#include "train/qat_lora.h"

#include <algorithm>

#include "core/error.h"
#include "train/gemm.h"

namespace tern::train {

LoraMerge::LoraMerge(const TrainModel& base, const LoraWeights& lora, ThreadPool* pool)
    : base_(base), lora_(lora), pool_(pool) {
  if (!base.encoded.empty())
    fail("QAT of a LoRA fine-tune merges the adapter into the base's weights: the base must be f32 in memory "
         "(load_model), not kept encoded (", base.encoded.size(), " matrices are)");
  merged_ = base;
  int64_t widest = 0, widest_in = 0;
  for (const LoraSlot& sl : lora.slots) {
    const ParamInfo* p = base.find(sl.target);
    if (p == nullptr) fail("QAT of a LoRA fine-tune: the base has no ", sl.target, " to merge the adapter into");
    if (p->ne.size() != 2 || p->ne[0] != sl.n_in || p->ne[1] != sl.n_out)
      fail("QAT of a LoRA fine-tune: ", sl.target, " is not ", sl.n_in, " x ", sl.n_out, " as the adapter's is");
    adapted_offsets_.push_back(p->offset);
    widest = std::max(widest, sl.n_in * sl.n_out);
    widest_in = std::max(widest_in, sl.n_in);
  }
  prod_.assign(size_t(widest), 0.0f);
  a_t_.assign(size_t(widest_in * lora.rank), 0.0f);
  update();
}

void LoraMerge::update() {
  const int64_t r = lora_.rank;
  const float s = lora_.scale();
  for (size_t i = 0; i < lora_.slots.size(); ++i) {
    const LoraSlot& sl = lora_.slots[i];
    const int64_t n = sl.n_in * sl.n_out, off = adapted_offsets_[i];
    // P = B A: C[n_out][n_in] = sum over the rank of B[o][j] A[j][:].
    gemm(pool_, false, sl.n_out, sl.n_in, r, lora_.data.data() + sl.b, r, lora_.data.data() + sl.a, sl.n_in,
         prod_.data(), sl.n_in, false);
    const float* w0 = base_.data.data() + off;
    float* w = merged_.data.data() + off;
    for (int64_t k = 0; k < n; ++k) w[k] = w0[k] + s * prod_[size_t(k)];
  }
}

void LoraMerge::backward(const float* g, float* g_lora) {
  const int64_t r = lora_.rank;
  const float s = lora_.scale();
  for (size_t i = 0; i < lora_.slots.size(); ++i) {
    const LoraSlot& sl = lora_.slots[i];
    const float* G = g + adapted_offsets_[i];  // [n_out][n_in]
    const float* A = lora_.data.data() + sl.a;
    const float* B = lora_.data.data() + sl.b;
    float* dA = g_lora + sl.a;
    float* dB = g_lora + sl.b;
    // dB [n_out][rank] = s G A^T: gemm's B operand is A^T [n_in][rank].
    transpose(pool_, r, sl.n_in, A, sl.n_in, a_t_.data(), r);
    gemm(pool_, false, sl.n_out, r, sl.n_in, G, sl.n_in, a_t_.data(), r, dB, r, false);
    // dA [rank][n_in] = s B^T G: B read transposed (trans_a).
    gemm(pool_, true, r, sl.n_in, sl.n_out, B, r, G, sl.n_in, dA, sl.n_in, false);
    for (int64_t k = 0; k < sl.n_out * r; ++k) dB[k] *= s;
    for (int64_t k = 0; k < r * sl.n_in; ++k) dA[k] *= s;
  }
}

}  // namespace tern::train
