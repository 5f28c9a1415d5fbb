#pragma once
// The tiled (flash-style) attention kernel, written once over a 16-float vector type V and
// compiled per ISA by attention_avx2.cpp (V = two __m256), attention_avx512.cpp (V = one
// __m512) and, on ARM64, attention_neon.cpp (V = four float32x4_t). Everything has internal
// linkage and uses no std:: templates (see attention_iface.h).
//
// For a tile of R query rows (tokens i0..i1-1 times the g query heads of one KV head) the
// context is walked in blocks of kKeyBlock (64) positions:
//   Kt = K_block^T                          [head_dim][64]  (loaded once, used by all R rows)
//   S  = Q Kt * scale, causal mask -> -inf  [R][64]         (4 vectors per row, in registers)
//   online softmax: m' = max(m, max S), c = exp(m - m'), P = exp(S - m'),
//                   l = l c + sum P,  O = O c + P V_block
// and finally out = O / l. No n x n matrix exists. Each row's arithmetic depends only on that
// row (its query, its position, the keys it sees), never on the rows beside it in the tile, so
// a sequence's output is the same whatever it is batched with.
// K/V may be stored as IEEE half (KvType::F16): the K-block transpose and the P*V loads widen
// them with vcvtph2ps, which is exact, so the arithmetic is the f32 kernel's over the stored
// values (the same bits as an f32 arena holding them).
// GCC 12's AVX-512 headers build _mm512_undefined_*() as a self-initialised variable, which
// -Wmaybe-uninitialized reports inside intrinsics; silenced for the header's lines only.
#if defined(__aarch64__)
#include <arm_neon.h>
#else
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include <math.h>  // tanhf: a plain C function, no inline copy compiled for this ISA
#include <cstdint>
#include <type_traits>

#include "ops/attention_iface.h"

namespace tern::attn {
namespace {

#if defined(__AVX512F__)
struct V {
  __m512 v;
};
constexpr int kRowsPerPass = 4;  // query rows sharing each Kt load: 4 x 4 accumulators
constexpr int kPvRows = 4;       // query rows sharing each V load in P V: 4 x 4 accumulators
constexpr bool kPvBy16 = false;
inline V vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline V vload(const uint16_t* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }
inline void vstore(float* p, V a) { _mm512_storeu_ps(p, a.v); }
inline V vset1(float x) { return {_mm512_set1_ps(x)}; }
inline V vzero() { return {_mm512_setzero_ps()}; }
inline V vfma(V a, V b, V c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline V vmul(V a, V b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V vadd(V a, V b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V vsub(V a, V b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline V vmax(V a, V b) { return {_mm512_max_ps(a.v, b.v)}; }
inline V vdiv(V a, V b) { return {_mm512_div_ps(a.v, b.v)}; }
// a where x >= 0, else b.
inline V vselect_nonneg(V x, V a, V b) {
  return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(x.v, _mm512_setzero_ps(), _CMP_GE_OQ), b.v, a.v)};
}
inline float vhmax(V a) { return _mm512_reduce_max_ps(a.v); }
inline float vhsum(V a) { return _mm512_reduce_add_ps(a.v); }
// Lanes whose index base + lane is >= limit become `fill`.
inline V vkeep_below(V a, int32_t base, int32_t limit, float fill) {
  const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(base),
                                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  const __mmask16 keep = _mm512_cmplt_epi32_mask(idx, _mm512_set1_epi32(limit));
  return {_mm512_mask_blend_ps(keep, _mm512_set1_ps(fill), a.v)};
}
inline V vround(V a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
// 2^n for integral n in [-126, 127].
inline V vexp2i(V n) {
  const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(e, 23))};
}
// 0 where x < lim, else a.
inline V vzero_below(V a, V x, float lim) {
  const __mmask16 low = _mm512_cmp_ps_mask(x.v, _mm512_set1_ps(lim), _CMP_LT_OQ);
  return {_mm512_mask_blend_ps(low, a.v, _mm512_setzero_ps())};
}
#elif defined(__aarch64__)
struct V {
  float32x4_t q[4];
};
constexpr int kRowsPerPass = 1;  // 4 accumulators of four q registers each: half the register file
constexpr int kPvRows = 1;
constexpr bool kPvBy16 = false;
inline V vload(const float* p) { return {{vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)}}; }
inline V vload(const uint16_t* p) {
  V r;
  for (int i = 0; i < 4; ++i) r.q[i] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * i)));
  return r;
}
inline void vstore(float* p, V a) {
  for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, a.q[i]);
}
inline V vset1(float x) {
  const float32x4_t v = vdupq_n_f32(x);
  return {{v, v, v, v}};
}
inline V vzero() { return vset1(0.0f); }
// Lane by lane: V op(V a, V b) from a float32x4_t one.
#define TERN_ATTN_LANEWISE(name, expr)                 \
  inline V name(V a, V b) {                            \
    V r;                                               \
    for (int i = 0; i < 4; ++i) r.q[i] = expr(a.q[i], b.q[i]); \
    return r;                                          \
  }
