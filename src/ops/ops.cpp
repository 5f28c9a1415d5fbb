#include "ops/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "kernels/norm.h"
#include "quant/quant_traits.h"

namespace tern {

void rms_norm(const float* x, const float* weight, float* out, int64_t n_tokens, int64_t n,
              float eps, ThreadPool& pool) {
  // The row function is shared with matmul_shared_input's RMSNorm prologue (same bits).
  auto body = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) rms_norm_row(x + t * n, weight, out + t * n, n, eps);
  };
  // Small row counts: the pool's fork/join costs more than the work.
  if (n_tokens * n < 16384) {
    body(0, n_tokens);
    return;
  }
  pool.parallel_for(n_tokens, [&](int64_t b, int64_t e, int) { body(b, e); });
}

void rope_norm(float* x, const int32_t* positions, int64_t n_tokens, int64_t n_heads,
               int64_t head_dim, int64_t n_rot, float freq_base) {
  rope_norm_cols(x, n_heads * head_dim, positions, n_tokens, head_dim, n_rot, freq_base, 0, n_heads * head_dim);
}

void rope_table(const int32_t* positions, int64_t n_tokens, int64_t n_rot, float freq_base, float* cs) {
  const float theta_scale = std::pow(freq_base, -2.0f / float(n_rot));
  for (int64_t t = 0; t < n_tokens; ++t) {
    // theta of pair i is pos * theta_scale^i, accumulated by repeated multiplication as ggml
    // does.
    float theta = float(positions[t]);
    float* ct = cs + t * n_rot;
    for (int64_t i = 0; i < n_rot / 2; ++i) {
      ct[2 * i] = std::cos(theta);
      ct[2 * i + 1] = std::sin(theta);
      theta *= theta_scale;
    }
  }
}

void rope_cols_table(float* x, int64_t ldx, const float* cs, int64_t n_tokens, int64_t head_dim, int64_t n_rot,
                     int64_t c0, int64_t c1) {
  TERN_ASSERT(c0 % 2 == 0 && head_dim % 2 == 0);
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* xt = x + t * ldx;
    const float* ct = cs + t * n_rot;
    for (int64_t h0 = c0 - c0 % head_dim; h0 < c1; h0 += head_dim) {  // heads touching [c0, c1)
      const int64_t i_begin = std::max<int64_t>(0, c0 - h0), i_end = std::min(n_rot, c1 - h0);
      for (int64_t i = i_begin; i < i_end; i += 2) {
        const float c = ct[i], s = ct[i + 1];
        const float x0 = xt[h0 + i], x1 = xt[h0 + i + 1];
        xt[h0 + i] = x0 * c - x1 * s;
        xt[h0 + i + 1] = x0 * s + x1 * c;
      }
    }
  }
}

void rope_norm_cols(float* x, int64_t ldx, const int32_t* positions, int64_t n_tokens, int64_t head_dim,
                    int64_t n_rot, float freq_base, int64_t c0, int64_t c1) {
  std::vector<float> cs(static_cast<size_t>(n_rot));  // one token's rotations
  for (int64_t t = 0; t < n_tokens; ++t) {
    rope_table(positions + t, 1, n_rot, freq_base, cs.data());
    rope_cols_table(x + t * ldx, ldx, cs.data(), 1, head_dim, n_rot, c0, c1);
  }
}

namespace {
inline float silu_times(float g, float u) { return g / (1.0f + std::exp(-g)) * u; }

// One SwiGLU row piece with the selected variant (an element's result depends only on its
// inputs, not on where the piece starts).
void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  switch (selected_isa()) {
    case Isa::Avx512: attn::silu_mul_avx512(gate, up, out, n); break;
    case Isa::Avx2: attn::silu_mul_avx2(gate, up, out, n); break;
    case Isa::Neon: case Isa::Dotprod: case Isa::I8mm: attn::silu_mul_neon(gate, up, out, n); break;
    default:
      for (int64_t i = 0; i < n; ++i) out[i] = silu_times(gate[i], up[i]);
  }
}
}  // namespace

