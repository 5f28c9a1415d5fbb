#pragma once
// The one table of GGUF tensor names (llama.cpp's, src/llama-arch.cpp), used by the loader,
// `tern synth`, the llama2.c import and compress/. Per-layer names are "blk.<il>.<stem>.weight"
// (or ".bias").
#include <cstdint>
#include <string>

namespace tern {

enum class Tensor {
  TokenEmbd,      // token_embd          [n_embd, n_vocab]
  OutputNorm,     // output_norm         [n_embd]
  Output,         // output              [n_embd, n_vocab]   (absent: tied to token_embd)
  RopeFreqs,      // rope_freqs          [n_rot / 2]         (Llama 3.x frequency factors)
  AttnNorm,       // blk.N.attn_norm     [n_embd]
  AttnQ,          // blk.N.attn_q        [n_embd, n_head * head_dim]
  AttnK,          // blk.N.attn_k        [n_embd, n_head_kv * head_dim]
  AttnV,          // blk.N.attn_v        [n_embd, n_head_kv * head_dim]
  AttnQkv,        // blk.N.attn_qkv      [n_embd, (n_head + 2 n_head_kv) * head_dim]  (Phi-3)
  AttnOutput,     // blk.N.attn_output   [n_head * head_dim, n_embd]
  AttnQNorm,      // blk.N.attn_q_norm   [head_dim]          (Qwen3, Gemma 3)
  AttnKNorm,      // blk.N.attn_k_norm   [head_dim]
  AttnPostNorm,   // blk.N.post_attention_norm [n_embd]      (Gemma 2/3; gpt-oss: the FFN's input norm)
  AttnSinks,      // blk.N.attn_sinks    [n_head]            (gpt-oss: one softmax sink logit per head)
  FfnNorm,        // blk.N.ffn_norm      [n_embd]
  FfnGate,        // blk.N.ffn_gate      [n_embd, n_ff]
  FfnUp,          // blk.N.ffn_up        [n_embd, n_ff]      (Phi-3: [n_embd, 2 n_ff], gate then up)
  FfnDown,        // blk.N.ffn_down      [n_ff, n_embd]
  FfnPostNorm,    // blk.N.post_ffw_norm [n_embd]            (Gemma 2/3)
  FfnGateInp,     // blk.N.ffn_gate_inp  [n_embd, n_expert]  (router)
  FfnGateExps,    // blk.N.ffn_gate_exps [n_embd, n_ff_exp, n_expert]
  FfnUpExps,      // blk.N.ffn_up_exps   [n_embd, n_ff_exp, n_expert]
  FfnDownExps,    // blk.N.ffn_down_exps [n_ff_exp, n_embd, n_expert]
  FfnGateInpShexp,// blk.N.ffn_gate_inp_shexp [n_embd]       (Qwen2-MoE shared expert's gate)
  FfnGateShexp,   // blk.N.ffn_gate_shexp [n_embd, n_ff_shexp]
  FfnUpShexp,     // blk.N.ffn_up_shexp   [n_embd, n_ff_shexp]
  FfnDownShexp,   // blk.N.ffn_down_shexp [n_ff_shexp, n_embd]
  // State-space layers (Mamba).
  SsmIn,          // blk.N.ssm_in        [n_embd, 2 d_inner]  (x rows, then z rows)
  SsmConv1d,      // blk.N.ssm_conv1d    [d_conv, d_inner]    (+ bias [d_inner])
  SsmX,           // blk.N.ssm_x         [d_inner, dt_rank + 2 d_state]  (dt, B, C)
  SsmDt,          // blk.N.ssm_dt        [dt_rank, d_inner]   (+ bias [d_inner])
  SsmA,           // blk.N.ssm_a         [d_state, d_inner]   (-exp(A_log), as converted; no suffix)
  SsmD,           // blk.N.ssm_d         [d_inner]            (no suffix)
  SsmOut,         // blk.N.ssm_out       [d_inner, n_embd]
  // Mamba-2 (G = n_group, H = the SSM's heads): ssm_in is [n_embd, 2 d_inner + 2 G d_state + H]
  // (z, then x B C, then dt), ssm_conv1d [d_conv, d_inner + 2 G d_state], ssm_dt.bias [H],
  // ssm_a and ssm_d [1, H], and:
  SsmNorm,        // blk.N.ssm_norm      [d_inner / G, G]     (the grouped RMSNorm's weight)
  // Qwen3-Next's gated delta-net layers ("qwen3next"; Hk key heads and Hv value heads of S, conv
  // channels C = 2 Hk S + Hv S): attn_qkv [n_embd, C] (q, k, v rows), ssm_conv1d [d_conv, C] (no
  // bias), ssm_dt.bias [Hv], ssm_a [Hv] (-exp(A_log), no suffix), ssm_norm [S], ssm_out [Hv S, n_embd],
  // and attn_gate below (older converters: ssm_in [n_embd, 2 Hk S + 2 Hv S] in place of attn_qkv
  // and attn_gate, its rows q, k, v, z grouped per key head):
  AttnGate,       // blk.N.attn_gate     [n_embd, Hv S]       (z, the output norm's SiLU gate)
  SsmBetaAlpha,   // blk.N.ssm_ba        [n_embd, 2 Hv]       (per key head: its value heads' b, then a)
  // Multi-head latent attention (DeepSeek-V2/V3, "deepseek2"; R = q_lora_rank, C = kv_lora_rank,
  // dk = key_length_mla = nope + rope, dv = value_length_mla):
  AttnQA,         // blk.N.attn_q_a       [n_embd, R]          (absent when R = 0: attn_q [n_embd, n_head dk])
  AttnQANorm,     // blk.N.attn_q_a_norm  [R]
  AttnQB,         // blk.N.attn_q_b       [R, n_head dk]
  AttnKvAMqa,     // blk.N.attn_kv_a_mqa  [n_embd, C + rope]   (the latent, then the shared roped key)
  AttnKvANorm,    // blk.N.attn_kv_a_norm [C]
  AttnKB,         // blk.N.attn_k_b       [nope, C, n_head]    (k_nope = k_b^T latent, per head)
  AttnVB,         // blk.N.attn_v_b       [C, dv, n_head]      (v = v_b latent, per head)
  AttnKvB,        // blk.N.attn_kv_b      [C, n_head (nope + dv)]  (older converters; tern asks for k_b / v_b)
  FfnExpProbsB,   // blk.N.exp_probs_b.bias [n_expert]         (DeepSeek-V3: selection bias of the router)
  // RWKV-7 ("rwkv7"; E = n_embd, F = feed_forward_length, R* = the LoRA ranks; every norm a
  // LayerNorm with .weight and .bias; the model's tensors as llama.cpp's converter writes them):
  TokenEmbdNorm,      // token_embd_norm              [E]        (+ bias; the first LayerNorm)
  AttnNorm2,          // blk.N.attn_norm_2            [E]        (+ bias; the channel mix's norm)
  TimeMixLerpFused,   // blk.N.time_mix_lerp_fused    [E, 1, 1, 6] (r w k v a g token-shift mixes, f32)
  TimeMixW0,          // blk.N.time_mix_w0            [E]
  TimeMixW1,          // blk.N.time_mix_w1            [E, Rdecay]  (f32)
  TimeMixW2,          // blk.N.time_mix_w2            [Rdecay, E]  (f32)
  TimeMixA0,          // blk.N.time_mix_a0            [E]
  TimeMixA1,          // blk.N.time_mix_a1            [E, Riclr]
  TimeMixA2,          // blk.N.time_mix_a2            [Riclr, E]
  TimeMixV0,          // blk.N.time_mix_v0            [E]        (layer 0: unused copies of a0/a1/a2)
  TimeMixV1,          // blk.N.time_mix_v1            [E, Rvalue_res]
  TimeMixV2,          // blk.N.time_mix_v2            [Rvalue_res, E]
  TimeMixG1,          // blk.N.time_mix_g1            [E, Rgate]
  TimeMixG2,          // blk.N.time_mix_g2            [Rgate, E]
  TimeMixKK,          // blk.N.time_mix_k_k           [E]
  TimeMixKA,          // blk.N.time_mix_k_a           [E]
  TimeMixRK,          // blk.N.time_mix_r_k           [E]
  TimeMixKey,         // blk.N.time_mix_key           [E, E]
  TimeMixValue,       // blk.N.time_mix_value         [E, E]
  TimeMixReceptance,  // blk.N.time_mix_receptance    [E, E]
  TimeMixLn,          // blk.N.time_mix_ln            [E]        (+ bias; the per-head group norm)
  TimeMixOutput,      // blk.N.time_mix_output        [E, E]
  ChannelMixLerpK,    // blk.N.channel_mix_lerp_k     [E]
  ChannelMixKey,      // blk.N.channel_mix_key        [E, F]
  ChannelMixValue,    // blk.N.channel_mix_value      [F, E]
  // RWKV-6 ("rwkv6"; D = time_mix_extra_dim, Dd = time_decay_extra_dim, N = wkv.head_size; also
  // reads TokenEmbdNorm, AttnNorm2, TimeMixLerpFused [E, 1, 1, 5] (w k v r g), TimeMixW1
  // [E, 5 D], TimeMixW2 [D, E, 5], TimeMixKey / Value / Receptance / Output [E, E], TimeMixLn,
  // ChannelMixLerpK, ChannelMixKey [E, F] and ChannelMixValue [F, E] above):
  TimeMixLerpX,       // blk.N.time_mix_lerp_x        [E]        (the mixes' LoRA input mix)
  TimeMixLerpW,       // blk.N.time_mix_lerp_w        [E]        (older files: the fused mix's
  TimeMixLerpK,       // blk.N.time_mix_lerp_k        [E]         five parts as five tensors)
  TimeMixLerpV,       // blk.N.time_mix_lerp_v        [E]
  TimeMixLerpR,       // blk.N.time_mix_lerp_r        [E]
  TimeMixLerpG,       // blk.N.time_mix_lerp_g        [E]
  TimeMixFirst,       // blk.N.time_mix_first         [N, E / N] (the bonus u, f32)
  TimeMixDecay,       // blk.N.time_mix_decay         [E]
  TimeMixDecayW1,     // blk.N.time_mix_decay_w1      [E, Dd]    (f32)
  TimeMixDecayW2,     // blk.N.time_mix_decay_w2      [Dd, E]    (f32)
  TimeMixGate,        // blk.N.time_mix_gate          [E, E]
  ChannelMixLerpR,    // blk.N.channel_mix_lerp_r     [E]
  ChannelMixReceptance,  // blk.N.channel_mix_receptance [E, E]
};

// The stem of a tensor's name ("attn_q", "token_embd").
const char* tensor_stem(Tensor t);
// Whether the tensor belongs to a layer (named blk.<il>.<stem>).
bool tensor_per_layer(Tensor t);
// "token_embd.weight", "blk.3.attn_q.weight", "blk.3.attn_q.bias"; suffix "": no suffix
// (Mamba's "blk.3.ssm_a" and "blk.3.ssm_d", as llama.cpp names them).
std::string tensor_name(Tensor t, int64_t il = -1, const char* suffix = "weight");

}  // namespace tern