TERN_ATTN_LANEWISE(vmul, vmulq_f32)
TERN_ATTN_LANEWISE(vadd, vaddq_f32)
TERN_ATTN_LANEWISE(vsub, vsubq_f32)
TERN_ATTN_LANEWISE(vmax, vmaxq_f32)
TERN_ATTN_LANEWISE(vdiv, vdivq_f32)
#undef TERN_ATTN_LANEWISE
inline V vfma(V a, V b, V c) {  // a * b + c, fused
  V r;
  for (int i = 0; i < 4; ++i) r.q[i] = vfmaq_f32(c.q[i], a.q[i], b.q[i]);
  return r;
}
inline V vselect_nonneg(V x, V a, V b) {  // x >= 0 ? a : b
  V r;
  for (int i = 0; i < 4; ++i) r.q[i] = vbslq_f32(vcgeq_f32(x.q[i], vdupq_n_f32(0.0f)), a.q[i], b.q[i]);
  return r;
}
inline float vhmax(V a) { return vmaxvq_f32(vmaxq_f32(vmaxq_f32(a.q[0], a.q[1]), vmaxq_f32(a.q[2], a.q[3]))); }
inline float vhsum(V a) { return vaddvq_f32(vaddq_f32(vaddq_f32(a.q[0], a.q[1]), vaddq_f32(a.q[2], a.q[3]))); }
constexpr int32_t kLaneIndex[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
inline V vkeep_below(V a, int32_t base, int32_t limit, float fill) {  // lane i: base + i < limit ? a : fill
  V r;
  for (int i = 0; i < 4; ++i) {
    const int32x4_t idx = vaddq_s32(vdupq_n_s32(base), vld1q_s32(kLaneIndex + 4 * i));
    r.q[i] = vbslq_f32(vcltq_s32(idx, vdupq_n_s32(limit)), a.q[i], vdupq_n_f32(fill));
  }
  return r;
}
inline V vround(V a) {  // to nearest, ties to even
  V r;
  for (int i = 0; i < 4; ++i) r.q[i] = vrndnq_f32(a.q[i]);
  return r;
}
inline V vexp2i(V n) {  // 2^n for integral n
  V r;
  for (int i = 0; i < 4; ++i)
    r.q[i] = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n.q[i]), vdupq_n_s32(127)), 23));
  return r;
}
inline V vzero_below(V a, V x, float lim) {  // x < lim ? 0 : a
  V r;
  for (int i = 0; i < 4; ++i)
    r.q[i] = vbslq_f32(vcltq_f32(x.q[i], vdupq_n_f32(lim)), vdupq_n_f32(0.0f), a.q[i]);
  return r;
}
#else
struct V {
  __m256 lo, hi;
};
constexpr int kRowsPerPass = 1;  // 4 accumulators of two ymm each already fill the registers
constexpr int kPvRows = 2;       // P V by 16 columns: 2 rows x 2 chains of two ymm, 4 for V
constexpr bool kPvBy16 = true;
inline V vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline V vload(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}
inline void vstore(float* p, V a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline V vset1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline V vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V vfma(V a, V b, V c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline V vmul(V a, V b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline V vadd(V a, V b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline V vsub(V a, V b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline V vmax(V a, V b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline V vdiv(V a, V b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline V vselect_nonneg(V x, V a, V b) {
  const __m256 z = _mm256_setzero_ps();
  return {_mm256_blendv_ps(b.lo, a.lo, _mm256_cmp_ps(x.lo, z, _CMP_GE_OQ)),
          _mm256_blendv_ps(b.hi, a.hi, _mm256_cmp_ps(x.hi, z, _CMP_GE_OQ))};
}
inline float hreduce8(__m256 x, bool is_max) {
  __m128 h = is_max ? _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1))
                    : _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  __m128 s = _mm_movehl_ps(h, h);
  h = is_max ? _mm_max_ps(h, s) : _mm_add_ps(h, s);
  s = _mm_shuffle_ps(h, h, 1);
  h = is_max ? _mm_max_ss(h, s) : _mm_add_ss(h, s);
  return _mm_cvtss_f32(h);
}
inline float vhmax(V a) { return hreduce8(_mm256_max_ps(a.lo, a.hi), true); }
inline float vhsum(V a) { return hreduce8(_mm256_add_ps(a.lo, a.hi), false); }
inline V vkeep_below(V a, int32_t base, int32_t limit, float fill) {
  const __m256i lim = _mm256_set1_epi32(limit);
  const __m256i idx_lo = _mm256_add_epi32(_mm256_set1_epi32(base), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i idx_hi = _mm256_add_epi32(idx_lo, _mm256_set1_epi32(8));
  const __m256 f = _mm256_set1_ps(fill);
  return {_mm256_blendv_ps(f, a.lo, _mm256_castsi256_ps(_mm256_cmpgt_epi32(lim, idx_lo))),
          _mm256_blendv_ps(f, a.hi, _mm256_castsi256_ps(_mm256_cmpgt_epi32(lim, idx_hi)))};
}
inline V vround(V a) {
  return {_mm256_round_ps(a.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
          _mm256_round_ps(a.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
inline V vexp2i(V n) {
  const __m256i b = _mm256_set1_epi32(127);
  return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n.lo), b), 23)),
          _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n.hi), b), 23))};
}
inline V vzero_below(V a, V x, float lim) {
  const __m256 l = _mm256_set1_ps(lim);
  return {_mm256_andnot_ps(_mm256_cmp_ps(x.lo, l, _CMP_LT_OQ), a.lo),
          _mm256_andnot_ps(_mm256_cmp_ps(x.hi, l, _CMP_LT_OQ), a.hi)};
}
#endif

// exp(x) for x <= 0: Cody-Waite reduction x = n ln2 + r, a degree-6 polynomial for exp(r) on
// |r| <= ln2/2 (relative error ~2e-7), times 2^n; 0 below -87 (and for -inf), where expf
// underflows anyway.
inline V vexp_nonpos(V x) {
  const V xc = vmax(x, vset1(-87.0f));
  const V n = vround(vmul(xc, vset1(1.44269504088896341f)));
  V r = vfma(n, vset1(-0.693359375f), xc);
  r = vfma(n, vset1(2.12194440e-4f), r);
  V p = vset1(1.9875691500e-4f);
  p = vfma(p, r, vset1(1.3981999507e-3f));
  p = vfma(p, r, vset1(8.3334519073e-3f));
  p = vfma(p, r, vset1(4.1665795894e-2f));
  p = vfma(p, r, vset1(1.6666665459e-1f));
  p = vfma(p, r, vset1(5.0000001201e-1f));
  const V e = vadd(vfma(vmul(p, r), r, r), vset1(1.0f));
  return vzero_below(vmul(e, vexp2i(n)), x, -87.0f);
}
// out = silu(g) * u = g * sigmoid(g) * u, with sigmoid from e = exp(-|g|) (never overflows):
// 1 / (1 + e) for g >= 0, e / (1 + e) below. The tail goes through the same vector code on a
// padded copy, so an element's result does not depend on where a range starts or ends.
inline V silu_mul_v(V g, V u) {
  const V e = vexp_nonpos(vsub(vzero(), vmax(g, vsub(vzero(), g))));
  const V one = vset1(1.0f);
  return vmul(vmul(g, vdiv(vselect_nonneg(g, one, e), vadd(one, e))), u);
}
inline void silu_mul_impl(const float* g, const float* u, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) vstore(out + i, silu_mul_v(vload(g + i), vload(u + i)));
  if (i < n) {
    float gb[16], ub[16], ob[16];
    for (int k = 0; k < 16; ++k) {
      gb[k] = i + k < n ? g[i + k] : 0.0f;
      ub[k] = i + k < n ? u[i + k] : 0.0f;
    }
    vstore(ob, silu_mul_v(vload(gb), vload(ub)));
    for (int64_t k = 0; i + k < n; ++k) out[i + k] = ob[k];
  }
}

// K/V elements as f32: a float as it is, a half widened (exact; vcvtph2ps, F16C on both x86
// ISAs; fcvtl on ARM64). V8: 8 floats (one __m256, two float32x4_t), for head_dim tails of 8.
inline float kv_f32(float x) { return x; }
#if defined(__aarch64__)
inline float kv_f32(uint16_t h) {
  __fp16 v;
  __builtin_memcpy(&v, &h, 2);
  return float(v);
}
struct V8 {
  float32x4_t lo, hi;
};
inline V8 kv_load8(const float* p) { return {vld1q_f32(p), vld1q_f32(p + 4)}; }
inline V8 kv_load8(const uint16_t* p) {
  return {vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))), vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4)))};
}
inline V8 v8_zero() { return {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; }
// 8 int8 (q8_0) or 8 nibbles minus 8 (q4_0: the low or high halves of 8 bytes) times d, as
// float(q) * d: exact, the scalar dequantizer's values.
inline V8 q8_load8(const int8_t* q, float d) {
  const int16x8_t w = vmovl_s8(vld1_s8(q));
  return {vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), d),
          vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))), d)};
}
inline V8 q4_load8(const uint8_t* qs, int shift, float d) {
  uint8x8_t b = vld1_u8(qs);
  b = shift ? vshr_n_u8(b, 4) : vand_u8(b, vdup_n_u8(0x0F));
  const int16x8_t w = vsubq_s16(vreinterpretq_s16_u16(vmovl_u8(b)), vdupq_n_s16(8));
  return {vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), d),
          vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))), d)};
}
// 8 2-bit codes of a 32-element chunk of 8 bytes (kivi2: element j at bits 2 (j / 8) of byte
// j % 8), elements 8 sub .. 8 sub + 7, as f32.
inline V8 q2_codes8(const uint8_t* chunk, int sub) {
  const uint8x8_t b = vand_u8(vshl_u8(vld1_u8(chunk), vdup_n_s8(int8_t(-2 * sub))), vdup_n_u8(3));
  const uint16x8_t w = vmovl_u8(b);
  return {vcvtq_f32_u32(vmovl_u16(vget_low_u16(w))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(w)))};
}
inline V8 v8_set1(float x) { return {vdupq_n_f32(x), vdupq_n_f32(x)}; }
inline V8 v8_fmav(V8 a, V8 b, V8 c) { return {vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)}; }  // a * b + c, fused
inline V8 v8_fma(float a, V8 b, V8 c) { return {vfmaq_n_f32(c.lo, b.lo, a), vfmaq_n_f32(c.hi, b.hi, a)}; }  // a * b + c
inline V8 v8_add(V8 a, V8 b) { return {vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)}; }
inline void v8_store(float* p, V8 a) {
  vst1q_f32(p, a.lo);
  vst1q_f32(p + 4, a.hi);
}

