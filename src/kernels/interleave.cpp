// Weights interleaved by 16 rows at load time (matmul.h): which variants read which types so
// (a traits table), and the layouts themselves: interleave16 and its inverse for one row.
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "kernels/dispatch_internal.h"
#include "kernels/matmul.h"
#include "quant/quant_traits.h"

namespace tern {

using kern::bf16_pairs;
using kern::reads_interleaved;

namespace {

// Which variants read weights of a type interleaved by 16 rows (matmul.h), and the block the
// interleaving works in (elements; float types: one element, any row length): one row per type,
// a bit per variant. Both x86 SIMD tables for Q4_0, Q8_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, MXFP4 and
// the float types (MXFP4 decode 67-76% -> 81-95% of the plain sums' read rate, level with Q4_0's,
// bench_matmul --sweep 22); the AVX2 one for Q6_K too, the AVX-512 one for Q2_K and Q3_K (decode 57% -> 79% and
// 65% -> 90% of the plain sums' read rate; 128-token prompts 263 -> 505 GFLOP/s and, against
// Q3_K's token-lane tiles on the stored rows, 533 -> 457: decode's gain is the larger). (AVX-512
// row-lane tiles for Q6_K, tried: decode equal, 8-token batches 1.6x faster, but 128-token prompts
// 20% slower than the token-lane tiles on the stored rows, TinyLlama pp128 -7%.) The AVX-512
// one for TQ1_0 and TQ2_0 (rowlanes_avx512.cpp), against the classic tiles on the stored rows,
// 2 threads on a Xeon (AVX-512 VNNI) shared with other jobs, alternating runs: decode (--sweep
// 22) TQ2_0 6.1 -> 7.3 GB/s, TQ1_0 3.5 -> 6.9 (the plain sums 5.3 / 5.7: not a ceiling on that
// machine); 128-token prompts TQ2_0 120-167 -> 231-324 GFLOP/s, TQ1_0 101-106 -> 245-247;
// 8 tokens 179-187 -> 265-370 and 98-111 -> 204-289. TQ1_0 stays base-3 packed: decoded at load
// into TQ2_0's 2-bit layout it would read 2.06 instead of 1.69 bits per weight, and TQ2_0's
// interleaved decode sweep took 0.90x TQ1_0's time on one thread (7.5 vs 8.3 ms, 8 layers) but
// 1.16x on two (34.4 vs 29.6 ms, 22 layers): not worth 22% more memory. The ARM tables
// read the float types interleaved and the quantized ones as stored.
struct RepackTraits {
  DType type;
  int64_t block;
  uint32_t isas;  // bit int(Isa) set: that variant reads the type interleaved
};
constexpr uint32_t isa_bit(Isa i) { return 1u << int(i); }
constexpr uint32_t kX86Simd = isa_bit(Isa::Avx2) | isa_bit(Isa::Avx512);
constexpr uint32_t kArm = isa_bit(Isa::Neon) | isa_bit(Isa::Dotprod) | isa_bit(Isa::I8mm);
constexpr RepackTraits kRepackTraits[] = {
    {DType::F32, 1, kX86Simd | kArm},        {DType::F16, 1, kX86Simd | kArm},
    {DType::BF16, 1, kX86Simd | kArm},       {DType::Q4_0, 32, kX86Simd},
    {DType::Q8_0, 32, kX86Simd},             {DType::Q4_1, 32, kX86Simd},
    {DType::Q5_0, 32, kX86Simd},             {DType::Q5_1, 32, kX86Simd},
    {DType::Q2_K, kQK_K, isa_bit(Isa::Avx512)}, {DType::Q3_K, kQK_K, isa_bit(Isa::Avx512)},
    {DType::Q4_K, kQK_K, kX86Simd},          {DType::Q5_K, kQK_K, kX86Simd},
    {DType::Q6_K, kQK_K, isa_bit(Isa::Avx2)},  {DType::MXFP4, 32, kX86Simd},
    {DType::TQ1_0, kQK_K, isa_bit(Isa::Avx512)}, {DType::TQ2_0, kQK_K, isa_bit(Isa::Avx512)},
};

const RepackTraits* repack_traits(DType type) {
  for (const RepackTraits& t : kRepackTraits)
    if (t.type == type) return &t;
  return nullptr;
}

// Elements per block of an interleavable type.
int64_t interleave_block(DType type) {
  const RepackTraits* t = repack_traits(type);
  TERN_ASSERT_MSG(t, "interleave_block: not an interleavable type");
  return t->block;
}

}  // namespace

bool kern::reads_interleaved(Isa isa, DType type) {
  const RepackTraits* t = repack_traits(type);
  return t && (t->isas & isa_bit(isa));
}

bool kern::bf16_pairs(const WeightView& w) { return w.type == DType::BF16 && w.n_in % 2 == 0; }

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
  if (type == DType::TQ1_0 || type == DType::TQ2_0) {
    // d at 2i; then the block's quant bytes (TQ1_0: qs[48] and qh[4], one after another; TQ2_0:
    // qs[64]) 4 at a time: piece p (bytes 4p..4p+3) at 32 + 64p (matmul.h)
    static_assert(offsetof(BlockTQ1_0, qs) == 0 && offsetof(BlockTQ1_0, qh) == 48 && offsetof(BlockTQ2_0, qs) == 0);
    const int64_t pieces = type == DType::TQ1_0 ? 13 : 16;
    fn(2 * i, type == DType::TQ1_0 ? int64_t(offsetof(BlockTQ1_0, d)) : int64_t(offsetof(BlockTQ2_0, d)), 2);
    for (int64_t p = 0; p < pieces; ++p) fn(32 + 64 * p + 4 * i, 4 * p, 4);
    return;
  }
  if (type == DType::MXFP4) {  // e at i; the 4 nibble pieces at 16 + 64k (matmul.h)
    fn(i, 0, 1);
    for (int64_t k = 0; k < 4; ++k) fn(16 + 64 * k + 4 * i, 1 + 4 * k, 4);
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

}  // namespace tern
