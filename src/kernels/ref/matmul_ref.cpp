#include <vector>

#include "core/error.h"
#include "kernels/matmul.h"
#include "quant/quant_traits.h"

namespace tern {

void dequantize_row(const WeightView& w, int64_t row, float* dst) {
  const QuantTraits& q = require_quant_traits(w.type, "weight");
  if (w.interleaved16) {  // the row's blocks back in their stored order
    thread_local std::vector<uint8_t> blocks;
    blocks.resize(size_t(w.row_bytes()));
    deinterleave16_row(w, row, blocks.data());
    q.to_float(blocks.data(), dst, w.n_in);
    return;
  }
  q.to_float(static_cast<const uint8_t*>(w.data) + row * w.row_bytes(), dst, w.n_in);
}

void matmul_ref(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
                int64_t ldy, ThreadPool& pool) {
  const QuantTraits& q = require_quant_traits(w.type, "weight");
  TERN_ASSERT_MSG(!w.interleaved16, "matmul_ref: interleaved weights");
  const int64_t rb = w.row_bytes();
  pool.run([&](int ith, int nth) {
    thread_local std::vector<float> row;
    row.resize(size_t(w.n_in));
    const int64_t per = (w.n_out + nth - 1) / nth;
    const int64_t o0 = per * ith, o1 = std::min(w.n_out, o0 + per);
    for (int64_t o = o0; o < o1; ++o) {
      q.to_float(static_cast<const uint8_t*>(w.data) + o * rb, row.data(), w.n_in);
      for (int64_t t = 0; t < n_tokens; ++t) {
        const float* xt = x + t * ldx;
        float s = 0.0f;
        for (int64_t i = 0; i < w.n_in; ++i) s += row[size_t(i)] * xt[i];
        y[t * ldy + o] = s;
      }
    }
  });
}

}  // namespace tern