// dst[i] = half(src[i]), rounded to nearest even (fcvtn; the default FPCR rounding, no flush).
inline void f32_to_f16_impl(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1_u16(dst + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
  for (; i < n; ++i) {
    const __fp16 h = __fp16(src[i]);
    __builtin_memcpy(dst + i, &h, 2);
  }
}

// 4 x 4 transpose in registers: rows a, b, c, d become columns.
inline void transpose4x4(float32x4_t& a, float32x4_t& b, float32x4_t& c, float32x4_t& d) {
  const float32x4_t t0 = vtrn1q_f32(a, b), t1 = vtrn2q_f32(a, b), t2 = vtrn1q_f32(c, d), t3 = vtrn2q_f32(c, d);
  a = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
  b = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
  c = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
  d = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
}

// dst[i * ld + r] = rows[r][d0 + i] for r, i in 0..7: four 4 x 4 register transposes. P: a row
// pointer (const float*, const uint16_t*, or a quantized row's QRow).
template <class P>
inline void transpose8x8(const P* rows, int64_t d0, float* dst, int64_t ld) {
  float32x4_t lo[8], hi[8];  // row r's elements d0..d0+3, d0+4..d0+7
  for (int r = 0; r < 8; ++r) {
    const V8 v = kv_load8(rows[r] + d0);
    lo[r] = v.lo;
    hi[r] = v.hi;
  }
  transpose4x4(lo[0], lo[1], lo[2], lo[3]);  // lo[i]: element i of rows 0..3
  transpose4x4(lo[4], lo[5], lo[6], lo[7]);  // lo[4 + i]: element i of rows 4..7
  transpose4x4(hi[0], hi[1], hi[2], hi[3]);  // hi[i]: element 4 + i of rows 0..3
  transpose4x4(hi[4], hi[5], hi[6], hi[7]);
  for (int i = 0; i < 4; ++i) {
    vst1q_f32(dst + i * ld, lo[i]);
    vst1q_f32(dst + i * ld + 4, lo[4 + i]);
    vst1q_f32(dst + (4 + i) * ld, hi[i]);
    vst1q_f32(dst + (4 + i) * ld + 4, hi[4 + i]);
  }
}
#else
inline float kv_f32(uint16_t h) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(int(h)))); }
using V8 = __m256;
inline V8 kv_load8(const float* p) { return _mm256_loadu_ps(p); }
inline V8 kv_load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline V8 v8_zero() { return _mm256_setzero_ps(); }
// 8 int8 (q8_0) or 8 nibbles minus 8 (q4_0: the low or high halves of 8 bytes) times d, as
// float(q) * d: exact, the scalar dequantizer's values.
inline V8 q8_load8(const int8_t* q, float d) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), _mm256_set1_ps(d));
}
inline V8 q4_load8(const uint8_t* qs, int shift, float d) {
  __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs));
  b = _mm_and_si128(shift ? _mm_srli_epi16(b, 4) : b, _mm_set1_epi8(0x0F));
  const __m256i w = _mm256_sub_epi32(_mm256_cvtepu8_epi32(b), _mm256_set1_epi32(8));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(w), _mm256_set1_ps(d));
}
// 8 2-bit codes of a 32-element chunk of 8 bytes (kivi2: element j at bits 2 (j / 8) of byte
// j % 8), elements 8 sub .. 8 sub + 7, as f32 (a 16-bit shift: the mask drops what crosses bytes).
inline V8 q2_codes8(const uint8_t* chunk, int sub) {
  __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(chunk));
  b = _mm_and_si128(_mm_srl_epi16(b, _mm_cvtsi32_si128(2 * sub)), _mm_set1_epi8(3));
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
}
inline V8 v8_set1(float x) { return _mm256_set1_ps(x); }
inline V8 v8_fmav(V8 a, V8 b, V8 c) { return _mm256_fmadd_ps(a, b, c); }  // a * b + c, fused
inline V8 v8_fma(float a, V8 b, V8 c) { return _mm256_fmadd_ps(_mm256_set1_ps(a), b, c); }  // a * b + c
inline V8 v8_add(V8 a, V8 b) { return _mm256_add_ps(a, b); }
inline void v8_store(float* p, V8 a) { _mm256_storeu_ps(p, a); }

// dst[i] = half(src[i]), rounded to nearest even (vcvtps2ph).
inline void f32_to_f16_impl(const float* src, uint16_t* dst, int64_t n) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), kRound));
#endif
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), kRound));
  for (; i < n; ++i) dst[i] = uint16_t(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(src[i]), kRound), 0));
}
#endif

inline float exp_nonpos(float x) {
  float lanes[16];
  vstore(lanes, vexp_nonpos(vset1(x)));
  return lanes[0];
}

// The selective scan (attention_iface.h, SsmScanArgs): per channel and token, the d_state states
// 16 at a time; dt A <= 0, so exp is the attention kernels' exp_nonpos (a tail of states, when
// d_state is not a multiple of 16, takes the same function lane by lane: the same values).
inline void ssm_scan_impl(const SsmScanArgs& a, int64_t c0, int64_t c1) {
  const int64_t S = a.d_state;
  for (int64_t c = c0; c < c1; ++c) {
    float* h = a.h + c * S;
    const float* A = a.a + c * S;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const float raw = a.dt[t * a.lddt + c];
      const float dt = raw <= 20.0f ? log1pf(expf(raw)) : raw;
      const float u = a.u[t * a.ldu + c];
      const float udt = u * dt;
      const float* B = a.b + t * a.ldbc;
      const float* C = a.c + t * a.ldbc;
      const V vdt = vset1(dt), vudt = vset1(udt);
      V acc = vzero();
      int64_t k = 0;
      for (; k + 16 <= S; k += 16) {
        const V hv = vfma(vload(h + k), vexp_nonpos(vmul(vdt, vload(A + k))), vmul(vload(B + k), vudt));
        vstore(h + k, hv);
        acc = vfma(hv, vload(C + k), acc);
      }
      float y = vhsum(acc);
      for (; k < S; ++k) {
        h[k] = h[k] * exp_nonpos(dt * A[k]) + B[k] * udt;
        y += h[k] * C[k];
      }
      y += a.d[c] * u;
      const float z = a.z[t * a.ldz + c];
      a.y[t * a.ldy + c] = y * (z / (1.0f + expf(-z)));
    }
  }
}

