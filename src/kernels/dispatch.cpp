// Variant selection and the parts of a matmul shared by every ISA: activation quantization into
// the caller's scratch, and the split of output rows across the pool. The kernels themselves
// are the tables in ref/ and x86/ (see kernel_iface.h).
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/kernel_iface.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/tern_int.h"
#include "quant/quant_traits.h"

namespace tern {
namespace {

using kern::ActKind;
using kern::ActLayout;
using kern::GemmArgs;
using kern::KernelTable;

bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

const KernelTable& table_of(Isa isa) {
  switch (isa) {
    case Isa::Avx2: return kern::table_avx2();
    case Isa::Avx512: return kern::table_avx512();
    default: return kern::table_ref();
  }
}

Isa resolve_isa() {
  const Isa best = isa_supported(Isa::Avx512) ? Isa::Avx512
                   : isa_supported(Isa::Avx2) ? Isa::Avx2
                                              : Isa::Ref;
  const char* env = std::getenv("TERN_FORCE_ISA");
  if (!env || !*env) return best;
  const std::string v = env;
  Isa forced;
  if (v == "ref") forced = Isa::Ref;
  else if (v == "avx2") forced = Isa::Avx2;
  else if (v == "avx512") forced = Isa::Avx512;
  else fail("TERN_FORCE_ISA=", v, ": unknown kernel variant (expected ref, avx2 or avx512)");
  if (!isa_supported(forced))
    fail("TERN_FORCE_ISA=", v, ": this CPU cannot run the ", v, " kernels (",
         forced == Isa::Avx2 ? "needs AVX2, FMA and F16C"
                             : "needs AVX-512 F, BW, VL, DQ and VNNI",
         "; best available: ", isa_name(best), ")");
  return forced;
}

// Scratch owned by the calling thread (the pool's owner), grown to the largest matmul seen and
// reused: the quantized activations and one work area per pool thread.
struct Scratch {
  struct Buf {
    std::unique_ptr<uint8_t[]> mem;
    int64_t cap = 0;
    uint8_t* data = nullptr;  // 64-byte aligned view into mem
    uint8_t* get(int64_t bytes) {
      if (bytes > cap) {
        mem.reset(new uint8_t[size_t(bytes + 64)]);
        cap = bytes;
        data = mem.get() + (64 - reinterpret_cast<uintptr_t>(mem.get()) % 64) % 64;
      }
      return data;
    }
  };
  Buf act;
  Buf rows_scratch;  // matmul_rows' gemm scratch
  std::vector<Buf> per_thread;
  std::vector<uint8_t*> per_thread_ptr;
};

Scratch& caller_scratch() {
  thread_local Scratch s;
  return s;
}

// The activation layout a weight's kernel reads: interleaved weights take Rows at any size
// (BF16's pairs for the BF16 dot either way).
ActLayout effective_layout(const KernelTable& kt, const WeightView& w, int64_t n_tokens) {
  const ActLayout l = kt.act_layout(w.type, w.n_in, n_tokens);
  if (l.kind == ActKind::BF16Pairs) return l;
  return w.interleaved16 ? kern::act_rows_layout(w.type, w.n_in, n_tokens) : l;
}

// BF16 rows with an even n_in are interleaved by pairs of elements (matmul.h).
bool bf16_pairs(const WeightView& w) { return w.type == DType::BF16 && w.n_in % 2 == 0; }

// Which variants read weights interleaved (matmul.h): both SIMD tables for Q4_0, Q8_0, Q4_1,
// Q5_0, Q5_1, Q4_K, Q5_K and the float types; the AVX2 one for Q6_K too, the AVX-512 one for Q2_K
// and Q3_K (decode 57% -> 79% and 65% -> 90% of the plain sums' read rate; 128-token prompts
// 263 -> 505 GFLOP/s and, against Q3_K's token-lane tiles on the stored rows, 533 -> 457:
// decode's gain is the larger). (AVX-512 row-lane tiles for Q6_K, tried: decode
// equal, 8-token batches 1.6x faster, but 128-token prompts 20% slower than the token-lane tiles
// on the stored rows, TinyLlama pp128 -7%.)
bool reads_interleaved(Isa isa, DType type) {
  if (type == DType::Q6_K) return isa == Isa::Avx2;
  if (type == DType::Q2_K || type == DType::Q3_K) return isa == Isa::Avx512;
  return (type == DType::Q4_0 || type == DType::Q8_0 || type == DType::Q4_1 || type == DType::Q5_0 ||
          type == DType::Q5_1 || type == DType::Q4_K || type == DType::Q5_K || dtype_is_float(type)) &&
         (isa == Isa::Avx2 || isa == Isa::Avx512);
}

// Elements per block of an interleavable type (float types: one element, any row length).
int64_t interleave_block(DType type) {
  if (dtype_is_float(type)) return 1;
  return type == DType::Q2_K || type == DType::Q3_K || type == DType::Q4_K || type == DType::Q5_K || type == DType::Q6_K
             ? kQK_K
             : 32;
}

void require_interleave_kernels(Isa isa, const WeightView& w) {
  if (w.interleaved16 && !reads_interleaved(isa, w.type))
    fail("matmul: ", dtype_name(w.type), " weights interleaved by 16 rows cannot run on the ", isa_name(isa),
         " variant (set TERN_REPACK=0 to keep rows as stored)");
}

// Output rows per chunk: a multiple of the 4-row tiles, about 4 chunks per thread so that a
// thread that starts late (descheduled) costs little, but at least 16 rows to keep the claim
// overhead small next to the work. A lone token (decode) takes 2 per thread: each chunk is a
// stream of its own, and streams that start and stop cost bandwidth. bench_matmul --sweep 22
// (TinyLlama's decode weights, share of plain sums over the same bytes, 3 alternating runs of
// 4 builds in fast minutes): 8 chunks per thread Q4_0 0.80-0.87, 4: 0.875-0.88, 2: 0.91-0.92,
// 1: 0.93; Q8_0 4: 0.93-0.94, 2: 0.96-0.98, 1: 0.96. Two keep some of the slack for a thread
// that is late.
// Float weights take multiples of 32 rows: their tiles are 16-row groups (decode) and 32-row
// panels (prefill, AVX-512), which a chunk boundary inside would compute twice.
int64_t rows_per_chunk(int64_t n_out, int n_threads, int64_t n_tokens, DType type) {
  if (n_threads <= 1) return n_out;
  const int64_t chunks_per_thread = n_tokens == 1 ? 2 : 4;
  const int64_t granule = dtype_is_float(type) ? 32 : 4;
  int64_t per = (n_out + chunks_per_thread * n_threads - 1) / (chunks_per_thread * n_threads);
  per = (per + granule - 1) / granule * granule;
  return per < 16 ? 16 : per;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    default: return "ref";
  }
}

bool isa_supported(Isa isa) {
  static const bool avx2 = cpu_has_avx2();
  static const bool avx512 = cpu_has_avx512();
  switch (isa) {
    case Isa::Avx2: return avx2;
    case Isa::Avx512: return avx512;
    default: return true;
  }
}

Isa selected_isa() {
  static const Isa isa = resolve_isa();  // a throw leaves it unset: the next call re-reads
  return isa;
}

const char* active_isa() { return isa_name(selected_isa()); }

bool isa_bf16_dot(Isa isa, DType type, int64_t n_in) {
  return isa == Isa::Avx512 && type == DType::BF16 && n_in % 2 == 0 && isa_supported(Isa::Avx512) &&
         kern::bf16_dot_enabled();
}

namespace kern {
bool bf16_dot_enabled() {
  static const bool on = [] {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    const char* e = std::getenv("TERN_BF16_DOT");
    return __builtin_cpu_supports("avx512bf16") && !(e && std::string(e) == "0");
#else
    return false;
#endif
  }();
  return on;
}
}  // namespace kern

bool isa_has_kernel(Isa isa, DType type) { return table_of(isa).has_kernel(type); }

void matmul(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
            int64_t ldy, ThreadPool& pool) {
  matmul_isa(selected_isa(), w, x, ldx, n_tokens, y, ldy, pool);
}

void matmul_rows(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
                 int64_t ldy, int64_t r0, int64_t r1) {
  TERN_ASSERT(0 <= r0 && r0 <= r1 && r1 <= w.n_out);
  if (r0 == r1 || n_tokens <= 0) return;
  const Isa isa = selected_isa();
  require_interleave_kernels(isa, w);
  const KernelTable& kt = table_of(isa);
  if (!w.interleaved16 && (is_tern_int_type(w.type) || !kt.has_kernel(w.type) || w.row_bytes() < 0)) {
    // Rows are independent and stored one after another, so rows [r0, r1) are a matrix of
    // their own; a one-thread pool runs everything on this thread (matmul_isa also reports
    // a row length that does not fit the type).
    thread_local ThreadPool serial(1);
    const WeightView sub{w.type, w.n_in, r1 - r0, static_cast<const uint8_t*>(w.data) + r0 * w.row_bytes()};
    matmul_isa(isa, sub, x, ldx, n_tokens, y + r0, ldy, serial);
    return;
  }
  // The table's kernel straight on rows [r0, r1) of the whole weight (interleaved rows are not
  // one after another, so this is the only way for them): the tiles start at r0 as they would
  // at row 0 of a sub-matrix, so the same bits. Small models' phased forward pass makes
  // hundreds of these calls per token, so none of matmul_isa's pool machinery.
  const ActLayout lay = effective_layout(kt, w, n_tokens);
  Scratch& s = caller_scratch();
  uint8_t* act = nullptr;
  if (lay.kind != ActKind::None) {
    act = s.act.get(lay.bytes);
    kt.quantize(lay, w.type, x, ldx, w.n_in, n_tokens, 0, n_tokens, act);
  }
  const GemmArgs a{w.type, static_cast<const uint8_t*>(w.data), w.row_bytes(), w.n_in, w.n_out, x, ldx, act, lay,
                   n_tokens, y, ldy, w.interleaved16};
  const int64_t scratch_bytes = kt.scratch_bytes(w.type, w.n_in);
  kt.gemm(a, r0, r1, scratch_bytes > 0 ? s.rows_scratch.get(scratch_bytes) : nullptr);
}

bool want_interleave16(const WeightView& w) {
  static const bool enabled = [] {
    const char* e = std::getenv("TERN_REPACK");
    return !(e && std::string(e) == "0");
  }();
  return enabled && interleave16_for(selected_isa(), w);
}

bool interleave16_for(Isa isa, const WeightView& w) {
  // Float weights: any row count from one group on (the rows past the last whole group stay
  // as stored, after the groups).
  const bool rows_ok = dtype_is_float(w.type) ? w.n_out >= 16 : w.n_out > 0 && w.n_out % 16 == 0;
  return reads_interleaved(isa, w.type) && !w.interleaved16 && rows_ok && w.n_in % interleave_block(w.type) == 0;
}

namespace {
// The interleaved layout (matmul.h), in one place: fn(at, row_off, n) for each piece of row
// i's (0..15) block, which sits at byte row_off of the stored block and at byte `at` of the
// group's block: its f16 scale, then its quant bytes 4 at a time (4 pieces for Q4_0, 8 Q8_0).
// Q6_K (matmul.h): d at 2i; scale pair p at 32 + 32p + 2i; then per step 8n + k (n = 0, 1; k =
// 0..7) 192 bytes: ql bytes 64n + 4k.., ql bytes 64n + 32 + 4k.., qh bytes 32n + 4k.., 4 per row.
template <class Fn>
void for_each_piece(DType type, int64_t i, Fn&& fn) {
  if (type == DType::Q6_K) {
    fn(2 * i, int64_t(offsetof(BlockQ6_K, d)), 2);
    for (int64_t pr = 0; pr < 8; ++pr) fn(32 + 32 * pr + 2 * i, int64_t(offsetof(BlockQ6_K, scales)) + 2 * pr, 2);
    for (int64_t q = 0; q < 32; ++q) {  // ql bytes 64n + 32s + 4k..+3 -> step 8n + k, slot s
      const int64_t n = q / 16, s = q % 16 / 8, k = q % 8;
      fn(288 + 192 * (8 * n + k) + 64 * s + 4 * i, int64_t(offsetof(BlockQ6_K, ql)) + 4 * q, 4);
    }
    for (int64_t q = 0; q < 16; ++q) fn(288 + 192 * q + 128 + 4 * i, int64_t(offsetof(BlockQ6_K, qh)) + 4 * q, 4);
    return;
  }
  if (type == DType::Q2_K) {
    // d at 2i, dmin at 32 + 2i; the 16 scale bytes as four dwords at 64 + 64w + 4i; qs pieces p
    // (bytes 4p..4p+3 of qs) at 320 + 64p
    fn(2 * i, int64_t(offsetof(BlockQ2_K, d)), 2);
    fn(32 + 2 * i, int64_t(offsetof(BlockQ2_K, dmin)), 2);
    for (int64_t w = 0; w < 4; ++w) fn(64 + 64 * w + 4 * i, int64_t(offsetof(BlockQ2_K, scales)) + 4 * w, 4);
    for (int64_t p = 0; p < 16; ++p) fn(320 + 64 * p + 4 * i, int64_t(offsetof(BlockQ2_K, qs)) + 4 * p, 4);
    return;
  }
  if (type == DType::Q3_K) {
    // d at 2i; the 12 scale bytes as three dwords at 32 / 96 / 160 + 4i; qs pieces p (bytes
    // 4p..4p+3 of qs) at 224 + 128p for p < 8, each followed by hmask piece p, then at 736 + 64p
    fn(2 * i, int64_t(offsetof(BlockQ3_K, d)), 2);
    for (int64_t w = 0; w < 3; ++w) fn(32 + 64 * w + 4 * i, int64_t(offsetof(BlockQ3_K, scales)) + 4 * w, 4);
    for (int64_t p = 0; p < 16; ++p)
      fn((p < 8 ? 224 + 128 * p : 736 + 64 * p) + 4 * i, int64_t(offsetof(BlockQ3_K, qs)) + 4 * p, 4);
    for (int64_t k = 0; k < 8; ++k) fn(288 + 128 * k + 4 * i, int64_t(offsetof(BlockQ3_K, hmask)) + 4 * k, 4);
    return;
  }
  if (type == DType::Q4_1 || type == DType::Q5_0 || type == DType::Q5_1) {
    // d at 2i; m (Q4_1, Q5_1) at 32 + 2i; qh (Q5_0, Q5_1) as 4 bytes at `h` + 4i (moved as
    // stored: interleave16 then permutes its bits, q5_tile_bits); then the 4 nibble pieces
    // (matmul.h).
    const bool has_m = type != DType::Q5_0, has_h = type != DType::Q4_1;
    const int64_t h = has_m ? 64 : 32, q = h + (has_h ? 64 : 0);
    const int64_t qs_off = type == DType::Q4_1 ? int64_t(offsetof(BlockQ4_1, qs))
                           : type == DType::Q5_0 ? int64_t(offsetof(BlockQ5_0, qs)) : int64_t(offsetof(BlockQ5_1, qs));
    fn(2 * i, 0, 2);
    if (has_m) fn(32 + 2 * i, 2, 2);
    if (has_h) fn(h + 4 * i, type == DType::Q5_0 ? int64_t(offsetof(BlockQ5_0, qh)) : int64_t(offsetof(BlockQ5_1, qh)), 4);
    for (int64_t k = 0; k < 4; ++k) fn(q + 64 * k + 4 * i, qs_off + 4 * k, 4);
    return;
  }
  TERN_ASSERT(type == DType::Q4_0 || type == DType::Q8_0);
  fn(2 * i, 0, 2);
  for (int64_t k = 0; k < (type == DType::Q4_0 ? 4 : 8); ++k) fn(32 + 64 * k + 4 * i, 2 + 4 * k, 4);
}

// Q5_0 / Q5_1's qh in the interleaved layout (matmul.h): bit g of byte j = bit 4g + j of qh as
// stored (the fifth bit of element 4g + j), so that one shift moves nibble group g's four bits
// to bit 4 of their four bytes. Where the row's qh sits in the group block (-1: no qh).
uint32_t q5_tile_bits(uint32_t qh) {
  uint32_t out = 0;
  for (int g = 0; g < 8; ++g)
    for (int j = 0; j < 4; ++j) out |= (qh >> (4 * g + j) & 1u) << (8 * j + g);
  return out;
}
uint32_t q5_stored_bits(uint32_t t) {
  uint32_t qh = 0;
  for (int g = 0; g < 8; ++g)
    for (int j = 0; j < 4; ++j) qh |= (t >> (8 * j + g) & 1u) << (4 * g + j);
  return qh;
}
int64_t q5_qh_in_group(DType type) { return type == DType::Q5_0 ? 32 : type == DType::Q5_1 ? 64 : -1; }
int64_t q5_qh_in_block(DType type) {
  return type == DType::Q5_0 ? int64_t(offsetof(BlockQ5_0, qh)) : int64_t(offsetof(BlockQ5_1, qh));
}

// Q4_K's group block (matmul.h): d, dmin, the scale bytes, the mins' high bits, then qs pieces;
// Q5_K's the same, then its qh pieces.
constexpr int64_t kQ4KScaleBytes = 64, kQ4KMinHigh = 192, kQ4KQuants = 256;
// Q5_K (matmul.h): Q4_K's header; qs pieces 0..7 each followed by qh piece k; then the other qs
// pieces: the tiles read a super-block in address order.
inline int64_t q5_k_qs_piece(int64_t c, int64_t k) { return c == 0 ? 256 + 128 * k : 768 + 512 * c + 64 * k; }
inline int64_t q5_k_qh_piece(int64_t k) { return 320 + 128 * k; }

// Row i's (0..15) super-block `blk` into the group's block p.
void interleave_q4_k(const BlockQ4_K& blk, int64_t i, uint8_t* p, bool q5_layout = false) {
  std::memcpy(p + 2 * i, &blk.d, 2);
  std::memcpy(p + 32 + 2 * i, &blk.dmin, 2);
  uint32_t m_high = 0;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    q4_k_scale_min(j, blk.scales, &sc, &m);
    p[kQ4KScaleBytes + 16 * j + i] = uint8_t(sc | (m & 3) << 6);
    m_high |= uint32_t(m >> 2) << (4 * j);
  }
  std::memcpy(p + kQ4KMinHigh + 4 * i, &m_high, 4);
  for (int64_t c = 0; c < 4; ++c)
    for (int64_t k = 0; k < 8; ++k) {
      const int64_t at = q5_layout ? q5_k_qs_piece(c, k) : kQ4KQuants + 64 * (8 * c + k);
      std::memcpy(p + at + 4 * i, blk.qs + 32 * c + 4 * k, 4);
    }
}

// The inverse: row i's super-block as stored (its twelve scale bytes packed as the quantizer
// packs them, which is the only packing: every bit holds one of the 16 six-bit values).
void deinterleave_q4_k(const uint8_t* p, int64_t i, BlockQ4_K& blk, bool q5_layout = false) {
  std::memcpy(&blk.d, p + 2 * i, 2);
  std::memcpy(&blk.dmin, p + 32 + 2 * i, 2);
  uint32_t m_high;
  std::memcpy(&m_high, p + kQ4KMinHigh + 4 * i, 4);
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    const uint8_t b = p[kQ4KScaleBytes + 16 * j + i];
    sc[j] = b & 63;
    m[j] = uint8_t(b >> 6 | ((m_high >> (4 * j)) & 15) << 2);
  }
  q4_k_pack_scales(sc, m, blk.scales);
  for (int64_t c = 0; c < 4; ++c)
    for (int64_t k = 0; k < 8; ++k) {
      const int64_t at = q5_layout ? q5_k_qs_piece(c, k) : kQ4KQuants + 64 * (8 * c + k);
      std::memcpy(blk.qs + 32 * c + 4 * k, p + at + 4 * i, 4);
    }
}
}  // namespace

