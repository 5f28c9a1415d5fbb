// The driver of tern's integer kernels (activation quantization, row split across the pool) and
// the scalar reference row kernels. The SIMD row kernels are x86/tern_int_avx2.cpp,
// x86/tern_int_avx512.cpp (VNNI) and arm/tern_int_neon.cpp.
#include "kernels/tern_int.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "quant/quant_billm.h"
#include "quant/quant_tern.h"
#include "core/error.h"
#include "core/fp16.h"
#include "quant/quant_traits.h"

namespace tern {
namespace kern {
namespace {

void i8_dots_ref(const int8_t* w, int64_t n_in, const uint8_t* xu, int64_t stride, int64_t n_tok, int32_t* out) {
  for (int64_t t = 0; t < n_tok; ++t) {
    const uint8_t* x = xu + t * stride;
    int32_t s = 0;
    for (int64_t j = 0; j < n_in; ++j) s += int32_t(w[j]) * (int32_t(x[j]) - 128);
    out[t] = s;
  }
}

void tq_dots_ref(const uint8_t* w, int bits, int group, int64_t n_in, const uint8_t* act, int64_t stride,
                 int64_t off_dxv, int64_t off_xs, int64_t n_tok, float* out) {
  const TqFormat f{bits, group};
  uint8_t q[128];
  for (int64_t t = 0; t < n_tok; ++t) out[t] = 0.0f;
  for (int64_t g = 0; g < n_in / group; ++g) {
    float d;
    int z;
    tq_unpack_group(f, w + g * f.block_bytes(), q, &d, &z);
    for (int64_t t = 0; t < n_tok; ++t) {
      const uint8_t* a = act + t * stride;
      const auto* xq = reinterpret_cast<const int8_t*>(a) + g * group;
      const auto* dxv = reinterpret_cast<const float*>(a + off_dxv);
      const auto* xs = reinterpret_cast<const float*>(a + off_xs);
      float acc = 0.0f, corr = 0.0f;
      for (int b = 0; b < group / 32; ++b) {
        const int64_t blk = g * group / 32 + b;  // 32-block index within the row
        int32_t isum = 0;
        for (int j = 0; j < 32; ++j) isum += int32_t(q[32 * b + j]) * int32_t(xq[32 * b + j]);
        acc += dxv[(blk / 2) * 16 + (blk % 2) * 8] * float(isum);
        corr += xs[blk];
      }
      out[t] += d * (acc - float(z) * corr);
    }
  }
}

// The definition the SIMD variants follow (tern_int.h): four exact integer sums per 32 columns,
// scaled by d_x, then by the block's magnitudes.
void billm_dots_ref(const uint8_t* w, int group, int64_t n_in, const uint8_t* act, int64_t stride, int64_t off_dxv,
                    int64_t n_tok, float* out) {
  const BillmFormat f{group};
  BillmBlock blk;
  for (int64_t t = 0; t < n_tok; ++t) out[t] = 0.0f;
  for (int64_t g = 0; g < n_in / group; ++g) {
    billm_unpack_block(f, w + g * f.block_bytes(), &blk);
    bool sal[kBillmMaxGroup] = {};
    for (int i = 0; i < blk.n_salient; ++i)
      if (blk.salient[i] < group) sal[blk.salient[i]] = true;
    for (int64_t t = 0; t < n_tok; ++t) {
      const uint8_t* a = act + t * stride;
      const auto* xq = reinterpret_cast<const int8_t*>(a) + g * group;
      const auto* dxv = reinterpret_cast<const float*>(a + off_dxv);
      float c = 0.0f, e = 0.0f, s1 = 0.0f, s2 = 0.0f;
      for (int b = 0; b < group / 32; ++b) {
        int32_t ic = 0, ie = 0, is = 0, ir = 0;
        for (int j = 32 * b; j < 32 * b + 32; ++j) {
          const int32_t x = xq[j];
          const int32_t sx = blk.sgn[j] ? -x : x;
          if (sal[j]) {
            is += sx;
            ir += blk.sel[j] ? -x : x;
          } else {
            ic += sx;
            ie += blk.sel[j] ? sx : 0;
          }
        }
        const int64_t bi = g * group / 32 + b;
        const float dx = dxv[(bi / 2) * 16 + (bi % 2) * 8];
        c += dx * float(ic);
        e += dx * float(ie);
        s1 += dx * float(is);
        s2 += dx * float(ir);
      }
      out[t] += blk.a_c * c + (blk.a_s - blk.a_c) * e + blk.a_1 * s1 + blk.a_2 * s2;
    }
  }
}

}  // namespace

const TernIntRows& tern_int_rows_ref() {
  static const TernIntRows t{i8_dots_ref, tq_dots_ref, billm_dots_ref, nullptr, nullptr};
  return t;
}

}  // namespace kern

namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

const kern::TernIntRows& rows_of(Isa isa) {
  if (!isa_supported(isa)) fail("kernel variant ", isa_name(isa), " is not supported by this CPU");
  switch (isa) {
    case Isa::Avx512: return kern::tern_int_rows_avx512();
    case Isa::Avx2: return kern::tern_int_rows_avx2();
    case Isa::Neon: case Isa::Dotprod: case Isa::I8mm: return kern::tern_int_rows_neon();
    default: return kern::tern_int_rows_ref();
  }
}

// Activation scratch of the calling thread, grown to the largest call and reused.
std::vector<uint8_t>& act_scratch() {
  thread_local std::vector<uint8_t> buf;
  return buf;
}

uint8_t* aligned64(std::vector<uint8_t>& buf, int64_t bytes) {
  if (int64_t(buf.size()) < bytes + 64) buf.resize(size_t(bytes + 64));
  return buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
}

// Tokens per row-kernel call: weights stay in registers/L1 across them.
constexpr int64_t kTokBlock = 4;

// --- LLM.int8() / W8A8 ------------------------------------------------------------------------
//
// Per token (stride bytes, 64-aligned):  xu [n_in] u8 = q + 128 | dx f32 | xo [k] f32
// xu is the activation shifted into u8 (VNNI multiplies u8 by s8); outlier columns hold 128
// (q = 0). xo are the outlier columns' values rounded to f16: the 16-bit half of LLM.int8().
struct I8Layout {
  int64_t stride, off_dx, off_xo;
};

I8Layout i8_layout(int64_t n_in, int64_t k) {
  I8Layout l;
  l.off_dx = round_up(n_in, 4);
  l.off_xo = l.off_dx + 4;
  l.stride = round_up(l.off_xo + 4 * k, 64);
  return l;
}

void quantize_i8_token(const float* x, int64_t n_in, const int32_t* cols, int64_t k, const I8Layout& l,
                       uint8_t* dst) {
  float amax = 0.0f;
  int64_t next = 0;
  for (int64_t j = 0; j < n_in; ++j) {
    if (next < k && cols[next] == j) {
      ++next;
      continue;
    }
    amax = std::max(amax, std::fabs(x[j]));
  }
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  next = 0;
  auto* xo = reinterpret_cast<float*>(dst + l.off_xo);
  for (int64_t j = 0; j < n_in; ++j) {
    if (next < k && cols[next] == j) {
      dst[j] = 128;
      xo[next++] = fp16_to_f32(f32_to_fp16(x[j]));
      continue;
    }
    dst[j] = static_cast<uint8_t>(nearest_int(x[j] * id) + 128);
  }
  std::memcpy(dst + l.off_dx, &d, 4);
}

// Shared by the stored TI8 rows and llm_int8_matmul's explicit pieces: row r's int8 weights,
// its scale and its k 16-bit outlier weights.
struct I8Rows {
  const int8_t* (*q)(const void* ctx, int64_t r);
  float (*d)(const void* ctx, int64_t r);
  const uint16_t* (*o)(const void* ctx, int64_t r);
  const void* ctx;
};

// Stored TI8 rows (tern_int_matmul): what the 16-row kernels read directly.
struct StoredTi8 {
  const uint8_t* data;
  int64_t row_bytes, n_in;
};

// stored: the same rows as `rows`, as stored (nullptr for llm_int8_matmul's explicit pieces).
void i8_matmul(Isa isa, const I8Rows& rows, const StoredTi8* stored, const int32_t* cols, int64_t k, int64_t n_in,
               int64_t n_out, const float* x, int64_t ldx, int64_t n_tokens, float* y, int64_t ldy, ThreadPool& pool) {
  const I8Layout l = i8_layout(n_in, k);
  uint8_t* act = aligned64(act_scratch(), l.stride * n_tokens);
  auto quant = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) quantize_i8_token(x + t * ldx, n_in, cols, k, l, act + t * l.stride);
  };
  if (n_tokens < 8 || pool.size() == 1) quant(0, n_tokens);
  else pool.parallel_for(n_tokens, [&](int64_t t0, int64_t t1, int) { quant(t0, t1); });

  const kern::TernIntRows& kr = rows_of(isa);
  if (stored && kr.i8_rows16) {
    // 16-row tiles: chunks of whole tiles, about 4 per thread.
    const int64_t per = round_up(std::max<int64_t>(16, (n_out + 4 * pool.size() - 1) / (4 * pool.size())), 16);
    pool.for_chunks((n_out + per - 1) / per, [&](int64_t c, int) {
      const int64_t r0 = c * per, r1 = std::min(n_out, r0 + per);
      kr.i8_rows16(stored->data, stored->row_bytes, r0, r1, n_in, k, act, l.stride, l.off_dx, l.off_xo, n_tokens, y,
                   ldy);
    });
    return;
  }
  const int64_t per = std::max<int64_t>(4, (n_out + 4 * pool.size() - 1) / (4 * pool.size()));
  const int64_t n_chunks = (n_out + per - 1) / per;
  pool.for_chunks(n_chunks, [&](int64_t c, int) {
    int32_t isum[kTokBlock];
    thread_local std::vector<float> wo;  // [k] this row's outlier weights in f32
    wo.resize(size_t(k));
    const int64_t r0 = c * per, r1 = std::min(n_out, r0 + per);
    for (int64_t r = r0; r < r1; ++r) {
      const int8_t* q = rows.q(rows.ctx, r);
      const float dw = rows.d(rows.ctx, r);
      const uint16_t* o = rows.o(rows.ctx, r);
      for (int64_t j = 0; j < k; ++j) wo[size_t(j)] = fp16_to_f32(o[j]);
      for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokBlock) {
        const int64_t nt = std::min(kTokBlock, n_tokens - t0);
        kr.i8_dots(q, n_in, act + t0 * l.stride, l.stride, nt, isum);
        for (int64_t i = 0; i < nt; ++i) {
          const uint8_t* a = act + (t0 + i) * l.stride;
          float dx;
          std::memcpy(&dx, a + l.off_dx, 4);
          float s = dw * dx * float(isum[i]);
          const auto* xo = reinterpret_cast<const float*>(a + l.off_xo);
          // The 16-bit part: f16 weights times f16-rounded activations, f32 accumulation.
          for (int64_t j = 0; j < k; ++j) s += wo[size_t(j)] * xo[j];
          y[(t0 + i) * ldy + r] = s;
        }
      }
    }
  });
}