// Mamba-2's scan (attention_iface.h, Ssm2ScanArgs): per head and token one decay exp(dt A)
// (expf, as the reference's std::exp), then each channel's d_state states 16 at a time, four
// channels of the head together (B and C loaded once for the four; four independent sums, so
// the FMA latency is hidden; each channel's arithmetic is the same as one at a time).
inline float ssm2_finish(const Ssm2ScanArgs& a, V acc, float* h, const float* B, const float* C, int64_t k0,
                         float decay, float x, float xdt, int64_t hd, int64_t t, int64_t ch) {
  float y = vhsum(acc);
  for (int64_t k = k0; k < a.d_state; ++k) {
    h[k] = h[k] * decay + B[k] * xdt;
    y += h[k] * C[k];
  }
  y += a.d[hd] * x;
  const float z = a.z[t * a.ldz + ch];
  return y * (z / (1.0f + expf(-z)));
}

inline void ssm2_scan_impl(const Ssm2ScanArgs& a, int64_t h0, int64_t h1) {
  const int64_t S = a.d_state, P = a.head_dim, S16 = S - S % 16;
  for (int64_t hd = h0; hd < h1; ++hd) {
    const int64_t g = hd / a.heads_per_group;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const float raw = a.dt[t * a.lddt + hd];
      const float dt = raw <= 20.0f ? log1pf(expf(raw)) : raw;
      const float decay = expf(dt * a.a[hd]);
      const float* B = a.b + t * a.ldbc + g * S;
      const float* C = a.c + t * a.ldbc + g * S;
      const V vdecay = vset1(decay);
      int64_t p = 0;
      for (; p + 4 <= P; p += 4) {
        float* h[4];
        float x[4], xdt[4];
        V vxdt[4], acc[4];
        for (int j = 0; j < 4; ++j) {
          const int64_t ch = hd * P + p + j;
          h[j] = a.h + ch * S;
          x[j] = a.x[t * a.ldx + ch];
          xdt[j] = x[j] * dt;
          vxdt[j] = vset1(xdt[j]);
          acc[j] = vzero();
        }
        for (int64_t k = 0; k < S16; k += 16) {
          const V vb = vload(B + k), vc = vload(C + k);
          for (int j = 0; j < 4; ++j) {
            const V hv = vfma(vload(h[j] + k), vdecay, vmul(vb, vxdt[j]));
            vstore(h[j] + k, hv);
            acc[j] = vfma(hv, vc, acc[j]);
          }
        }
        for (int j = 0; j < 4; ++j) {
          const int64_t ch = hd * P + p + j;
          a.y[t * a.ldy + ch] = ssm2_finish(a, acc[j], h[j], B, C, S16, decay, x[j], xdt[j], hd, t, ch);
        }
      }
      for (; p < P; ++p) {
        const int64_t ch = hd * P + p;
        float* h = a.h + ch * S;
        const float x = a.x[t * a.ldx + ch];
        const float xdt = x * dt;
        const V vxdt = vset1(xdt);
        V acc = vzero();
        for (int64_t k = 0; k < S16; k += 16) {
          const V hv = vfma(vload(h + k), vdecay, vmul(vload(B + k), vxdt));
          vstore(h + k, hv);
          acc = vfma(hv, vload(C + k), acc);
        }
        a.y[t * a.ldy + ch] = ssm2_finish(a, acc, h, B, C, S16, decay, x, xdt, hd, t, ch);
      }
    }
  }
}

#if !defined(__aarch64__)
// dst[i * ld + r] = rows[r][d0 + i] for r, i in 0..7: eight 8-element row pieces (f32, or f16
// widened as loaded, or quantized and dequantized as loaded) transposed in registers (unpack,
// shuffle, 128-bit permute), AVX on both ISAs. P: a row pointer, as above.
template <class P>
inline void transpose8x8(const P* rows, int64_t d0, float* dst, int64_t ld) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = kv_load8(rows[i] + d0);
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  _mm256_storeu_ps(dst + 0 * ld, _mm256_permute2f128_ps(u0, u4, 0x20));
  _mm256_storeu_ps(dst + 1 * ld, _mm256_permute2f128_ps(u1, u5, 0x20));
  _mm256_storeu_ps(dst + 2 * ld, _mm256_permute2f128_ps(u2, u6, 0x20));
  _mm256_storeu_ps(dst + 3 * ld, _mm256_permute2f128_ps(u3, u7, 0x20));
  _mm256_storeu_ps(dst + 4 * ld, _mm256_permute2f128_ps(u0, u4, 0x31));
  _mm256_storeu_ps(dst + 5 * ld, _mm256_permute2f128_ps(u1, u5, 0x31));
  _mm256_storeu_ps(dst + 6 * ld, _mm256_permute2f128_ps(u2, u6, 0x31));
  _mm256_storeu_ps(dst + 7 * ld, _mm256_permute2f128_ps(u3, u7, 0x31));
}
#endif

constexpr int64_t kB = kKeyBlock;
static_assert(kB == 64, "the score loop keeps one block row in 4 vectors of 16");

// S rows of NR query rows for one key block: s[rr][j] = sum_d q[rr][d] * Kt[d][j], d in order.
template <int NR>
inline void block_scores(const float* const* q, const float* Kt, int64_t hd, float* const* s) {
  V acc[NR][4];
  for (int rr = 0; rr < NR; ++rr)
    for (int c = 0; c < 4; ++c) acc[rr][c] = vzero();
  for (int64_t d = 0; d < hd; ++d) {
    const float* kt = Kt + d * kB;
    const V k0 = vload(kt), k1 = vload(kt + 16), k2 = vload(kt + 32), k3 = vload(kt + 48);
    for (int rr = 0; rr < NR; ++rr) {
      const V qd = vset1(q[rr][d]);
      acc[rr][0] = vfma(qd, k0, acc[rr][0]);
      acc[rr][1] = vfma(qd, k1, acc[rr][1]);
      acc[rr][2] = vfma(qd, k2, acc[rr][2]);
      acc[rr][3] = vfma(qd, k3, acc[rr][3]);
    }
  }
  for (int rr = 0; rr < NR; ++rr)
    for (int c = 0; c < 4; ++c) vstore(s[rr] + 16 * c, acc[rr][c]);
}

