// The AVX-512 block of train/gemm: a 12 x 32 register tile (24 zmm accumulators), B packed
// per 32-column panel, A broadcast straight from its matrix (see gemm_kernels.h).
//
// GCC 12's AVX-512 headers trip -Wuninitialized inside the intrinsics (kernels/x86/simd.h
// explains); the diagnostic belongs to the header, so it is silenced for its lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "train/gemm_kernels.h"

namespace tern::train::detail {
namespace {

constexpr int kMr = kAvx512Mr;
constexpr int kLanes = 16;

// Copies columns [0, cols) of kc rows of B into a panel of `width` (16 or 32) floats a row,
// zero beyond cols, so the micro-kernel's loads are whole vectors.
void pack_panel(int64_t kc, const float* b, int64_t ldb, int64_t cols, int width, float* dst) {
  const __mmask16 m0 = cols >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << cols) - 1);
  const __mmask16 m1 = cols >= 32 ? __mmask16(0xFFFF) : cols <= 16 ? __mmask16(0) : __mmask16((1u << (cols - 16)) - 1);
  if (width == 32) {
    for (int64_t k = 0; k < kc; ++k) {
      const float* src = b + k * ldb;
      _mm512_store_ps(dst + k * 32, _mm512_maskz_loadu_ps(m0, src));
      _mm512_store_ps(dst + k * 32 + 16, _mm512_maskz_loadu_ps(m1, src + 16));
    }
  } else {
    for (int64_t k = 0; k < kc; ++k) _mm512_store_ps(dst + k * 16, _mm512_maskz_loadu_ps(m0, b + k * ldb));
  }
}

// ROWS x (16 NV) of C from a packed panel. The last vector of each row uses `last` (the
// panel's valid columns): masked loads and stores never touch C beyond the block.
template <int ROWS, int NV, bool TRANS>
void micro_tile(int64_t kc, const float* a, int64_t lda, const float* panel, float* c, int64_t ldc, bool load_c,
                __mmask16 last) {
  constexpr int W = kLanes * NV;
  __m512 acc[ROWS][NV];
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? last : __mmask16(0xFFFF);
      acc[r][v] = load_c ? _mm512_maskz_loadu_ps(m, c + r * ldc + v * kLanes) : _mm512_setzero_ps();
    }
  }
  // Row pointers of A (TRANS: one pointer, rows are neighbours).
  const float* ar = a;
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    __m512 bv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_ps(panel + k * W + v * kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r) {
      const __m512 av = _mm512_set1_ps(TRANS ? ar[r] : ar[r * lda]);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
    ar += TRANS ? lda : 1;
  }
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? last : __mmask16(0xFFFF);
      _mm512_mask_storeu_ps(c + r * ldc + v * kLanes, m, acc[r][v]);
    }
  }
}

using MicroFn = void (*)(int64_t, const float*, int64_t, const float*, float*, int64_t, bool, __mmask16);

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

void gemm_block_avx512(bool trans_a, int64_t m, int64_t n, int64_t kc, const float* a, int64_t lda,
                       const float* b, int64_t ldb, float* c, int64_t ldc, bool load_c, float* b_pack) {
  for (int64_t j0 = 0; j0 < n; j0 += kAvx512Nr) {
    const int64_t cols = std::min<int64_t>(kAvx512Nr, n - j0);
    const int nv = cols > kLanes ? 2 : 1;
    pack_panel(kc, b + j0, ldb, cols, nv * kLanes, b_pack);
    const int64_t last_cols = cols - (nv - 1) * kLanes;
    const __mmask16 last = last_cols >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << last_cols) - 1);
    const auto& tiles = kTiles[nv - 1][trans_a ? 1 : 0];
    for (int64_t i0 = 0; i0 < m; i0 += kMr) {
      const int rows = int(std::min<int64_t>(kMr, m - i0));
      const float* a_tile = trans_a ? a + i0 : a + i0 * lda;
      tiles[size_t(rows - 1)](kc, a_tile, lda, b_pack, c + i0 * ldc + j0, ldc, load_c, last);
    }
  }
}

}  // namespace tern::train::detail
