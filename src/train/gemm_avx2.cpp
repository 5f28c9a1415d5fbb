// The AVX2 block of train/gemm: a 6 x 16 register tile (12 ymm accumulators, 2 for the B row,
// 1 broadcast: 15 of the 16 registers), B packed per 16-column panel, A broadcast straight
// from its matrix (see gemm_kernels.h). The same structure as gemm_avx512.cpp at half width.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "train/gemm_kernels.h"

namespace tern::train::detail {
namespace {

constexpr int kMr = kAvx2Mr;
constexpr int kLanes = 8;

// Lane mask of the first `cols` (0..8) lanes, for maskload / maskstore.
__m256i lanes_below(int64_t cols) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::clamp<int64_t>(cols, 0, 8))), idx);
}

// Copies columns [0, cols) of kc rows of B into a panel of `width` (8 or 16) floats a row,
// zero beyond cols, so the micro-kernel's loads are whole vectors.
void pack_panel(int64_t kc, const float* b, int64_t ldb, int64_t cols, int width, float* dst) {
  if (width == 16 && cols == 16) {
    for (int64_t k = 0; k < kc; ++k) {
      _mm256_store_ps(dst + k * 16, _mm256_loadu_ps(b + k * ldb));
      _mm256_store_ps(dst + k * 16 + 8, _mm256_loadu_ps(b + k * ldb + 8));
    }
    return;
  }
  const __m256i m0 = lanes_below(cols), m1 = lanes_below(cols - 8);
  for (int64_t k = 0; k < kc; ++k) {
    _mm256_store_ps(dst + k * width, _mm256_maskload_ps(b + k * ldb, m0));
    if (width == 16) _mm256_store_ps(dst + k * width + 8, _mm256_maskload_ps(b + k * ldb + 8, m1));
  }
}

// ROWS x (8 NV) of C from a packed panel; the last vector of each row holds `last_cols`
// (1..8) valid columns. (A count rather than a vector mask: a function pointer type with a
// vector parameter would drop its alignment attribute.)
template <int ROWS, int NV, bool TRANS>
void micro_tile(int64_t kc, const float* a, int64_t lda, const float* panel, float* c, int64_t ldc, bool load_c,
                int last_cols) {
  constexpr int W = kLanes * NV;
  const __m256i all = _mm256_set1_epi32(-1);
  const __m256i last = lanes_below(last_cols);
  __m256 acc[ROWS][NV];
#pragma GCC unroll 8
  for (int r = 0; r < ROWS; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      const __m256i m = v == NV - 1 ? last : all;
      acc[r][v] = load_c ? _mm256_maskload_ps(c + r * ldc + v * kLanes, m) : _mm256_setzero_ps();
    }
  }
  const float* ar = a;
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    __m256 bv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) bv[v] = _mm256_load_ps(panel + k * W + v * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) {
      const __m256 av = _mm256_broadcast_ss(TRANS ? ar + r : ar + r * lda);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
    }
    ar += TRANS ? lda : 1;
  }
#pragma GCC unroll 8
  for (int r = 0; r < ROWS; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      const __m256i m = v == NV - 1 ? last : all;
      _mm256_maskstore_ps(c + r * ldc + v * kLanes, m, acc[r][v]);
    }
  }
}

using MicroFn = void (*)(int64_t, const float*, int64_t, const float*, float*, int64_t, bool, int);

template <int NV, bool TRANS, int... R>
constexpr auto make_row_table(std::integer_sequence<int, R...>) {
  return std::array<MicroFn, sizeof...(R)>{&micro_tile<R + 1, NV, TRANS>...};
}

// [NV - 1][TRANS][rows - 1]
const std::array<MicroFn, kMr> kTiles[2][2] = {
    {make_row_table<1, false>(std::make_integer_sequence<int, kMr>{}),
     make_row_table<1, true>(std::make_integer_sequence<int, kMr>{})},
    {make_row_table<2, false>(std::make_integer_sequence<int, kMr>{}),
     make_row_table<2, true>(std::make_integer_sequence<int, kMr>{})},
};

}  // namespace

void gemm_block_avx2(bool trans_a, int64_t m, int64_t n, int64_t kc, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float* c, int64_t ldc, bool load_c, float* b_pack) {
  for (int64_t j0 = 0; j0 < n; j0 += kAvx2Nr) {
    const int64_t cols = std::min<int64_t>(kAvx2Nr, n - j0);
    const int nv = cols > kLanes ? 2 : 1;
    pack_panel(kc, b + j0, ldb, cols, nv * kLanes, b_pack);
    const int last_cols = int(cols - (nv - 1) * kLanes);
    const auto& tiles = kTiles[nv - 1][trans_a ? 1 : 0];
    for (int64_t i0 = 0; i0 < m; i0 += kMr) {
      const int rows = int(std::min<int64_t>(kMr, m - i0));
      const float* a_tile = trans_a ? a + i0 : a + i0 * lda;
      tiles[size_t(rows - 1)](kc, a_tile, lda, b_pack, c + i0 * ldc + j0, ldc, load_c, last_cols);
    }
  }
}

}  // namespace tern::train::detail