void interleave16(const WeightView& w, uint8_t* dst) {
  const int64_t block = interleave_block(w.type);
  const int64_t blk = dtype_row_bytes(w.type, block), group_blk = 16 * blk;
  const int64_t nb = w.n_in / block, rb = w.row_bytes();
  const auto* src = static_cast<const uint8_t*>(w.data);
  if (dtype_is_float(w.type)) {  // per group of 16 rows, per k (BF16: pair of k): the 16 rows' elements; the tail rows as stored
    const int64_t grouped = w.n_out / 16 * 16;
    const int64_t e = bf16_pairs(w) ? 2 : 1, piece = e * blk;  // elements, bytes of a row's piece
    for (int64_t g = 0; g < grouped; g += 16)
      for (int64_t k = 0; k < w.n_in; k += e)
        for (int64_t i = 0; i < 16; ++i)
          std::memcpy(dst + g * rb + (16 * k + e * i) * blk, src + (g + i) * rb + k * blk, size_t(piece));
    std::memcpy(dst + grouped * rb, src + grouped * rb, size_t((w.n_out - grouped) * rb));
    return;
  }
  TERN_ASSERT(w.n_out % 16 == 0 && w.n_in % block == 0);
  for (int64_t g = 0; g < w.n_out / 16; ++g)
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t i = 0; i < 16; ++i) {
        uint8_t* p = dst + (g * nb + b) * group_blk;
        const uint8_t* row_blk = src + (g * 16 + i) * rb + b * blk;
        if (w.type == DType::Q4_K) {
          BlockQ4_K q;
          std::memcpy(&q, row_blk, sizeof q);
          interleave_q4_k(q, i, p);
          continue;
        }
        if (w.type == DType::Q5_K) {  // Q4_K's fields, and qh bytes 4k..4k+3 of row i
          BlockQ5_K q5;
          std::memcpy(&q5, row_blk, sizeof q5);
          BlockQ4_K q;
          q.d = q5.d;
          q.dmin = q5.dmin;
          std::memcpy(q.scales, q5.scales, sizeof q.scales);
          std::memcpy(q.qs, q5.qs, sizeof q.qs);
          interleave_q4_k(q, i, p, true);
          for (int64_t k = 0; k < 8; ++k) std::memcpy(p + q5_k_qh_piece(k) + 4 * i, q5.qh + 4 * k, 4);
          continue;
        }
        for_each_piece(w.type, i, [&](int64_t at, int64_t row_off, size_t n) { std::memcpy(p + at, row_blk + row_off, n); });
        if (const int64_t h = q5_qh_in_group(w.type); h >= 0) {
          uint32_t qh;
          std::memcpy(&qh, p + h + 4 * i, 4);
          qh = q5_tile_bits(qh);
          std::memcpy(p + h + 4 * i, &qh, 4);
        }
      }
}

