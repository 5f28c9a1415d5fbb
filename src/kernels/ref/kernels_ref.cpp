// The scalar "ref" kernel table: the same arithmetic as the SIMD paths (activations quantized
// to Q8_0 / Q8_K, integer dot products per block, one float scale per block), written as
// plain loops. It is what TERN_FORCE_ISA=ref runs, and the oracle the ISA variants' integer
// paths are compared against (tests/kernels); matmul_ref (dequantize + f32 dot) is the
// independent oracle for all of them.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/fp16.h"
#include "kernels/kernel_iface.h"
#include "quant/quant_traits.h"

namespace tern::kern {
namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// --- activation quantizers (the rules every ISA reproduces bit for bit) ---------------------

// Q8_0 activations: d = amax / 127 in f32, q = nearest(x / d) with ties to even (what SIMD
// float->int conversion does, unlike Q8_0 weights' roundf).
void quantize_q8_0_act(const float* x, int64_t n_in, int8_t* qs, float* d, int32_t* nsum) {
  for (int64_t b = 0; b < n_in / 32; ++b) {
    const float* xb = x + 32 * b;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const float db = amax / 127.0f;
    const float id = db != 0.0f ? 1.0f / db : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int q = nearest_int(xb[j] * id);
      qs[32 * b + j] = static_cast<int8_t>(q);
      sum += q;
    }
    d[b] = db;
    nsum[b] = -sum;
  }
}

// Q8_K activations: llama.cpp's quantize_row_q8_K rule (see quant_k.cpp), split into arrays.
void quantize_q8_k_act(const float* x, int64_t n_in, int8_t* qs, float* d, int16_t* bsums) {
  for (int64_t b = 0; b < n_in / kQK_K; ++b) {
    const float* xb = x + kQK_K * b;
    int8_t* q = qs + kQK_K * b;
    float max = 0, amax = 0;
    for (int j = 0; j < kQK_K; ++j)
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    if (amax == 0.0f) {
      std::memset(q, 0, kQK_K);
      std::memset(bsums + 16 * b, 0, 16 * sizeof(int16_t));
      d[b] = 0.0f;
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < kQK_K; ++j) {
      const int v = nearest_int(iscale * xb[j]);
      q[j] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += q[16 * g + l];
      bsums[16 * b + g] = static_cast<int16_t>(sum);
    }
    d[b] = 1 / iscale;
  }
}

// --- per-type dot products of one weight row with one activation row ------------------------

float dot_q8_0(const uint8_t* w, int64_t n_in, const int8_t* xq, const float* xd) {
  const auto* blk = reinterpret_cast<const BlockQ8_0*>(w);
  float s = 0.0f;
  for (int64_t b = 0; b < n_in / 32; ++b) {
    int32_t isum = 0;
    for (int j = 0; j < 32; ++j) isum += blk[b].qs[j] * xq[32 * b + j];
    s += float(isum) * (fp16_to_f32(blk[b].d) * xd[b]);
  }
  return s;
}

float dot_q4_0(const uint8_t* w, int64_t n_in, const int8_t* xq, const float* xd,
               const int32_t* nsum) {
  const auto* blk = reinterpret_cast<const BlockQ4_0*>(w);
  float s = 0.0f;
  for (int64_t b = 0; b < n_in / 32; ++b) {
    // sum (q - 8) * x = sum q * x - 8 * sum x: the nibbles stay unsigned (what pmaddubsw and
    // vpdpbusd want), the offset comes from the activation's block sum.
    int32_t isum = 8 * nsum[b];
    for (int j = 0; j < 16; ++j)
      isum += (blk[b].qs[j] & 0x0F) * xq[32 * b + j] + (blk[b].qs[j] >> 4) * xq[32 * b + j + 16];
    s += float(isum) * (fp16_to_f32(blk[b].d) * xd[b]);
  }
  return s;
}

