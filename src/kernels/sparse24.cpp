// The driver of the 2:4 sparse kernels (activation quantization, row split across the pool)
// and the scalar reference row kernels. The SIMD row kernels are x86/sparse24_avx2.cpp,
// x86/sparse24_avx512.cpp (VNNI) and arm/sparse24_neon.cpp.
#include "kernels/sparse24.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "kernels/dispatch_internal.h"
#include "kernels/kernel_iface.h"
#include "quant/quant_sparse.h"
#include "quant/quant_traits.h"

namespace tern {
namespace kern {
namespace {

void q8_dots_ref(const uint8_t* w, int64_t n_in, const uint8_t* act, int64_t stride, int64_t off_dxv,
                 int64_t n_tok, float* out, uint8_t* /*scratch*/) {
  for (int64_t t = 0; t < n_tok; ++t) {
    const uint8_t* xu = act + t * stride;
    const auto* dxv = reinterpret_cast<const float*>(xu + off_dxv);
    float s = 0.0f;
    for (int64_t b = 0; b < n_in / kTs24Block; ++b) {
      const uint8_t* blk = w + b * kTs24Q8Bytes;
      uint16_t dh;
      uint32_t idx;
      std::memcpy(&dh, blk, 2);
      std::memcpy(&idx, blk + kTs24Q8IdxOff, 4);
      int32_t isum = 0;
      for (int k = 0; k < 16; ++k) {
        const int64_t c = 32 * b + 4 * (k / 2) + ts24_pos(idx, k);
        isum += int32_t(int8_t(blk[2 + k])) * (int32_t(xu[c]) - 128);
      }
      const float dx = dxv[(b / 4) * 16 + (b % 2) * 8 + (b / 2 % 2) * 2];
      s += fp16_to_f32(dh) * dx * float(isum);
    }
    out[t] = s;
  }
}

void f16_dots_ref(const uint8_t* w, int64_t n_in, const float* x, int64_t ldx, int64_t n_tok, float* out,
                  uint8_t* /*scratch*/) {
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* xt = x + t * ldx;
    float s = 0.0f;
    for (int64_t b = 0; b < n_in / kTs24Block; ++b) {
      const uint8_t* blk = w + b * kTs24F16Bytes;
      uint32_t idx;
      std::memcpy(&idx, blk + kTs24F16IdxOff, 4);
      for (int k = 0; k < 16; ++k) {
        uint16_t h;
        std::memcpy(&h, blk + 2 * k, 2);
        s += fp16_to_f32(h) * xt[32 * b + 4 * (k / 2) + ts24_pos(idx, k)];
      }
    }
    out[t] = s;
  }
}

}  // namespace

int64_t sparse24_scratch_bytes(int64_t n_in) { return 4 * ((n_in + 127) / 128 * 128) + 1024; }

const Sparse24Rows& sparse24_rows_ref() {
  static const Sparse24Rows t{q8_dots_ref, f16_dots_ref};
  return t;
}

// The entry points of the variants this target does not build (CMake compiles *_avx2 /
// *_avx512 files on x86-64 only, *_neon files on ARM64 only). isa_supported() says no to those
// variants there, so these are never reached; each fails loudly if one were.
#if !(defined(__x86_64__) || defined(__i386__))
const Sparse24Rows& sparse24_rows_avx2() {
  fail("the AVX2 sparse24 kernels are not built into this binary (a non-x86 build)");
}
const Sparse24Rows& sparse24_rows_avx512() {
  fail("the AVX-512 sparse24 kernels are not built into this binary (a non-x86 build)");
}
#endif
#if !defined(__aarch64__)
const Sparse24Rows& sparse24_rows_neon() {
  fail("the NEON sparse24 kernels are not built into this binary (not an ARM64 build)");
}
#endif

}  // namespace kern

namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

const kern::Sparse24Rows& rows_of(Isa isa) {
  if (!isa_supported(isa)) fail("kernel variant ", isa_name(isa), " is not supported by this CPU");
  switch (isa) {
    case Isa::Avx512: return kern::sparse24_rows_avx512();
    case Isa::Avx2: return kern::sparse24_rows_avx2();
    case Isa::Neon: case Isa::Dotprod: case Isa::I8mm: return kern::sparse24_rows_neon();
    default: return kern::sparse24_rows_ref();
  }
}

uint8_t* aligned64(std::vector<uint8_t>& buf, int64_t bytes) {
  if (int64_t(buf.size()) < bytes + 64) buf.resize(size_t(bytes + 64));
  return buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
}

