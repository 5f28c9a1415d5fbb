#include "train/gemm.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "train/gemm_kernels.h"

namespace tern::train {

void gemm_ref(bool trans_a, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* b,
              int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      float acc = accumulate ? c[i * ldc + j] : 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += (trans_a ? a[k * lda + i] : a[i * lda + k]) * b[k * ldb + j];
      c[i * ldc + j] = acc;
    }
  }
}

namespace detail {
namespace {

// Below this many multiply-adds a pool region (wake-up, claim, join: microseconds) costs more
// than it saves.
constexpr int64_t kSerialMacs = int64_t(1) << 18;

// K blocks of at most kMaxKc rows: one packed B panel (kMaxKc x 32 floats, 32 KiB) then stays
// in L1 while every row tile of the block streams over it.
constexpr int64_t kMaxKc = 256;

using BlockFn = void (*)(bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*,
                         int64_t, bool, float*);

// A thread tile of C: mc x nc, looping over all of K. Defaults keep a tile's A rows
// (mc x kc, 192 KiB) and C (mc x nc, 192 KiB) in a Zen-class 1 MiB L2; tiles shrink when
// there are too few to keep every thread busy. The plan may depend on the thread count
// because the results do not: each C element is one FMA chain over k whatever the tiling
// (gemm_kernels.h).
struct TilePlan {
  int64_t mc, nc, kc;
  int64_t tiles_m, tiles_n;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

TilePlan plan_tiles(int64_t M, int64_t N, int64_t K, int mr, int nr, int threads) {
  const int64_t units_m = ceil_div(M, mr), units_n = ceil_div(N, nr);
  int64_t tm = ceil_div(M, 192), tn = ceil_div(N, 256);
  tm = std::min(tm, units_m);
  tn = std::min(tn, units_n);
  // Several tiles per thread, so that claiming evens out a thread that starts late; split N
  // first while tiles stay at least 4 register tiles wide (B panels are re-packed per tile
  // row, A re-read per tile column: both cheap next to the FMAs).
  const int64_t want = threads > 1 ? int64_t(4) * threads : 1;
  while (tm * tn < want) {
    if (tn < units_n && ceil_div(units_n, tn + 1) >= 4) ++tn;
    else if (tm < units_m && ceil_div(units_m, tm + 1) >= 2) ++tm;
    else break;
  }
  TilePlan p{};
  p.mc = ceil_div(units_m, tm) * mr;
  p.nc = ceil_div(units_n, tn) * nr;
  p.tiles_m = ceil_div(M, p.mc);
  p.tiles_n = ceil_div(N, p.nc);
  p.kc = K > 0 ? ceil_div(K, ceil_div(K, kMaxKc)) : 0;
  return p;
}

// The packed-panel scratch of the calling thread; pool workers persist, so each keeps its own.
float* pack_scratch() {
  struct AlignedDelete {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t(64)); }
  };
  thread_local std::unique_ptr<float[], AlignedDelete> buf(
      static_cast<float*>(::operator new[](sizeof(float) * size_t(gemm_pack_floats(kMaxKc)), std::align_val_t(64))));
  return buf.get();
}

void zero_c(int64_t M, int64_t N, float* c, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) std::memset(c + i * ldc, 0, sizeof(float) * size_t(N));
}

void gemm_ref_rows(ThreadPool* pool, bool trans_a, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda,
                   const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  // Whole rows per chunk: each C element is gemm_ref's own loop, whatever the split.
  constexpr int64_t kRows = 8;
  auto rows = [&](int64_t chunk, int) {
    const int64_t i0 = chunk * kRows, m = std::min(kRows, M - i0);
    gemm_ref(trans_a, m, N, K, trans_a ? a + i0 : a + i0 * lda, lda, b, ldb, c + i0 * ldc, ldc, accumulate);
  };
  const int64_t chunks = ceil_div(M, kRows);
  if (!pool || M * N * K < kSerialMacs) {
    for (int64_t ch = 0; ch < chunks; ++ch) rows(ch, 0);
  } else {
    pool->for_chunks(chunks, [&](int64_t ch, int th) { rows(ch, th); });
  }
}

}  // namespace