void swiglu(const float* gate, const float* up, float* out, int64_t n, ThreadPool& pool) {
  if (n < 32768) {
    silu_mul(gate, up, out, n);
    return;
  }
  pool.parallel_for(n, [&](int64_t b, int64_t e, int) { silu_mul(gate + b, up + b, out + b, e - b); });
}

void swiglu_cols(const float* gate, const float* up, float* out, int64_t ld, int64_t n_tokens, int64_t c0,
                 int64_t c1) {
  for (int64_t t = 0; t < n_tokens; ++t) silu_mul(gate + t * ld + c0, up + t * ld + c0, out + t * ld + c0, c1 - c0);
}

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void kivi_row_to_f32(const KiviLayer& L, int64_t kv_row, int64_t slot, bool is_v, int64_t e0, int64_t n,
                     float* dst) {
  const int64_t g = slot / kKiviGroup;
  const int32_t stage = L.stage_of[g];
  if (stage >= 0) {
    const uint16_t* row = L.stages[stage] + ((is_v ? kKiviGroup : 0) + slot % kKiviGroup) * kv_row;
    for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(row[e0 + i]);
    return;
  }
  // Element j of a 32-element chunk: bits 2 (j / 8) of byte j % 8.
  auto code = [](const uint8_t* chunk, int64_t j) { return float((chunk[j % 8] >> (2 * (j / 8))) & 3); };
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = e0 + i;
    if (!is_v) {
      const uint8_t* codes = L.k_codes + slot * (kv_row / 4) + e / 32 * 8;
      dst[i] = std::fma(code(codes, e % 32), fp16_to_f32(L.k_step[g * kv_row + e]), fp16_to_f32(L.k_min[g * kv_row + e]));
    } else {
      const uint8_t* b = L.v_blocks + (slot * (kv_row / 32) + e / 32) * kKiviVBlockBytes;
      uint16_t step, mn;
      std::memcpy(&step, b, 2);
      std::memcpy(&mn, b + 2, 2);
      dst[i] = std::fma(code(b + 4, e % 32), fp16_to_f32(step), fp16_to_f32(mn));
    }
  }
}