// MXFP4: the E2M1 values doubled (kMxfp4Values, -12..12) times the int8 activations, exactly in
// int32 (|sum| <= 32 * 12 * 127), then the block's scale 2^(e - 128) times the activations' d, as
// ggml's vec_dot_mxfp4_q8_0.
float dot_mxfp4(const uint8_t* w, int64_t n_in, const int8_t* xq, const float* xd) {
  const auto* blk = reinterpret_cast<const BlockMXFP4*>(w);
  float s = 0.0f;
  for (int64_t b = 0; b < n_in / 32; ++b) {
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j)
      isum += kMxfp4Values[blk[b].qs[j] & 0x0F] * xq[32 * b + j] + kMxfp4Values[blk[b].qs[j] >> 4] * xq[32 * b + j + 16];
    s += float(isum) * (e8m0_half(blk[b].e) * xd[b]);
  }
  return s;
}

// Q4_1 / Q5_0 / Q5_1 (Block): quant j of a block is its nibble (low: j < 16) and, for Q5, bit j of
// qh as 16. Q5_0: as Q4_0 with the -16 offset folded in through nsum. Q4_1 / Q5_1:
// sum (d q + m) * dx xq = d dx sum q xq + m dx sum xq, sum xq = -nsum.
template <class Block>
float dot_q32x(const uint8_t* w, int64_t n_in, const int8_t* xq, const float* xd, const int32_t* nsum) {
  constexpr bool kMin = !std::is_same_v<Block, BlockQ5_0>, kHigh = !std::is_same_v<Block, BlockQ4_1>;
  const auto* blk = reinterpret_cast<const Block*>(w);
  float s = 0.0f;
  for (int64_t b = 0; b < n_in / 32; ++b) {
    const Block& B = blk[b];
    int32_t isum = kMin ? 0 : 16 * nsum[b];
    for (int j = 0; j < 32; ++j) {
      int q = j < 16 ? B.qs[j] & 0x0F : B.qs[j - 16] >> 4;
      if constexpr (kHigh) q |= (B.qh[j / 8] >> (j % 8) & 1) << 4;
      isum += q * xq[32 * b + j];
    }
    s += float(isum) * (fp16_to_f32(B.d) * xd[b]);
    if constexpr (kMin) s -= float(nsum[b]) * (fp16_to_f32(B.m) * xd[b]);
  }
  return s;
}

// Q4_K: d * dx * sum_j sc_j (q . x)_j  -  dmin * dx * sum_j m_j * (sum of x over sub-block j).
// Q5_K (Block = BlockQ5_K): the same with 5-bit quants (bit 4 of element l of sub-block j: bit j
// of qh[l]).
template <class Block>
float dot_q4_k(const uint8_t* w, int64_t n_in, const int8_t* xq, const float* xd, const int16_t* bsums) {
  const auto* blk = reinterpret_cast<const Block*>(w);
  float s = 0.0f;
  for (int64_t b = 0; b < n_in / kQK_K; ++b) {
    const Block& B = blk[b];
    const int8_t* x = xq + kQK_K * b;
    const int16_t* bs = bsums + 16 * b;
    int32_t sum_q = 0, sum_m = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      q4_k_scale_min(j, B.scales, &sc, &m);
      const uint8_t* q = B.qs + 32 * (j / 2);
      const int shift = (j % 2) * 4;
      int32_t dot = 0;
      for (int l = 0; l < 32; ++l) {
        int ql = (q[l] >> shift) & 0x0F;
        if constexpr (std::is_same_v<Block, BlockQ5_K>) ql |= (B.qh[l] >> j & 1) << 4;
        dot += ql * x[32 * j + l];
      }
      sum_q += sc * dot;
      sum_m += m * (bs[2 * j] + bs[2 * j + 1]);
    }
    s += xd[b] * (fp16_to_f32(B.d) * float(sum_q) - fp16_to_f32(B.dmin) * float(sum_m));
  }
  return s;
}