// --- TQ ----------------------------------------------------------------------------------------
//
// Per token (stride bytes, 64-aligned):
//   xq [n_in] int8 | dxv [n_in/64][16] f32 | xs [n_in/32] f32
// dxv holds each 32-block's scale d_x[b] eight times, two blocks per 16 lanes, so that a 64-wide
// integer dot (16 lanes of 4 products: lanes 0-7 block 2c, 8-15 block 2c+1) is scaled with one
// vector multiply. xs[b] = d_x[b] * sum(q of block b), for the zero points.
struct TqLayout {
  int64_t stride, off_dxv, off_xs;
};

TqLayout tq_layout(int64_t n_in) {
  TqLayout l;
  l.off_dxv = round_up(n_in, 64);
  l.off_xs = l.off_dxv + (n_in / 64) * 64;
  l.stride = round_up(l.off_xs + (n_in / 32) * 4, 64);
  return l;
}

void quantize_tq_token(const float* x, int64_t n_in, const TqLayout& l, uint8_t* dst) {
  auto* xq = reinterpret_cast<int8_t*>(dst);
  auto* dxv = reinterpret_cast<float*>(dst + l.off_dxv);
  auto* xs = reinterpret_cast<float*>(dst + l.off_xs);
  for (int64_t b = 0; b < n_in / 32; ++b) {
    const float* xb = x + 32 * b;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int q = nearest_int(xb[j] * id);
      xq[32 * b + j] = static_cast<int8_t>(q);
      sum += q;
    }
    for (int j = 0; j < 8; ++j) dxv[(b / 2) * 16 + (b % 2) * 8 + j] = d;
    xs[b] = d * float(sum);
  }
}