void gemm_isa(Isa isa, ThreadPool* pool, bool trans_a, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda,
              const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (!isa_supported(isa)) fail("train gemm: this CPU cannot run the ", isa_name(isa), " variant");
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate) zero_c(M, N, c, ldc);
    return;
  }
  if (!isa_is_x86_simd(isa)) {  // the reference, and the ARM variants (no training tiles of their own yet)
    gemm_ref_rows(pool, trans_a, M, N, K, a, lda, b, ldb, c, ldc, accumulate);
    return;
  }
  const bool avx512 = isa == Isa::Avx512;
  const BlockFn block = avx512 ? &gemm_block_avx512 : &gemm_block_avx2;
  const bool serial = !pool || pool->size() == 1 || M * N * K < kSerialMacs;
  const TilePlan p = plan_tiles(M, N, K, avx512 ? kAvx512Mr : kAvx2Mr, avx512 ? kAvx512Nr : kAvx2Nr,
                                serial ? 1 : pool->size());
  auto tile = [&](int64_t t, int) {
    const int64_t i0 = (t / p.tiles_n) * p.mc, j0 = (t % p.tiles_n) * p.nc;
    const int64_t m = std::min(p.mc, M - i0), n = std::min(p.nc, N - j0);
    float* pack = pack_scratch();
    for (int64_t k0 = 0; k0 < K; k0 += p.kc) {
      const int64_t kc = std::min(p.kc, K - k0);
      const float* a_blk = trans_a ? a + k0 * lda + i0 : a + i0 * lda + k0;
      block(trans_a, m, n, kc, a_blk, lda, b + k0 * ldb + j0, ldb, c + i0 * ldc + j0, ldc, accumulate || k0 > 0, pack);
    }
  };
  const int64_t tiles = p.tiles_m * p.tiles_n;
  if (serial) {
    for (int64_t t = 0; t < tiles; ++t) tile(t, 0);
  } else {
    pool->for_chunks(tiles, [&](int64_t t, int th) { tile(t, th); });
  }
}

}  // namespace detail

void gemm(ThreadPool* pool, bool trans_a, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda,
          const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  detail::gemm_isa(selected_isa(), pool, trans_a, M, N, K, a, lda, b, ldb, c, ldc, accumulate);
}

void transpose(ThreadPool* pool, int64_t R, int64_t C, const float* in, int64_t ld_in, float* out, int64_t ld_out) {
  if (R <= 0 || C <= 0) return;
  // Square tiles: a tile's 32 source rows and 32 destination rows (8 KiB) stay in L1, so
  // every cache line read or written is used whole. A chunk is a band of 32 rows by up to
  // 1024 columns: enough chunks to share, few enough to stay far below the pool's limit.
  constexpr int64_t kTile = 32, kBandCols = 1024;
  const int64_t bands_r = (R + kTile - 1) / kTile, bands_c = (C + kBandCols - 1) / kBandCols;
  auto band = [&](int64_t t, int) {
    const int64_t r0 = (t / bands_c) * kTile, r1 = std::min(R, r0 + kTile);
    const int64_t band_c0 = (t % bands_c) * kBandCols, band_c1 = std::min(C, band_c0 + kBandCols);
    for (int64_t c0 = band_c0; c0 < band_c1; c0 += kTile) {
      const int64_t c1 = std::min(band_c1, c0 + kTile);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r) out[c * ld_out + r] = in[r * ld_in + c];
    }
  };
  const int64_t chunks = bands_r * bands_c;
  if (!pool || R * C < (int64_t(1) << 16)) {
    for (int64_t t = 0; t < chunks; ++t) band(t, 0);
  } else {
    pool->for_chunks(chunks, [&](int64_t t, int th) { band(t, th); });
  }
}

}  // namespace tern::train
