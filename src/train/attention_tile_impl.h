#pragma once
// The flash-style training attention tiles, written once over GCC vector types and compiled
// per ISA: attention_avx512.cpp (16 lanes), attention_avx2.cpp (8 lanes) and attention.cpp
// (baseline SSE2, 4 lanes; the Ref variant). Everything is in an unnamed namespace and uses no
// std:: templates or inline std:: functions, so no differently compiled copy of shared inline
// code can reach another translation unit (see kernels/kernel_iface.h).
//
// One unit = (sequence, kv head). Its rows are (token, query head of the group) pairs, token
// major. The lanes of a vector run over *keys*, not over head_dim: head_dim is 8 for
// stories260K, which would leave most lanes of a head_dim vector idle, while a causal sequence
// always has many keys. So the unit first transposes its K and V into key blocks of kBlock
// keys (4 vectors):
//   Kt[block][d][key in block]   (zeros past the sequence's end)
// and every product becomes "broadcast one scalar of a row, FMA with a key-block vector":
//   S  = q . Kt            dP = dO . Vt           (scores, and dP of the backward)
//   dVt += dO[d] * P       dKt += q[d] * dS       (rank-1 updates of the transposed grads)
//   O  += P * Vt[d],  dq += dS * Kt[d]            (kept per lane, summed over lanes per row)
// A pass handles kRows rows at once so each loaded key-block vector serves several rows.
//
// Forward (FlashAttention-2): per row, an online softmax over key blocks 0..(token / kBlock):
//   m' = max(m, max S), c = exp(m - m'), P = exp(S - m'), l = l c + sum P, O = O c + P V;
// stores o = O / l and lse = m + log l only.
// Backward: P = exp(S - lse) recomputed per block, D = rowsum(dO * O) once per row,
// dS = P (dP - D) scale; dq stays per row, dK and dV accumulate over the unit's rows in the
// transposed scratch and are written to dk/dv rows when the unit ends. No T x T matrix.
//
// Determinism: a unit's order of operations is fixed by the shape alone (passes in row order,
// blocks in key order, lanes summed in lane order), so any thread count gives the same bits.
#if defined(__AVX2__)
// GCC 12's AVX-512 headers build _mm512_undefined_*() as a self-initialised variable, which
// -Wmaybe-uninitialized reports inside intrinsics; silenced for the header's lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include <math.h>    // expf, logf: plain C functions, no inline copy compiled for this ISA
#include <stdint.h>
#include <string.h>  // memcpy: a builtin for the vector loads and stores

#include "train/attention_kernels.h"

namespace tern::train::detail {
namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr int kRows = 4;  // 4 rows x 4 accumulator vectors = 16 of the 32 zmm registers
#elif defined(__AVX2__)
constexpr int kLanes = 8;
constexpr int kRows = 2;  // 2 x 4 accumulators + 4 key vectors + a broadcast fit 16 ymm
#else
constexpr int kLanes = 4;
constexpr int kRows = 2;
#endif
constexpr int kVecsPerBlock = 4;
constexpr int64_t kBlock = kLanes * kVecsPerBlock;  // keys per key block

typedef float VecF __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t VecI __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline VecF vload(const float* p) {
  VecF v;
  memcpy(&v, p, sizeof v);
  return v;
}
inline void vstore(float* p, VecF v) { memcpy(p, &v, sizeof v); }
inline VecF vsplat(float x) { return VecF{} + x; }
// ISO C++ mode compiles with -ffp-contract=off, so a * b + c would stay two roundings and two
// instructions; the intrinsic asks for the fused one where the ISA has it.
inline VecF vfma(VecF a, VecF b, VecF c) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#elif defined(__AVX2__)
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}
inline VecF vmax(VecF a, VecF b) { return a > b ? a : b; }
inline VecF vmin(VecF a, VecF b) { return a < b ? a : b; }
inline float hsum(VecF v) {
  float s = v[0];
  for (int i = 1; i < kLanes; ++i) s += v[i];
  return s;
}
inline float hmax(VecF v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}
inline VecI lane_index() {
  VecI v;
  for (int i = 0; i < kLanes; ++i) v[i] = i;
  return v;
}

