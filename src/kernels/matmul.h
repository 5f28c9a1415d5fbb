#pragma once
// Matrix multiplication of a stored weight by f32 activations, the hot loop of every model.
//
//   W: [n_out rows][n_in] in `type` (ggml layout: a row is n_in contiguous elements)
//   x: [n_tokens][n_in]  f32, rows ldx floats apart
//   y: [n_tokens][n_out] f32, rows ldy floats apart       y[t][o] = sum_i W[o][i] * x[t][i]
//
// n_tokens == 1 is the decode GEMV; larger n_tokens is the prefill GEMM. The implementation
// (kernels/dispatch) picks the variant once per process from the CPU's features
// (TERN_FORCE_ISA=ref|avx2|avx512, on ARM64 ref|neon|dotprod|i8mm, overrides); every variant
// is tested against kernels/ref.
// Must be called from the thread that owns `pool`; work is split across the pool.
//
// Quantized weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, MXFP4, TQ1_0, TQ2_0) multiply activations quantized on the fly to
// 8 bits per block (Q8_0 / Q8_K, as llama.cpp does), so results differ from the f32 oracle
// matmul_ref by that rounding (~0.5% of the magnitude of the result). Float weights (F32,
// F16, BF16) use f32 arithmetic throughout, one FMA per element in k order into one sum per
// output (acc = fma(W[o][k], x[t][k], acc)): the same bits on every variant, batch size,
// thread count and row range.
#include <cstdint>
#include <span>

#include "core/dtype.h"
#include "core/thread_pool.h"