namespace {

// Elements [kvh * hd, (kvh + 1) * hd) of the K (or V) row at `slot`, as f32: a float as it is,
// a half widened, a q8_0 / q4_0 element as llama.cpp's dequantizer computes it (q * d, (q - 8) * d).
void kv_head_row(const AttentionArgs& a, const void* base, bool is_v, int64_t slot, int64_t kvh, float* dst) {
  const int64_t hd = a.head_dim, e0 = kvh * hd;
  switch (a.kv_type) {
    case KvType::F32: {
      const float* row = static_cast<const float*>(base) + slot * a.kv_row + e0;
      std::copy(row, row + hd, dst);
      return;
    }
    case KvType::F16: {
      const uint16_t* row = static_cast<const uint16_t*>(base) + slot * a.kv_row + e0;
      for (int64_t d = 0; d < hd; ++d) dst[d] = fp16_to_f32(row[d]);
      return;
    }
    case KvType::Q8_0: {
      const auto* row = static_cast<const BlockQ8_0*>(base) + slot * (a.kv_row / kKvQuantBlock);
      for (int64_t d = 0; d < hd; ++d) {
        const BlockQ8_0& b = row[(e0 + d) / kKvQuantBlock];
        dst[d] = float(b.qs[(e0 + d) % kKvQuantBlock]) * fp16_to_f32(b.d);
      }
      return;
    }
    case KvType::Q4_0: {
      const auto* row = static_cast<const BlockQ4_0*>(base) + slot * (a.kv_row / kKvQuantBlock);
      for (int64_t d = 0; d < hd; ++d) {
        const BlockQ4_0& b = row[(e0 + d) / kKvQuantBlock];
        const int64_t j = (e0 + d) % kKvQuantBlock;
        const int q = j < 16 ? (b.qs[j] & 0x0F) : (b.qs[j - 16] >> 4);
        dst[d] = float(q - 8) * fp16_to_f32(b.d);
      }
      return;
    }
    case KvType::Kivi2:
      kivi_row_to_f32(*static_cast<const KiviLayer*>(base), a.kv_row, slot, is_v, e0, hd, dst);
      return;
  }
}
static_assert(sizeof(BlockQ8_0) == kKvQ8_0BlockBytes && sizeof(BlockQ4_0) == kKvQ4_0BlockBytes);

// One query row of one head: online softmax over positions 0..n_ctx-1 (or its window). With
// key_mass, a second pass adds each key's probability under the final maximum and sum.
void attend_row(const AttentionArgs& a, int64_t i, int64_t h, float* acc, float* krow, float* vrow) {
  const int64_t hd = a.head_dim;
  const int64_t kvh = h / (a.n_head / a.n_head_kv);
  const float* q = a.q + i * a.ldq + h * hd;
  float* out = a.out + i * a.ldo + h * hd;
  const int64_t n_ctx = a.n_past + i + 1;
  const int64_t p_first = a.window > 0 && n_ctx > a.window ? n_ctx - a.window : 0;
  auto score = [&](int64_t p) {
    kv_head_row(a, a.k_base, false, a.slots[p], kvh, krow);
    float s = 0.0f;
    for (int64_t d = 0; d < hd; ++d) s += q[d] * krow[d];
    s *= a.scale;
    if (a.softcap > 0.0f) s = a.softcap * std::tanh(s / a.softcap);
    return s;
  };
  float m = -INFINITY, l = 0.0f;
  std::fill(acc, acc + hd, 0.0f);
  for (int64_t p = p_first; p < n_ctx; ++p) {
    const float s = score(p);
    kv_head_row(a, a.v_base, true, a.slots[p], kvh, vrow);
    if (s > m) {
      // New maximum: rescale what was accumulated so far.
      const float r = std::exp(m - s);
      l = l * r + 1.0f;
      for (int64_t d = 0; d < hd; ++d) acc[d] = acc[d] * r + vrow[d];
      m = s;
    } else {
      const float w = std::exp(s - m);
      l += w;
      for (int64_t d = 0; d < hd; ++d) acc[d] += w * vrow[d];
    }
  }
  if (a.sinks) {
    // The head's sink joins the softmax as a score with no value (attention_iface.h).
    const float sink = a.sinks[h];
    if (sink > m) {
      const float r = std::exp(m - sink);
      l = l * r + 1.0f;
      for (int64_t d = 0; d < hd; ++d) acc[d] *= r;
      m = sink;
    } else {
      l += std::exp(sink - m);
    }
  }
  const float inv = 1.0f / l;
  for (int64_t d = 0; d < hd; ++d) out[d] = acc[d] * inv;
  if (a.key_mass) {
    float* mass = a.key_mass + kvh * a.ld_key_mass;
    for (int64_t p = p_first; p < n_ctx; ++p) mass[p] += std::exp(score(p) - m) * inv;
  }
}

// The scalar half conversion: core/fp16.h's (round to nearest even) for numbers; a NaN keeps
// its sign and top payload bits and becomes quiet, as vcvtps2ph does.
void f32_to_f16_ref(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t w = f32_to_bits(src[i]);
    dst[i] = (w & 0x7fffffffu) > 0x7f800000u ? uint16_t(((w >> 16) & 0x8000u) | 0x7e00u | ((w >> 13) & 0x3ffu))
                                             : f32_to_fp16(src[i]);
  }
}

}  // namespace

namespace {
void f32_to_f16_with(Isa isa, const float* src, uint16_t* dst, int64_t n) {
  switch (isa) {
    case Isa::Avx512: attn::f32_to_f16_avx512(src, dst, n); break;
    case Isa::Avx2: attn::f32_to_f16_avx2(src, dst, n); break;
    case Isa::Neon: case Isa::Dotprod: case Isa::I8mm: attn::f32_to_f16_neon(src, dst, n); break;
    default: f32_to_f16_ref(src, dst, n);
  }
}
}  // namespace