// exp(x) with x clamped to [-87, 88] (callers mask what lies outside): x = n ln2 + r,
// |r| <= ln2 / 2, a degree-6 polynomial for exp(r) (Cephes' expf coefficients, relative error
// about 2e-7), times 2^n built in the exponent bits. n is rounded with the 1.5 * 2^23 trick:
// adding it leaves n in the low mantissa bits.
inline VecF vexp(VecF x) {
  const float round_magic = 12582912.0f;
  x = vmin(vmax(x, vsplat(-87.0f)), vsplat(88.0f));
  const VecF t = x * 1.44269504088896341f + round_magic;
  const VecF n = t - round_magic;
  const VecI n_int = __builtin_bit_cast(VecI, t) - __builtin_bit_cast(VecI, vsplat(round_magic));
  VecF r = x - n * 0.693359375f;  // ln 2 split in two: the first part times n is exact
  r = r + n * 2.12194440e-4f;
  VecF p = vsplat(1.9875691500e-4f);
  p = vfma(p, r, vsplat(1.3981999507e-3f));
  p = vfma(p, r, vsplat(8.3334519073e-3f));
  p = vfma(p, r, vsplat(4.1665795894e-2f));
  p = vfma(p, r, vsplat(1.6666665459e-1f));
  p = vfma(p, r, vsplat(5.0000001201e-1f));
  const VecF e = vfma(p * r, r, r) + 1.0f;
  return e * __builtin_bit_cast(VecF, (n_int + 127) << 23);
}

inline int64_t blocks_of(int64_t n_ctx) { return (n_ctx + kBlock - 1) / kBlock; }

// Scratch layout of a unit (each part a multiple of kBlock floats, so vectors stay aligned):
//   Kt, Vt        [n_blocks][head_dim][kBlock]
//   dKt, dVt      [n_blocks][head_dim][kBlock]   (backward only)
//   row_acc       [kRows][head_dim][kLanes]      O (forward) or dq (backward) per lane
// (a pass's P and dS for one key block live in registers).
struct UnitScratch {
  float *kt, *vt, *dkt, *dvt, *row_acc;
};
inline int64_t transposed_floats(const AttentionShape& s) { return blocks_of(s.n_ctx) * s.head_dim * kBlock; }
inline int64_t row_acc_floats(const AttentionShape& s) {
  const int64_t n = kRows * s.head_dim * kLanes;
  return (n + kBlock - 1) / kBlock * kBlock;
}
inline int64_t unit_scratch_floats(const AttentionShape& s) {
  return 4 * transposed_floats(s) + row_acc_floats(s);
}
inline UnitScratch carve(const AttentionShape& s, float* base) {
  const int64_t tf = transposed_floats(s);
  UnitScratch u;
  u.kt = base;
  u.vt = u.kt + tf;
  u.dkt = u.vt + tf;
  u.dvt = u.dkt + tf;
  u.row_acc = u.dvt + tf;
  return u;
}

// dst[block][d][j] = src row (seq, key j) of kv head kvh, element d; 0 for keys past n_ctx.
inline void transpose_kv(const AttentionShape& s, const float* src, int64_t seq, int64_t kvh, float* dst) {
  const int64_t hd = s.head_dim, row = s.n_head_kv * hd;
  const int64_t nb = blocks_of(s.n_ctx);
  for (int64_t b = 0; b < nb; ++b) {
    float* blk = dst + b * hd * kBlock;
    for (int64_t jl = 0; jl < kBlock; ++jl) {
      const int64_t j = b * kBlock + jl;
      if (j < s.n_ctx) {
        const float* x = src + (seq * s.n_ctx + j) * row + kvh * hd;
        for (int64_t d = 0; d < hd; ++d) blk[d * kBlock + jl] = x[d];
      } else {
        for (int64_t d = 0; d < hd; ++d) blk[d * kBlock + jl] = 0.0f;
      }
    }
  }
}