void deinterleave16_row(const WeightView& w, int64_t row, uint8_t* dst) {
  TERN_ASSERT(w.interleaved16);
  const int64_t block = interleave_block(w.type);
  const int64_t blk = dtype_row_bytes(w.type, block), group_blk = 16 * blk;
  const int64_t nb = w.n_in / block;
  if (dtype_is_float(w.type)) {
    const int64_t rb = w.row_bytes();
    const auto* base = static_cast<const uint8_t*>(w.data);
    if (row >= w.n_out / 16 * 16) {  // a tail row, as stored
      std::memcpy(dst, base + row * rb, size_t(rb));
      return;
    }
    const uint8_t* group = base + (row / 16) * 16 * rb;
    const int64_t e = bf16_pairs(w) ? 2 : 1;
    for (int64_t k = 0; k < w.n_in; k += e)
      std::memcpy(dst + k * blk, group + (16 * k + e * (row % 16)) * blk, size_t(e * blk));
    return;
  }
  const auto* group = static_cast<const uint8_t*>(w.data) + (row / 16) * nb * group_blk;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = group + b * group_blk;
    uint8_t* row_blk = dst + b * blk;
    if (w.type == DType::Q4_K) {
      BlockQ4_K q;
      deinterleave_q4_k(p, row % 16, q);
      std::memcpy(row_blk, &q, sizeof q);
      continue;
    }
    if (w.type == DType::Q5_K) {
      BlockQ4_K q;
      deinterleave_q4_k(p, row % 16, q, true);
      BlockQ5_K q5;
      q5.d = q.d;
      q5.dmin = q.dmin;
      std::memcpy(q5.scales, q.scales, sizeof q5.scales);
      std::memcpy(q5.qs, q.qs, sizeof q5.qs);
      for (int64_t k = 0; k < 8; ++k) std::memcpy(q5.qh + 4 * k, p + q5_k_qh_piece(k) + 4 * (row % 16), 4);
      std::memcpy(row_blk, &q5, sizeof q5);
      continue;
    }
    for_each_piece(w.type, row % 16, [&](int64_t at, int64_t row_off, size_t n) { std::memcpy(row_blk + row_off, p + at, n); });
    if (q5_qh_in_group(w.type) >= 0) {
      uint32_t t;
      std::memcpy(&t, row_blk + q5_qh_in_block(w.type), 4);
      t = q5_stored_bits(t);
      std::memcpy(row_blk + q5_qh_in_block(w.type), &t, 4);
    }
  }
}