namespace {
// The scan's scalar reference (attention_iface.h, SsmScanArgs).
void ssm_scan_ref(const SsmScanArgs& a, int64_t c0, int64_t c1) {
  const int64_t S = a.d_state;
  for (int64_t c = c0; c < c1; ++c) {
    float* h = a.h + c * S;
    const float* A = a.a + c * S;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const float raw = a.dt[t * a.lddt + c];
      const float dt = raw <= 20.0f ? std::log1p(std::exp(raw)) : raw;
      const float u = a.u[t * a.ldu + c];
      const float* B = a.b + t * a.ldbc;
      const float* C = a.c + t * a.ldbc;
      float y = 0.0f;
      for (int64_t k = 0; k < S; ++k) {
        h[k] = h[k] * std::exp(dt * A[k]) + B[k] * (u * dt);
        y += h[k] * C[k];
      }
      y += a.d[c] * u;
      const float z = a.z[t * a.ldz + c];
      a.y[t * a.ldy + c] = y * (z / (1.0f + std::exp(-z)));
    }
  }
}
}  // namespace

void ssm_scan_isa(Isa isa, const SsmScanArgs& a, int64_t c0, int64_t c1) {
  switch (isa) {
    case Isa::Avx512: attn::ssm_scan_avx512(a, c0, c1); break;
    case Isa::Avx2: attn::ssm_scan_avx2(a, c0, c1); break;
    case Isa::Neon: case Isa::Dotprod: case Isa::I8mm: attn::ssm_scan_neon(a, c0, c1); break;
    default: ssm_scan_ref(a, c0, c1);
  }
}

void ssm_scan(const SsmScanArgs& a, int64_t c0, int64_t c1) { ssm_scan_isa(selected_isa(), a, c0, c1); }

namespace {
// Mamba-2's scan, the scalar reference (attention_iface.h, Ssm2ScanArgs).
void ssm2_scan_ref(const Ssm2ScanArgs& a, int64_t h0, int64_t h1) {
  const int64_t S = a.d_state, P = a.head_dim;
  for (int64_t hd = h0; hd < h1; ++hd) {
    const int64_t g = hd / a.heads_per_group;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const float raw = a.dt[t * a.lddt + hd];
      const float dt = raw <= 20.0f ? std::log1p(std::exp(raw)) : raw;
      const float decay = std::exp(dt * a.a[hd]);
      const float* B = a.b + t * a.ldbc + g * S;
      const float* C = a.c + t * a.ldbc + g * S;
      for (int64_t p = 0; p < P; ++p) {
        const int64_t ch = hd * P + p;
        float* h = a.h + ch * S;
        const float x = a.x[t * a.ldx + ch];
        float y = 0.0f;
        for (int64_t k = 0; k < S; ++k) {
          h[k] = h[k] * decay + B[k] * (x * dt);
          y += h[k] * C[k];
        }
        y += a.d[hd] * x;
        const float z = a.z[t * a.ldz + ch];
        a.y[t * a.ldy + ch] = y * (z / (1.0f + std::exp(-z)));
      }
    }
  }
}
}  // namespace

void ssm2_scan_isa(Isa isa, const Ssm2ScanArgs& a, int64_t h0, int64_t h1) {
  switch (isa) {
    case Isa::Avx512: attn::ssm2_scan_avx512(a, h0, h1); break;
    case Isa::Avx2: attn::ssm2_scan_avx2(a, h0, h1); break;
    case Isa::Neon: case Isa::Dotprod: case Isa::I8mm: attn::ssm2_scan_neon(a, h0, h1); break;
    default: ssm2_scan_ref(a, h0, h1);
  }
}

void ssm2_scan(const Ssm2ScanArgs& a, int64_t h0, int64_t h1) { ssm2_scan_isa(selected_isa(), a, h0, h1); }