// The inverse for the gradients: rows of the sequence only (padding keys are dropped).
inline void untranspose_kv(const AttentionShape& s, const float* src, int64_t seq, int64_t kvh, float* dst) {
  const int64_t hd = s.head_dim, row = s.n_head_kv * hd;
  for (int64_t j = 0; j < s.n_ctx; ++j) {
    const float* blk = src + (j / kBlock) * hd * kBlock + j % kBlock;
    float* y = dst + (seq * s.n_ctx + j) * row + kvh * hd;
    for (int64_t d = 0; d < hd; ++d) y[d] = blk[d * kBlock];
  }
}

// The pass's rows: token and the offset of the row's head inside a q-shaped row.
struct PassRows {
  int64_t token[kRows];
  int64_t offset[kRows];  // element offset of (token, head) in q / o / dq / d_o
  int64_t lse_index[kRows];
};
inline PassRows pass_rows(const AttentionShape& s, int64_t seq, int64_t kvh, int64_t r0, int nr) {
  const int64_t g = s.n_head / s.n_head_kv;
  PassRows pr;
  for (int rr = 0; rr < nr; ++rr) {
    const int64_t r = r0 + rr, t = r / g, h = kvh * g + r % g;
    pr.token[rr] = t;
    pr.offset[rr] = ((seq * s.n_ctx + t) * s.n_head + h) * s.head_dim;
    pr.lse_index[rr] = (seq * s.n_ctx + t) * s.n_head + h;
  }
  return pr;
}

// acc[rr][c] = sum_d x_rr[d] * blk[d][c lanes], d in order: one key block's dot products for
// NR rows (q . Kt, or dO . Vt).
template <int NR>
inline void block_dots(const float* const* x, const float* blk, int64_t hd, VecF (&acc)[NR][kVecsPerBlock]) {
  for (int rr = 0; rr < NR; ++rr)
    for (int c = 0; c < kVecsPerBlock; ++c) acc[rr][c] = VecF{};
  for (int64_t d = 0; d < hd; ++d) {
    const float* kd = blk + d * kBlock;
    VecF kv[kVecsPerBlock];
    for (int c = 0; c < kVecsPerBlock; ++c) kv[c] = vload(kd + c * kLanes);
    for (int rr = 0; rr < NR; ++rr) {
      const VecF xd = vsplat(x[rr][d]);
      for (int c = 0; c < kVecsPerBlock; ++c) acc[rr][c] = vfma(xd, kv[c], acc[rr][c]);
    }
  }
}

// acc[d] (a vector of per-lane partial sums) = acc[d] * rescale + sum_c w[c] * blk[d][c]:
// O += P V (forward) or dq += dS K (backward) for one row and one key block.
template <int NR>
inline void block_weighted_rows(const VecF (&w)[NR][kVecsPerBlock], const float (&rescale)[NR], const float* blk,
                                int64_t hd, float* row_acc) {
  for (int64_t d = 0; d < hd; ++d) {
    const float* kd = blk + d * kBlock;
    VecF kv[kVecsPerBlock];
    for (int c = 0; c < kVecsPerBlock; ++c) kv[c] = vload(kd + c * kLanes);
    for (int rr = 0; rr < NR; ++rr) {
      float* a = row_acc + (rr * hd + d) * kLanes;
      const VecF lo = vfma(w[rr][1], kv[1], w[rr][0] * kv[0]);
      const VecF hi = vfma(w[rr][3], kv[3], w[rr][2] * kv[2]);
      vstore(a, vfma(vload(a), vsplat(rescale[rr]), lo + hi));
    }
  }
}