// o[0..hd) = o + sum_{j < nv} p[j] * vrow[j][0..hd). Two interleaved chains over j (even and odd
// keys) per 16 columns, summed at the end: a fixed order for a given row. V rows through row
// pointers P (floats; halves widened as loaded; a quantized row's QRow, dequantized as loaded).
template <class P>
inline void accumulate_pv(float* o, const float* p, const P* vrow, int64_t nv, int64_t hd) {
  int64_t c = 0;
  for (; c + 32 <= hd; c += 32) {
    V a0 = vload(o + c), a1 = vload(o + c + 16), b0 = vzero(), b1 = vzero();
    int64_t j = 0;
    for (; j + 1 < nv; j += 2) {
      const V pj = vset1(p[j]), pk = vset1(p[j + 1]);
      a0 = vfma(pj, vload(vrow[j] + c), a0);
      a1 = vfma(pj, vload(vrow[j] + c + 16), a1);
      b0 = vfma(pk, vload(vrow[j + 1] + c), b0);
      b1 = vfma(pk, vload(vrow[j + 1] + c + 16), b1);
    }
    if (j < nv) {
      const V pj = vset1(p[j]);
      a0 = vfma(pj, vload(vrow[j] + c), a0);
      a1 = vfma(pj, vload(vrow[j] + c + 16), a1);
    }
    vstore(o + c, vadd(a0, b0));
    vstore(o + c + 16, vadd(a1, b1));
  }
  for (; c + 16 <= hd; c += 16) {
    V a0 = vload(o + c), b0 = vzero();
    int64_t j = 0;
    for (; j + 1 < nv; j += 2) {
      a0 = vfma(vset1(p[j]), vload(vrow[j] + c), a0);
      b0 = vfma(vset1(p[j + 1]), vload(vrow[j + 1] + c), b0);
    }
    if (j < nv) a0 = vfma(vset1(p[j]), vload(vrow[j] + c), a0);
    vstore(o + c, vadd(a0, b0));
  }
  // 8 columns at a time (head_dim 8 or 24, a tail of 8): four chains over j (j mod 4), summed
  // at the end. One scalar chain per column here cost a dependent FMA per key and column:
  // with head_dim 8 (stories260K) that made the P V product most of a decode step.
  for (; c + 8 <= hd; c += 8) {
    V8 a0 = kv_load8(o + c), a1 = v8_zero(), a2 = a1, a3 = a1;
    int64_t j = 0;
    for (; j + 3 < nv; j += 4) {
      a0 = v8_fma(p[j], kv_load8(vrow[j] + c), a0);
      a1 = v8_fma(p[j + 1], kv_load8(vrow[j + 1] + c), a1);
      a2 = v8_fma(p[j + 2], kv_load8(vrow[j + 2] + c), a2);
      a3 = v8_fma(p[j + 3], kv_load8(vrow[j + 3] + c), a3);
    }
    for (; j < nv; ++j) a0 = v8_fma(p[j], kv_load8(vrow[j] + c), a0);
    v8_store(o + c, v8_add(v8_add(a0, a1), v8_add(a2, a3)));
  }
  for (; c < hd; ++c) {  // head_dim not a multiple of 8
    float acc = o[c];
    for (int64_t j = 0; j < nv; ++j) acc = __builtin_fmaf(p[j], kv_f32(vrow[j][c]), acc);
    o[c] = acc;
  }
}

// accumulate_pv for NR rows that read the same V rows (one tile's block), each with its own
// output o[i], probabilities p[i] and key count nv[i] (head_dim a multiple of 32): each V load
// serves the NR rows. Every row's chains are accumulate_pv's, in its order (the pairs all rows
// see run together; each row then goes on alone to its own nv), so every row's bits are those
// of accumulate_pv on it alone.
// Each column's chains are independent of the others', so columns may be taken 16 at a time
// instead of 32 (AVX2: its 16 registers hold two rows' accumulators that way), with the same bits.
template <int NR, class P>
inline void accumulate_pv_rows16(float* const* o, const float* const* p, const int32_t* nv, const P* vrow,
                                 int64_t hd) {
  int64_t joint = nv[0];
  for (int i = 1; i < NR; ++i) joint = nv[i] < joint ? nv[i] : joint;
  for (int64_t c = 0; c + 16 <= hd; c += 16) {
    V a[NR], b[NR];
    for (int i = 0; i < NR; ++i) {
      a[i] = vload(o[i] + c);
      b[i] = vzero();
    }
    int64_t j = 0;
    for (; j + 1 < joint; j += 2) {
      const V vj = vload(vrow[j] + c), vk = vload(vrow[j + 1] + c);
      for (int i = 0; i < NR; ++i) {
        a[i] = vfma(vset1(p[i][j]), vj, a[i]);
        b[i] = vfma(vset1(p[i][j + 1]), vk, b[i]);
      }
    }
    for (int i = 0; i < NR; ++i) {
      int64_t k = j;
      for (; k + 1 < nv[i]; k += 2) {
        a[i] = vfma(vset1(p[i][k]), vload(vrow[k] + c), a[i]);
        b[i] = vfma(vset1(p[i][k + 1]), vload(vrow[k + 1] + c), b[i]);
      }
      if (k < nv[i]) a[i] = vfma(vset1(p[i][k]), vload(vrow[k] + c), a[i]);
      vstore(o[i] + c, vadd(a[i], b[i]));
    }
  }
}

template <int NR, class P>
inline void accumulate_pv_rows(float* const* o, const float* const* p, const int32_t* nv, const P* vrow, int64_t hd) {
  if constexpr (kPvBy16) {
    accumulate_pv_rows16<NR>(o, p, nv, vrow, hd);
    return;
  }
  int64_t joint = nv[0];
  for (int i = 1; i < NR; ++i) joint = nv[i] < joint ? nv[i] : joint;
  for (int64_t c = 0; c + 32 <= hd; c += 32) {
    V a0[NR], a1[NR], b0[NR], b1[NR];
    for (int i = 0; i < NR; ++i) {
      a0[i] = vload(o[i] + c);
      a1[i] = vload(o[i] + c + 16);
      b0[i] = vzero();
      b1[i] = vzero();
    }
    int64_t j = 0;
    for (; j + 1 < joint; j += 2) {
      const V vj0 = vload(vrow[j] + c), vj1 = vload(vrow[j] + c + 16);
      const V vk0 = vload(vrow[j + 1] + c), vk1 = vload(vrow[j + 1] + c + 16);
      for (int i = 0; i < NR; ++i) {
        const V pj = vset1(p[i][j]), pk = vset1(p[i][j + 1]);
        a0[i] = vfma(pj, vj0, a0[i]);
        a1[i] = vfma(pj, vj1, a1[i]);
        b0[i] = vfma(pk, vk0, b0[i]);
        b1[i] = vfma(pk, vk1, b1[i]);
      }
    }
    for (int i = 0; i < NR; ++i) {
      int64_t k = j;
      for (; k + 1 < nv[i]; k += 2) {
        const V pj = vset1(p[i][k]), pk = vset1(p[i][k + 1]);
        a0[i] = vfma(pj, vload(vrow[k] + c), a0[i]);
        a1[i] = vfma(pj, vload(vrow[k] + c + 16), a1[i]);
        b0[i] = vfma(pk, vload(vrow[k + 1] + c), b0[i]);
        b1[i] = vfma(pk, vload(vrow[k + 1] + c + 16), b1[i]);
      }
      if (k < nv[i]) {
        const V pj = vset1(p[i][k]);
        a0[i] = vfma(pj, vload(vrow[k] + c), a0[i]);
        a1[i] = vfma(pj, vload(vrow[k] + c + 16), a1[i]);
      }
      vstore(o[i] + c, vadd(a0[i], b0[i]));
      vstore(o[i] + c + 16, vadd(a1[i], b1[i]));
    }
  }
}

// dst[j][0..hd) = the values of vrow[j][0..hd) as f32, j < nb, read with the loads accumulate_pv
// uses (each element is widened or dequantized on its own, so the same floats whatever the load
// width): a tile whose rows all read the block's V rows widens them once instead of per row.
template <class P>
inline void widen_rows(const P* vrow, int64_t nb, int64_t hd, float* dst) {
  for (int64_t j = 0; j < nb; ++j) {
    float* d = dst + j * hd;
    int64_t c = 0;
    for (; c + 16 <= hd; c += 16) vstore(d + c, vload(vrow[j] + c));
    for (; c + 8 <= hd; c += 8) v8_store(d + c, kv_load8(vrow[j] + c));
    for (; c < hd; ++c) d[c] = kv_f32(vrow[j][c]);
  }
}