// TQ and BiLLM rows: both read activations quantized per 32 columns (TqLayout).
void tq_matmul(Isa isa, const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y, int64_t ldy,
               ThreadPool& pool) {
  const bool billm = is_billm(w.type);
  const TqFormat f = billm ? TqFormat{} : tq_format(w.type);
  const int billm_group = billm ? billm_format(w.type).group : 0;
  const int64_t n_in = w.n_in, n_out = w.n_out, rb = w.row_bytes();
  const TqLayout l = tq_layout(n_in);
  uint8_t* act = aligned64(act_scratch(), l.stride * n_tokens);
  auto quant = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) quantize_tq_token(x + t * ldx, n_in, l, act + t * l.stride);
  };
  if (n_tokens < 8 || pool.size() == 1) quant(0, n_tokens);
  else pool.parallel_for(n_tokens, [&](int64_t t0, int64_t t1, int) { quant(t0, t1); });

  const kern::TernIntRows& kr = rows_of(isa);
  const auto* wd = static_cast<const uint8_t*>(w.data);
  // The ISA's tiles of 8 or 16 rows where it has them for this format (chunks of whole tiles,
  // about 4 per thread), else its row kernels.
  const bool tiles = !billm && kr.tq_tiles;
  const int64_t per_thread = (n_out + 4 * pool.size() - 1) / (4 * pool.size());
  const int64_t per = tiles ? round_up(std::max<int64_t>(16, per_thread), 16) : std::max<int64_t>(4, per_thread);
  const int64_t n_chunks = (n_out + per - 1) / per;
  pool.for_chunks(n_chunks, [&](int64_t c, int) {
    const int64_t r0 = c * per, r1 = std::min(n_out, r0 + per);
    if (tiles && kr.tq_tiles(wd, rb, r0, r1, f.bits, f.group, n_in, act, l.stride, l.off_dxv, l.off_xs, n_tokens, y,
                             ldy))
      return;
    float out[kTokBlock];
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokBlock) {
        const int64_t nt = std::min(kTokBlock, n_tokens - t0);
        if (billm) kr.billm_dots(wd + r * rb, billm_group, n_in, act + t0 * l.stride, l.stride, l.off_dxv, nt, out);
        else kr.tq_dots(wd + r * rb, f.bits, f.group, n_in, act + t0 * l.stride, l.stride, l.off_dxv, l.off_xs, nt, out);
        for (int64_t i = 0; i < nt; ++i) y[(t0 + i) * ldy + r] = out[i];
      }
  });
}

}  // namespace