// Q2_K and Q3_K over their 16 sub-blocks of 16 (bsums are per 16 as well). Q2_K:
// d * dx * sum_j sc_j (q . x)_j  -  dmin * dx * sum_j m_j * bsum_j, sc_j and m_j the low and high
// nibbles of scales[j]. Q3_K: d * dx * sum_j (sc_j - 32) * ((q3 . x)_j - 4 * bsum_j), q3 = q + 4h
// in 0..7 (q - 4(1 - h) = q3 - 4).
template <class Block>
float dot_q23_k(const uint8_t* w, int64_t n_in, const int8_t* xq, const float* xd, const int16_t* bsums) {
  constexpr bool kQ3 = std::is_same_v<Block, BlockQ3_K>;
  const auto* blk = reinterpret_cast<const Block*>(w);
  float s = 0.0f;
  for (int64_t b = 0; b < n_in / kQK_K; ++b) {
    const Block& B = blk[b];
    const int8_t* x = xq + kQK_K * b;
    const int16_t* bs = bsums + 16 * b;
    uint8_t sc3[16];
    if constexpr (kQ3) q3_k_scales(B.scales, sc3);
    int32_t sum_q = 0, sum_m = 0;
    for (int e = 0; e < kQK_K; e += 16) {  // sub-block j = e / 16: half n, group i, l0 = 0 or 16
      const int n = e / 128, i = e % 128 / 32, l0 = e % 32, j = e / 16;
      int32_t dot = 0;
      for (int l = l0; l < l0 + 16; ++l) {
        int q = (B.qs[32 * n + l] >> (2 * i)) & 3;
        if constexpr (kQ3) q |= ((B.hmask[l] >> (4 * n + i)) & 1) << 2;
        dot += q * x[e - l0 + l];
      }
      if constexpr (kQ3) {
        sum_q += (int(sc3[j]) - 32) * (dot - 4 * bs[j]);
      } else {
        sum_q += (B.scales[j] & 0x0F) * dot;
        sum_m += (B.scales[j] >> 4) * bs[j];
      }
    }
    if constexpr (kQ3) s += (fp16_to_f32(B.d) * xd[b]) * float(sum_q);
    else s += xd[b] * (fp16_to_f32(B.d) * float(sum_q) - fp16_to_f32(B.dmin) * float(sum_m));
  }
  return s;
}

// Q6_K: d * dx * sum_j sc_j * ((q . x)_j - 32 * (sum of x over sub-block j)).
float dot_q6_k(const uint8_t* w, int64_t n_in, const int8_t* xq, const float* xd,
               const int16_t* bsums) {
  const auto* blk = reinterpret_cast<const BlockQ6_K*>(w);
  float s = 0.0f;
  for (int64_t b = 0; b < n_in / kQK_K; ++b) {
    const BlockQ6_K& B = blk[b];
    const int8_t* x = xq + kQK_K * b;
    const int16_t* bs = bsums + 16 * b;
    int32_t q6[kQK_K];
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = B.ql + 64 * h;
      const uint8_t* qh = B.qh + 32 * h;
      int32_t* q = q6 + 128 * h;
      for (int l = 0; l < 32; ++l) {
        q[l] = (ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4);
        q[l + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
        q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
        q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
      }
    }
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) {
      int32_t dot = 0;
      for (int l = 0; l < 16; ++l) dot += q6[16 * j + l] * x[16 * j + l];
      isum += B.scales[j] * (dot - 32 * bs[j]);
    }
    s += (fp16_to_f32(B.d) * xd[b]) * float(isum);
  }
  return s;
}

// TQ1_0 / TQ2_0 (quant_traits.h): trits t = code - 1, d * dx * sum_e t_e x_e with the integer sum
// exact, as ggml's vec_dot_tq1_0_q8_K / _tq2_0_q8_K. Written as sum code * x - sum x (sum x: the
// block's 16 bsums), the form the SIMD kernels use with their unsigned codes; the value is the same.
// TQ1_0's code n of a byte: (byte * 3^n mod 256) * 3 >> 8 (every byte gives 0..2).
float dot_tq1_0(const uint8_t* w, int64_t n_in, const int8_t* xq, const float* xd, const int16_t* bsums) {
  const auto* blk = reinterpret_cast<const BlockTQ1_0*>(w);
  const auto code = [](uint8_t byte, int n) { return int((unsigned(uint8_t(byte * kTq1Pow3[n])) * 3) >> 8); };
  float s = 0.0f;
  for (int64_t b = 0; b < n_in / kQK_K; ++b) {
    const BlockTQ1_0& B = blk[b];
    const int8_t* x = xq + kQK_K * b;
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) isum -= bsums[16 * b + j];
    for (int n = 0; n < 5; ++n) {
      for (int m = 0; m < 32; ++m) isum += code(B.qs[m], n) * x[32 * n + m];
      for (int m = 0; m < 16; ++m) isum += code(B.qs[32 + m], n) * x[160 + 16 * n + m];
    }
    for (int n = 0; n < 4; ++n)
      for (int j = 0; j < 4; ++j) isum += code(B.qh[j], n) * x[240 + 4 * n + j];
    s += float(isum) * (fp16_to_f32(B.d) * xd[b]);
  }
  return s;
}