namespace {
// Mamba-2's scan in the chunked form, the scalar reference (attention_iface.h): each head's chunk
// as the formulas state it, one sum at a time (seg and cum summed directly).
void ssm2_scan_chunked_ref(const Ssm2ScanArgs& a, int64_t h0, int64_t h1, int64_t L) {
  const int64_t S = a.d_state, P = a.head_dim;
  std::vector<float> dt(static_cast<size_t>(L)), av(static_cast<size_t>(L)), m(static_cast<size_t>(L * L));
  for (int64_t hd = h0; hd < h1; ++hd) {
    const int64_t g = hd / a.heads_per_group;
    float* h = a.h + hd * P * S;  // [P][S]
    for (int64_t t0 = 0; t0 < a.n_tokens; t0 += L) {
      const int64_t l = std::min(L, a.n_tokens - t0);
      const float* B = a.b + t0 * a.ldbc + g * S;
      const float* C = a.c + t0 * a.ldbc + g * S;
      const float* X = a.x + t0 * a.ldx + hd * P;
      for (int64_t t = 0; t < l; ++t) {
        const float raw = a.dt[(t0 + t) * a.lddt + hd];
        dt[size_t(t)] = raw <= 20.0f ? std::log1p(std::exp(raw)) : raw;
        av[size_t(t)] = dt[size_t(t)] * a.a[hd];
      }
      // m[t][s] = (C[t] . B[s]) exp(seg(t, s)) dt_s, s <= t.
      for (int64_t t = 0; t < l; ++t) {
        float seg = 0.0f;
        for (int64_t s = t; s >= 0; --s) {
          if (s < t) seg += av[size_t(s + 1)];
          float cb = 0.0f;
          for (int64_t k = 0; k < S; ++k) cb += C[t * a.ldbc + k] * B[s * a.ldbc + k];
          m[size_t(t * L + s)] = cb * std::exp(seg) * dt[size_t(s)];
        }
      }
      float cum = 0.0f;
      for (int64_t t = 0; t < l; ++t) {
        cum += av[size_t(t)];
        const float in = std::exp(cum);
        for (int64_t p = 0; p < P; ++p) {
          float off = 0.0f, diag = 0.0f;
          for (int64_t k = 0; k < S; ++k) off += C[t * a.ldbc + k] * h[p * S + k];
          for (int64_t s = 0; s <= t; ++s) diag += m[size_t(t * L + s)] * X[s * a.ldx + p];
          const float x = X[t * a.ldx + p], z = a.z[(t0 + t) * a.ldz + hd * P + p];
          a.y[(t0 + t) * a.ldy + hd * P + p] = (off * in + diag + a.d[hd] * x) * (z / (1.0f + std::exp(-z)));
        }
      }
      // The state, once per chunk: h exp(cum(l - 1)) + sum_s exp(seg(l - 1, s)) dt_s x[s] B[s]^T.
      const float total = std::exp(cum);
      for (int64_t p = 0; p < P; ++p)
        for (int64_t k = 0; k < S; ++k) {
          float acc = h[p * S + k] * total, seg = 0.0f;
          for (int64_t s = l - 1; s >= 0; --s) {
            if (s < l - 1) seg += av[size_t(s + 1)];
            acc += std::exp(seg) * dt[size_t(s)] * X[s * a.ldx + p] * B[s * a.ldbc + k];
          }
          h[p * S + k] = acc;
        }
    }
  }
}

// The calling thread's scratch for the chunked scan, at least `floats` long.
float* ssm2_chunked_scratch(int64_t floats) {
  thread_local std::vector<float> scratch;
  if (int64_t(scratch.size()) < floats) scratch.resize(size_t(floats));
  return scratch.data();
}
}  // namespace

void ssm2_scan_chunked_isa(Isa isa, const Ssm2ScanArgs& a, int64_t h0, int64_t h1, int64_t chunk) {
  TERN_ASSERT_MSG(chunk >= 1, "ssm2_scan_chunked: chunk must be at least 1 token");
  const auto scratch = [&] { return ssm2_chunked_scratch(ssm2_chunked_scratch_floats(a.d_state, a.head_dim, chunk)); };
  switch (isa) {
    case Isa::Avx512: attn::ssm2_scan_chunked_avx512(a, h0, h1, chunk, scratch()); break;
    case Isa::Avx2: attn::ssm2_scan_chunked_avx2(a, h0, h1, chunk, scratch()); break;
    case Isa::Neon: case Isa::Dotprod: case Isa::I8mm: attn::ssm2_scan_chunked_neon(a, h0, h1, chunk, scratch()); break;
    default: ssm2_scan_chunked_ref(a, h0, h1, chunk);
  }
}

void ssm2_scan_chunked(const Ssm2ScanArgs& a, int64_t h0, int64_t h1, int64_t chunk) {
  ssm2_scan_chunked_isa(selected_isa(), a, h0, h1, chunk);
}

