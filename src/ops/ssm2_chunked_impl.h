#pragma once
// Mamba-2's scan in its chunked ("SSD") form (attention_iface.h, ssm2_scan_chunked_*) for one
// ISA, on the 16-float vector type of attention_tile_impl.h. Per B/C group and chunk of l <= L
// tokens (columns padded to lp, a multiple of 16), shared by the group's heads:
//   Ct  [S][lp]  = C^T of the chunk (0 beyond l)
//   CBt [l][lp]  = B C^T: CBt[s][t] = B[s] . C[t]
// then per head (its state h [P][S] as the caller keeps it, read and written in place):
//   Mt[s][t] = CBt[s][t] exp(seg(t, s)) dt_s for s <= t, else 0   (the decay-masked kernel)
//   Yt [P][lp] = (h Ct) exp(cum(t)) + X^T Mt                       (incoming state, then intra-chunk)
//   h = h exp(cum(l - 1)) + X^T (B dt exp(seg(l - 1, s)))          (the state, once per chunk)
//   y[t][p] = (Yt[p][t] + D x[t][p]) silu(z[t][p])                  (Yt transposed back, silu_mul_v)
// seg(t, s) = a_{s+1} + ... + a_t is summed as it is used (row s of Mt from row s + 1 plus a_{s+1},
// lanes t < s held at -inf, so exp gives the mask's 0); no difference of cumulative sums, which
// would cancel when large time steps make them large. Every product is a register-tiled loop
// (R rows x NV vectors of accumulators, one broadcast and NV loads per step of the sum; X^T Mt
// skips Mt's zeros below the diagonal). x86 runs it with subnormals flushed (see
// SsdFlushSubnormals). Included by the per-ISA attention_*.cpp files only.
#include <math.h>
#include <cstdint>

#include "ops/attention_tile_impl.h"

namespace tern::attn {
namespace {

// The register tile: R rows x NV vectors of 16 accumulators.
#if defined(__AVX512F__)
constexpr int kSsdRows = 6, kSsdCols = 4;  // 24 zmm accumulators + 4 of B + 1 broadcast
#elif defined(__aarch64__)
constexpr int kSsdRows = 3, kSsdCols = 2;  // 24 q accumulators (a V is four q registers)
#else
constexpr int kSsdRows = 2, kSsdCols = 2;  // AVX2: 8 ymm accumulators (a V is two ymm)
#endif

enum class SsdInit { Zero, Load, Scale };  // C starts at 0, at C, or at C * scale

// Rows [j0, j1) of the sum into the accumulators of vectors Q .. NV - 1.
template <int R, int NV, int Q>
inline void ssd_steps(V (&acc)[R][NV], int64_t j0, int64_t j1, const float* A, int64_t ar, int64_t ac, const float* B,
                      int64_t ldb) {
  for (int64_t j = j0; j < j1; ++j) {
    const float* b = B + j * ldb;
    const float* aj = A + j * ac;
    V bv[NV];
    for (int v = Q; v < NV; ++v) bv[v] = vload(b + 16 * v);
    for (int r = 0; r < R; ++r) {
      const V av = vset1(aj[r * ar]);
      for (int v = Q; v < NV; ++v) acc[r][v] = vfma(av, bv[v], acc[r][v]);
    }
  }
}

// B upper triangular (B[j][c] = 0 for c < j), the tile's columns starting at c0: vector v
// (columns c0 + 16 v ..) takes rows j < c0 + 16 (v + 1) only, the rows below adding zeros.
template <int R, int NV, int Q>
inline void ssd_steps_upper(V (&acc)[R][NV], int64_t K, int64_t c0, const float* A, int64_t ar, int64_t ac,
                            const float* B, int64_t ldb) {
  const int64_t j0 = Q == 0 ? 0 : c0 + 16 * Q, j1 = c0 + 16 * (Q + 1) < K ? c0 + 16 * (Q + 1) : K;
  ssd_steps<R, NV, Q>(acc, j0, j1, A, ar, ac, B, ldb);
  if constexpr (Q + 1 < NV) ssd_steps_upper<R, NV, Q + 1>(acc, K, c0, A, ar, ac, B, ldb);
}

// C[R][16 NV] (init) += sum_j A(r, j) B[j][...], A(r, j) = A[r ar + j ac]; upper_c0 >= 0: B
// upper triangular and the tile's first column upper_c0 (its zeros skipped).
template <int R, int NV>
inline void ssd_tile(int64_t K, const float* A, int64_t ar, int64_t ac, const float* B, int64_t ldb, float* C,
                     int64_t ldc, SsdInit init, float scale, int64_t upper_c0) {
  V acc[R][NV];
  const V vs = vset1(scale);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v)
      acc[r][v] = init == SsdInit::Zero   ? vzero()
                  : init == SsdInit::Load ? vload(C + r * ldc + 16 * v)
                                          : vmul(vload(C + r * ldc + 16 * v), vs);
  if (upper_c0 < 0) ssd_steps<R, NV, 0>(acc, 0, K, A, ar, ac, B, ldb);
  else ssd_steps_upper<R, NV, 0>(acc, K, upper_c0, A, ar, ac, B, ldb);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) vstore(C + r * ldc + 16 * v, acc[r][v]);
}

