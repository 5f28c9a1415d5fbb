#pragma once
// Internal interface between kernels/dispatch.cpp and the per-ISA kernel tables (ref, avx2,
// avx512, neon, dotprod, i8mm). Not for use outside src/kernels.
//
// How a matmul runs (dispatch.cpp):
//   1. quantize the f32 activations once into the caller's scratch, in the format the weight
//      type pairs with (Q8_0 for the blocks of 32, MXFP4 included; Q8_K for the K-quants and TQ1_0 / TQ2_0; float
//      weights read x as is);
//   2. split the output rows into chunks claimed by the pool's threads; each chunk computes
//      y[t][r] for its rows and every token with the table's gemm.
//
// ISA translation units must not call inline functions of shared headers (WeightView's
// members, core/fp16.h, std:: templates that baseline code also instantiates): an out-of-line
// copy compiled with -mavx512f could be the one the linker keeps for every caller. So this
// header is plain data and function pointers, and the layouts below come with their offsets
// precomputed by baseline code.
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace tern::kern {

// Quantized-activation layouts. "Rows" layouts keep one token per row (stride `stride`):
//
//   Q8_0Rows, per token:  qs [n_in] int8 | d [n_in/32] f32 | nsum [n_in/32] int32
//       x[i] ~= d[i/32] * qs[i]; nsum[b] = -sum(qs of block b) (Q4_0's -8 offset folds into
//       the integer accumulator through it, as does the bias of the x86 tiles' MXFP4 table). d is kept in f32, not f16 as in GGUF's Q8_0.
//   Q8_KRows, per token:  qs [n_in] int8 | d [n_in/256] f32 | bsums [n_in/16] int16
//       exactly the content of llama.cpp's block_q8_K, split into arrays.
//
// "Lanes" layouts (AVX-512 GEMM only, see x86/avx512_tiles.h) interleave 16 tokens so that
// one vector lane is one token; `stride` is then the bytes of one 16-token group. They hold
// the first lane_tokens tokens (the last group padded); the remaining tokens, too few to fill
// a group profitably, follow at tail_offset in the Rows layout (tail_stride, off_d, off_sum).
//
//   BF16Pairs, per token (BF16 weights on CPUs with AVX512-BF16, n_in even; x86/tiles_float.h):
//       n_in / 2 dwords, dword p = bf16(x[2p]) | bf16(x[2p+1]) << 16 (round to nearest even,
//       as vcvtne2ps2bf16), the operand vdpbf16ps broadcasts; stride padded by 64 bytes past
//       a multiple of 64 so that a tile's token rows do not share L1 sets.
enum class ActKind : uint8_t { None, Q8_0Rows, Q8_KRows, Q8_0Lanes, Q8_KLanes, BF16Pairs };

// The BF16Pairs layout for n_tokens tokens of n_in (even) elements.
struct ActLayout;
ActLayout bf16_pairs_layout(int64_t n_in, int64_t n_tokens);
// Whether BF16 weights multiply bf16-rounded activations with vdpbf16ps (AVX-512 table): the
// CPU has AVX512-BF16, and TERN_BF16_DOT is "1", or unset on a CPU where the dot is the faster
// (not Intel's: isa.cpp). Read once per process.
bool bf16_dot_enabled();

// A plain aggregate (no member initialisers) so that ISA code constructing one calls no
// function; value-initialise it: ActLayout l{};
struct ActLayout {
  ActKind kind;
  int64_t stride;         // bytes per token (Rows) or per 16-token group (Lanes); multiple of 64
  int64_t off_d;          // Rows: offset of d within a token row
  int64_t off_sum;        // Rows: offset of nsum (Q8_0) / bsums (Q8_K)
  int64_t bytes;          // total for all tokens
  int64_t token_granule;  // quantize() ranges must start at multiples of this
  int64_t lane_tokens;    // Lanes: tokens in the groups; the rest are Rows at tail_offset
  int64_t tail_offset;
  int64_t tail_stride;
};

// Rows layout for the activation type that `weight_type` pairs with (None for float types).
ActLayout act_rows_layout(DType weight_type, int64_t n_in, int64_t n_tokens);

// Everything one gemm call needs; plain data so that ISA code can read it freely.
struct GemmArgs {
  DType type;
  const uint8_t* w;      // [n_out][row_bytes]
  int64_t row_bytes;
  int64_t n_in;
  int64_t n_out;
  const float* x;        // [n_tokens][ldx] f32 (float weight types)
  int64_t ldx;
  const uint8_t* act;    // quantized activations (ActLayout), nullptr for float weights
  ActLayout act_layout;
  int64_t n_tokens;
  float* y;              // [n_tokens][ldy]
  int64_t ldy;
  bool interleaved16;    // Q4_0 / Q8_0 rows interleaved by 16 (matmul.h), AVX2 / AVX-512 tables
};

struct KernelTable {
  const char* name;
  // False when this table has no kernel for the weight type (dispatch then uses matmul_ref).
  bool (*has_kernel)(DType weight_type);
  ActLayout (*act_layout)(DType weight_type, int64_t n_in, int64_t n_tokens);
  // Quantizes tokens [t0, t1) of x into act (layout from act_layout). Disjoint ranges may run
  // concurrently; t0 is a multiple of the layout's token_granule. The range that ends at
  // n_tokens also fills any padding the layout has.
  void (*quantize)(const ActLayout& layout, DType weight_type, const float* x, int64_t ldx,
                   int64_t n_in, int64_t n_tokens, int64_t t0, int64_t t1, uint8_t* act);
  // Per-thread scratch the gemm needs (bytes, 64-aligned when given).
  int64_t (*scratch_bytes)(DType weight_type, int64_t n_in);
  // y[t][r] for rows [r0, r1) and all tokens.
  void (*gemm)(const GemmArgs& a, int64_t r0, int64_t r1, uint8_t* scratch);
};

const KernelTable& table_ref();
const KernelTable& table_avx2();
const KernelTable& table_avx512();
// ARM64 (arm/neon_kernels.h): baseline NEON, +dotprod, +i8mm.
const KernelTable& table_neon();
const KernelTable& table_dotprod();
const KernelTable& table_i8mm();

// Scalar references of the integer paths, one dot product of a weight row with a quantized
// activation row (Rows layouts): tests compare ISA variants against these.
float dot_ref(DType weight_type, const uint8_t* w_row, int64_t n_in, const uint8_t* act_row,
              const ActLayout& layout);
// Scalar quantizer of one token into a Rows layout (what every ISA's quantize reproduces).
void quantize_row_ref(const ActLayout& layout, const float* x, int64_t n_in, uint8_t* act_row);

}  // namespace tern::kern