namespace {
// RWKV-7's WKV, the scalar reference (attention_iface.h, Wkv7Args), in ggml's order of operations.
void wkv7_ref(const Wkv7Args& a, int64_t h0, int64_t h1) {
  const int64_t N = a.head_size;
  for (int64_t h = h0; h < h1; ++h) {
    float* S = a.s + h * N * N;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const int64_t o = t * a.ld + h * N;
      const float *r = a.r + o, *w = a.w + o, *k = a.k + o, *v = a.v + o, *aa = a.a + o, *b = a.b + o;
      float* y = a.y + t * a.ldy + h * N;
      for (int64_t i = 0; i < N; ++i) {
        float* row = S + i * N;
        float sa = 0.0f;
        for (int64_t j = 0; j < N; ++j) sa += aa[j] * row[j];
        float acc = 0.0f;
        for (int64_t j = 0; j < N; ++j) {
          row[j] = row[j] * w[j] + v[i] * k[j] + sa * b[j];
          acc += row[j] * r[j];
        }
        y[i] = acc;
      }
    }
  }
}
}  // namespace

void wkv7_isa(Isa isa, const Wkv7Args& a, int64_t h0, int64_t h1) {
  switch (isa) {
    case Isa::Avx512: attn::wkv7_avx512(a, h0, h1); break;
    case Isa::Avx2: attn::wkv7_avx2(a, h0, h1); break;
    case Isa::Neon: case Isa::Dotprod: case Isa::I8mm: attn::wkv7_neon(a, h0, h1); break;
    default: wkv7_ref(a, h0, h1);
  }
}

void wkv7(const Wkv7Args& a, int64_t h0, int64_t h1) { wkv7_isa(selected_isa(), a, h0, h1); }

namespace {
// The gated delta rule, the scalar reference (attention_iface.h, GatedDeltaArgs), in the order
// of ggml's CPU op (ggml_compute_forward_gated_delta_net): decay, the state's read of k, the
// rank-1 update, the read of q.
void gated_delta_ref(const GatedDeltaArgs& a, int64_t h0, int64_t h1) {
  const int64_t S = a.head_dim;
  std::vector<float> delta(static_cast<size_t>(S));
  for (int64_t h = h0; h < h1; ++h) {
    float* M = a.s + h * S * S;
    const int64_t kh = h / a.heads_per_key;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const float* q = a.q + t * a.ldqk + kh * S;
      const float* k = a.k + t * a.ldqk + kh * S;
      const float* v = a.v + t * a.ldv + h * S;
      const float decay = std::exp(a.g[t * a.ldgb + h]), beta = a.beta[t * a.ldgb + h];
      float* o = a.o + t * a.ldo + h * S;
      for (int64_t i = 0; i < S * S; ++i) M[i] *= decay;
      for (int64_t j = 0; j < S; ++j) {
        const float* row = M + j * S;
        float sum = 0.0f;
        for (int64_t i = 0; i < S; ++i) sum += row[i] * k[i];
        delta[size_t(j)] = (v[j] - sum) * beta;
      }
      for (int64_t j = 0; j < S; ++j) {
        float* row = M + j * S;
        for (int64_t i = 0; i < S; ++i) row[i] += k[i] * delta[size_t(j)];
      }
      for (int64_t j = 0; j < S; ++j) {
        const float* row = M + j * S;
        float sum = 0.0f;
        for (int64_t i = 0; i < S; ++i) sum += row[i] * q[i];
        o[j] = sum * a.scale;
      }
    }
  }
}
}  // namespace

void gated_delta_isa(Isa isa, const GatedDeltaArgs& a, int64_t h0, int64_t h1) {
  switch (isa) {
    case Isa::Avx512: attn::gated_delta_avx512(a, h0, h1); break;
    case Isa::Avx2: attn::gated_delta_avx2(a, h0, h1); break;
    case Isa::Neon: case Isa::Dotprod: case Isa::I8mm: attn::gated_delta_neon(a, h0, h1); break;
    default: gated_delta_ref(a, h0, h1);
  }
}

void gated_delta(const GatedDeltaArgs& a, int64_t h0, int64_t h1) { gated_delta_isa(selected_isa(), a, h0, h1); }