// One forward pass: NR rows starting at row r0 of the unit.
template <int NR>
inline void forward_pass(const AttentionForwardArgs& a, int64_t seq, int64_t kvh, int64_t r0, const UnitScratch& u) {
  const AttentionShape& s = a.shape;
  const int64_t hd = s.head_dim;
  const PassRows pr = pass_rows(s, seq, kvh, r0, NR);
  const float* q[NR];
  float m[NR], l[NR];
  for (int rr = 0; rr < NR; ++rr) {
    q[rr] = a.q + pr.offset[rr];
    m[rr] = -__builtin_inff();
    l[rr] = 0.0f;
  }
  for (int64_t i = 0; i < NR * hd * kLanes; ++i) u.row_acc[i] = 0.0f;
  const VecI lanes = lane_index();
  const int64_t last_block = pr.token[NR - 1] / kBlock;  // rows are in token order
  for (int64_t b = 0; b <= last_block; ++b) {
    VecF sc[NR][kVecsPerBlock];
    block_dots<NR>(q, u.kt + b * hd * kBlock, hd, sc);
    float rescale[NR];
    for (int rr = 0; rr < NR; ++rr) {
      // Keys after the row's token (and padding past the sequence) are masked.
      const VecI visible_limit = VecI{} + int32_t(pr.token[rr] + 1 - b * kBlock);
      VecI visible[kVecsPerBlock];
      float block_max = -__builtin_inff();
      for (int c = 0; c < kVecsPerBlock; ++c) {
        visible[c] = lanes + c * kLanes < visible_limit;
        sc[rr][c] = visible[c] ? sc[rr][c] * s.scale : vsplat(-__builtin_inff());
        const float mc = hmax(sc[rr][c]);
        block_max = mc > block_max ? mc : block_max;
      }
      // Block 0 shows every row key 0, so m is finite from the first block on.
      const float m_new = block_max > m[rr] ? block_max : m[rr];
      rescale[rr] = b == 0 ? 0.0f : expf(m[rr] - m_new);
      VecF sum{};
      for (int c = 0; c < kVecsPerBlock; ++c) {
        sc[rr][c] = visible[c] ? vexp(sc[rr][c] - m_new) : VecF{};
        sum += sc[rr][c];
      }
      l[rr] = l[rr] * rescale[rr] + hsum(sum);
      m[rr] = m_new;
    }
    block_weighted_rows<NR>(sc, rescale, u.vt + b * hd * kBlock, hd, u.row_acc);
  }
  for (int rr = 0; rr < NR; ++rr) {
    const float inv_l = 1.0f / l[rr];
    float* o = a.o + pr.offset[rr];
    for (int64_t d = 0; d < hd; ++d) o[d] = hsum(vload(u.row_acc + (rr * hd + d) * kLanes)) * inv_l;
    a.lse[pr.lse_index[rr]] = m[rr] + logf(l[rr]);
  }
}

