#pragma once
// What the SIMD row kernels of tern's integer formats (x86/tern_int_avx2.cpp,
// x86/tern_int_avx512.cpp, arm/tern_int_neon.cpp) share around their ISA-specific inner loops:
// the token driver (tokens 4 at a time into kernels templated on the count), BiLLM's row driver,
// and the reading of a BILLM block (quant/quant_billm.h) into words.
//
// Include only from those files. Everything is in an unnamed namespace so each ISA's translation
// unit has its own copy (no ODR mixing of differently compiled code, see kernels/kernel_iface.h).
#include <cstdint>
#include <cstring>

namespace tern::kern {
namespace {

// A compile-time int as a type (a token count, a group size): Int<N>::value.
template <int N>
struct Int {
  static constexpr int value = N;
};

// fn(Int<NT>{}, t) for tokens t .. t + NT - 1 of n_tok, NT = 4 until fewer are left.
template <class Fn>
inline void by_four_tokens(int64_t n_tok, Fn&& fn) {
  for (int64_t t = 0; t < n_tok; t += 4) {
    switch (n_tok - t >= 4 ? 4 : n_tok - t) {
      case 4: fn(Int<4>{}, t); break;
      case 3: fn(Int<3>{}, t); break;
      case 2: fn(Int<2>{}, t); break;
      default: fn(Int<1>{}, t); break;
    }
  }
}

// ---- TQ tiles (x86/tern_int_rows16_avx512.cpp, x86/tern_int_rows8_avx2.cpp) ---------------------

// A TQ tile's activations: token t's row at act + t * stride (TqLayout, tern_int.cpp).
struct TqView {
  const uint8_t* act;
  int64_t stride, off_dxv, off_xs, n_in;
};

// The tiles' loops over rows [r0, r1) x n_tok tokens: token blocks whose activations (~256 KB)
// stay in L2 while the rows pass over them; in a block, tiles of R rows (the last one's missing
// rows repeat its last row and are not stored: `keep` has a bit per row to store) by up to T
// tokens: tile(rows, keep, pf, t, n, y) with pf the rows prefetch_tiles tiles on for the first
// token chunk (nullptr for the others) and y at token t, row r.
template <int R, int T, class Tile>
inline void each_row_tile(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t stride, int64_t n_tok,
                          float* y, int64_t ldy, int prefetch_tiles, Tile&& tile) {
  int64_t tb = (256 << 10) / (stride > 0 ? stride : 1);
  tb = tb < T ? T : tb / T * T;
  for (int64_t t0 = 0; t0 < n_tok; t0 += tb) {
    const int64_t t1 = t0 + tb < n_tok ? t0 + tb : n_tok;
    for (int64_t r = r0; r < r1; r += R) {
      const int n_rows = r1 - r < R ? int(r1 - r) : R;
      const uint8_t* rows[R];
      for (int i = 0; i < R; ++i) rows[i] = w + (r + (i < n_rows ? i : n_rows - 1)) * row_bytes;
      const uint8_t* pf = w + (r + prefetch_tiles * R) * row_bytes;
      const uint32_t keep = n_rows == 32 ? ~0u : (1u << n_rows) - 1u;
      for (int64_t t = t0; t < t1; t += T) {
        const int64_t n = t1 - t < T ? t1 - t : T;
        tile(static_cast<const uint8_t* const*>(rows), keep, t == t0 ? pf : nullptr, t, n, y + t * ldy + r);
      }
    }
  }
}

// fn(Int<BITS>{}, Int<G>{}) for the formats the tiles serve (4 or 8 bits, groups of 64 or 128);
// false for another (3 bits: the row kernels).
template <class Fn>
inline bool tq_tiles_by_format(int bits, int group, Fn&& fn) {
  if (bits == 4 && group == 64) fn(Int<4>{}, Int<64>{});
  else if (bits == 4 && group == 128) fn(Int<4>{}, Int<128>{});
  else if (bits == 8 && group == 64) fn(Int<8>{}, Int<64>{});
  else if (bits == 8 && group == 128) fn(Int<8>{}, Int<128>{});
  else return false;
  return true;
}

// ---- BiLLM -----------------------------------------------------------------------------------

// A BILLM block of G columns: sign plane [G/8] | selector plane [G/8] | f16 a_c, a_s, a_1, a_2 |
// salient column list [G/32] (0xFF ends a shorter list).
template <int G>
inline constexpr int64_t kBillmBlockBytes = G / 4 + 8 + G / 32;

// A block as a kernel reads it: its four magnitudes, whether it lists any salient column, and
// its sign, selector and salient planes as W words (column j at bit j % bits of word
// j / bits, little-endian as stored).
template <int G, class W>
struct BillmWords {
  static constexpr int kWords = G / (8 * int(sizeof(W)));
  float a_c, a_s, a_1, a_2;
  bool any_salient;
  W sgn[kWords], sel[kWords], sal[kWords];
};

// The block at blk, through the ISA's f16 conversion `f16` (float(uint16_t)).
template <int G, class W, class F16>
inline BillmWords<G, W> billm_words(const uint8_t* blk, F16 f16) {
  constexpr int kBits = 8 * int(sizeof(W));
  BillmWords<G, W> b;
  uint16_t h[4];
  std::memcpy(h, blk + G / 4, 8);
  b.a_c = f16(h[0]);
  b.a_s = f16(h[1]);
  b.a_1 = f16(h[2]);
  b.a_2 = f16(h[3]);
  std::memcpy(b.sgn, blk, G / 8);
  std::memcpy(b.sel, blk + G / 8, G / 8);
  const uint8_t* idx = blk + G / 4 + 8;
  b.any_salient = idx[0] != 0xFF;
  for (int c = 0; c < b.kWords; ++c) b.sal[c] = 0;
  for (int i = 0; i < G / 32 && idx[i] < G; ++i) b.sal[idx[i] / kBits] |= W(W(1) << (idx[i] % kBits));
  return b;
}

// The ISA's kernel of one BILLM row times NT tokens (act: the first token's row, TqAct layout),
// defined by each file that includes this header.
template <int G, int NT>
void billm_dots_nt(const uint8_t* w, int64_t n_in, const uint8_t* act, int64_t stride, int64_t off_dxv, float* out);

// TernIntRows::billm_dots over billm_dots_nt.
inline void billm_dots(const uint8_t* w, int group, int64_t n_in, const uint8_t* act, int64_t stride,
                       int64_t off_dxv, int64_t n_tok, float* out) {
  const auto rows = [&](auto g) {
    by_four_tokens(n_tok, [&](auto nt, int64_t t) {
      billm_dots_nt<decltype(g)::value, decltype(nt)::value>(w, n_in, act + t * stride, stride, off_dxv, out + t);
    });
  };
  if (group == 64) rows(Int<64>{});
  else rows(Int<128>{});
}

}  // namespace
}  // namespace tern::kern