namespace {
// RWKV-6's WKV, the scalar reference (attention_iface.h, Wkv6Args): ggml's scalar loop, row i of
// the state (key channel i) at a time, each y[j] summed over i in order.
void wkv6_ref(const Wkv6Args& a, int64_t h0, int64_t h1) {
  const int64_t N = a.head_size;
  for (int64_t h = h0; h < h1; ++h) {
    float* S = a.s + h * N * N;
    const float* u = a.u + h * N;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const int64_t o = t * a.ld + h * N;
      const float *r = a.r + o, *k = a.k + o, *v = a.v + o, *w = a.w + o;
      float* y = a.y + t * a.ldy + h * N;
      for (int64_t j = 0; j < N; ++j) y[j] = 0.0f;
      for (int64_t i = 0; i < N; ++i) {
        float* row = S + i * N;
        const float ki = k[i], ri = r[i], ui = u[i], wi = w[i];
        for (int64_t j = 0; j < N; ++j) {
          const float kv = v[j] * ki;
          const float prev = row[j];
          const float tmp = kv * ui + prev;
          y[j] += tmp * ri;
          row[j] = prev * wi + kv;
        }
      }
    }
  }
}
}  // namespace

void wkv6_isa(Isa isa, const Wkv6Args& a, int64_t h0, int64_t h1) {
  switch (isa) {
    case Isa::Avx512: attn::wkv6_avx512(a, h0, h1); break;
    case Isa::Avx2: attn::wkv6_avx2(a, h0, h1); break;
    case Isa::Neon: case Isa::Dotprod: case Isa::I8mm: attn::wkv6_neon(a, h0, h1); break;
    default: wkv6_ref(a, h0, h1);
  }
}

void wkv6(const Wkv6Args& a, int64_t h0, int64_t h1) { wkv6_isa(selected_isa(), a, h0, h1); }

void convert_f32_to_f16_isa(Isa isa, const float* src, uint16_t* dst, int64_t n) {
  if (!isa_supported(isa)) fail("f16 conversion variant ", isa_name(isa), " is not supported by this CPU");
  f32_to_f16_with(isa, src, dst, n);
}

void convert_f32_to_f16(const float* src, uint16_t* dst, int64_t n) { f32_to_f16_with(selected_isa(), src, dst, n); }

namespace {

void attention_ref(std::span<const AttentionArgs> seqs, ThreadPool& pool) {
  pool.run([&](int ith, int nth) {
    thread_local std::vector<float> acc;
    int64_t max_hd = 0;
    for (const auto& a : seqs) max_hd = std::max(max_hd, a.head_dim);
    acc.resize(size_t(3 * max_hd));
    // Items are interleaved across threads (item % nth) so that long and short rows of a
    // causal prefill are spread evenly; a sequence that sums key masses runs on thread 0
    // alone (its rows add into the same keys).
    int64_t item = 0;
    for (const auto& a : seqs) {
      for (int64_t i = 0; i < a.n_tokens; ++i)
        for (int64_t h = 0; h < a.n_head; ++h, ++item)
          if (a.key_mass ? ith == 0 : item % nth == ith)
            attend_row(a, i, h, acc.data(), acc.data() + max_hd, acc.data() + 2 * max_hd);
    }
  });
}

// One unit of parallel work: query tokens [i0, i1) of sequence `seq`, KV head `kvh`.
struct TileItem {
  int32_t seq;
  int32_t kvh;
  int64_t i0, i1;
};

// Query rows per tile: enough to amortise loading each K block (tokens x GQA group), few
// enough that S and O stay in L1/L2.
constexpr int64_t kTileRows = 32;

// Query tokens per tile for a GQA group of g query heads.
int64_t tokens_per_tile(int64_t g) { return std::max<int64_t>(1, kTileRows / g); }

using TileKernel = void (*)(const AttentionArgs&, int64_t, int64_t, int64_t, float*);
TileKernel tile_kernel(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return attn::attention_tile_avx512;
    case Isa::Avx2: return attn::attention_tile_avx2;
    default: return attn::attention_tile_neon;  // the three ARM variants (float code: one build)
  }
}

// The calling thread's tile scratch, at least `floats` long.
float* tile_scratch(int64_t floats) {
  thread_local std::vector<float> scratch;
  if (int64_t(scratch.size()) < floats) scratch.resize(size_t(floats));
  return scratch.data();
}

}  // namespace