// TQ2_0's element 128h + 32l + m: (qs[32h + m] >> 2l) & 3, minus 1 (code 3 counts as 3 - 1 = 2,
// as in ggml's vec_dot; weight_check refuses files that hold it).
float dot_tq2_0(const uint8_t* w, int64_t n_in, const int8_t* xq, const float* xd, const int16_t* bsums) {
  const auto* blk = reinterpret_cast<const BlockTQ2_0*>(w);
  float s = 0.0f;
  for (int64_t b = 0; b < n_in / kQK_K; ++b) {
    const BlockTQ2_0& B = blk[b];
    const int8_t* x = xq + kQK_K * b;
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) isum -= bsums[16 * b + j];
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 4; ++l)
        for (int m = 0; m < 32; ++m) isum += ((B.qs[32 * h + m] >> (2 * l)) & 3) * x[128 * h + 32 * l + m];
    s += float(isum) * (fp16_to_f32(B.d) * xd[b]);
  }
  return s;
}

// One FMA per element, in order (the float arithmetic of every variant: x86/tiles_float.h).
float dot_float(DType t, const uint8_t* w, int64_t n_in, const float* x) {
  float s = 0.0f;
  switch (t) {
    case DType::F32: {
      const auto* p = reinterpret_cast<const float*>(w);
      for (int64_t i = 0; i < n_in; ++i) s = std::fma(p[i], x[i], s);
      break;
    }
    case DType::F16: {
      const auto* p = reinterpret_cast<const uint16_t*>(w);
      for (int64_t i = 0; i < n_in; ++i) s = std::fma(fp16_to_f32(p[i]), x[i], s);
      break;
    }
    case DType::BF16: {
      const auto* p = reinterpret_cast<const uint16_t*>(w);
      for (int64_t i = 0; i < n_in; ++i) s = std::fma(bf16_to_f32(p[i]), x[i], s);
      break;
    }
    default:
      break;
  }
  return s;
}

// --- the table ---------------------------------------------------------------------------

bool ref_has_kernel(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q8_0: case DType::Q4_0:
    case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q2_K: case DType::Q3_K:
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::MXFP4: case DType::TQ1_0:
    case DType::TQ2_0:
      return true;
    default:
      return false;
  }
}

void ref_quantize(const ActLayout& lay, DType, const float* x, int64_t ldx, int64_t n_in,
                  int64_t, int64_t t0, int64_t t1, uint8_t* act) {
  for (int64_t t = t0; t < t1; ++t) quantize_row_ref(lay, x + t * ldx, n_in, act + t * lay.stride);
}

int64_t ref_scratch_bytes(DType, int64_t) { return 0; }

void ref_gemm(const GemmArgs& a, int64_t r0, int64_t r1, uint8_t*) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* w = a.w + r * a.row_bytes;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      float v;
      if (a.act_layout.kind == ActKind::None)
        v = dot_float(a.type, w, a.n_in, a.x + t * a.ldx);
      else
        v = dot_ref(a.type, w, a.n_in, a.act + t * a.act_layout.stride, a.act_layout);
      a.y[t * a.ldy + r] = v;
    }
  }
}

const KernelTable kRefTable = {"ref", ref_has_kernel, act_rows_layout, ref_quantize,
                               ref_scratch_bytes, ref_gemm};

}  // namespace

