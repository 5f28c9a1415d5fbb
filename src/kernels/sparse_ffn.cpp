// The driver of the sparse FFN kernels (argument checks, activation quantization, the thread
// split of sparse_ffn_reglu, build_down_t) and the scalar reference row kernels. The SIMD row
// kernels are x86/sparse_ffn_avx2.cpp, x86/sparse_ffn_avx512.cpp (VNNI) and, for all three ARM
// variants, arm/sparse_ffn_neon.cpp. See sparse_ffn.h for the arithmetic every variant shares.
#include "kernels/sparse_ffn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "kernels/dispatch_internal.h"
#include "kernels/kernel_iface.h"
#include "quant/quant_traits.h"

namespace tern {
namespace kern {
// (Named inner namespaces: the unity build merges this file's unnamed namespace with its
// neighbours', where rows_of, aligned64, dot_ref exist too.)
namespace sparse_ffn_ref {
namespace {

// The reduction trees every variant reproduces (x86: hsum256 of kernels/x86/simd.h on
// p[0..8) + p[8..16)).
float tree8(const float* p) {
  float s4[4], s2[2];
  for (int l = 0; l < 4; ++l) s4[l] = p[l] + p[l + 4];
  for (int l = 0; l < 2; ++l) s2[l] = s4[l] + s4[l + 2];
  return s2[0] + s2[1];
}

float tree16(const float* p) {
  float s8[8];
  for (int l = 0; l < 8; ++l) s8[l] = p[l] + p[l + 8];
  return tree8(s8);
}

template <bool kF16>
float dot_float_ref(const uint8_t* w, int64_t n, const float* x) {
  auto at = [&](int64_t i) {
    if constexpr (kF16) {
      uint16_t h;
      std::memcpy(&h, w + 2 * i, 2);
      return fp16_to_f32(h);
    } else {
      float v;
      std::memcpy(&v, w + 4 * i, 4);
      return v;
    }
  };
  float p[16] = {};
  const int64_t n16 = n / 16 * 16;
  for (int64_t c = 0; c < n16; c += 16)
    for (int l = 0; l < 16; ++l) p[l] = std::fma(at(c + l), x[c + l], p[l]);
  float s = tree16(p);
  for (int64_t i = n16; i < n; ++i) s = std::fma(at(i), x[i], s);
  return s;
}

float dot_q8_0_ref(const uint8_t* w, int64_t n_in, const int8_t* xq, const float* xd) {
  float p[8] = {};
  for (int64_t b = 0; b < n_in / 32; ++b) {
    const auto& blk = reinterpret_cast<const BlockQ8_0*>(w)[b];
    int32_t isum = 0;
    for (int j = 0; j < 32; ++j) isum += int32_t(blk.qs[j]) * xq[32 * b + j];
    p[b % 8] = std::fma(float(isum), fp16_to_f32(blk.d) * xd[b], p[b % 8]);
  }
  return tree8(p);
}

float dot_q4_0_ref(const uint8_t* w, int64_t n_in, const int8_t* xq, const float* xd, const int32_t* nsum) {
  float p[8] = {};
  for (int64_t b = 0; b < n_in / 32; ++b) {
    const auto& blk = reinterpret_cast<const BlockQ4_0*>(w)[b];
    // sum (q - 8) x = sum q x + 8 nsum (nsum = -sum x): the dense kernels' folding.
    int32_t isum = 8 * nsum[b];
    for (int j = 0; j < 16; ++j)
      isum += (blk.qs[j] & 0x0F) * xq[32 * b + j] + (blk.qs[j] >> 4) * xq[32 * b + 16 + j];
    p[b % 8] = std::fma(float(isum), fp16_to_f32(blk.d) * xd[b], p[b % 8]);
  }
  return tree8(p);
}

void dot_ref(const SparseDotArgs& a) {
  for (int64_t k = 0; k < a.n_idx; ++k) {
    const uint8_t* w = a.rows + int64_t(a.idx[k]) * a.row_bytes;
    switch (a.type) {
      case DType::F32: a.out[k] = dot_float_ref<false>(w, a.n_in, a.x); break;
      case DType::F16: a.out[k] = dot_float_ref<true>(w, a.n_in, a.x); break;
      case DType::Q8_0: a.out[k] = dot_q8_0_ref(w, a.n_in, a.xq, a.xd); break;
      default: a.out[k] = dot_q4_0_ref(w, a.n_in, a.xq, a.xd, a.nsum); break;
    }
  }
}

void axpy_ref(const SparseAxpyArgs& a) {
  for (int64_t k = 0; k < a.n_idx; ++k) {
    const uint8_t* w = a.rows + int64_t(a.idx[k]) * a.row_bytes;
    const float c = a.coef[k];
    switch (a.type) {
      case DType::F32:
        for (int64_t i = a.c0; i < a.c1; ++i) {
          float v;
          std::memcpy(&v, w + 4 * i, 4);
          a.y[i] = std::fma(c, v, a.y[i]);
        }
        break;
      case DType::F16:
        for (int64_t i = a.c0; i < a.c1; ++i) {
          uint16_t h;
          std::memcpy(&h, w + 2 * i, 2);
          a.y[i] = std::fma(c, fp16_to_f32(h), a.y[i]);
        }
        break;
      case DType::Q8_0:
        for (int64_t b = a.c0 / 32; b < a.c1 / 32; ++b) {
          const auto& blk = reinterpret_cast<const BlockQ8_0*>(w)[b];
          const float s = c * fp16_to_f32(blk.d);
          for (int j = 0; j < 32; ++j) a.y[32 * b + j] = std::fma(s, float(blk.qs[j]), a.y[32 * b + j]);
        }
        break;
      default:
        for (int64_t b = a.c0 / 32; b < a.c1 / 32; ++b) {
          const auto& blk = reinterpret_cast<const BlockQ4_0*>(w)[b];
          const float s = c * fp16_to_f32(blk.d);
          float* yb = a.y + 32 * b;
          for (int j = 0; j < 16; ++j) yb[j] = std::fma(s, float((blk.qs[j] & 0x0F) - 8), yb[j]);
          for (int j = 0; j < 16; ++j) yb[16 + j] = std::fma(s, float((blk.qs[j] >> 4) - 8), yb[16 + j]);
        }
        break;
    }
  }
}

}  // namespace
}  // namespace sparse_ffn_ref

const SparseFfnRows& sparse_ffn_rows_ref() {
  static const SparseFfnRows t{sparse_ffn_ref::dot_ref, sparse_ffn_ref::axpy_ref};
  return t;
}

// The x86 variants' entry points where they are not built (CMake compiles *_avx2 / *_avx512
// files on x86-64 only); isa_supported() says no to those variants there, so never reached.
#if !(defined(__x86_64__) || defined(__i386__))
const SparseFfnRows& sparse_ffn_rows_avx2() {
  fail("the AVX2 sparse FFN kernels are not built into this binary (a non-x86 build)");
}
const SparseFfnRows& sparse_ffn_rows_avx512() {
  fail("the AVX-512 sparse FFN kernels are not built into this binary (a non-x86 build)");
}
#endif
// The NEON variant's where it is not built (CMake compiles *_neon files on ARM64 only).
#if !defined(__aarch64__)
const SparseFfnRows& sparse_ffn_rows_neon() {
  fail("the NEON sparse FFN kernels are not built into this binary (not an ARM64 build)");
}
#endif

}  // namespace kern

namespace sparse_ffn_driver {
namespace {

const kern::SparseFfnRows& rows_of(Isa isa) {
  if (!isa_supported(isa)) fail("kernel variant ", isa_name(isa), " is not supported by this CPU");
  switch (isa) {
    case Isa::Avx512: return kern::sparse_ffn_rows_avx512();
    case Isa::Avx2: return kern::sparse_ffn_rows_avx2();
    case Isa::Neon: case Isa::Dotprod: case Isa::I8mm: return kern::sparse_ffn_rows_neon();
    default: return kern::sparse_ffn_rows_ref();
  }
}

bool quantized(DType t) { return t == DType::Q8_0 || t == DType::Q4_0; }

uint8_t* aligned64(std::vector<uint8_t>& buf, int64_t bytes) {
  if (int64_t(buf.size()) < bytes + 64) buf.resize(size_t(bytes + 64));
  return buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
}

void check_rows(const char* what, DType type, int64_t row_bytes, int64_t n_rows, int64_t n) {
  if (!is_sparse_ffn_type(type))
    fail(what, ": ", dtype_name(type), " rows are not supported (F32, F16, Q8_0, Q4_0)");
  const int64_t need = dtype_row_bytes(type, n);
  if (n < 0 || need < 0) fail(what, ": a ", dtype_name(type), " row of ", n, " elements is not whole blocks");
  if (row_bytes < need) fail(what, ": row_bytes ", row_bytes, " < the ", need, " bytes of a row");
  if (n_rows < 0) fail(what, ": negative row count");
}

// Every index in [0, n_rows): one pass before the kernels, which then trust them.
void check_idx(const char* what, const int32_t* idx, int64_t n_idx, int64_t n_rows) {
  if (n_idx < 0) fail(what, ": negative index count");
  int32_t lo = 0, hi = 0;
  for (int64_t k = 0; k < n_idx; ++k) {
    lo = std::min(lo, idx[k]);
    hi = std::max(hi, idx[k]);
  }
  if (n_idx > 0 && (lo < 0 || hi >= n_rows))
    fail(what, ": row index ", lo < 0 ? lo : hi, " out of range [0, ", n_rows, ")");
}

// x as Q8_0 activations (the Q8_0Rows layout of kernel_iface.h, one token), by the variant's
// own quantizer (bit-identical to quantize_row_ref on every variant), into a per-thread buffer.
struct QuantX {
  const int8_t* xq;
  const float* xd;
  const int32_t* nsum;
};
QuantX quantize_x(Isa isa, const float* x, int64_t n_in) {
  const kern::ActLayout lay = kern::act_rows_layout(DType::Q8_0, n_in, 1);
  thread_local std::vector<uint8_t> buf;
  uint8_t* act = aligned64(buf, lay.bytes);
  const kern::KernelTable& kt = kern::table_of(isa);
  kt.quantize(lay, DType::Q8_0, x, n_in, n_in, 1, 0, 1, act);
  return QuantX{reinterpret_cast<const int8_t*>(act), reinterpret_cast<const float*>(act + lay.off_d),
                reinterpret_cast<const int32_t*>(act + lay.off_sum)};
}

kern::SparseDotArgs dot_args(DType type, const void* rows, int64_t row_bytes, int64_t n_in, const float* x,
                             const QuantX& q) {
  return kern::SparseDotArgs{type, static_cast<const uint8_t*>(rows), row_bytes, n_in, nullptr, 0, x,
                             q.xq, q.xd, q.nsum, nullptr};
}

}  // namespace
}  // namespace sparse_ffn_driver

namespace sfd = sparse_ffn_driver;

bool is_sparse_ffn_type(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::Q8_0 || t == DType::Q4_0;
}

void sparse_rows_dot_isa(Isa isa, DType type, const void* rows, int64_t row_bytes, int64_t n_rows, int64_t n_in,
                         const int32_t* idx, int64_t n_idx, const float* x, float* out) {
  sfd::check_rows("sparse_rows_dot", type, row_bytes, n_rows, n_in);
  sfd::check_idx("sparse_rows_dot", idx, n_idx, n_rows);
  const kern::SparseFfnRows& kr = sfd::rows_of(isa);
  if (n_idx == 0) return;
  const sfd::QuantX q = sfd::quantized(type) ? sfd::quantize_x(isa, x, n_in) : sfd::QuantX{};
  kern::SparseDotArgs a = sfd::dot_args(type, rows, row_bytes, n_in, x, q);
  a.idx = idx;
  a.n_idx = n_idx;
  a.out = out;
  kr.dot(a);
}

void sparse_rows_axpy_isa(Isa isa, DType type, const void* rows, int64_t row_bytes, int64_t n_rows, int64_t n_out,
                          const int32_t* idx, const float* coef, int64_t n_idx, float* y) {
  sfd::check_rows("sparse_rows_axpy", type, row_bytes, n_rows, n_out);
  sfd::check_idx("sparse_rows_axpy", idx, n_idx, n_rows);
  const kern::SparseFfnRows& kr = sfd::rows_of(isa);
  if (n_idx == 0 || n_out == 0) return;
  kr.axpy(kern::SparseAxpyArgs{type, static_cast<const uint8_t*>(rows), row_bytes, 0, n_out, idx, coef, n_idx, y});
}

void sparse_rows_dot(DType type, const void* rows, int64_t row_bytes, int64_t n_rows, int64_t n_in,
                     const int32_t* idx, int64_t n_idx, const float* x, float* out) {
  sparse_rows_dot_isa(selected_isa(), type, rows, row_bytes, n_rows, n_in, idx, n_idx, x, out);
}

void sparse_rows_axpy(DType type, const void* rows, int64_t row_bytes, int64_t n_rows, int64_t n_out,
                      const int32_t* idx, const float* coef, int64_t n_idx, float* y) {
  sparse_rows_axpy_isa(selected_isa(), type, rows, row_bytes, n_rows, n_out, idx, coef, n_idx, y);
}

void sparse_ffn_reglu_isa(Isa isa, const SparseFfnWeights& w, const float* xn, const int32_t* idx, int64_t n_idx,
                          float* y, ThreadPool& pool, bool accumulate) {
  const int64_t rb = w.gate_up_stride > 0 ? w.gate_up_stride : dtype_row_bytes(w.type, w.n_embd);
  const int64_t drb = w.down_t_stride > 0 ? w.down_t_stride : dtype_row_bytes(w.down_t_type, w.n_embd);
  const int64_t n_rows = w.n_rows > 0 ? w.n_rows : w.n_ff;
  sfd::check_rows("sparse_ffn_reglu: gate/up", w.type, rb, n_rows, w.n_embd);
  sfd::check_rows("sparse_ffn_reglu: down_t", w.down_t_type, drb, n_rows, w.n_embd);
  if (n_rows > 0 && (!w.gate || !w.up || !w.down_t)) fail("sparse_ffn_reglu: missing weights");
  sfd::check_idx("sparse_ffn_reglu", idx, n_idx, n_rows);
  const kern::SparseFfnRows& kr = sfd::rows_of(isa);
  const int64_t n = w.n_embd;
  if (!accumulate) std::fill(y, y + n, 0.0f);
  if (n_idx == 0 || n == 0) return;

  const sfd::QuantX q = sfd::quantized(w.type) ? sfd::quantize_x(isa, xn, n) : sfd::QuantX{};
  // coef[k] = a_{idx[k]} (0 where the gate is <= 0), filled by chunks of idx: each value comes
  // from its own rows alone, so the chunking does not change any bit.
  thread_local std::vector<float> coef_buf;
  thread_local std::vector<int32_t> act_idx_buf;
  thread_local std::vector<float> act_coef_buf;
  coef_buf.resize(size_t(n_idx));
  float* coef = coef_buf.data();
  constexpr int64_t kMaxChunk = 256;  // idx per chunk: the up pass's compacted lists live on the stack
  const int64_t per =
      std::clamp<int64_t>((n_idx + 4 * pool.size() - 1) / (4 * pool.size()), 16, kMaxChunk);
  const int64_t n_chunks = (n_idx + per - 1) / per;
  pool.for_chunks(n_chunks, [&](int64_t c, int) {
    const int64_t k0 = c * per, k1 = std::min(n_idx, k0 + per);
    float g[kMaxChunk], u[kMaxChunk];
    int32_t live[kMaxChunk], pos[kMaxChunk];
    kern::SparseDotArgs a = sfd::dot_args(w.type, w.gate, rb, n, xn, q);
    a.idx = idx + k0;
    a.n_idx = k1 - k0;
    a.out = g;
    kr.dot(a);
    // Up rows only for neurons that pass the ReLU: a predictor's false positives cost a gate row.
    int64_t n_live = 0;
    for (int64_t k = 0; k < k1 - k0; ++k)
      if (g[k] > 0.0f) {
        live[n_live] = idx[k0 + k];
        pos[n_live++] = int32_t(k);
      }
    for (int64_t k = k0; k < k1; ++k) coef[k] = 0.0f;
    if (n_live == 0) return;
    a.rows = static_cast<const uint8_t*>(w.up);
    a.idx = live;
    a.n_idx = n_live;
    a.out = u;
    kr.dot(a);
    for (int64_t i = 0; i < n_live; ++i) coef[k0 + pos[i]] = g[pos[i]] * u[i];
  });

  // The live neurons in idx order: the down rows to add.
  act_idx_buf.clear();
  act_coef_buf.clear();
  for (int64_t k = 0; k < n_idx; ++k)
    if (coef[k] != 0.0f) {
      act_idx_buf.push_back(idx[k]);
      act_coef_buf.push_back(coef[k]);
    }
  const int64_t n_act = int64_t(act_idx_buf.size());
  if (n_act == 0) return;
  // Columns of y in blocks of 32 (whole quantized blocks), one range per thread (longer slices
  // of each gathered row: with two a thread, the decoder's sparse FFN at 2 threads ran about
  // 10% slower on TinyLlama's shape); each range adds every live row's slice in idx order, so
  // y's bits do not depend on the split.
  const int64_t n_blocks = (n + 31) / 32;
  const int64_t bper = pool.size() == 1 ? n_blocks : std::max<int64_t>(1, (n_blocks + pool.size() - 1) / pool.size());
  const int64_t n_ranges = (n_blocks + bper - 1) / bper;
  const int32_t* act_idx = act_idx_buf.data();
  const float* act_coef = act_coef_buf.data();
  pool.for_chunks(n_ranges, [&](int64_t c, int) {
    const int64_t c0 = c * bper * 32, c1 = std::min(n, (c + 1) * bper * 32);
    kr.axpy(kern::SparseAxpyArgs{w.down_t_type, static_cast<const uint8_t*>(w.down_t), drb, c0, c1, act_idx,
                                 act_coef, n_act, y});
  });
}

void sparse_ffn_reglu(const SparseFfnWeights& w, const float* xn, const int32_t* idx, int64_t n_idx, float* y,
                      ThreadPool& pool, bool accumulate) {
  sparse_ffn_reglu_isa(selected_isa(), w, xn, idx, n_idx, y, pool, accumulate);
}

std::vector<uint8_t> build_down_t(const WeightView& down, DType out_type) {
  if (!is_sparse_ffn_type(down.type)) fail("build_down_t: down must be F32, F16, Q8_0 or Q4_0");
  if (!is_sparse_ffn_type(out_type)) fail("build_down_t: ", dtype_name(out_type), " is not a sparse FFN type");
  const int64_t n_embd = down.n_out, n_ff = down.n_in;
  const int64_t orb = dtype_row_bytes(out_type, n_embd);
  if (orb < 0) fail("build_down_t: ", n_embd, " columns are not whole ", dtype_name(out_type), " blocks");
  // Transposed whole in f32 (t [n_ff][n_embd]: 46 MB at TinyLlama's shape, once at load), then
  // each row of down_t goes through the codec once.
  std::vector<float> t(static_cast<size_t>(n_ff * n_embd));
  std::vector<float> row(static_cast<size_t>(n_ff));
  for (int64_t i = 0; i < n_embd; ++i) {
    dequantize_row(down, i, row.data());
    for (int64_t j = 0; j < n_ff; ++j) t[size_t(j * n_embd + i)] = row[size_t(j)];
  }
  std::vector<uint8_t> out(static_cast<size_t>(n_ff * orb));
  for (int64_t j = 0; j < n_ff; ++j) {
    const float* src = t.data() + j * n_embd;
    uint8_t* dst = out.data() + j * orb;
    if (out_type == DType::F32) {
      std::memcpy(dst, src, size_t(n_embd) * 4);
    } else if (out_type == DType::F16) {
      for (int64_t i = 0; i < n_embd; ++i) {
        const uint16_t h = f32_to_fp16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
    } else {
      quant_traits(out_type)->from_float(src, dst, n_embd);
    }
  }
  return out;
}

}  // 
