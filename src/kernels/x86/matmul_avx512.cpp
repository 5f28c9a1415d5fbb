// AVX-512 (F/BW/VL/DQ/VNNI) kernel table, and its choice of tile family (the families:
// avx512_tiles.h):
//  - quantized weights, decode: Q4_0 / Q8_0 in the wide tiles (wide_avx512.cpp: several rows per
//    zmm, 8 rows), MXFP4 there at every batch size; the K-quants in the classic tiles of tiles_int.h with VNNI (vpdpbusd / vpdpwssd
//    on 256-bit vectors, 32 registers: 4 rows x 4 tokens);
//  - Q4_0 / Q8_0, 2 to 15 tokens (small decode batches, and the tokens after a batch's last
//    full 16-token group): the row-lane tiles (rowlanes_avx512.cpp), 16 weight rows per zmm;
//  - quantized weights, full 16-token groups (K-quants: from 12 tokens) up to prefill: the
//    token-lane GEMM, 16 tokens per zmm (K-quants: lanes_avx512.cpp; Q4_0 / Q8_0 / Q5_0:
//    fused_avx512.cpp); the K-quants' tokens of a last partial group too small to pay for its
//    padding go to the classic tiles;
//  - weights interleaved by 16 rows: the interleaved tiles of rowlanes_avx512.cpp, any batch;
//  - float weights: tiles_float.h (one FMA chain per output, vectors across outputs: 12-token
//    x 32-row panel tiles for prefill, groups read directly for decode; BF16 on CPUs with
//    AVX512-BF16 by vdpbf16ps on bf16-rounded activations, in the same tiles).
#include "kernels/x86/act_quant.h"
#include "kernels/x86/avx512_tiles.h"
#include "kernels/x86/tiles_float.h"