// Quantized arenas (KvType::Q8_0 / Q4_0): rows are read through QRow, a pointer-like view of
// a row of blocks whose loads dequantize 8 or 16 elements in registers (exact: an integer times
// an fp16 scale), so the f32 code runs unchanged over them and a quantized arena gives exactly
// what an f32 arena holding the dequantized values gives.
struct KvQ8_0 {
  static constexpr int64_t kBlockBytes = kKvQ8_0BlockBytes;
  // Elements j..j+7 of block b (scale d) as f32; element j alone.
  static V8 load8(const uint8_t* b, int64_t j, float d) { return q8_load8(reinterpret_cast<const int8_t*>(b + 2) + j, d); }
  static float element(const uint8_t* b, int64_t j, float d) { return float(int8_t(b[2 + j])) * d; }
};
struct KvQ4_0 {
  static constexpr int64_t kBlockBytes = kKvQ4_0BlockBytes;
  static V8 load8(const uint8_t* b, int64_t j, float d) { return q4_load8(b + 2 + (j & 15), j < 16 ? 0 : 4, d); }
  static float element(const uint8_t* b, int64_t j, float d) {
    const uint8_t q = b[2 + (j & 15)];
    return float(int(j < 16 ? q & 0x0F : q >> 4) - 8) * d;
  }
};
// Element e onwards of a row of Q blocks: rows[r] + d0 and rows[r][d] as for a float pointer.
template <class Q>
struct QRow {
  const uint8_t* row;
  int64_t e;
  QRow operator+(int64_t k) const { return {row, e + k}; }
  // (Element indices are never negative: unsigned division is a shift, with no sign fix-up.)
  const uint8_t* block(int64_t at) const { return row + uint64_t(at) / kKvQuantBlock * Q::kBlockBytes; }
  int64_t in_block(int64_t at) const { return int64_t(uint64_t(at) % kKvQuantBlock); }
  static float scale(const uint8_t* b) {
    uint16_t dh;
    __builtin_memcpy(&dh, b, 2);
    return kv_f32(dh);
  }
  float operator[](int64_t k) const {
    const uint8_t* b = block(e + k);
    return Q::element(b, in_block(e + k), scale(b));
  }
};
// 8 elements from e (a multiple of 8: they lie in one block); 16 as two such pieces.
template <class Q>
inline V8 kv_load8(QRow<Q> p) {
  const uint8_t* b = p.block(p.e);
  return Q::load8(b, p.in_block(p.e), QRow<Q>::scale(b));
}
// 16 elements of a decoding row (QRow, KiviRow) as two 8-element loads.
template <class Row>
inline V vload_pieces(Row p) {
  const V8 lo = kv_load8(p), hi = kv_load8(p + 8);
#if defined(__AVX512F__)
  return {_mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1))};
#elif defined(__aarch64__)
  return {{lo.lo, lo.hi, hi.lo, hi.hi}};
#else
  return {lo, hi};
#endif
}
template <class Q>
inline V vload(QRow<Q> p) {
  return vload_pieces(p);
}

// KIVI 2-bit arenas (KvType::Kivi2, attention_iface.h's KiviLayer): a row is the slot's fp16
// stage row while its group is open, else its sealed codes: K with the group's per-channel
// steps and minima, V as per-token blocks. Loads give fma(code, step, minimum) in f32, what
// the scalar decoder (ops.cpp) computes, so the f32 code runs unchanged over them.
struct KvKivi2 {};
inline uint32_t kivi_code(const uint8_t* chunk, int64_t j) { return (chunk[j % 8] >> (2 * (j / 8))) & 3u; }
struct KiviRow {
  const uint16_t* f16;   // open group: the slot's stage row (nothing else is read), else nullptr
  const uint8_t* codes;  // sealed: the slot's K codes row, or its V blocks row
  const uint16_t* step;  // sealed K: the group's per-channel steps; nullptr for V
  const uint16_t* mn;    // sealed K: the group's per-channel minima
  int64_t e;
  KiviRow operator+(int64_t k) const {
    KiviRow r = *this;
    r.e += k;
    return r;
  }
  static float half(const uint8_t* p) {
    uint16_t h;
    __builtin_memcpy(&h, p, 2);
    return kv_f32(h);
  }
  float operator[](int64_t k) const {
    const int64_t i = e + k;
    if (f16) return kv_f32(f16[i]);
    if (step) return __builtin_fmaf(float(kivi_code(codes + i / 32 * 8, i % 32)), kv_f32(step[i]), kv_f32(mn[i]));
    const uint8_t* b = codes + i / 32 * kKiviVBlockBytes;
    return __builtin_fmaf(float(kivi_code(b + 4, i % 32)), half(b), half(b + 2));
  }
};
// 8 elements from e (a multiple of 8: one chunk or block).
inline V8 kv_load8(KiviRow p) {
  if (p.f16) return kv_load8(p.f16 + p.e);
  const int sub = int(p.e % 32 / 8);
  if (p.step) return v8_fmav(q2_codes8(p.codes + p.e / 32 * 8, sub), kv_load8(p.step + p.e), kv_load8(p.mn + p.e));
  const uint8_t* b = p.codes + p.e / 32 * kKiviVBlockBytes;
  return v8_fmav(q2_codes8(b + 4, sub), v8_set1(KiviRow::half(b)), v8_set1(KiviRow::half(b + 2)));
}
inline V vload(KiviRow p) { return vload_pieces(p); }

// The row pointer a tile reads K/V of type T through.
template <class T> struct KvTraits {  // float / uint16_t: read in place
  using Row = const T*;
  static constexpr bool kQuant = false;
};
template <> struct KvTraits<KvQ8_0> {
  using Row = QRow<KvQ8_0>;
  static constexpr bool kQuant = true;
};
template <> struct KvTraits<KvQ4_0> {
  using Row = QRow<KvQ4_0>;
  static constexpr bool kQuant = true;
};
template <> struct KvTraits<KvKivi2> {
  using Row = KiviRow;
  static constexpr bool kQuant = false;
};

// One tile's state over the key blocks: the block's K transposed (Kt) and its V rows.
template <class T>  // float, uint16_t (IEEE half), KvQ8_0, KvQ4_0 or KvKivi2
struct TileBlocks {
  using Row = typename KvTraits<T>::Row;
  const AttentionArgs& a;
  int64_t kvh, hd;
  float* Kt;  // [hd][kB]
  Row vrow[kB];