namespace tern {

struct WeightView {
  DType type = DType::F32;
  int64_t n_in = 0;    // ne[0]
  int64_t n_out = 0;   // ne[1]
  const void* data = nullptr;
  // Q4_0 / Q8_0 / Q4_1 / Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K / MXFP4 and F32 / F16 / BF16 (by 16):
  // the rows interleaved at load time (interleave16 below) for the AVX2 / AVX-512 kernels,
  // instead of one row after another.
  bool interleaved16 = false;
  int64_t row_bytes() const { return dtype_row_bytes(type, n_in); }
};

// Q4_0 / Q8_0 weights interleaved by 16 rows: per group of 16 rows (n_out a multiple of 16),
// per 32-element block b, 16 blocks' bytes (288 for Q4_0, 544 for Q8_0): the 16 rows' f16
// scales, then K x 64 bytes (K = 4 for Q4_0's 16 nibble bytes, 8 for Q8_0's 32 quants) where
// bytes 4i..4i+3 of the k-th 64 are bytes 4k..4k+3 of row i's quant bytes. The same bytes as
// the rows, in the order the row-lane tiles consume them (no per-block transpose): a 64-byte
// piece is one AVX-512 vector, or two AVX2 vectors of 8 rows each.
// Q4_1 / Q5_0 / Q5_1 per group and block of 32: the rows' d (f16) at 0; Q4_1 / Q5_1 their m
// (f16) at 32; Q5_0 / Q5_1 their 32-bit qh at 32 / 64 + 4i, bits permuted (bit g of byte j =
// the fifth bit of element 4g + j, so one shift puts a nibble group's four at bit 4 of its four
// bytes); then Q4_0's 4 nibble pieces.
// MXFP4 per group and block of 32 (272 bytes): the rows' E8M0 bytes at i, then Q4_0's 4 nibble
// pieces at 16 + 64k.
// Q4_K per group of 16 rows and super-block of 256: 16 x 144 bytes: the rows' d (f16) at 0,
// dmin at 32; at 64 + 16j row i's byte sc_j | (m_j & 3) << 6 (sub-block j's
// 6-bit scale and the low bits of its min); at 192 + 4i row i's eight m_j >> 2 in nibbles; at
// 256 + 64p (p = 8c + k) bytes 4i..4i+3 = qs bytes 32c + 4k..+3 of row i. The scale bytes are
// repacked (losslessly: deinterleave16_row restores them), the rest moved.
// Q5_K: 16 x 176 bytes: Q4_K's first 256 bytes; Q4_K's qs pieces p = k (c = 0) at 256 + 128k,
// each followed by a qh piece: bytes 4i..4i+3 = qh bytes 4k..4k+3 of row i (the fifth bits of
// elements 4k.. of all 8 sub-blocks); then pieces p = 8c + k (c = 1..3) at 768 + 512c + 64k.
// So the tiles read each super-block in address order.
// Q2_K (AVX-512 kernels only): 16 x 84 bytes: d[16] at 0, dmin[16] at 32; row i's 16 scale bytes
// as dwords at 64 + 64w + 4i; qs pieces p (bytes 4p..4p+3 of row i's qs) at 320 + 64p.
// Q3_K (AVX-512 kernels only): 16 x 110 bytes: d[16] at 0; row i's 12 scale bytes as dwords at
// 32 / 96 / 160 + 4i; qs pieces p (bytes 4i..4i+3 = qs bytes 4p..4p+3 of row i) at 224 + 128p for
// p < 8, each followed by hmask piece p (hmask bytes 4p..), then at 736 + 64p for p >= 8.
// TQ2_0 / TQ1_0 (AVX-512 kernels only): 16 x 66 / 16 x 54 bytes: d[16] at 0; then the block's
// quant bytes as stored (TQ2_0 qs[64]; TQ1_0 qs[48] and qh[4]) 4 at a time: bytes 4i..4i+3 of
// piece p at 32 + 64p are bytes 4p..4p+3 of row i's (16 pieces, 13 for TQ1_0).
// Q6_K (AVX2 kernels only): 16 x 210 bytes: d[16] at 0; at 32 + 32p + 2i row i's scales 2p and
// 2p + 1; at 288 + 192 (8n + k) three 64-byte pieces: bytes 4i..4i+3 of each are row i's ql bytes
// 64n + 4k.., ql bytes 64n + 32 + 4k.. and qh bytes 32n + 4k.. (n = 0, 1; k = 0..7).
// F32 / F16 / BF16 per group of 16 rows, per element k: the 16 rows' elements k (one vector
// of 16 outputs at one k, what the float tiles multiply by a broadcast activation); any n_in;
// the n_out % 16 rows after the last whole group stay as stored, where they were. BF16 with an
// even n_in per pair of elements (2p, 2p + 1) instead: 16 dwords, dword i = row i's elements 2p
// | 2p + 1 << 16 (the operand of vdpbf16ps; the FMA tiles split a dword by a shift and a mask).
// Whether this process would use them: Q4_0, Q8_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, MXFP4 or a float type with the AVX2 or
// AVX-512 kernels selected, Q6_K with the AVX2 ones, Q2_K / Q3_K / TQ1_0 / TQ2_0 with the AVX-512 ones, a float type with
// an ARM variant selected (the table in kernels/dispatch.cpp); n_out % 16 == 0 (float types: n_out >= 16);
// TERN_REPACK not "0".
bool want_interleave16(const WeightView& w);
// Writes w (rows, one after another) interleaved into dst (w.n_out * row_bytes bytes).
void interleave16(const WeightView& w, uint8_t* dst);
// The inverse for one row: row `row` of interleaved w as stored blocks (row_bytes bytes).
void deinterleave16_row(const WeightView& w, int64_t row, uint8_t* dst);

void matmul(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
            int64_t ldy, ThreadPool& pool);

// Output rows [r0, r1) only (y's other columns untouched), on the calling thread alone: for
// callers that split the rows across threads themselves. Equal to matmul's rows bit for bit
// when r0 is a multiple of 4 (the kernels' row tile; float weights: any r0).
void matmul_rows(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
                 int64_t ldy, int64_t r0, int64_t r1);

// Several weights applied to the same input (q/k/v of attention, gate/up of the FFN):
// y_k = x W_k^T for each target. When the weights share a kernel and an activation format, x is
// quantized once and all their rows are one pool region (instead of one quantization and one
// fork/join per weight); otherwise each runs as matmul(). Results equal matmul()'s bit for bit.
struct MatmulTarget {
  WeightView w;  // all with the same n_in
  float* y;      // [n_tokens][ldy]
  int64_t ldy;
};
// Elementwise work fused into the matmul (RoPE on q/k, SwiGLU of gate/up): fn(ctx, target,
// n_tokens, r0, r1) runs as soon as output rows [r0, r1) of `target` are final, for every token,
// on the thread that computed them (the rows are still in its cache). With joint_rows, every
// target must have the same n_out and a chunk computes rows [r0, r1) of all of them before one
// call with target = -1 (SwiGLU needs gate and up of the same rows). With joint_rows and
// joint_group = G > 0, the targets are consecutive groups of G (a decode token's experts: each
// one's gate and up), a chunk computes rows [r0, r1) of one group's targets, and the call names
// the group (target = its index); chunks then span up to a whole group's rows, so that each
// reads long streams. r0 is a multiple of 4.
struct RowsDone {
  void (*fn)(const void* ctx, int target, int64_t n_tokens, int64_t r0, int64_t r1) = nullptr;
  const void* ctx = nullptr;
  bool joint_rows = false;
  int joint_group = 0;
};
// RMSNorm fused in front of the matmul (attn_norm before q/k/v, ffn_norm before gate/up): x is
// the un-normalised input, and each token row is normalised into out_rows (rms_norm_row of
// kernels/norm.h, the function ops' rms_norm runs: the same bits) by the thread that quantizes
// it, right before it does, while the row is in its cache. Float weights read the normalised
// rows. Equals rms_norm followed by matmul_shared_input on its output bit for bit, with one
// pool region and one pass over x fewer.
struct InputRmsNorm {
  const float* weight = nullptr;  // [n_in]; nullptr: no prologue, x is used as it is
  float eps = 0.0f;
  float* out_rows = nullptr;      // [n_tokens][ldx] receives the normalised rows (required with
                                  // weight; may be x itself); valid for the caller after the call
};
void matmul_shared_input(std::span<const MatmulTarget> targets, const float* x, int64_t ldx,
                         int64_t n_tokens, ThreadPool& pool, const RowsDone& done = {},
                         const InputRmsNorm& norm = {});

// Reference implementation (dequantize a row, f32 dot products): the oracle for tests.
void matmul_ref(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
                int64_t ldy, ThreadPool& pool);

// Copies row `row` of w into dst[0..n_in) as f32 (embedding lookup).
void dequantize_row(const WeightView& w, int64_t row, float* dst);

// Name of the ISA variant in use ("ref", "avx2", "avx512", "neon", "dotprod", "i8mm"). The first call (or the first
// matmul) reads TERN_FORCE_ISA and throws tern::Error when it names an unknown variant or one
// this CPU cannot run; call it at start-up to report that as a usage error.
const char* active_isa();

// --- variants, for tests and benchmarks ---------------------------------------------------

// The x86 variants, then the ARM64 ones (kernels/arm): Neon is baseline Armv8-A, Dotprod adds
// sdot (Armv8.2-A), I8mm adds smmla (Armv8.6-A). The ARM variants give the reference kernels'
// results bit for bit for every weight type (kernels/arm/neon_kernels.h).
enum class Isa { Ref, Avx2, Avx512, Neon, Dotprod, I8mm };
inline constexpr Isa kAllIsas[] = {Isa::Ref, Isa::Avx2, Isa::Avx512, Isa::Neon, Isa::Dotprod, Isa::I8mm};

const char* isa_name(Isa isa);
// The x86 SIMD variants (Avx2, Avx512): the ones with training kernels of their own (the ARM
// variants run the training references; their attention tiles are ops/attention_neon.cpp).
inline bool isa_is_x86_simd(Isa isa) { return isa == Isa::Avx2 || isa == Isa::Avx512; }
// Whether this CPU (and OS) can run the variant: AVX2 needs AVX2+FMA+F16C; AVX-512 needs
// F, BW, VL, DQ and VNNI as well; Neon an ARM64 CPU (AdvSIMD), Dotprod and I8mm the hwcaps
// asimddp and i8mm (Linux's getauxval).
bool isa_supported(Isa isa);
// The variant matmul() uses (best supported unless TERN_FORCE_ISA says otherwise).
Isa selected_isa();
// Whether variant `isa` multiplies weights of `type` (rows of n_in) by activations rounded to
// bf16, with AVX512-BF16's vdpbf16ps (products exact in f32, as llama.cpp's BF16 path): BF16
// weights, even n_in, the AVX-512 variant on a CPU with AVX512-BF16, by default where the dot
// is faster than the FMA tiles (AMD; not Intel), TERN_BF16_DOT=1 / 0 forcing it on / off.
// Those results differ from the f32-activation ones by that rounding (<= 2^-9 relative per
// activation); every other float path is the exact FMA chain above.
bool isa_bf16_dot(Isa isa, DType type, int64_t n_in);
// Runs one specific variant; throws tern::Error when the CPU cannot run it.
void matmul_isa(Isa isa, const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens,
                float* y, int64_t ldy, ThreadPool& pool);
void matmul_shared_input_isa(Isa isa, std::span<const MatmulTarget> targets, const float* x, int64_t ldx,
                             int64_t n_tokens, ThreadPool& pool, const RowsDone& done = {},
                             const InputRmsNorm& norm = {});
// Whether `isa` has a kernel for weights of `type` (otherwise matmul_isa falls back to
// matmul_ref, e.g. for Q8_K weights).
bool isa_has_kernel(Isa isa, DType type);
// Whether `isa` reads w interleaved by 16 (want_interleave16 for that variant, TERN_REPACK aside).
bool interleave16_for(Isa isa, const WeightView& w);

}  // namespace tern