bool is_tern_int_type(DType t) { return is_ti8(t) || is_tq(t) || is_billm(t); }

void tern_int_matmul(Isa isa, const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
                     int64_t ldy, ThreadPool& pool) {
  if (n_tokens <= 0 || w.n_out <= 0) return;
  const int64_t rb = w.row_bytes();
  if (rb < 0) fail("matmul: row length ", w.n_in, " is not a multiple of the ", dtype_name(w.type), " block size");
  if (is_tq(w.type) || is_billm(w.type)) {
    tq_matmul(isa, w, x, ldx, n_tokens, y, ldy, pool);
    return;
  }
  TERN_ASSERT(is_ti8(w.type));
  // The outlier columns, from the markers of row 0 (every row marks the same ones).
  const auto* data = static_cast<const uint8_t*>(w.data);
  thread_local std::vector<int32_t> cols;
  cols.resize(size_t(w.n_in));
  const int64_t k = std::min(ti8_outlier_cols(data, w.n_in, cols.data()), ti8_capacity(w.type, w.n_in));
  const StoredTi8 st{data, rb, w.n_in};
  const I8Rows rows{
      [](const void* c, int64_t r) {
        const auto* s = static_cast<const StoredTi8*>(c);
        return reinterpret_cast<const int8_t*>(s->data + r * s->row_bytes);
      },
      [](const void* c, int64_t r) {
        const auto* s = static_cast<const StoredTi8*>(c);
        uint16_t h;
        std::memcpy(&h, s->data + r * s->row_bytes + s->n_in, 2);
        return fp16_to_f32(h);
      },
      [](const void* c, int64_t r) {
        const auto* s = static_cast<const StoredTi8*>(c);
        // The tail is 2-byte aligned within the row only when row_bytes is even: TI8 rows are
        // n_in/32 * (32 + even tail) bytes, so it is.
        return reinterpret_cast<const uint16_t*>(s->data + r * s->row_bytes + s->n_in + 2);
      },
      &st};
  i8_matmul(isa, rows, &st, cols.data(), k, w.n_in, w.n_out, x, ldx, n_tokens, y, ldy, pool);
}

void llm_int8_matmul(Isa isa, const int8_t* w_i8, const float* d_w, const int32_t* cols, int64_t k,
                     const uint16_t* w_o, int64_t n_in, int64_t n_out, const float* x, int64_t ldx,
                     int64_t n_tokens, float* y, int64_t ldy, ThreadPool& pool) {
  if (n_in % 32 != 0) fail("llm_int8_matmul: n_in ", n_in, " is not a multiple of 32");
  if (n_tokens <= 0 || n_out <= 0) return;
  // Outlier columns must not count in the int8 sum: a copy of the int8 rows with them zeroed.
  std::vector<int8_t> q(w_i8, w_i8 + n_in * n_out);  // [n_out, n_in]
  for (int64_t r = 0; r < n_out; ++r)
    for (int64_t i = 0; i < k; ++i) q[size_t(r * n_in + cols[i])] = 0;
  struct Ctx {
    const int8_t* q;
    const float* d;
    const uint16_t* o;
    int64_t n_in, k;
  } ctx{q.data(), d_w, w_o, n_in, k};
  const I8Rows rows{
      [](const void* c, int64_t r) {
        const auto* s = static_cast<const Ctx*>(c);
        return s->q + r * s->n_in;
      },
      [](const void* c, int64_t r) { return static_cast<const Ctx*>(c)->d[r]; },
      [](const void* c, int64_t r) {
        const auto* s = static_cast<const Ctx*>(c);
        return s->o + r * s->k;
      },
      &ctx};
  i8_matmul(isa, rows, nullptr, cols, k, n_in, n_out, x, ldx, n_tokens, y, ldy, pool);
}

}  // namespace tern