namespace {

// Equal layouts mean one quantized copy of x serves both weights: the tables' quantize()
// depends on the layout only, not on the weight type.
bool layouts_equal(const ActLayout& a, const ActLayout& b) {
  return a.kind == b.kind && a.stride == b.stride && a.off_d == b.off_d && a.off_sum == b.off_sum &&
         a.bytes == b.bytes && a.token_granule == b.token_granule && a.lane_tokens == b.lane_tokens &&
         a.tail_offset == b.tail_offset && a.tail_stride == b.tail_stride;
}

// The table-kernel path for weights that share one input x and one activation layout: x is
// quantized once, and the rows of all the weights are chunks of one pool region. With the
// RMSNorm prologue, the phase that quantizes also normalises (into norm.out_rows), each row
// right before it is quantized; float weights then read the normalised rows.
void gemm_shared_input(const KernelTable& kt, std::span<const MatmulTarget> ts, const ActLayout& lay,
                       const float* x, int64_t ldx, int64_t n_tokens, ThreadPool& pool, const RowsDone& done,
                       const InputRmsNorm& norm) {
  Scratch& s = caller_scratch();
  const int64_t n_in = ts[0].w.n_in;
  const DType act_type = ts[0].w.type;  // any member: they share the layout
  const bool quantized = lay.kind != ActKind::None;
  uint8_t* act = quantized ? s.act.get(lay.bytes) : nullptr;
  const float* x_in = norm.weight ? norm.out_rows : x;  // [n_tokens][ldx] what the kernels read
  if (quantized || norm.weight) {
    const int64_t g = quantized ? lay.token_granule : 1;
    // Tokens [t0, t1) (t0 a multiple of g) made ready for the gemm. The prologue goes one
    // quantizer granule at a time (a single row for the Rows layouts, 16 for the Lanes ones),
    // so the quantizer reads rows that are still in this thread's L1 (L2 for 16 rows).
    auto prepare = [&](int64_t t0, int64_t t1) {
      if (!norm.weight) {
        kt.quantize(lay, act_type, x, ldx, n_in, n_tokens, t0, t1, act);
        return;
      }
      for (int64_t a = t0; a < t1; a += g) {
        const int64_t b = std::min(t1, a + g);
        for (int64_t t = a; t < b; ++t) rms_norm_row(x + t * ldx, norm.weight, norm.out_rows + t * ldx, n_in, norm.eps);
        if (quantized) kt.quantize(lay, act_type, norm.out_rows, ldx, n_in, n_tokens, a, b, act);
      }
    };
    // Quantizing is O(n_tokens * n_in) against the matmul's O(n_tokens * n_in * n_out): only
    // worth spreading over the pool for a batch of tokens.
    const int64_t n_units = (n_tokens + g - 1) / g;
    if (n_tokens < 8 || pool.size() == 1 || n_units == 1) {
      prepare(0, n_tokens);
    } else {
      const int64_t per = (n_units + pool.size() - 1) / pool.size();
      const int64_t n_chunks = (n_units + per - 1) / per;
      pool.for_chunks(n_chunks, [&](int64_t c, int) {
        const int64_t t0 = c * per * g;
        prepare(t0, std::min(n_tokens, (c + 1) * per * g));
      });
    }
  }

  struct Chunk {
    int32_t target;
    int64_t r0, r1;
  };
  thread_local std::vector<GemmArgs> args;
  thread_local std::vector<Chunk> chunks;
  args.clear();
  chunks.clear();
  int64_t scratch_bytes = 0;
  for (size_t k = 0; k < ts.size(); ++k) {
    const MatmulTarget& t = ts[k];
    args.push_back(GemmArgs{t.w.type, static_cast<const uint8_t*>(t.w.data), t.w.row_bytes(), t.w.n_in,
                            t.w.n_out, x_in, ldx, act, lay, n_tokens, t.y, t.ldy, t.w.interleaved16});
    scratch_bytes = std::max(scratch_bytes, kt.scratch_bytes(t.w.type, t.w.n_in));
    if (done.joint_rows && k > 0) continue;  // joint chunks: one list over the common rows
    const int64_t per = rows_per_chunk(t.w.n_out, pool.size(), n_tokens, t.w.type);
    for (int64_t r0 = 0; r0 < t.w.n_out; r0 += per)
      chunks.push_back(Chunk{done.joint_rows ? -1 : int32_t(k), r0, std::min(t.w.n_out, r0 + per)});
  }
  const size_t nth = size_t(pool.size());
  if (s.per_thread.size() < nth) {
    s.per_thread.resize(nth);
    s.per_thread_ptr.resize(nth);
  }
  for (size_t i = 0; i < nth; ++i)
    s.per_thread_ptr[i] = scratch_bytes > 0 ? s.per_thread[i].get(scratch_bytes) : nullptr;
  uint8_t* const* scratch = s.per_thread_ptr.data();
  // The workers reach the caller's thread_local lists through these references.
  const std::vector<GemmArgs>& args_ref = args;
  const std::vector<Chunk>& chunks_ref = chunks;
  pool.for_chunks(int64_t(chunks_ref.size()), [&](int64_t c, int thread) {
    const Chunk& ch = chunks_ref[size_t(c)];
    if (ch.target < 0) {
      for (const GemmArgs& a : args_ref) kt.gemm(a, ch.r0, ch.r1, scratch[thread]);
    } else {
      kt.gemm(args_ref[size_t(ch.target)], ch.r0, ch.r1, scratch[thread]);
    }
    if (done.fn) done.fn(done.ctx, ch.target, n_tokens, ch.r0, ch.r1);
  });
}

}  // namespace

