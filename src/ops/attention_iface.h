#pragma once
// Plain-data interface between ops/ops.cpp and the ISA variants of the tiled attention kernel
// (attention_avx2.cpp, attention_avx512.cpp, attention_neon.cpp). Like kernels/kernel_iface.h, nothing here is an
// inline function: an ISA translation unit must not emit a copy of shared inline code that the
// linker could then hand to baseline callers.
#include <cstdint>

namespace tern {

// Element type of a K/V arena: f32; IEEE half (converted to f32 as the kernels load it; values
// are rounded to nearest even when stored, see convert_f32_to_f16 in ops.h); or llama.cpp's
// q8_0 / q4_0 blocks of 32 along each slot's row (a row of n_head_kv * head_dim elements is
// row / 32 blocks; a head's slice may start inside a block, its 8-element pieces never cross
// one). Sizes, names and the quantizer are kv/kv_type.h's traits table.
// Kivi2: KIVI's 2-bit cache (KiviLayer below).
enum class KvType : int32_t { F32 = 0, F16 = 1, Q8_0 = 2, Q4_0 = 3, Kivi2 = 4 };

// The quantized K/V blocks as the kernels read them (llama.cpp's block_q8_0 / block_q4_0):
//   q8_0: fp16 d | int8 q[32]                        x = q * d
//   q4_0: fp16 d | uint8 qs[16] (element j < 16 in the low nibble of qs[j], j >= 16 in the high
//         nibble of qs[j - 16])                       x = (nibble - 8) * d
inline constexpr int64_t kKvQuantBlock = 32;
inline constexpr int64_t kKvQ8_0BlockBytes = 34;
inline constexpr int64_t kKvQ4_0BlockBytes = 18;

// KIVI 2-bit K/V (KvType::Kivi2; Liu et al. 2024, "KIVI: a tuning-free asymmetric 2bit
// quantization for KV cache"): keys per channel, values per token, the newest keys and values
// in full precision. Slots form groups of kKiviGroup consecutive slots (a sequence's positions
// in order: the Session's contiguous slots, or one paged block of a multiple of 32). A group is
//   open:   its rows are fp16 in a stage (stage_of[g] >= 0): the full-precision recent window;
//   sealed: (stage_of[g] < 0) K as 2-bit codes per slot with one fp16 step and minimum per
//           channel for the group's 32 slots; V as per-token blocks of 32 elements, each with
//           its own fp16 step and minimum.
// kv/kv_store.cpp seals a group when its last slot is written and reopens one (dequantizing
// it into a stage) when a sealed slot is written again.
// 2-bit codes of 32 elements sit in 8 bytes: element j at bits 2 (j / 8) of byte j % 8, so 8
// consecutive elements from a multiple of 8 are one shift and mask of 8 bytes. An element is
// fma(code, step, minimum), in float (one rounding: the kernels and the scalar decoder agree).
//   K of slot s, element e (sealed): codes k_codes[s * kv_row / 4 + e / 32 * 8 ..], step
//     k_step[g * kv_row + e], minimum k_min[g * kv_row + e], g = s / kKiviGroup
//   V of slot s, block b (sealed): v_blocks + (s * kv_row / 32 + b) * kKiviVBlockBytes:
//     fp16 step | fp16 minimum | uint8 codes[8]
//   open group g, stage i = stage_of[g]: K row of slot s at stages[i] + (s % kKiviGroup) * kv_row,
//     its V row at stages[i] + (kKiviGroup + s % kKiviGroup) * kv_row
// Averaged over a group, K and V each take 3 bits an element (2-bit codes; K's two fp16 per
// channel per 32 slots; V's two fp16 per 32 elements).
inline constexpr int64_t kKiviGroup = 32;
inline constexpr int64_t kKiviVBlockBytes = 12;
struct KiviLayer {
  const uint8_t* k_codes;   // [n_slots][kv_row / 4]
  const uint16_t* k_step;   // [n_groups][kv_row] fp16
  const uint16_t* k_min;    // [n_groups][kv_row] fp16
  const uint8_t* v_blocks;  // [n_slots][kv_row / 32] blocks
  const int32_t* stage_of;  // [n_groups]: -1 sealed, else the group's stage
  const uint16_t* const* stages;  // [n_stages] -> fp16 [K, V][kKiviGroup][kv_row]
};

// Causal attention of one sequence's new tokens over its KV cache (see ops.h).
//
//   q:   [n_tokens, n_head * head_dim]     (rows ldq floats apart)
//   out: [n_tokens, n_head * head_dim]     (rows ldo floats apart)
//   K/V of position p live at k_base + slots[p] * kv_row (same for v), kv_row = n_head_kv*head_dim
//   elements of kv_type (float or uint16_t half; for q8_0 / q4_0 rows of kv_row / 32 blocks;
//   for kivi2 k_base and v_base both point at the layer's KiviLayer)
//   new token i sits at position n_past + i and sees positions 0 .. n_past + i, or with a
//   sliding window of `window` positions only n_past + i - window + 1 .. n_past + i (llama.cpp's
//   rule: a key at distance window or more is masked).
//   softcap > 0: each scaled score s becomes softcap * tanh(s / softcap) before the softmax
//   (Gemma 2's attention-logit soft-capping).
//   sinks (gpt-oss): one learned logit per query head that joins every row's softmax as one more
//   "key" with no value: out = sum_p exp(s_p - m) v_p / (sum_p exp(s_p - m) + exp(sink - m)), m the
//   maximum over the scores and the sink (llama.cpp's soft_max_ext with sinks).
//   GQA: query head h reads KV head h / (n_head / n_head_kv); K/V are never copied per head.
struct AttentionArgs {
  const float* q;
  int64_t ldq;
  float* out;
  int64_t ldo;
  const void* k_base;    // elements of kv_type
  const void* v_base;
  int64_t kv_row;        // elements
  const int32_t* slots;  // [n_past + n_tokens]
  int64_t n_past;
  int64_t n_tokens;
  int64_t n_head;
  int64_t n_head_kv;
  int64_t head_dim;
  float scale;  // 1/sqrt(head_dim)
  KvType kv_type = KvType::F32;
  float softcap = 0.0f;  // 0: none
  int64_t window = 0;    // 0: the whole context
  const float* sinks = nullptr;  // [n_head] per-head sink logits (already scaled), nullptr: none
  // When set (H2O): key_mass[kvh * ld_key_mass + p] += the softmax probability of key p, summed
  // over the new tokens and the query heads of KV head kvh. Written by the tiles of one KV head
  // only, so heads never race; the values do not depend on how rows are tiled up to rounding.
  float* key_mass = nullptr;
  int64_t ld_key_mass = 0;  // >= n_past + n_tokens
};

// Mamba's selective scan (models/mamba.cpp) over one sequence's n_tokens, per channel c:
//   dt = softplus(dt_raw[t][c])      (ggml's: dt_raw itself above 20)
//   h[c][s] = h[c][s] exp(dt A[c][s]) + B[t][s] (u[t][c] dt)         for s < d_state
//   y[t][c] = (sum_s h[c][s] C[t][s] + D[c] u[t][c]) silu(z[t][c])
// A <= 0 (the file holds -exp(A_log); the loader checks). Rows of each [n_tokens][ld] input are
// `ld` floats apart; h is the sequence's state, [d_inner][d_state], read and left updated.
struct SsmScanArgs {
  const float* u;   // [n][ldu], channel c at column c
  int64_t ldu;
  const float* dt;  // [n][lddt] before softplus
  int64_t lddt;
  const float* b;   // [n][ldbc] B; C at c
  const float* c;
  int64_t ldbc;
  const float* z;   // [n][ldz] the gate
  int64_t ldz;
  const float* a;   // [d_inner][d_state]
  const float* d;   // [d_inner]
  float* h;         // [d_inner][d_state]
  float* y;         // [n][ldy]
  int64_t ldy;
  int64_t n_tokens;
  int64_t d_state;
};

// Mamba-2's scan (models/mamba2.cpp) over one sequence's n_tokens, per head hd of head_dim
// channels c = hd * head_dim + p, whose B and C are those of group g = hd / heads_per_group:
//   dt = softplus(dt_raw[t][hd])     (the bias already added; ggml's: dt_raw itself above 20)
//   h[c][s] = h[c][s] exp(dt A[hd]) + B[t][g][s] (x[t][c] dt)        for s < d_state
//   y[t][c] = (sum_s h[c][s] C[t][g][s] + D[hd] x[t][c]) silu(z[t][c])
// One scalar A <= 0 per head (the loader checks), so the decay is one exp per head and token.
// Rows of each [n_tokens][ld] input are `ld` floats apart; group g's B is at b + g * d_state
// (C likewise); h is the sequence's state, [n_head * head_dim][d_state], read and left updated.
struct Ssm2ScanArgs {
  const float* x;   // [n][ldx], channel c at column c
  int64_t ldx;
  const float* dt;  // [n][lddt], head hd at column hd, before softplus
  int64_t lddt;
  const float* b;   // [n][ldbc] B of every group; C at c
  const float* c;
  int64_t ldbc;
  const float* z;   // [n][ldz] the gate
  int64_t ldz;
  const float* a;   // [n_head]
  const float* d;   // [n_head]
  float* h;         // [n_head * head_dim][d_state]
  float* y;         // [n][ldy]
  int64_t ldy;
  int64_t n_tokens;
  int64_t d_state;
  int64_t head_dim;
  int64_t heads_per_group;
};

// The same scan in Mamba-2's chunked ("SSD", state-space duality) form, for prefill: the tokens
// in chunks of L, per head and chunk (a_t = dt_t A[hd], t and s within the chunk):
//   seg(t, s) = a_{s+1} + ... + a_t (s <= t; summed directly, never as a difference of cumulative
//               sums), cum(t) = a_0 + ... + a_t
//   y[t] = exp(cum(t)) C[t] h_in + sum_{s <= t} (C[t] . B[s]) exp(seg(t, s)) dt_s x[s]
//   h_out = exp(cum(L - 1)) h_in + sum_s exp(seg(L - 1, s)) dt_s x[s] B[s]^T
// then D x and the silu(z) gate as above: small matrix products, the state read and written once
// per chunk. Mathematically the recurrence; in floats it differs from it by rounding (ops.h).
// Floats of scratch one call of a variant needs for chunks of `chunk` tokens.
constexpr int64_t ssm2_chunked_scratch_floats(int64_t d_state, int64_t head_dim, int64_t chunk) {
  // C^T [d_state][Lp] | (B C^T) [Lp][Lp] | decay-masked (B C^T) [Lp][Lp] | B dt decay [Lp][d_state] |
  // y^T [head_dim][Lp] and y [Lp][head_dim] | 7 rows of Lp (dt, a, cum, decays, segment sums) | a y row
  const int64_t lp = (chunk + 15) / 16 * 16;
  return 2 * d_state * lp + 2 * lp * lp + 2 * head_dim * lp + 7 * lp + head_dim;
}

// RWKV-7's WKV recurrence (models/rwkv7.cpp; ggml_rwkv_wkv7) over one sequence's n_tokens, per
// head h of head_size channels (i, j < head_size, index h * head_size + i), with the head's state
// S [head_size][head_size] (row i: value channel i, column j: key channel j):
//   sa_i = sum_j a[t][j] S[i][j]
//   S[i][j] = S[i][j] w[t][j] + v[t][i] k[t][j] + sa_i b[t][j]
//   y[t][i] = sum_j S[i][j] r[t][j]
// Rows of each [n_tokens][ld] input are `ld` floats apart; s is the sequence's state, [n_head]
// [head_size][head_size], read and left updated.
struct Wkv7Args {
  const float* r;
  const float* w;
  const float* k;
  const float* v;
  const float* a;
  const float* b;
  int64_t ld;
  float* s;
  float* y;  // [n][ldy]
  int64_t ldy;
  int64_t n_tokens;
  int64_t head_size;
};

// RWKV-6's WKV recurrence (models/rwkv6.cpp; ggml_rwkv_wkv6) over one sequence's n_tokens, per
// head h of head_size channels (i, j < head_size, index h * head_size + i), with the head's state
// S [head_size][head_size] (row i: key channel i, column j: value channel j) and the bonus u
// (time_mix_first, one per channel, the same for every token):
//   y[t][j] = sum_i r[t][i] (S[i][j] + u[i] k[t][i] v[t][j])      (summed over i in order)
//   S[i][j] = S[i][j] w[t][i] + k[t][i] v[t][j]
// Rows of each [n_tokens][ld] input are `ld` floats apart; s is the sequence's state, [n_head]
// [head_size][head_size], read and left updated; y is written (not accumulated into).
struct Wkv6Args {
  const float* r;
  const float* k;
  const float* v;
  const float* w;
  int64_t ld;
  const float* u;  // [n_head * head_size]
  float* s;
  float* y;  // [n][ldy]
  int64_t ldy;
  int64_t n_tokens;
  int64_t head_size;
};

// Qwen3-Next's gated delta rule (models/delta_net_block.h; ggml_gated_delta_net) over one
// sequence's n_tokens, per value head h of S = head_dim channels, which reads key head
// h / heads_per_key (q and k repeated to the value heads as llama.cpp's repeat does: key head g
// serves value heads g r .. g r + r - 1), with the head's state M [S][S] (row j: value channel j,
// column i: key channel i, ggml's layout):
//   M = M exp(g[t][h])
//   d_j = (v[t][j] - sum_i M[j][i] k[t][i]) beta[t][h]
//   M[j][i] += k[t][i] d_j
//   o[t][j] = scale sum_i M[j][i] q[t][i]
// Rows of each [n_tokens][ld] input are `ld` floats apart (q and k L2-normalised already); s is
// the sequence's state, [n_v_heads][S][S], read and left updated.
struct GatedDeltaArgs {
  const float* q;     // [n][ldqk], key head g at column g * S
  const float* k;
  int64_t ldqk;
  const float* v;     // [n][ldv], value head h at column h * S
  int64_t ldv;
  const float* g;     // [n][ldgb] log decay of each value head (<= 0)
  const float* beta;  // [n][ldgb]
  int64_t ldgb;
  float* s;           // [n_v_heads][S][S]
  float* o;           // [n][ldo], value head h at column h * S
  int64_t ldo;
  int64_t n_tokens;
  int64_t head_dim;
  int64_t heads_per_key;  // n_v_heads / n_k_heads
  float scale;            // 1 / sqrt(head_dim)
};

namespace attn {

// Keys per tile: the kernel walks the context in blocks of this many positions.
constexpr int64_t kKeyBlock = 64;

// Floats of scratch one tile of `n_rows` query rows (tokens x heads of one KV group) needs.
constexpr int64_t tile_scratch_floats(int64_t head_dim, int64_t n_rows) {
  // Kt [head_dim][kKeyBlock] | S [n_rows][kKeyBlock] | O [n_rows][head_dim] | m, l [n_rows] |
  // Vf [kKeyBlock][head_dim]
  return 2 * head_dim * kKeyBlock + n_rows * kKeyBlock + n_rows * head_dim + 2 * n_rows;
}

// One tile: query tokens [i0, i1) of `a`, every query head of KV head `kvh` (the GQA group
// shares each K/V row it loads). Rows are independent: a row's result does not depend on which
// other rows share its tile, so batching never changes a sequence's output.
void attention_tile_avx2(const AttentionArgs& a, int64_t kvh, int64_t i0, int64_t i1, float* scratch);
void attention_tile_avx512(const AttentionArgs& a, int64_t kvh, int64_t i0, int64_t i1, float* scratch);
void attention_tile_neon(const AttentionArgs& a, int64_t kvh, int64_t i0, int64_t i1, float* scratch);

// out[i] = silu(gate[i]) * up[i] for i < n (SwiGLU), vectorised with the attention kernels'
// exp; out may alias gate or up.
void silu_mul_avx2(const float* gate, const float* up, float* out, int64_t n);
void silu_mul_avx512(const float* gate, const float* up, float* out, int64_t n);
void silu_mul_neon(const float* gate, const float* up, float* out, int64_t n);

// dst[i] = IEEE half of src[i], rounded to nearest even (vcvtps2ph with _MM_FROUND_TO_NEAREST_INT:
// the same bits as core/fp16.h's f32_to_fp16 for every non-NaN input).
void f32_to_f16_avx2(const float* src, uint16_t* dst, int64_t n);
void f32_to_f16_avx512(const float* src, uint16_t* dst, int64_t n);
void f32_to_f16_neon(const float* src, uint16_t* dst, int64_t n);

// The selective scan (SsmScanArgs) on channels [c0, c1), vectorised over the states (16 at a
// time, exp as the attention kernels compute it).
void ssm_scan_avx2(const SsmScanArgs& a, int64_t c0, int64_t c1);
void ssm_scan_avx512(const SsmScanArgs& a, int64_t c0, int64_t c1);
void ssm_scan_neon(const SsmScanArgs& a, int64_t c0, int64_t c1);
// Mamba-2's scan (Ssm2ScanArgs) on heads [h0, h1), vectorised over the states.
void ssm2_scan_avx2(const Ssm2ScanArgs& a, int64_t h0, int64_t h1);
void ssm2_scan_avx512(const Ssm2ScanArgs& a, int64_t h0, int64_t h1);
void ssm2_scan_neon(const Ssm2ScanArgs& a, int64_t h0, int64_t h1);
// Its chunked form (ssm2_chunked_impl.h) on heads [h0, h1), chunks of `chunk` tokens; scratch:
// ssm2_chunked_scratch_floats(d_state, head_dim, chunk) floats.
void ssm2_scan_chunked_avx2(const Ssm2ScanArgs& a, int64_t h0, int64_t h1, int64_t chunk, float* scratch);
void ssm2_scan_chunked_avx512(const Ssm2ScanArgs& a, int64_t h0, int64_t h1, int64_t chunk, float* scratch);
void ssm2_scan_chunked_neon(const Ssm2ScanArgs& a, int64_t h0, int64_t h1, int64_t chunk, float* scratch);
// RWKV-7's WKV (Wkv7Args) on heads [h0, h1), vectorised over a state row (wkv7_impl.h).
void wkv7_avx2(const Wkv7Args& a, int64_t h0, int64_t h1);
void wkv7_avx512(const Wkv7Args& a, int64_t h0, int64_t h1);
void wkv7_neon(const Wkv7Args& a, int64_t h0, int64_t h1);
// The gated delta rule (GatedDeltaArgs) on value heads [h0, h1), vectorised over a state row
// (gated_delta_impl.h).
void gated_delta_avx2(const GatedDeltaArgs& a, int64_t h0, int64_t h1);
void gated_delta_avx512(const GatedDeltaArgs& a, int64_t h0, int64_t h1);
void gated_delta_neon(const GatedDeltaArgs& a, int64_t h0, int64_t h1);
// RWKV-6's WKV (Wkv6Args) on heads [h0, h1), vectorised over the value channels (wkv6_impl.h).
void wkv6_avx2(const Wkv6Args& a, int64_t h0, int64_t h1);
void wkv6_avx512(const Wkv6Args& a, int64_t h0, int64_t h1);
void wkv6_neon(const Wkv6Args& a, int64_t h0, int64_t h1);

}  // namespace attn
}  // namespace tern