kern::Ts24Act act_layout(int64_t n_in) {
  kern::Ts24Act l;
  l.n_pad = round_up(n_in, 128);
  l.off_dxv = l.n_pad;
  l.stride = round_up(l.off_dxv + l.n_pad / 128 * 64, 64);
  return l;
}

// Q8_0's rule per 32 columns (as the TQ kernels quantize), into the Ts24Act layout.
void quantize_token(const float* x, int64_t n_in, const kern::Ts24Act& l, uint8_t* dst) {
  auto* dxv = reinterpret_cast<float*>(dst + l.off_dxv);
  std::memset(dst + n_in, 128, size_t(l.n_pad - n_in));
  std::fill(dxv, dxv + l.n_pad / 128 * 16, 0.0f);
  for (int64_t b = 0; b < n_in / 32; ++b) {
    const float* xb = x + 32 * b;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; ++j) dst[32 * b + j] = static_cast<uint8_t>(nearest_int(xb[j] * id) + 128);
    float* lanes = dxv + (b / 4) * 16 + (b % 2) * 8 + (b / 2 % 2) * 2;
    lanes[0] = lanes[1] = lanes[4] = lanes[5] = d;
  }
}

// Per-thread row-kernel scratch, grown to the largest row and reused.
uint8_t* thread_scratch(int64_t n_in) {
  thread_local std::vector<uint8_t> buf;
  return aligned64(buf, kern::sparse24_scratch_bytes(n_in));
}

// ---- Prefill through the dense kernels -----------------------------------------------------------
//
// With many tokens the row kernels' per-token work (gathers, one row at a time) loses to the
// dense kernels' register tiles, which reuse each weight across tokens and each activation
// across rows. So a batch expands a few rows at a time into the dense type's blocks in the
// thread's scratch (ts24_q8 -> Q8_0: the same f16 scale, zeros in the pruned columns, so the
// same integer sums; ts24_f16 -> F16 interleaved by 16 rows, the layout the float tiles read)
// and runs the variant's dense gemm on them, with x quantized once for all rows. The expanded
// rows stay in L2 and are read once per token tile, so the weight stream from memory is still
// the compressed one.
constexpr int64_t kDenseMinTokens = 8;

// One ts24_q8 row as Q8_0 blocks (n_in / 32 x 34 bytes).
void expand_q8_row(const uint8_t* src, int64_t n_in, uint8_t* dst) {
  for (int64_t b = 0; b < n_in / 32; ++b) {
    const uint8_t* blk = src + b * kTs24Q8Bytes;
    uint8_t* out = dst + b * 34;
    std::memcpy(out, blk, 2);
    std::memset(out + 2, 0, 32);
    uint32_t idx;
    std::memcpy(&idx, blk + kTs24Q8IdxOff, 4);
    for (int k = 0; k < 16; ++k) {
      out[2 + 4 * (k / 2) + ts24_pos(idx, k)] = blk[2 + k];  // no repeated positions (has_repeat)
    }
  }
}

// Rows [0, n) of a ts24_f16 sub-matrix as F16 interleaved by 16 (matmul.h): per group of 16
// rows, per column k, the 16 rows' values; the n % 16 rows after the last group as plain rows.
void expand_f16_rows(const uint8_t* src, int64_t rb, int64_t n, int64_t n_in, uint16_t* dst) {
  std::memset(dst, 0, size_t(n * n_in) * 2);
  const int64_t n_grouped = n / 16 * 16;
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* row = src + r * rb;
    uint16_t* base;
    int64_t step;  // elements between columns k and k + 1
    if (r < n_grouped) {
      base = dst + (r / 16) * 16 * n_in + r % 16;
      step = 16;
    } else {
      base = dst + r * n_in;
      step = 1;
    }
    for (int64_t b = 0; b < n_in / 32; ++b) {
      const uint8_t* blk = row + b * kTs24F16Bytes;
      uint32_t idx;
      std::memcpy(&idx, blk + kTs24F16IdxOff, 4);
      for (int k = 0; k < 16; ++k) {
        uint16_t h;
        std::memcpy(&h, blk + 2 * k, 2);
        base[(32 * b + 4 * (k / 2) + ts24_pos(idx, k)) * step] = h;  // no repeated positions (has_repeat)
      }
    }
  }
}