void attention_isa(Isa isa, std::span<const AttentionArgs> seqs, ThreadPool& pool) {
  if (!isa_supported(isa)) fail("attention variant ", isa_name(isa), " is not supported by this CPU");
  for (const auto& a : seqs) {
    TERN_ASSERT(a.n_head_kv > 0 && a.n_head % a.n_head_kv == 0 && a.head_dim > 0 && a.window >= 0);
    // Quantized rows: whole blocks, and a head's 8-element pieces inside one block each.
    TERN_ASSERT(a.kv_type == KvType::F32 || a.kv_type == KvType::F16 ||
                (a.kv_row % kKvQuantBlock == 0 && a.head_dim % 8 == 0));
    TERN_ASSERT(a.kv_type != KvType::Kivi2 || a.k_base == a.v_base);
    TERN_ASSERT(!a.key_mass || a.ld_key_mass >= a.n_past + a.n_tokens);
  }
  if (isa == Isa::Ref) {
    attention_ref(seqs, pool);
    return;
  }
  const TileKernel tile = tile_kernel(isa);

  // Tiles, the latest query tokens first: under causal masking they see the most keys, and
  // the pool's threads claim items in order, so the long ones start early.
  // The list lives in the caller's thread_local; the workers reach it through this reference
  // (naming a thread_local inside the lambda would give each worker its own, empty one).
  thread_local std::vector<TileItem> caller_items;
  std::vector<TileItem>& items = caller_items;
  items.clear();
  int64_t work = 0, max_scratch = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    const AttentionArgs& a = seqs[si];
    if (a.n_tokens <= 0) continue;
    const int64_t g = a.n_head / a.n_head_kv;
    // With key masses a KV head's rows are one tile: tiles of one head would add into the
    // same keys from two threads.
    const int64_t tq = a.key_mass ? a.n_tokens : tokens_per_tile(g);
    max_scratch = std::max(max_scratch, attn::tile_scratch_floats(a.head_dim, tq * g));
    work += a.n_tokens * a.n_head * (a.n_past + a.n_tokens) * a.head_dim;
    for (int64_t i1 = a.n_tokens; i1 > 0; i1 -= tq)
      for (int64_t kvh = 0; kvh < a.n_head_kv; ++kvh)
        items.push_back(TileItem{int32_t(si), int32_t(kvh), std::max<int64_t>(0, i1 - tq), i1});
  }
  auto run_item = [&](int64_t c, int) {
    const TileItem& it = items[size_t(c)];
    tile(seqs[size_t(it.seq)], it.kvh, it.i0, it.i1, tile_scratch(max_scratch));
  };
  // A decode step of a small model: fork/join would cost more than the work.
  if (work < (int64_t(1) << 16) || pool.size() == 1) {
    for (int64_t c = 0; c < int64_t(items.size()); ++c) run_item(c, 0);
    return;
  }
  pool.for_chunks(int64_t(items.size()), [&](int64_t c, int t) { run_item(c, t); });
}

void attention_kv_head(const AttentionArgs& a, int64_t kvh) {
  if (a.n_tokens <= 0) return;
  const Isa isa = selected_isa();
  const int64_t g = a.n_head / a.n_head_kv;
  if (isa == Isa::Ref) {
    thread_local std::vector<float> acc;
    acc.resize(size_t(3 * a.head_dim));
    for (int64_t i = 0; i < a.n_tokens; ++i)
      for (int64_t h = kvh * g; h < (kvh + 1) * g; ++h)
        attend_row(a, i, h, acc.data(), acc.data() + a.head_dim, acc.data() + 2 * a.head_dim);
    return;
  }
  const TileKernel tile = tile_kernel(isa);
  const int64_t tq = tokens_per_tile(g);
  float* scratch = tile_scratch(attn::tile_scratch_floats(a.head_dim, tq * g));
  for (int64_t i1 = a.n_tokens; i1 > 0; i1 -= tq) tile(a, kvh, std::max<int64_t>(0, i1 - tq), i1, scratch);
}

void attention(std::span<const AttentionArgs> seqs, ThreadPool& pool) {
  attention_isa(selected_isa(), seqs, pool);
}

}  // namespace tern