  // Loads positions [p0, p0 + nb): Kt = K_block^T (zero past nb) and vrow[j] = V row of p0 + j.
  void load(int64_t p0, int64_t nb) {
    Row krow[kB];
    if constexpr (std::is_same_v<T, KvKivi2>) {
      const KiviLayer& L = *static_cast<const KiviLayer*>(a.k_base);
      const int64_t e = kvh * hd;
      for (int64_t j = 0; j < nb; ++j) {
        const int64_t slot = a.slots[p0 + j];
        const int64_t g = slot / kKiviGroup;
        const int32_t stage = L.stage_of[g];
        if (stage >= 0) {
          const uint16_t* k = L.stages[stage] + slot % kKiviGroup * a.kv_row;
          krow[j] = Row{k, nullptr, nullptr, nullptr, e};
          vrow[j] = Row{k + kKiviGroup * a.kv_row, nullptr, nullptr, nullptr, e};
        } else {
          krow[j] = Row{nullptr, L.k_codes + slot * (a.kv_row / 4), L.k_step + g * a.kv_row, L.k_min + g * a.kv_row, e};
          vrow[j] = Row{nullptr, L.v_blocks + slot * (a.kv_row / 32) * kKiviVBlockBytes, nullptr, nullptr, e};
        }
      }
    } else if constexpr (KvTraits<T>::kQuant) {
      const int64_t row_bytes = a.kv_row / kKvQuantBlock * T::kBlockBytes;
      const uint8_t* kb = static_cast<const uint8_t*>(a.k_base);
      const uint8_t* vb = static_cast<const uint8_t*>(a.v_base);
      for (int64_t j = 0; j < nb; ++j) {
        const int64_t slot = a.slots[p0 + j];
        krow[j] = Row{kb + slot * row_bytes, kvh * hd};
        vrow[j] = Row{vb + slot * row_bytes, kvh * hd};
      }
    } else {
      const T* const k_base = static_cast<const T*>(a.k_base);
      const T* const v_base = static_cast<const T*>(a.v_base);
      for (int64_t j = 0; j < nb; ++j) {
        const int64_t slot = a.slots[p0 + j];
        krow[j] = k_base + slot * a.kv_row + kvh * hd;
        vrow[j] = v_base + slot * a.kv_row + kvh * hd;
      }
    }
    transpose_block(krow, nb);
  }
  // Kt = K_block^T: 8 x 8 register transposes where keys and head_dim allow (a decode tile has
  // only the GQA group's rows to share this cost with), scalar elsewhere. Pure data movement:
  // the result is the same either way.
  void transpose_block(const Row* krow, int64_t nb) {
    int64_t j8 = 0;
    if (hd % 8 == 0)
      for (; j8 + 8 <= nb; j8 += 8)
        for (int64_t d = 0; d < hd; d += 8) transpose8x8(krow + j8, d, Kt + d * kB + j8, kB);
    for (int64_t j = j8; j < nb; ++j)
      for (int64_t d = 0; d < hd; ++d) Kt[d * kB + j] = kv_f32(krow[j][d]);
    for (int64_t d = 0; d < hd; ++d)
      for (int64_t j = nb; j < kB; ++j) Kt[d * kB + j] = 0.0f;
  }
};