// Whether any group of these blocks names one position twice (never written by the encoder;
// the dense blocks cannot hold such a sum exactly). With p_k at bit 8 * (k % 4) + 2 * (k / 4),
// the pair of group g (values 2g, 2g + 1) sits at the same 2 bits of bytes 2j and 2j + 1.
bool has_repeat(const uint8_t* blocks, int64_t bytes, bool q8) {
  const int64_t bb = q8 ? kTs24Q8Bytes : kTs24F16Bytes, off = q8 ? kTs24Q8IdxOff : kTs24F16IdxOff;
  for (int64_t p = 0; p < bytes; p += bb) {
    uint32_t idx;
    std::memcpy(&idx, blocks + p + off, 4);
    const uint32_t diff = (idx ^ (idx >> 8)) & 0x00FF00FFu;  // 2-bit fields: 0 where equal
    if (((diff | (diff >> 1)) & 0x00550055u) != 0x00550055u) return true;
  }
  return false;
}

// Rows [r0, r1) by the row kernels, on this thread alone (the dense path's way out for blocks
// it cannot expand); ts24_q8 quantizes the tokens into this thread's own buffer.
void row_kernels(Isa isa, const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx,
                 int64_t n_tokens, float* y, int64_t ldy) {
  const kern::Sparse24Rows& kr = rows_of(isa);
  const int64_t n_in = w.n_in, rb = w.row_bytes();
  const auto* wd = static_cast<const uint8_t*>(w.data);
  const bool q8 = w.type == DType::TS24_Q8;
  const kern::Ts24Act l = act_layout(n_in);
  uint8_t* act = nullptr;  // [n_tokens][l.stride]
  if (q8) {
    thread_local std::vector<uint8_t> own;
    act = aligned64(own, l.stride * n_tokens);
    for (int64_t t = 0; t < n_tokens; ++t) quantize_token(x + t * ldx, n_in, l, act + t * l.stride);
  }
  constexpr int64_t kTok = 64;
  float out[kTok];
  uint8_t* scratch = thread_scratch(n_in);
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kTok) {
      const int64_t nt = std::min(kTok, n_tokens - t0);
      if (q8) kr.q8_dots(wd + r * rb, n_in, act + t0 * l.stride, l.stride, l.off_dxv, nt, out, scratch);
      else kr.f16_dots(wd + r * rb, n_in, x + t0 * ldx, ldx, nt, out, scratch);
      for (int64_t i = 0; i < nt; ++i) y[(t0 + i) * ldy + r] = out[i];
    }
}

void dense_prefill(Isa isa, const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
                   int64_t ldy, ThreadPool& pool) {
  const kern::KernelTable& kt = kern::table_of(isa);
  const bool q8 = w.type == DType::TS24_Q8;
  const DType dense = q8 ? DType::Q8_0 : DType::F16;
  const bool interleaved = !q8;
  const int64_t n_in = w.n_in, n_out = w.n_out, rb = w.row_bytes(), drb = dtype_row_bytes(dense, n_in);
  kern::ActLayout lay = kt.act_layout(dense, n_in, n_tokens);
  if (interleaved) lay = kern::act_rows_layout(dense, n_in, n_tokens);  // as dispatch's effective_layout
  thread_local std::vector<uint8_t> act_buf;
  uint8_t* act = nullptr;
  if (lay.kind != kern::ActKind::None) {
    act = aligned64(act_buf, lay.bytes);
    const int64_t g = lay.token_granule, n_units = (n_tokens + g - 1) / g;
    const int64_t per = (n_units + pool.size() - 1) / pool.size();
    pool.for_chunks((n_units + per - 1) / per, [&](int64_t c, int) {
      kt.quantize(lay, dense, x, ldx, n_in, n_tokens, c * per * g, std::min(n_tokens, (c + 1) * per * g), act);
    });
  }
  // Rows expanded per gemm call: a multiple of 32 (the float tiles' panels), about 256 KiB.
  const int64_t sub = std::clamp<int64_t>((256 << 10) / drb / 32 * 32, 32, 256);
  const int64_t per_thread = 4;
  int64_t per = (n_out + per_thread * pool.size() - 1) / (per_thread * pool.size());
  per = std::max<int64_t>(32, (per + 31) / 32 * 32);
  const int64_t n_chunks = (n_out + per - 1) / per;
  const int64_t gemm_scratch = kt.scratch_bytes(dense, n_in);
  const auto* wd = static_cast<const uint8_t*>(w.data);
  pool.for_chunks(n_chunks, [&](int64_t c, int) {
    thread_local std::vector<uint8_t> exp_buf, gemm_buf;
    uint8_t* expanded = aligned64(exp_buf, std::min(sub, per) * drb);  // [rows][drb] or interleaved
    uint8_t* scratch = gemm_scratch > 0 ? aligned64(gemm_buf, gemm_scratch) : nullptr;
    const int64_t c0 = c * per, c1 = std::min(n_out, c0 + per);
    for (int64_t r0 = c0; r0 < c1; r0 += sub) {
      const int64_t n = std::min(sub, c1 - r0);
      if (has_repeat(wd + r0 * rb, rb * n, q8)) {
        row_kernels(isa, w, r0, r0 + n, x, ldx, n_tokens, y, ldy);
        continue;
      }
      if (q8) {
        for (int64_t r = 0; r < n; ++r) expand_q8_row(wd + (r0 + r) * rb, n_in, expanded + r * drb);
      } else {
        expand_f16_rows(wd + r0 * rb, rb, n, n_in, reinterpret_cast<uint16_t*>(expanded));
      }
      const kern::GemmArgs a{dense, expanded, drb, n_in, n, x, ldx, act, lay, n_tokens, y + r0, ldy,
                             interleaved && n >= 16};
      kt.gemm(a, 0, n, scratch);
    }
  });
}

}  // namespace