template <int R, int NV = kSsdCols>
inline void ssd_tile_cols(int nv, int64_t K, const float* A, int64_t ar, int64_t ac, const float* B, int64_t ldb,
                          float* C, int64_t ldc, SsdInit init, float scale, int64_t upper_c0) {
  if constexpr (NV > 1) {
    if (nv < NV) return ssd_tile_cols<R, NV - 1>(nv, K, A, ar, ac, B, ldb, C, ldc, init, scale, upper_c0);
  }
  ssd_tile<R, NV>(K, A, ar, ac, B, ldb, C, ldc, init, scale, upper_c0);
}

template <int R = kSsdRows>
inline void ssd_tile_rows(int nr, int nv, int64_t K, const float* A, int64_t ar, int64_t ac, const float* B,
                          int64_t ldb, float* C, int64_t ldc, SsdInit init, float scale, int64_t upper_c0) {
  if constexpr (R > 1) {
    if (nr < R) return ssd_tile_rows<R - 1>(nr, nv, K, A, ar, ac, B, ldb, C, ldc, init, scale, upper_c0);
  }
  ssd_tile_cols<R>(nv, K, A, ar, ac, B, ldb, C, ldc, init, scale, upper_c0);
}

// C[M][N] (init) += A[M][K] B[K][N], N a multiple of 16; rows of B ldb floats apart, of C ldc;
// upper: B is upper triangular (B[j][c] = 0 for c < j), its zeros skipped. Each element is one
// sum in j order, whatever the tiling.
inline void ssd_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t ar, int64_t ac, const float* B,
                     int64_t ldb, float* C, int64_t ldc, SsdInit init, float scale = 1.0f, bool upper = false) {
  for (int64_t c0 = 0; c0 < N; c0 += 16 * kSsdCols) {
    const int nv = int((N - c0) / 16 < kSsdCols ? (N - c0) / 16 : kSsdCols);
    for (int64_t r0 = 0; r0 < M; r0 += kSsdRows) {
      const int nr = int(M - r0 < kSsdRows ? M - r0 : kSsdRows);
      ssd_tile_rows(nr, nv, K, A + r0 * ar, ar, ac, B + c0, ldb, C + r0 * ldc + c0, ldc, init, scale,
                    upper ? c0 : -1);
    }
  }
}