namespace tern::kern {
namespace {

using avx512::kFusedRows;
using avx512::kLaneBlockQ8_0;
using avx512::kLaneBlockQ8_K;
using avx512::kLanes;
using avx512::kLanesRows;
using avx512::OpsAvx512;
using avx512::round_up64;

// --- the choice of tile family: one row per weight type ------------------------------------

using RowsGemm = void (*)(const GemmArgs&, const RowsView&, int64_t, int64_t);

// Q4_0 / Q8_0 tokens in a Rows layout (a whole batch below lanes_from, else the tokens after its
// last full 16-token group): a batch of one token (decode) in the wide tiles, which stream a
// GEMV's weights ~4% faster; any other in the row-lane tiles, so that from two tokens on a
// token's results never depend on its batch (the token-lane tiles give the same bits). Measured
// on 2 threads (2048 x 5632, in cache), row-lane against the wide tiles: 2 tokens 268 -> 318
// GFLOP/s (Q4_0) and 213 -> 258 (Q8_0), 3 tokens 296 -> 384 and 239 -> 323, 8 tokens 425 -> 534
// and 380 -> 480.
template <RowsGemm kRowLanes>
void q32_rows(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  if (a.n_tokens == 1) return avx512::gemm_wide(a, v, r0, r1);
  kRowLanes(a, v, r0, r1);
}

void classic_rows(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  gemm_int_classic<OpsAvx512>(a, v, r0, r1);
}

enum class LaneTiles : uint8_t { None, Fused, Prep };
enum class Scratch : uint8_t { None, FusedScales, FusedQ5, Prep, Float };

struct TileChoice {
  DType type;
  bool float_tiles;  // tiles_float.h at every batch size (interleaved or not), and nothing else
  // The token-lane tiles of 16-token groups (Fused: fused_avx512.cpp; Prep: lanes_avx512.cpp,
  // the K-quants), None: a Rows layout at every batch size.
  LaneTiles lanes;
  int64_t lanes_from;  // below this many tokens a batch runs whole in the Rows tiles
  int64_t lanes_min;   // a last partial group of at least this many tokens is padded into lanes
  RowsGemm rows;       // the Rows layout's tiles: a batch below lanes_from, a lane batch's tail
  Scratch scratch;     // what the tiles keep per thread (avx512_scratch_bytes)
};

// lanes_from: below it a Q4_0 / Q8_0 batch runs whole in the row-lane tiles; from it on, its
// full 16-token groups take the token-lane tiles. Measured side by side on 2 threads (2048 x
// 5632, in cache), row-lane vs token-lane: 16 tokens 555 vs 508 GFLOP/s (Q4_0), 530 vs 495
// (Q8_0); 32 tokens 560-580 vs 526 (Q4_0), level for Q8_0 (530 / 535: its row-lane unpack is
// twice as long); 128 tokens level for Q4_0, token-lane ahead for Q8_0 (555-580 vs 525-530).
// Q5_0's rows are rebuilt per call (gemm_fused's Q5_0): below 32 tokens the classic tiles.
// lanes_min: a 16-token group pays for all 16 lanes: below this many tokens in a group the Rows
// tiles are faster. Measured on 2 threads with in-cache weights: the K-quants win from 12
// tokens (single core) over the classic tiles; Q4_0 / Q8_0 / Q5_0 lay out full groups only, the
// row-lane tiles being level with or faster than a padded group at any smaller count.
// Float weights run tiles_float.h at every size (the table's BF16 pairs, avx512_act_layout);
// MXFP4 (gpt-oss's experts, whose tokens come a few at a time per expert) the wide tiles: it has
// no row-lane or token-lane tiles of its own. A type without a row runs the classic tiles
// (tiles_int_k.h) on Rows at every batch size. Weights interleaved by 16 rows (interleave.cpp's
// table) run the interleaved tiles at every size, whatever their row here.
constexpr TileChoice kTileChoices[] = {
    {DType::Q4_0, false, LaneTiles::Fused, 64, kLanes, q32_rows<avx512::gemm_rowlanes_q4_0>, Scratch::FusedScales},
    {DType::Q8_0, false, LaneTiles::Fused, 32, kLanes, q32_rows<avx512::gemm_rowlanes_q8_0>, Scratch::FusedScales},
    {DType::Q5_0, false, LaneTiles::Fused, 32, kLanes, classic_rows, Scratch::FusedQ5},
    {DType::Q3_K, false, LaneTiles::Prep, 0, 12, classic_rows, Scratch::Prep},
    {DType::Q4_K, false, LaneTiles::Prep, 0, 12, classic_rows, Scratch::Prep},
    {DType::Q6_K, false, LaneTiles::Prep, 0, 12, classic_rows, Scratch::Prep},
    {DType::MXFP4, false, LaneTiles::None, 0, 0, avx512::gemm_wide, Scratch::None},
    {DType::F32, true, LaneTiles::None, 0, 0, nullptr, Scratch::Float},
    {DType::F16, true, LaneTiles::None, 0, 0, nullptr, Scratch::Float},
    {DType::BF16, true, LaneTiles::None, 0, 0, nullptr, Scratch::Float},
};

// The one function that chooses: the type's row, or the classic tiles'.
TileChoice tile_choice(DType type) {
  for (const TileChoice& c : kTileChoices)
    if (c.type == type) return c;
  return {type, false, LaneTiles::None, 0, 0, classic_rows, Scratch::None};
}

// --- the table ---------------------------------------------------------------------------

// Full groups go to lanes; a last partial group too when it has enough tokens, else its tokens
// form a Rows tail. (The layouts: avx512_tiles.h.)
ActLayout avx512_act_layout(DType type, int64_t n_in, int64_t n_tokens) {
  if (type == DType::BF16 && n_in % 2 == 0 && bf16_dot_enabled()) return bf16_pairs_layout(n_in, n_tokens);
  ActLayout l = act_rows_layout(type, n_in, n_tokens);
  if (l.kind == ActKind::None) return l;
  const TileChoice c = tile_choice(type);
  if (c.lanes == LaneTiles::None || n_tokens < c.lanes_from) return l;
  const int64_t rem = n_tokens % kLanes;
  const int64_t lane_tokens = rem >= c.lanes_min ? n_tokens : n_tokens - rem;
  if (lane_tokens == 0) return l;
  const bool k_quant = c.lanes == LaneTiles::Prep;
  l.kind = k_quant ? ActKind::Q8_KLanes : ActKind::Q8_0Lanes;
  l.tail_stride = l.stride;  // Rows offsets off_d / off_sum stay valid for the tail
  l.stride = k_quant ? (n_in / kQK_K) * kLaneBlockQ8_K : (n_in / 32) * kLaneBlockQ8_0;
  l.lane_tokens = lane_tokens;
  l.tail_offset = l.stride * ((lane_tokens + kLanes - 1) / kLanes);
  l.bytes = l.tail_offset + l.tail_stride * (n_tokens - lane_tokens);
  l.token_granule = kLanes;
  return l;
}

void avx512_quantize(const ActLayout& lay, DType, const float* x, int64_t ldx, int64_t n_in,
                     int64_t, int64_t t0, int64_t t1, uint8_t* act) {
  if (lay.kind == ActKind::BF16Pairs)
    quantize_bf16_pairs(lay, x, ldx, n_in, t0, t1, act);
  else if (lay.kind == ActKind::Q8_0Lanes || lay.kind == ActKind::Q8_KLanes)
    avx512::quantize_lanes(lay, x, ldx, n_in, t0, t1, act);
  else
    quantize_rows(lay, x, ldx, n_in, t0, t1, act);
}

int64_t avx512_scratch_bytes(DType type, int64_t n_in) {
  const int64_t fused_scales = round_up64(int64_t(sizeof(float)) * kFusedRows * (n_in / 32));
  switch (tile_choice(type).scratch) {
    case Scratch::FusedScales: return fused_scales;
    case Scratch::FusedQ5:  // fused_scales, then the rows rebuilt as Q8_0
      return fused_scales + round_up64(kFusedRows * (n_in / 32) * int64_t(sizeof(BlockQ8_0)));
    case Scratch::Prep: return kLanesRows * avx512::lanes_prep_row_bytes(n_in);
    case Scratch::Float: return float_scratch_bytes<Avx512Vec>();
    case Scratch::None: break;
  }
  return 0;
}

// The tile family of each call, rows [r0, r1), from the type's row of kTileChoices: tokens in a
// token-lane layout (avx512_act_layout) run its token-lane tiles, and their Rows tail the row's
// Rows tiles; float weights tiles_float.h; weights interleaved by 16 rows the interleaved tiles;
// any other batch the row's Rows tiles.
void avx512_gemm(const GemmArgs& a, int64_t r0, int64_t r1, uint8_t* scratch) {
  const TileChoice c = tile_choice(a.type);
  if (a.act_layout.kind == ActKind::Q8_0Lanes || a.act_layout.kind == ActKind::Q8_KLanes) {
    if (a.act_layout.kind == ActKind::Q8_0Lanes)
      avx512::gemm_fused(a, r0, r1, scratch);
    else
      avx512::gemm_lanes(a, r0, r1, scratch);
    if (a.act_layout.lane_tokens < a.n_tokens) c.rows(a, rows_view(a), r0, r1);
    return;
  }
  if (c.float_tiles) return gemm_float<Avx512Vec>(a, r0, r1, scratch);
  if (a.interleaved16) return avx512::gemm_interleaved(a, rows_view(a), r0, r1);
  c.rows(a, rows_view(a), r0, r1);
}

const KernelTable kAvx512Table = {"avx512", x86_has_kernel, avx512_act_layout, avx512_quantize,
                                  avx512_scratch_bytes, avx512_gemm};

}  // namespace

const KernelTable& table_avx512() { return kAvx512Table; }

}  // namespace tern::kern