bool is_sparse24_type(DType t) { return is_ts24(t); }

void sparse24_matmul(Isa isa, const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
                     int64_t ldy, ThreadPool& pool) {
  TERN_ASSERT(is_ts24(w.type));
  if (w.n_in <= 0 || w.n_in % kTs24Block != 0)
    fail("matmul: ", dtype_name(w.type), " weight [", w.n_out, ", ", w.n_in, "]: rows must be a multiple of ",
         kTs24Block, " columns");
  if (n_tokens <= 0 || w.n_out <= 0) return;
  const kern::Sparse24Rows& kr = rows_of(isa);
  // A batch on a SIMD variant: the dense kernels on rows expanded in L2 (the reference stays the
  // reference: row kernels at every size).
  const DType dense = w.type == DType::TS24_Q8 ? DType::Q8_0 : DType::F16;
  if (isa != Isa::Ref && n_tokens >= kDenseMinTokens && kern::table_of(isa).has_kernel(dense) &&
      (dense == DType::Q8_0 || kern::reads_interleaved(isa, DType::F16))) {
    dense_prefill(isa, w, x, ldx, n_tokens, y, ldy, pool);
    return;
  }
  const int64_t n_in = w.n_in, n_out = w.n_out, rb = w.row_bytes();
  const auto* wd = static_cast<const uint8_t*>(w.data);
  const bool q8 = w.type == DType::TS24_Q8;

  const kern::Ts24Act l = act_layout(n_in);
  uint8_t* act = nullptr;  // [n_tokens][l.stride] (ts24_q8 only)
  if (q8) {
    thread_local std::vector<uint8_t> act_buf;
    act = aligned64(act_buf, l.stride * n_tokens);
    auto quant = [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) quantize_token(x + t * ldx, n_in, l, act + t * l.stride);
    };
    if (n_tokens < 8 || pool.size() == 1) quant(0, n_tokens);
    else pool.parallel_for(n_tokens, [&](int64_t t0, int64_t t1, int) { quant(t0, t1); });
  }

  // Chunks of output rows: a lone token (decode) takes 2 per thread (each chunk is a stream of
  // its own, see rows_per_chunk in dispatch.cpp), a batch 4, so that a late thread costs little.
  const int64_t per_thread = n_tokens == 1 ? 2 : 4;
  const int64_t per = std::max<int64_t>(4, (n_out + per_thread * pool.size() - 1) / (per_thread * pool.size()));
  const int64_t n_chunks = (n_out + per - 1) / per;
  // Tokens per row-kernel call: the kernels prepare a row once per call (controls, scales), so
  // a batch is handed over whole, in pieces that keep out[] small.
  constexpr int64_t kTokCall = 64;
  pool.for_chunks(n_chunks, [&](int64_t c, int) {
    float out[kTokCall];
    uint8_t* scratch = thread_scratch(n_in);
    const int64_t r0 = c * per, r1 = std::min(n_out, r0 + per);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokCall) {
        const int64_t nt = std::min(kTokCall, n_tokens - t0);
        if (q8) kr.q8_dots(wd + r * rb, n_in, act + t0 * l.stride, l.stride, l.off_dxv, nt, out, scratch);
        else kr.f16_dots(wd + r * rb, n_in, x + t0 * ldx, ldx, nt, out, scratch);
        for (int64_t i = 0; i < nt; ++i) y[(t0 + i) * ldy + r] = out[i];
      }
  });
}

}  // namespace tern