void matmul_isa(Isa isa, const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens,
                float* y, int64_t ldy, ThreadPool& pool) {
  if (!isa_supported(isa)) fail("kernel variant ", isa_name(isa), " is not supported by this CPU");
  if (n_tokens <= 0 || w.n_out <= 0) return;
  // tern's integer formats carry their own kernels (per-token int8 activations, outlier
  // columns, group zero points); they do not fit the block-pair KernelTable.
  if (is_tern_int_type(w.type)) {
    tern_int_matmul(isa, w, x, ldx, n_tokens, y, ldy, pool);
    return;
  }
  if (w.row_bytes() < 0)
    fail("matmul: row length ", w.n_in, " is not a multiple of the ", dtype_name(w.type),
         " block size");
  require_interleave_kernels(isa, w);
  const KernelTable& kt = table_of(isa);
  if (!kt.has_kernel(w.type)) {
    matmul_ref(w, x, ldx, n_tokens, y, ldy, pool);
    return;
  }
  const MatmulTarget one{w, y, ldy};
  gemm_shared_input(kt, std::span<const MatmulTarget>(&one, 1), effective_layout(kt, w, n_tokens), x, ldx,
                    n_tokens, pool, RowsDone{}, InputRmsNorm{});
}

void matmul_shared_input_isa(Isa isa, std::span<const MatmulTarget> targets, const float* x, int64_t ldx,
                             int64_t n_tokens, ThreadPool& pool, const RowsDone& done, const InputRmsNorm& norm) {
  if (!isa_supported(isa)) fail("kernel variant ", isa_name(isa), " is not supported by this CPU");
  if (targets.empty() || n_tokens <= 0) return;
  TERN_ASSERT_MSG(!norm.weight || norm.out_rows, "matmul_shared_input: RMSNorm prologue without out_rows");
  for (const MatmulTarget& t : targets) require_interleave_kernels(isa, t.w);
  const KernelTable& kt = table_of(isa);
  const ActLayout lay = effective_layout(kt, targets[0].w, n_tokens);
  bool shared = true;
  for (const MatmulTarget& t : targets) {
    TERN_ASSERT_MSG(t.w.n_in == targets[0].w.n_in, "matmul_shared_input: weights of different row lengths");
    TERN_ASSERT_MSG(!done.joint_rows || t.w.n_out == targets[0].w.n_out, "matmul_shared_input: joint rows of different counts");
    shared = shared && t.w.n_out > 0 && !is_tern_int_type(t.w.type) && t.w.row_bytes() >= 0 &&
             kt.has_kernel(t.w.type) && layouts_equal(effective_layout(kt, t.w, n_tokens), lay);
  }
  if (!shared) {
    // The prologue as a pass of its own, then one matmul per weight; the epilogue runs over
    // whole outputs, on this thread.
    const int64_t n_in = targets[0].w.n_in;
    if (norm.weight) {
      auto rows = [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) rms_norm_row(x + t * ldx, norm.weight, norm.out_rows + t * ldx, n_in, norm.eps);
      };
      if (n_tokens < 8 || pool.size() == 1) rows(0, n_tokens);
      else pool.parallel_for(n_tokens, [&](int64_t t0, int64_t t1, int) { rows(t0, t1); });
      x = norm.out_rows;
    }
    for (size_t k = 0; k < targets.size(); ++k) {
      const MatmulTarget& t = targets[k];
      matmul_isa(isa, t.w, x, ldx, n_tokens, t.y, t.ldy, pool);
      if (done.fn && !done.joint_rows) done.fn(done.ctx, int(k), n_tokens, 0, t.w.n_out);
    }
    if (done.fn && done.joint_rows) done.fn(done.ctx, -1, n_tokens, 0, targets[0].w.n_out);
    return;
  }
  gemm_shared_input(kt, targets, lay, x, ldx, n_tokens, pool, done, norm);
}

void matmul_shared_input(std::span<const MatmulTarget> targets, const float* x, int64_t ldx, int64_t n_tokens,
                         ThreadPool& pool, const RowsDone& done, const InputRmsNorm& norm) {
  matmul_shared_input_isa(selected_isa(), targets, x, ldx, n_tokens, pool, done, norm);
}

}  // namespace tern