ActLayout act_rows_layout(DType weight_type, int64_t n_in, int64_t n_tokens) {
  ActLayout l{};
  l.token_granule = 1;
  switch (weight_type) {
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::MXFP4:
      l.kind = ActKind::Q8_0Rows;
      l.off_d = n_in;
      l.off_sum = n_in + 4 * (n_in / 32);
      l.stride = round_up(l.off_sum + 4 * (n_in / 32), 64);
      break;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::TQ1_0:
    case DType::TQ2_0:
      l.kind = ActKind::Q8_KRows;
      l.off_d = n_in;
      l.off_sum = n_in + 4 * (n_in / kQK_K);
      l.stride = round_up(l.off_sum + 2 * (n_in / 16), 64);
      break;
    default:
      return l;
  }
  l.bytes = l.stride * n_tokens;
  return l;
}

ActLayout bf16_pairs_layout(int64_t n_in, int64_t n_tokens) {
  ActLayout l{};
  l.kind = ActKind::BF16Pairs;
  l.token_granule = 1;
  l.stride = round_up(n_in * 2, 64) + 64;
  l.bytes = l.stride * n_tokens;
  return l;
}

void quantize_row_ref(const ActLayout& lay, const float* x, int64_t n_in, uint8_t* row) {
  if (lay.kind == ActKind::BF16Pairs) {  // bf16 elements in order: dword p = x[2p] | x[2p+1] << 16
    for (int64_t i = 0; i < n_in; ++i) {
      // vcvtne2ps2bf16: round to nearest even, denormal inputs as zeros (DAZ), quiet NaNs.
      float v = x[i];
      uint32_t u;
      std::memcpy(&u, &v, 4);
      if ((u & 0x7f800000u) == 0) {
        u &= 0x80000000u;
        std::memcpy(&v, &u, 4);
      }
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(row + 2 * i, &h, 2);
    }
    return;
  }
  auto* qs = reinterpret_cast<int8_t*>(row);
  auto* d = reinterpret_cast<float*>(row + lay.off_d);
  if (lay.kind == ActKind::Q8_0Rows)
    quantize_q8_0_act(x, n_in, qs, d, reinterpret_cast<int32_t*>(row + lay.off_sum));
  else if (lay.kind == ActKind::Q8_KRows)
    quantize_q8_k_act(x, n_in, qs, d, reinterpret_cast<int16_t*>(row + lay.off_sum));
}

float dot_ref(DType t, const uint8_t* w, int64_t n_in, const uint8_t* row, const ActLayout& lay) {
  const auto* xq = reinterpret_cast<const int8_t*>(row);
  const auto* xd = reinterpret_cast<const float*>(row + lay.off_d);
  const auto* nsum = reinterpret_cast<const int32_t*>(row + lay.off_sum);   // Q8_0Rows
  const auto* bsums = reinterpret_cast<const int16_t*>(row + lay.off_sum);  // Q8_KRows
  switch (t) {
    case DType::Q8_0: return dot_q8_0(w, n_in, xq, xd);
    case DType::Q4_0: return dot_q4_0(w, n_in, xq, xd, nsum);
    case DType::Q4_1: return dot_q32x<BlockQ4_1>(w, n_in, xq, xd, nsum);
    case DType::Q5_0: return dot_q32x<BlockQ5_0>(w, n_in, xq, xd, nsum);
    case DType::Q5_1: return dot_q32x<BlockQ5_1>(w, n_in, xq, xd, nsum);
    case DType::MXFP4: return dot_mxfp4(w, n_in, xq, xd);
    case DType::Q2_K: return dot_q23_k<BlockQ2_K>(w, n_in, xq, xd, bsums);
    case DType::Q3_K: return dot_q23_k<BlockQ3_K>(w, n_in, xq, xd, bsums);
    case DType::Q4_K: return dot_q4_k<BlockQ4_K>(w, n_in, xq, xd, bsums);
    case DType::Q5_K: return dot_q4_k<BlockQ5_K>(w, n_in, xq, xd, bsums);
    case DType::Q6_K: return dot_q6_k(w, n_in, xq, xd, bsums);
    case DType::TQ1_0: return dot_tq1_0(w, n_in, xq, xd, bsums);
    case DType::TQ2_0: return dot_tq2_0(w, n_in, xq, xd, bsums);
    default:
      return 0.0f;
  }
}

const KernelTable& table_ref() { return kRefTable; }

}  // namespace tern::kern