// One backward pass: NR rows starting at row r0; dq of the rows is written, dKt/dVt accumulate.
template <int NR>
inline void backward_pass(const AttentionBackwardArgs& a, int64_t seq, int64_t kvh, int64_t r0,
                          const UnitScratch& u) {
  const AttentionShape& s = a.shape;
  const int64_t hd = s.head_dim;
  const PassRows pr = pass_rows(s, seq, kvh, r0, NR);
  const float* q[NR];
  const float* d_o[NR];
  float lse[NR], delta[NR], one[NR];
  for (int rr = 0; rr < NR; ++rr) {
    q[rr] = a.q + pr.offset[rr];
    d_o[rr] = a.d_o + pr.offset[rr];
    lse[rr] = a.lse[pr.lse_index[rr]];
    const float* o = a.o + pr.offset[rr];
    float dsum = 0.0f;  // D = rowsum(dO * O): the softmax Jacobian's diagonal correction
    for (int64_t d = 0; d < hd; ++d) dsum += d_o[rr][d] * o[d];
    delta[rr] = dsum;
    one[rr] = 1.0f;
  }
  for (int64_t i = 0; i < NR * hd * kLanes; ++i) u.row_acc[i] = 0.0f;
  const VecI lanes = lane_index();
  const int64_t last_block = pr.token[NR - 1] / kBlock;
  for (int64_t b = 0; b <= last_block; ++b) {
    const float* kt = u.kt + b * hd * kBlock;
    const float* vt = u.vt + b * hd * kBlock;
    float* dkt = u.dkt + b * hd * kBlock;
    float* dvt = u.dvt + b * hd * kBlock;
    VecF p[NR][kVecsPerBlock], ds[NR][kVecsPerBlock];
    block_dots<NR>(q, kt, hd, p);
    block_dots<NR>(d_o, vt, hd, ds);  // dP = dO . V
    for (int rr = 0; rr < NR; ++rr) {
      const VecI visible_limit = VecI{} + int32_t(pr.token[rr] + 1 - b * kBlock);
      for (int c = 0; c < kVecsPerBlock; ++c) {
        const VecI visible = lanes + c * kLanes < visible_limit;
        p[rr][c] = visible ? vexp(p[rr][c] * s.scale - lse[rr]) : VecF{};
        ds[rr][c] = p[rr][c] * (ds[rr][c] - delta[rr]) * s.scale;
      }
    }
    // dVt[d] += sum_rr dO_rr[d] P_rr and dKt[d] += sum_rr q_rr[d] dS_rr, rows in order.
    for (int64_t d = 0; d < hd; ++d) {
      float* dv_d = dvt + d * kBlock;
      float* dk_d = dkt + d * kBlock;
      for (int c = 0; c < kVecsPerBlock; ++c) {
        VecF accv = vload(dv_d + c * kLanes), acck = vload(dk_d + c * kLanes);
        for (int rr = 0; rr < NR; ++rr) {
          accv = vfma(vsplat(d_o[rr][d]), p[rr][c], accv);
          acck = vfma(vsplat(q[rr][d]), ds[rr][c], acck);
        }
        vstore(dv_d + c * kLanes, accv);
        vstore(dk_d + c * kLanes, acck);
      }
    }
    block_weighted_rows<NR>(ds, one, kt, hd, u.row_acc);  // dq += dS K
  }
  for (int rr = 0; rr < NR; ++rr) {
    float* dq = a.dq + pr.offset[rr];
    for (int64_t d = 0; d < hd; ++d) dq[d] = hsum(vload(u.row_acc + (rr * hd + d) * kLanes));
  }
}

inline void forward_unit_impl(const AttentionForwardArgs& a, int64_t seq, int64_t kvh, float* scratch) {
  const AttentionShape& s = a.shape;
  const UnitScratch u = carve(s, scratch);
  transpose_kv(s, a.k, seq, kvh, u.kt);
  transpose_kv(s, a.v, seq, kvh, u.vt);
  const int64_t n_rows = s.n_ctx * (s.n_head / s.n_head_kv);
  int64_t r = 0;
  for (; r + kRows <= n_rows; r += kRows) forward_pass<kRows>(a, seq, kvh, r, u);
  for (; r < n_rows; ++r) forward_pass<1>(a, seq, kvh, r, u);
}

inline void backward_unit_impl(const AttentionBackwardArgs& a, int64_t seq, int64_t kvh, float* scratch) {
  const AttentionShape& s = a.shape;
  const UnitScratch u = carve(s, scratch);
  transpose_kv(s, a.k, seq, kvh, u.kt);
  transpose_kv(s, a.v, seq, kvh, u.vt);
  const int64_t tf = transposed_floats(s);
  for (int64_t i = 0; i < tf; ++i) u.dkt[i] = 0.0f;
  for (int64_t i = 0; i < tf; ++i) u.dvt[i] = 0.0f;
  const int64_t n_rows = s.n_ctx * (s.n_head / s.n_head_kv);
  int64_t r = 0;
  for (; r + kRows <= n_rows; r += kRows) backward_pass<kRows>(a, seq, kvh, r, u);
  for (; r < n_rows; ++r) backward_pass<1>(a, seq, kvh, r, u);
  untranspose_kv(s, u.dkt, seq, kvh, a.dk);
  untranspose_kv(s, u.dvt, seq, kvh, a.dv);
}

}  // namespace
}  // namespace tern::train::detail
