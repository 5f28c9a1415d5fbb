#pragma once
// Shape-checked building blocks of decoder-only transformers, on f32 activations.
// The matmuls themselves are kernels/matmul.h; these are the elementwise / row-wise ops and
// attention between them. All run on the caller's ThreadPool.
#include <cstdint>
#include <span>

#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "ops/attention_iface.h"

namespace tern {

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight           x, out: [n_tokens, n]
void rms_norm(const float* x, const float* weight, float* out, int64_t n_tokens, int64_t n,
              float eps, ThreadPool& pool);

// RoPE, "normal" layout (llama.cpp's LLAMA_ROPE_TYPE_NORM): within each head, the pairs
// (2i, 2i+1) for 2i < n_rot are rotated by pos * freq_base^(-2i/n_rot); the rest are left.
//   x: [n_tokens, n_heads * head_dim], positions: [n_tokens]
void rope_norm(float* x, const int32_t* positions, int64_t n_tokens, int64_t n_heads,
               int64_t head_dim, int64_t n_rot, float freq_base);
// The same on columns [c0, c1) of each token's row only (rows ldx floats apart; c0 even, c1 even
// or the row's end): for applying RoPE to a matmul's output rows as they are produced. Equal to
// rope_norm on those columns bit for bit.
void rope_norm_cols(float* x, int64_t ldx, const int32_t* positions, int64_t n_tokens, int64_t head_dim,
                    int64_t n_rot, float freq_base, int64_t c0, int64_t c1);
// The rotations rope_norm applies, for tabulating once per forward pass (they depend on the
// position only, not on the head or the layer): cs[t][i] = {cos, sin} of pair i of token t,
// i < n_rot / 2, computed exactly as rope_norm does.   cs: [n_tokens][n_rot / 2][2]
void rope_table(const int32_t* positions, int64_t n_tokens, int64_t n_rot, float freq_base, float* cs);
// rope_norm_cols with the rotations from rope_table: the same bits.
void rope_cols_table(float* x, int64_t ldx, const float* cs, int64_t n_tokens, int64_t head_dim,
                     int64_t n_rot, int64_t c0, int64_t c1);

// RoPE with the extensions of llama.cpp's ggml_rope_ext: per-pair frequency factors (Llama 3.x
// rope_freqs, Phi-3 LongRoPE: the frequency of pair i is divided by freq_factors[i]), linear
// position scaling (freq_scale = 1 / factor) and YaRN (ext_factor > 0: ramp between
// interpolated and extrapolated frequencies over the correction dimensions, magnitude scaled).
struct RopeParams {
  int64_t n_rot = 0;
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  const float* freq_factors = nullptr;  // [n_rot / 2] or nullptr
  float ext_factor = 0.0f;
  float attn_factor = 1.0f;
  float beta_fast = 32.0f, beta_slow = 1.0f;
  int64_t n_ctx_orig = 0;
};
// cs[t][i] = {cos, sin} (times the YaRN magnitude) of pair i of token t, as rope_table's layout.
// With no factors, scaling or YaRN: rope_table's values bit for bit.
void rope_table_ext(const int32_t* positions, int64_t n_tokens, const RopeParams& p, float* cs);
// The NeoX pair layout (llama.cpp's LLAMA_ROPE_TYPE_NEOX): within each head, element i is
// rotated with element i + n_rot/2 by pair i's angle, for i < n_rot/2.
//   x: [n_tokens][ldx], heads of head_dim from column 0; cs from rope_table(_ext)
void rope_neox_table(float* x, int64_t ldx, const float* cs, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                     int64_t n_rot);
// Each head's piece of each row RMS-normalised with the same weight (Qwen3 / Gemma 3 q/k norms).
//   x: [n_tokens][ldx] in place, weight: [head_dim]
void rms_norm_heads(float* x, int64_t ldx, const float* weight, int64_t n_tokens, int64_t n_heads,
                    int64_t head_dim, float eps);
// y[t][c] += bias[c] for c in [c0, c1), n_tokens rows ldy floats apart.
void add_bias_cols(float* y, int64_t ldy, const float* bias, int64_t n_tokens, int64_t c0, int64_t c1);
// out = gelu(gate) * up with the tanh approximation of GELU (GeGLU, Gemma), n elements.
void geglu(const float* gate, const float* up, float* out, int64_t n);
// gpt-oss's clamped SwiGLU (llama.cpp's swiglu_oai, alpha 1.702, limit 7): with g = min(gate, 7)
// and u = clamp(up, -7, 7), out = g * sigmoid(1.702 g) * (u + 1), n elements; out may alias.
void swiglu_oai(const float* gate, const float* up, float* out, int64_t n);
// ReGLU: out = max(gate, 0) * up (a ReLU-fied SwiGLU; exactly 0 where gate <= 0).
void reglu(const float* gate, const float* up, float* out, int64_t n);
// Mamba's selective scan (SsmScanArgs, ops/attention_iface.h) on channels [c0, c1): the selected
// ISA's variant (TERN_FORCE_ISA picks one), or the given one (tests). The scalar reference uses
// std::exp; the SIMD variants the attention kernels' exp (relative error ~2e-7).
void ssm_scan(const SsmScanArgs& a, int64_t c0, int64_t c1);
void ssm_scan_isa(Isa isa, const SsmScanArgs& a, int64_t c0, int64_t c1);
// Mamba-2's scan (Ssm2ScanArgs, ops/attention_iface.h) on heads [h0, h1): a scalar decay per
// head and B/C shared by a group's heads; the variants as for ssm_scan (the decay is std::exp
// in every one of them, so they differ from the reference only in the order of the sums).
void ssm2_scan(const Ssm2ScanArgs& a, int64_t h0, int64_t h1);
void ssm2_scan_isa(Isa isa, const Ssm2ScanArgs& a, int64_t h0, int64_t h1);
// The same scan in the chunked ("SSD") form (attention_iface.h), chunks of `chunk` tokens: for
// prefill, where it turns the per-token state updates into small matrix products (models/
// ssm2_block.h decides when). Its results (y and the state left) equal ssm2_scan's up to float
// rounding, not bit for bit (tests/ops/test_ssm2_chunked.cpp); Isa::Ref is a scalar reference
// of the chunked arithmetic. Scratch: a thread_local buffer of the calling thread.
void ssm2_scan_chunked(const Ssm2ScanArgs& a, int64_t h0, int64_t h1, int64_t chunk);
void ssm2_scan_chunked_isa(Isa isa, const Ssm2ScanArgs& a, int64_t h0, int64_t h1, int64_t chunk);
// RWKV-7's WKV recurrence (Wkv7Args, ops/attention_iface.h) on heads [h0, h1); the variants
// differ from the scalar reference only in the order of the sums (tests/ops/test_attention.cpp).
void wkv7(const Wkv7Args& a, int64_t h0, int64_t h1);
void wkv7_isa(Isa isa, const Wkv7Args& a, int64_t h0, int64_t h1);
// Qwen3-Next's gated delta rule (GatedDeltaArgs, ops/attention_iface.h) on value heads [h0, h1);
// the variants differ from the scalar reference (ggml's order of operations, exp as std::exp)
// only in the order of the sums (tests/models/test_qwen3next.cpp).
void gated_delta(const GatedDeltaArgs& a, int64_t h0, int64_t h1);
void gated_delta_isa(Isa isa, const GatedDeltaArgs& a, int64_t h0, int64_t h1);
// RWKV-6's WKV recurrence (Wkv6Args, ops/attention_iface.h) on heads [h0, h1). The scalar
// reference is ggml's scalar loop (a multiply, then an add); the variants are ggml's SIMD loop
// (fused multiply-adds), so they differ from the reference only by the rounding of the fused
// operations, never in the order of a sum (tests/models/test_rwkv6.cpp).
void wkv6(const Wkv6Args& a, int64_t h0, int64_t h1);
void wkv6_isa(Isa isa, const Wkv6Args& a, int64_t h0, int64_t h1);
// x = cap * tanh(x / cap) elementwise (final-logit soft-capping).
void softcap_inplace(float* x, int64_t n, float cap);

// out = silu(gate) * up, elementwise over [n_tokens, n_ff] (SwiGLU).
void swiglu(const float* gate, const float* up, float* out, int64_t n, ThreadPool& pool);
// out = silu(gate) * up on columns [c0, c1) of n_tokens rows (ld floats apart), on the calling
// thread; the same arithmetic as swiglu().
void swiglu_cols(const float* gate, const float* up, float* out, int64_t ld, int64_t n_tokens, int64_t c0,
                 int64_t c1);

// x += y elementwise.
void add_inplace(float* x, const float* y, int64_t n);

// dst[i] = IEEE half of src[i], rounded to nearest even: what a KvType::F16 arena stores. Every
// variant gives the same bits (vcvtps2ph with _MM_FROUND_TO_NEAREST_INT, or core/fp16.h's
// converter; a NaN stays a NaN with its sign and top payload bits, quieted).
void convert_f32_to_f16(const float* src, uint16_t* dst, int64_t n);

// Elements [e0, e0 + n) of the K (is_v false) or V row of `slot` in a kivi2 layer
// (attention_iface.h's KiviLayer, rows of kv_row elements) as f32: the values the attention
// kernels read (an open group's halves widened; a sealed one's fma(code, step, minimum)).
void kivi_row_to_f32(const KiviLayer& layer, int64_t kv_row, int64_t slot, bool is_v, int64_t e0, int64_t n,
                     float* dst);
void convert_f32_to_f16_isa(Isa isa, const float* src, uint16_t* dst, int64_t n);  // tests

// Causal attention of a batch of sequences over their KV caches (AttentionArgs in
// ops/attention_iface.h): flash-style, tiled over query rows and key blocks with an online
// softmax; no n x n score matrix exists. K/V are f32 or IEEE half (AttentionArgs::kv_type), a
// half widened to f32 as it is loaded (exact). The query heads of one GQA group share each K/V row
// they load. A row's result does not depend on the other rows of the batch, so a sequence's
// output is the same alone, in a prefill chunk or in a batch of decodes.
void attention(std::span<const AttentionArgs> seqs, ThreadPool& pool);
// The query heads of KV head `kvh` of one sequence, every new token, on the calling thread
// alone (for callers that split heads across threads themselves); equal to attention()'s
// result for those heads bit for bit.
void attention_kv_head(const AttentionArgs& a, int64_t kvh);
// The same with a chosen kernel variant (tests; TERN_FORCE_ISA selects for attention()):
// Isa::Ref is the scalar reference, one query row at a time with a per-key online softmax.
void attention_isa(Isa isa, std::span<const AttentionArgs> seqs, ThreadPool& pool);

}  // namespace tern