template <class T>
inline void tile_impl(const AttentionArgs& a, int64_t kvh, int64_t i0, int64_t i1, float* scratch) {
  const int64_t hd = a.head_dim;
  const int64_t g = a.n_head / a.n_head_kv;
  const int64_t R = (i1 - i0) * g;
  float* Kt = scratch;         // [hd][kB]
  float* S = Kt + hd * kB;     // [R][kB]
  float* O = S + R * kB;       // [R][hd]
  float* m = O + R * hd;       // [R]
  float* l = m + R;            // [R]
  float* Vf = l + R;           // [kB][hd] the block's V rows as f32 (widen below)
  TileBlocks<T> blk{a, kvh, hd, Kt, {}};
  // The block's V rows are widened to f32 once when several rows read them: accumulate_pv would
  // otherwise widen or dequantize every V element once per row. The same floats, so the same
  // bits. Quantized rows whenever 2+ rows share them; halves (one vcvtph2ps a load) only in a
  // prompt's tile of 4+ tokens: for a decode's GQA group of 8 the extra stores cost more than
  // they save at 1024 keys. bench_attention, 2 threads, Zen 4, head_dim 64, 1024 keys, prefill
  // GFLOP/s / decode us: q8_0 41-43 -> 85-102 / 93-256 -> 59-203 (14/2, 32/8, 32/4 heads; 16/8
  // level); f16 90-101 -> 94-114 / level (32/4 decode widened: 100 -> 111 us).
  constexpr bool kHalf = std::is_same_v<T, uint16_t>;
  // f32 rows are read in place, except where consecutive slots' rows lie a multiple of 4 KiB
  // apart (Qwen3's 8 KV heads of 128: the loads of a block's rows alias in L1 and run at a
  // fraction of their rate): bench_attention 16/8 heads of 128, f32, prefill 87 -> 97-101 GFLOP/s;
  // copying other strides costs more than it saves (32/4 of 64: 114 -> 108).
  const bool widen = std::is_same_v<T, float> ? R >= 4 && a.kv_row * int64_t(sizeof(float)) % 4096 == 0
                                              : (kHalf ? i1 - i0 >= 4 : R >= 2);
  const float* vf_rows[kB];
  if (widen)
    for (int64_t j = 0; j < kB; ++j) vf_rows[j] = Vf + j * hd;
  const float neg_inf = -__builtin_inff();
  for (int64_t r = 0; r < R; ++r) {
    m[r] = neg_inf;
    l[r] = 0.0f;
    for (int64_t d = 0; d < hd; ++d) O[r * hd + d] = 0.0f;
  }
  auto q_row = [&](int64_t r) { return a.q + (i0 + r / g) * a.ldq + (kvh * g + r % g) * hd; };

  const int64_t last_pos = a.n_past + i1 - 1;  // the tile's last row sees 0..last_pos
  // With a sliding window the tile's first row sees nothing before first_pos - window + 1.
  int64_t p_start = 0;
  if (a.window > 0 && a.n_past + i0 + 1 > a.window) p_start = (a.n_past + i0 + 1 - a.window) / kB * kB;
  // The scores of the block at p0 for rows r_first.. (rows before the block, position < p0, see
  // none of it; rows are ordered by position, so the first active row is found once).
  auto block_rows = [&](int64_t p0) {
    int64_t r_first = 0;
    while (r_first < R && a.n_past + i0 + r_first / g < p0) ++r_first;
    int64_t r = r_first;
    for (; r + kRowsPerPass <= R; r += kRowsPerPass) {
      const float* qs[kRowsPerPass];
      float* ss[kRowsPerPass];
      for (int rr = 0; rr < kRowsPerPass; ++rr) {
        qs[rr] = q_row(r + rr);
        ss[rr] = S + (r + rr) * kB;
      }
      block_scores<kRowsPerPass>(qs, Kt, hd, ss);
    }
    if constexpr (kRowsPerPass > 2) {
      for (; r + 2 <= R; r += 2) {  // the last rows in pairs (a decode's GQA group of 2)
        const float* qs[2] = {q_row(r), q_row(r + 1)};
        float* ss[2] = {S + r * kB, S + (r + 1) * kB};
        block_scores<2>(qs, Kt, hd, ss);
      }
    }
    for (; r < R; ++r) {
      const float* qs[1] = {q_row(r)};
      float* ss[1] = {S + r * kB};
      block_scores<1>(qs, Kt, hd, ss);
    }
    return r_first;
  };
  // Row r's scores of the block at p0 (nb keys), masked to -inf past its position and outside
  // its window, scaled and soft-capped, into s0..s3; false when the row sees none of the block.
  auto row_scores = [&](int64_t r, int64_t p0, int64_t nb, V& s0, V& s1, V& s2, V& s3, int32_t& nv) {
    const int64_t pos = a.n_past + i0 + r / g;
    nv = int32_t(pos + 1 - p0 < nb ? pos + 1 - p0 : nb);  // keys this row sees
    float* s = S + r * kB;
    V scale = vset1(a.scale);
    if (a.window > 0 || a.softcap > 0.0f) {
      // Keys [p0, p0 + lo) are outside the row's window; soft-capping scales in place first.
      const int64_t first = a.window > 0 ? pos + 1 - a.window : 0;
      const int32_t lo = first > p0 ? int32_t(first - p0 < nv ? first - p0 : nv) : 0;
      if (lo >= nv) return false;  // the whole block is outside the window
      for (int32_t j = 0; j < nv; ++j) {
        float x = s[j] * a.scale;
        if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
        s[j] = j < lo ? neg_inf : x;
      }
      scale = vset1(1.0f);
    }
    s0 = vkeep_below(vmul(vload(s), scale), 0, nv, neg_inf);
    s1 = vkeep_below(vmul(vload(s + 16), scale), 16, nv, neg_inf);
    s2 = vkeep_below(vmul(vload(s + 32), scale), 32, nv, neg_inf);
    s3 = vkeep_below(vmul(vload(s + 48), scale), 48, nv, neg_inf);
    return true;
  };

  for (int64_t p0 = p_start; p0 <= last_pos; p0 += kB) {
    const int64_t nb = last_pos + 1 - p0 < kB ? last_pos + 1 - p0 : kB;
    blk.load(p0, nb);
    if (widen) widen_rows(blk.vrow, nb, hd, Vf);
    const int64_t r_first = block_rows(p0);
    // The P V products of rows whose softmax is done, kPvRows at a time (each V load serves
    // them all) where head_dim allows, one by one otherwise and for the last few.
    int64_t pending[kPvRows];
    int32_t pending_nv[kPvRows];
    int n_pending = 0;
    auto flush_pv = [&](bool all) {
      if (kPvRows > 1 && n_pending == kPvRows) {
        float* os[kPvRows];
        const float* ps[kPvRows];
        for (int i = 0; i < kPvRows; ++i) {
          os[i] = O + pending[i] * hd;
          ps[i] = S + pending[i] * kB;
        }
        if (widen) accumulate_pv_rows<kPvRows>(os, ps, pending_nv, vf_rows, hd);
        else accumulate_pv_rows<kPvRows>(os, ps, pending_nv, blk.vrow, hd);
        n_pending = 0;
      }
      if (!all) return;
      int i = 0;
      if constexpr (kPvRows > 2) {
        for (; i + 2 <= n_pending; i += 2) {  // the last few in pairs (a decode's GQA group of 2)
          float* os[2] = {O + pending[i] * hd, O + pending[i + 1] * hd};
          const float* ps[2] = {S + pending[i] * kB, S + pending[i + 1] * kB};
          if (widen) accumulate_pv_rows<2>(os, ps, pending_nv + i, vf_rows, hd);
          else accumulate_pv_rows<2>(os, ps, pending_nv + i, blk.vrow, hd);
        }
      }
      for (; i < n_pending; ++i) {
        if (widen) accumulate_pv(O + pending[i] * hd, S + pending[i] * kB, vf_rows, pending_nv[i], hd);
        else accumulate_pv(O + pending[i] * hd, S + pending[i] * kB, blk.vrow, pending_nv[i], hd);
      }
      n_pending = 0;
    };
    const bool pv_rows = kPvRows > 1 && hd % 32 == 0;
    for (int64_t r = r_first; r < R; ++r) {
      V s0, s1, s2, s3;
      int32_t nv;
      if (!row_scores(r, p0, nb, s0, s1, s2, s3, nv)) continue;
      float* s = S + r * kB;
      const float block_max = vhmax(vmax(vmax(s0, s1), vmax(s2, s3)));
      const float mx = m[r] > block_max ? m[r] : block_max;
      const V vm = vset1(mx);
      s0 = vexp_nonpos(vsub(s0, vm));
      s1 = vexp_nonpos(vsub(s1, vm));
      s2 = vexp_nonpos(vsub(s2, vm));
      s3 = vexp_nonpos(vsub(s3, vm));
      const float sum = vhsum(vadd(vadd(s0, s1), vadd(s2, s3)));
      vstore(s, s0);
      vstore(s + 16, s1);
      vstore(s + 32, s2);
      vstore(s + 48, s3);
      // m[r] == -inf only before the row's first block, where O and l are still 0.
      const float c = m[r] == neg_inf ? 0.0f : exp_nonpos(m[r] - mx);
      l[r] = l[r] * c + sum;
      m[r] = mx;
      float* o = O + r * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] *= c;
      if (pv_rows) {
        pending[n_pending] = r;
        pending_nv[n_pending++] = nv;
        flush_pv(false);
      } else if (widen) {
        accumulate_pv(o, s, vf_rows, nv, hd);
      } else {
        accumulate_pv(o, s, blk.vrow, nv, hd);
      }
    }
    flush_pv(true);
  }

  // Sinks: one more term of the row's softmax denominator, with no value; the row's maximum
  // and sum take it in, so that the key masses below are the probabilities of the keys too.
  if (a.sinks)
    for (int64_t r = 0; r < R; ++r) {
      const float sink = a.sinks[kvh * g + r % g];
      const float mx = m[r] > sink ? m[r] : sink;
      const float c = m[r] == neg_inf ? 0.0f : exp_nonpos(m[r] - mx);
      l[r] = l[r] * c + exp_nonpos(sink - mx);
      m[r] = mx;
      for (int64_t d = 0; d < hd; ++d) O[r * hd + d] *= c;
    }
  for (int64_t r = 0; r < R; ++r) {
    float* out = a.out + (i0 + r / g) * a.ldo + (kvh * g + r % g) * hd;
    const float inv = 1.0f / l[r];
    for (int64_t d = 0; d < hd; ++d) out[d] = O[r * hd + d] * inv;
  }

  // H2O: each key's probability exp(s - m) / l under the rows' final maxima and sums, summed
  // over the tile's rows. A second pass over the blocks recomputes the scores (the first pass
  // only knows each row's normaliser at its end); the output above is untouched.
  if (a.key_mass) {
    float* mass = a.key_mass + kvh * a.ld_key_mass;
    for (int64_t p0 = p_start; p0 <= last_pos; p0 += kB) {
      const int64_t nb = last_pos + 1 - p0 < kB ? last_pos + 1 - p0 : kB;
      blk.load(p0, nb);
      const int64_t r_first = block_rows(p0);
      V acc0 = vzero(), acc1 = vzero(), acc2 = vzero(), acc3 = vzero();
      for (int64_t r = r_first; r < R; ++r) {
        V s0, s1, s2, s3;
        int32_t nv;
        if (!row_scores(r, p0, nb, s0, s1, s2, s3, nv)) continue;
        const V vm = vset1(m[r]), inv = vset1(1.0f / l[r]);
        acc0 = vfma(vexp_nonpos(vsub(s0, vm)), inv, acc0);
        acc1 = vfma(vexp_nonpos(vsub(s1, vm)), inv, acc1);
        acc2 = vfma(vexp_nonpos(vsub(s2, vm)), inv, acc2);
        acc3 = vfma(vexp_nonpos(vsub(s3, vm)), inv, acc3);
      }
      float sums[kB];
      vstore(sums, acc0);
      vstore(sums + 16, acc1);
      vstore(sums + 32, acc2);
      vstore(sums + 48, acc3);
      for (int64_t j = 0; j < nb; ++j) mass[p0 + j] += sums[j];
    }
  }
}

inline void tile_any(const AttentionArgs& a, int64_t kvh, int64_t i0, int64_t i1, float* scratch) {
  switch (a.kv_type) {
    case KvType::F16: tile_impl<uint16_t>(a, kvh, i0, i1, scratch); break;
    case KvType::Q8_0: tile_impl<KvQ8_0>(a, kvh, i0, i1, scratch); break;
    case KvType::Q4_0: tile_impl<KvQ4_0>(a, kvh, i0, i1, scratch); break;
    case KvType::Kivi2: tile_impl<KvKivi2>(a, kvh, i0, i1, scratch); break;
    default: tile_impl<float>(a, kvh, i0, i1, scratch);
  }
}

}  // namespace
}  // namespace tern::attn