// dst[i][r] = src[r][i] for r < rows, i < cols (rows of src lds floats apart, of dst ldd): 8 x 8
// blocks in registers (attention_tile_impl.h's transpose8x8), the edges one at a time.
inline void ssd_transpose(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst, int64_t ldd) {
  const int64_t r8 = rows - rows % 8, c8 = cols - cols % 8;
  for (int64_t r = 0; r < r8; r += 8) {
    const float* rp[8];
    for (int i = 0; i < 8; ++i) rp[i] = src + (r + i) * lds;
    for (int64_t c = 0; c < c8; c += 8) transpose8x8(rp, c, dst + c * ldd + r, ldd);
    for (int64_t c = c8; c < cols; ++c)
      for (int i = 0; i < 8; ++i) dst[c * ldd + r + i] = rp[i][c];
  }
  for (int64_t r = r8; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}

// Subnormal floats flushed to zero (MXCSR FTZ and DAZ) while it lives, the caller's MXCSR back
// after. A head whose decays are strong leaves a band of products near exp(-87) in the masked
// kernel and the state's weights, subnormal after a multiply; on x86 every vector operation on a
// subnormal takes a microcode assist (~100 cycles), which made prefill 4x slower on such heads.
// Values below 2^-126 become 0: nothing the model's outputs can see.
#if defined(__aarch64__)
struct SsdFlushSubnormals {};  // (not set on ARM64, whose cores generally take subnormals without a trap)
#else
struct SsdFlushSubnormals {
  unsigned csr = _mm_getcsr();
  SsdFlushSubnormals() { _mm_setcsr(csr | 0x8040u); }  // FTZ (bit 15) | DAZ (bit 6)
  ~SsdFlushSubnormals() { _mm_setcsr(csr); }
  SsdFlushSubnormals(const SsdFlushSubnormals&) = delete;
  SsdFlushSubnormals& operator=(const SsdFlushSubnormals&) = delete;
};
#endif

inline void ssm2_chunked_impl(const Ssm2ScanArgs& a, int64_t h0, int64_t h1, int64_t L, float* scratch) {
  [[maybe_unused]] const SsdFlushSubnormals flush;
  const int64_t S = a.d_state, P = a.head_dim, S16 = S - S % 16, P16 = P - P % 16, hpg = a.heads_per_group;
  const int64_t Lp = (L + 15) / 16 * 16;
  float* ct = scratch;           // [S][Lp]
  float* cbt = ct + S * Lp;      // [Lp][Lp]
  float* mt = cbt + Lp * Lp;     // [Lp][Lp]
  float* bw = mt + Lp * Lp;      // [Lp][S] B[s] dt_s exp(seg(l - 1, s))
  float* yt = bw + Lp * S;       // [P][Lp]
  float* yr = yt + P * Lp;       // [Lp][P] yt transposed
  float* dtv = yr + Lp * P;      // [Lp] dt
  float* av = dtv + Lp;          // [Lp] dt A
  float* ecum = av + Lp;         // [Lp] cum(t), then exp(cum(t))
  float* wv = ecum + Lp;         // [Lp] dt_s exp(seg(l - 1, s))
  float* seg = wv + Lp;          // [Lp] seg(t, s) of the current row s
  float* lanes = seg + Lp;       // [2 Lp] one vector of exp(seg)
  float* vrow = lanes + 2 * Lp;  // [P] y + D x of one token
  const float neg_inf = -__builtin_inff();
  for (int64_t g = h0 / hpg; g * hpg < h1; ++g) {
    const int64_t hb = g * hpg > h0 ? g * hpg : h0, he = (g + 1) * hpg < h1 ? (g + 1) * hpg : h1;
    for (int64_t t0 = 0; t0 < a.n_tokens; t0 += L) {
      const int64_t l = a.n_tokens - t0 < L ? a.n_tokens - t0 : L, lp = (l + 15) / 16 * 16;
      const float* B = a.b + t0 * a.ldbc + g * S;  // row s at B + s ldbc
      const float* C = a.c + t0 * a.ldbc + g * S;
      // The group's C^T and B C^T.
      ssd_transpose(C, a.ldbc, l, S, ct, Lp);
      for (int64_t k = 0; k < S; ++k)
        for (int64_t t = l; t < lp; ++t) ct[k * Lp + t] = 0.0f;
      ssd_gemm(l, lp, S, B, a.ldbc, 1, ct, Lp, cbt, Lp, SsdInit::Zero);

      for (int64_t hd = hb; hd < he; ++hd) {
        const float A = a.a[hd];
        float* h = a.h + hd * P * S;  // [P][S]
        const float* X = a.x + t0 * a.ldx + hd * P;  // x[s][p] at X[s ldx + p]
        float cum = 0.0f;
        for (int64_t t = 0; t < l; ++t) {
          const float raw = a.dt[(t0 + t) * a.lddt + hd];
          dtv[t] = raw <= 20.0f ? log1pf(expf(raw)) : raw;
          av[t] = dtv[t] * A;
          cum += av[t];
          ecum[t] = cum;
        }
        for (int64_t t = l; t < lp; ++t) ecum[t] = 0.0f;
        for (int64_t t = 0; t < lp; t += 16) vstore(ecum + t, vexp_nonpos(vload(ecum + t)));
        const float total = ecum[l - 1];
        // Mt, row s from row s + 1: seg(t, s) = seg(t, s + 1) + a_{s+1}, seg(s, s) = 0.
        for (int64_t t = 0; t < lp; ++t) seg[t] = neg_inf;
        const int64_t last = (l - 1) / 16 * 16;  // the vector holding column l - 1
        for (int64_t s = l - 1; s >= 0; --s) {
          if (s + 1 < l) {
            const V step = vset1(av[s + 1]);
            for (int64_t t = s / 16 * 16; t < lp; t += 16) vstore(seg + t, vadd(vload(seg + t), step));
          }
          seg[s] = 0.0f;
          const V vdt = vset1(dtv[s]);
          float* row = mt + s * Lp;
          const float* cb = cbt + s * Lp;
          for (int64_t t = 0; t < lp; t += 16) {
            if (t + 16 <= s) {  // every lane t < s: masked
              vstore(row + t, vzero());
              continue;
            }
            const V e = vexp_nonpos(vload(seg + t));
            if (t == last) vstore(lanes, e);
            vstore(row + t, vmul(vmul(vload(cb + t), e), vdt));
          }
          wv[s] = lanes[l - 1 - last] * dtv[s];
        }
        // Yt = (h Ct) exp(cum(t)) + X^T Mt, from the incoming state (Mt upper triangular).
        ssd_gemm(P, lp, S, h, S, 1, ct, Lp, yt, Lp, SsdInit::Zero);
        for (int64_t p = 0; p < P; ++p)
          for (int64_t t = 0; t < lp; t += 16) vstore(yt + p * Lp + t, vmul(vload(yt + p * Lp + t), vload(ecum + t)));
        ssd_gemm(P, lp, l, X, 1, a.ldx, mt, Lp, yt, Lp, SsdInit::Load, 1.0f, true);
        // The state: h exp(cum(l - 1)) + X^T (B dt exp(seg(l - 1, s))), a tail of states one at
        // a time in the same order.
        for (int64_t s = 0; s < l; ++s) {
          const V w = vset1(wv[s]);
          for (int64_t k = 0; k < S16; k += 16) vstore(bw + s * S + k, vmul(vload(B + s * a.ldbc + k), w));
        }
        if (S16 > 0) ssd_gemm(P, S16, l, X, 1, a.ldx, bw, S, h, S, SsdInit::Scale, total);
        for (int64_t p = 0; p < P; ++p)
          for (int64_t k = S16; k < S; ++k) {
            float acc = h[p * S + k] * total;
            for (int64_t s = 0; s < l; ++s) acc += X[s * a.ldx + p] * (B[s * a.ldbc + k] * wv[s]);
            h[p * S + k] = acc;
          }
        // y = (Yt^T + D x) silu(z).
        ssd_transpose(yt, Lp, P, l, yr, P);
        const V vd = vset1(a.d[hd]);
        for (int64_t t = 0; t < l; ++t) {
          const float* xt = X + t * a.ldx;
          const float* yrow = yr + t * P;
          const float* z = a.z + (t0 + t) * a.ldz + hd * P;
          float* y = a.y + (t0 + t) * a.ldy + hd * P;
          for (int64_t p = 0; p < P16; p += 16)
            vstore(y + p, silu_mul_v(vload(z + p), vfma(vd, vload(xt + p), vload(yrow + p))));
          if (P16 < P) {  // the tail: silu_mul_impl's padded vector, the same arithmetic
            for (int64_t p = P16; p < P; ++p) vrow[p] = yrow[p] + a.d[hd] * xt[p];
            silu_mul_impl(z + P16, vrow + P16, y + P16, P - P16);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tern::attn
