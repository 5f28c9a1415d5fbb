#include "models/synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <memory>

#include "core/error.h"
#include "core/thread_pool.h"
#include "models/arch.h"
#include "models/hparams.h"
#include "models/tensor_names.h"
#include "quant/quant_traits.h"

namespace tern {

const std::vector<SynthShape>& synth_shapes() {
  // Public configurations of these models (config.json); random weights, real sizes. The
  // "-tiny" shapes keep each architecture's features at a few hundred KB, for tests (a small
  // sliding window so that generations cross it, MoE with several experts per token).
  static const std::vector<SynthShape> kShapes = {
      {.name = "stories260k", .n_embd = 64, .n_ff = 172, .n_layer = 5, .n_head = 8, .n_head_kv = 4, .n_vocab = 512, .n_ctx = 512},
      {.name = "tinyllama-1.1b", .n_embd = 2048, .n_ff = 5632, .n_layer = 22, .n_head = 32, .n_head_kv = 4, .n_vocab = 32000, .n_ctx = 2048},
      {.name = "llama2-7b", .n_embd = 4096, .n_ff = 11008, .n_layer = 32, .n_head = 32, .n_head_kv = 32, .n_vocab = 32000, .n_ctx = 4096},
      {.name = "llama3-8b", .n_embd = 4096, .n_ff = 14336, .n_layer = 32, .n_head = 32, .n_head_kv = 8, .n_vocab = 128256,
       .n_ctx = 8192, .rope_freq_base = 500000.0f},
      // Qwen2-0.5B's sizes in the Llama architecture (no biases, Norm RoPE): the benchmark shape
      // docs/performance.md measured before the qwen2 architecture existed.
      {.name = "qwen2-0.5b", .n_embd = 896, .n_ff = 4864, .n_layer = 24, .n_head = 14, .n_head_kv = 2, .n_vocab = 151936,
       .n_ctx = 32768, .rope_freq_base = 1000000.0f, .tied_output = true},
      {.name = "qwen2.5-0.5b", .arch = "qwen2", .n_embd = 896, .n_ff = 4864, .n_layer = 24, .n_head = 14, .n_head_kv = 2,
       .n_vocab = 151936, .n_ctx = 32768, .rope_freq_base = 1000000.0f, .tied_output = true},
      {.name = "qwen3-0.6b", .arch = "qwen3", .n_embd = 1024, .n_ff = 3072, .n_layer = 28, .n_head = 16, .n_head_kv = 8,
       .n_vocab = 151936, .n_ctx = 40960, .rope_freq_base = 1000000.0f, .tied_output = true, .head_dim = 128},
      {.name = "llama3.2-1b", .n_embd = 2048, .n_ff = 8192, .n_layer = 16, .n_head = 32, .n_head_kv = 8, .n_vocab = 128256,
       .n_ctx = 131072, .rope_freq_base = 500000.0f, .tied_output = true, .llama3_rope_ctx = 8192},
      {.name = "phi3-mini", .arch = "phi3", .n_embd = 3072, .n_ff = 8192, .n_layer = 32, .n_head = 32, .n_head_kv = 32,
       .n_vocab = 32064, .n_ctx = 4096, .n_swa = 2047},
      {.name = "gemma2-2b", .arch = "gemma2", .n_embd = 2304, .n_ff = 9216, .n_layer = 26, .n_head = 8, .n_head_kv = 4,
       .n_vocab = 256000, .n_ctx = 8192, .tied_output = true, .head_dim = 256, .n_swa = 4096, .attn_softcap = 50.0f,
       .final_softcap = 30.0f},
      {.name = "gemma3-1b", .arch = "gemma3", .n_embd = 1152, .n_ff = 6912, .n_layer = 26, .n_head = 4, .n_head_kv = 1,
       .n_vocab = 262144, .n_ctx = 32768, .rope_freq_base = 1000000.0f, .tied_output = true, .head_dim = 256, .n_swa = 512},
      // Mixtral's layer (8 experts, 2 per token) at a size two cores run.
      {.name = "mixtral-mini", .n_embd = 1024, .n_ff = 2816, .n_layer = 8, .n_head = 16, .n_head_kv = 4, .n_vocab = 32000,
       .n_ctx = 32768, .rope_freq_base = 1000000.0f, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 2816},
      // Qwen3-MoE's layer (many small experts, 8 per token) at a size two cores run.
      {.name = "qwen3moe-mini", .arch = "qwen3moe", .n_embd = 1024, .n_ff = 3072, .n_layer = 8, .n_head = 16,
       .n_head_kv = 4, .n_vocab = 151936, .n_ctx = 40960, .rope_freq_base = 1000000.0f, .head_dim = 128, .n_expert = 64,
       .n_expert_used = 8, .n_ff_exp = 384},
      // gpt-oss (config.json of openai/gpt-oss-20b and -120b): 2880 wide, 64 query heads of 64, 8 KV
      // heads, experts of 2880 in MXFP4 (32 of them top-4; 128 top-4), a 128-token window on
      // every other layer, YaRN x32 over 4096 tokens.
      {.name = "gpt-oss-20b", .arch = "gpt-oss", .n_embd = 2880, .n_ff = 2880, .n_layer = 24, .n_head = 64,
       .n_head_kv = 8, .n_vocab = 201088, .n_ctx = 131072, .rope_freq_base = 150000.0f, .head_dim = 64,
       .n_expert = 32, .n_expert_used = 4, .n_ff_exp = 2880, .n_swa = 128, .yarn_factor = 32.0f, .yarn_ctx_orig = 4096},
      {.name = "gpt-oss-120b", .arch = "gpt-oss", .n_embd = 2880, .n_ff = 2880, .n_layer = 36, .n_head = 64,
       .n_head_kv = 8, .n_vocab = 201088, .n_ctx = 131072, .rope_freq_base = 150000.0f, .head_dim = 64,
       .n_expert = 128, .n_expert_used = 4, .n_ff_exp = 2880, .n_swa = 128, .yarn_factor = 32.0f, .yarn_ctx_orig = 4096},
      // Mamba-1 (state-spaces/mamba-130m, -1.4b): tied embeddings, 2x inner width, 16 states per
      // channel, 4 conv taps, dt rank n_embd / 16; the converter's 2^20 context.
      {.name = "mamba-130m", .arch = "mamba", .n_embd = 768, .n_layer = 24, .n_vocab = 50280, .n_ctx = 1 << 20,
       .tied_output = true, .ssm_d_inner = 1536, .ssm_d_state = 16, .ssm_d_conv = 4, .ssm_dt_rank = 48},
      {.name = "mamba-1.4b", .arch = "mamba", .n_embd = 2048, .n_layer = 48, .n_vocab = 50280, .n_ctx = 1 << 20,
       .tied_output = true, .ssm_d_inner = 4096, .ssm_d_state = 16, .ssm_d_conv = 4, .ssm_dt_rank = 128},
      // Mamba-2 (state-spaces/mamba2-130m): 2x inner width in 24 heads of 64, 128 states, one
      // B/C group, 4 conv taps, tied embeddings, the vocabulary padded to a multiple of 16.
      {.name = "mamba2-130m", .arch = "mamba2", .n_embd = 768, .n_layer = 24, .n_vocab = 50288, .n_ctx = 1 << 20,
       .tied_output = true, .ssm_d_inner = 1536, .ssm_d_state = 128, .ssm_d_conv = 4, .ssm_dt_rank = 24,
       .ssm_n_group = 1},
      // RWKV7-Goose-World 0.1B (fla-hub/rwkv7-0.1B-world): 768 wide, 12 layers, heads of 64, FFN
      // 4x, the world vocabulary's 65536 tokens (a generated one here); LoRA ranks as the
      // converter derives them for 768 (decay 64, iclr 64, value residual 32, gate 128).
      {.name = "rwkv7-0.1b", .arch = "rwkv7", .n_embd = 768, .n_ff = 3072, .n_layer = 12, .n_vocab = 65536,
       .n_ctx = 1 << 20, .rwkv_head_size = 64, .rwkv_lora_decay = 64, .rwkv_lora_iclr = 64, .rwkv_lora_value = 32,
       .rwkv_lora_gate = 128},
      // RWKV-6-World 1.6B (RWKV/v6-Finch-1B6-HF): 2048 wide, 24 layers, heads of 64, FFN 3.5x
      // (7168), the world vocabulary's 65536 tokens (a generated one here); the converter's
      // time_mix_extra_dim 32 and time_decay_extra_dim 64 (64 / 128 only for 4096 wide), the
      // config's rescale_every 6.
      {.name = "rwkv6-1.6b", .arch = "rwkv6", .n_embd = 2048, .n_ff = 7168, .n_layer = 24, .n_vocab = 65536,
       .n_ctx = 1 << 20, .rwkv_head_size = 64, .rwkv_mix_extra = 32, .rwkv_decay_extra = 64, .rwkv_rescale_every = 6},
      // DeepSeek-V2-Lite (config.json of deepseek-ai/DeepSeek-V2-Lite): 2048 wide, 27 layers, 16
      // heads of 128 + 64 (nope + rope) with values of 128, no query compression, a latent of
      // 512; the first layer dense (10944), then 64 experts of 1408 (6 per token, softmax, not
      // renormalised) and 2 shared; YaRN x40 over 4096 with mscale_all_dim 0.707.
      {.name = "deepseek-v2-lite", .arch = "deepseek2", .n_embd = 2048, .n_ff = 10944, .n_layer = 27, .n_head = 16,
       .n_head_kv = 1, .n_vocab = 102400, .n_ctx = 163840, .n_expert = 64, .n_expert_used = 6, .n_ff_exp = 1408,
       .yarn_factor = 40.0f, .yarn_ctx_orig = 4096, .mla_kv_lora = 512, .mla_nope = 128, .mla_rope = 64, .mla_v = 128,
       .n_dense_lead = 1, .n_expert_shared = 2, .expert_weights_scale = 1.0f, .yarn_mscale_all_dim = 0.707f},
      // IBM Granite 4.0-H (config.json of ibm-granite/granite-4.0-h-micro and -h-tiny, as
      // convert_hf_to_gguf.py's GraniteHybridModel writes them): 40 layers, 4 of them attention
      // (GQA, no positional encoding), the others Mamba-2 (2x inner width in heads of 64, 128
      // states, one B/C group, 4 conv taps); tied embeddings; embedding x12, residual x0.22,
      // attention scale 1/128, logits / (h-micro 8, h-tiny 6) [the attention layers' positions
      // and the logit scales as recalled from the released configs, not read from them here].
      // h-micro: dense SwiGLU of 8192; h-tiny: 64 experts of 512 (6 per token) + a shared one of 1024.
      {.name = "granite-4.0-h-micro", .arch = "granitehybrid", .n_embd = 2048, .n_ff = 8192, .n_layer = 40,
       .n_head = 32, .n_head_kv = 8, .n_vocab = 100352, .n_ctx = 1 << 20, .tied_output = true, .ssm_d_inner = 4096,
       .ssm_d_state = 128, .ssm_d_conv = 4, .ssm_dt_rank = 64, .ssm_n_group = 1,
       .layer_kinds = "MMMMMAMMMMMMMMMAMMMMMMMMMAMMMMMMMMMAMMMM", .embd_scale = 12.0f, .residual_scale = 0.22f,
       .attn_scale = 0.0078125f, .logit_scale = 8.0f},
      {.name = "granite-4.0-h-tiny", .arch = "granitehybrid", .n_embd = 1536, .n_ff = 512, .n_layer = 40,
       .n_head = 12, .n_head_kv = 4, .n_vocab = 100352, .n_ctx = 1 << 20, .tied_output = true, .n_expert = 64,
       .n_expert_used = 6, .n_ff_exp = 512, .n_ff_shexp = 1024, .ssm_d_inner = 3072, .ssm_d_state = 128,
       .ssm_d_conv = 4, .ssm_dt_rank = 48, .ssm_n_group = 1,
       .layer_kinds = "MMMMMAMMMMMMMMMAMMMMMMMMMAMMMMMMMMMAMMMM", .embd_scale = 12.0f, .residual_scale = 0.22f,
       .attn_scale = 0.0078125f, .logit_scale = 6.0f},
      // DeepSeek-V2's layer at a size two cores run (an invented shape, for timings against
      // llama.cpp): query compression (512), V2's latent (512 + 64) and heads (128 + 64, values
      // 128), the first layer dense, then 32 experts of 512 (4 per token) and 2 shared.
      {.name = "deepseek2-mini", .arch = "deepseek2", .n_embd = 1024, .n_ff = 2816, .n_layer = 8, .n_head = 16,
       .n_head_kv = 1, .n_vocab = 32000, .n_ctx = 163840, .n_expert = 32, .n_expert_used = 4, .n_ff_exp = 512,
       .yarn_factor = 40.0f, .yarn_ctx_orig = 4096, .mla_q_lora = 512, .mla_kv_lora = 512, .mla_nope = 128,
       .mla_rope = 64, .mla_v = 128, .n_dense_lead = 1, .n_expert_shared = 2, .expert_weights_scale = 1.0f,
       .yarn_mscale_all_dim = 0.707f},
      // Qwen3-Next-80B-A3B (config.json of Qwen/Qwen3-Next-80B-A3B-Instruct, as convert_hf_to_gguf.py's
      // Qwen3NextModel writes it, without the multi-token-prediction block): 2048 wide, 48 layers,
      // every 4th gated attention (16 query heads of 256 over 2 KV heads, a quarter of each head
      // roped, base 1e7), the others gated delta-net (16 key heads and 32 value heads of 128, 4
      // conv taps); every layer 512 experts of 512 (10 per token) and a gated shared expert of 512.
      {.name = "qwen3-next-80b-a3b", .arch = "qwen3next", .n_embd = 2048, .n_ff = 5120, .n_layer = 48, .n_head = 16,
       .n_head_kv = 2, .n_vocab = 151936, .n_ctx = 262144, .rope_freq_base = 10000000.0f, .head_dim = 256,
       .n_expert = 512, .n_expert_used = 10, .n_ff_exp = 512, .n_ff_shexp = 512, .ssm_d_inner = 4096,
       .ssm_d_state = 128, .ssm_d_conv = 4, .ssm_dt_rank = 32, .ssm_n_group = 16, .full_attn_interval = 4,
       .n_rot = 64},
      // Tests.
      {.name = "llama3-tiny", .n_embd = 64, .n_ff = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_vocab = 512,
       .n_ctx = 512, .rope_freq_base = 500000.0f, .tied_output = true, .llama3_rope_ctx = 32, .init_gain = 1.0f},
      {.name = "mixtral-tiny", .n_embd = 64, .n_ff = 96, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_vocab = 512,
       .n_ctx = 512, .rope_freq_base = 1000000.0f, .n_expert = 4, .n_expert_used = 2, .n_ff_exp = 96, .init_gain = 1.0f},
      {.name = "qwen2-tiny", .arch = "qwen2", .n_embd = 64, .n_ff = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
       .n_vocab = 512, .n_ctx = 512, .rope_freq_base = 1000000.0f, .tied_output = true, .init_gain = 1.0f},
      {.name = "qwen2moe-tiny", .arch = "qwen2moe", .n_embd = 64, .n_ff = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
       .n_vocab = 512, .n_ctx = 512, .rope_freq_base = 1000000.0f, .n_expert = 4, .n_expert_used = 2, .n_ff_exp = 64,
       .n_ff_shexp = 96, .init_gain = 1.0f},
      {.name = "qwen3-tiny", .arch = "qwen3", .n_embd = 64, .n_ff = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
       .n_vocab = 512, .n_ctx = 512, .rope_freq_base = 1000000.0f, .tied_output = true, .head_dim = 32, .init_gain = 1.0f},
      {.name = "qwen3moe-tiny", .arch = "qwen3moe", .n_embd = 64, .n_ff = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
       .n_vocab = 512, .n_ctx = 512, .rope_freq_base = 1000000.0f, .head_dim = 32, .n_expert = 8, .n_expert_used = 2,
       .n_ff_exp = 32, .init_gain = 1.0f},
      {.name = "phi3-tiny", .arch = "phi3", .n_embd = 64, .n_ff = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 4,
       .n_vocab = 512, .n_ctx = 512, .n_swa = 16, .init_gain = 1.0f},
      {.name = "gemma2-tiny", .arch = "gemma2", .n_embd = 64, .n_ff = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
       .n_vocab = 512, .n_ctx = 512, .tied_output = true, .head_dim = 32, .n_swa = 16, .attn_softcap = 50.0f,
       .final_softcap = 30.0f, .init_gain = 1.0f},
      {.name = "gemma3-tiny", .arch = "gemma3", .n_embd = 64, .n_ff = 128, .n_layer = 6, .n_head = 4, .n_head_kv = 1,
       .n_vocab = 512, .n_ctx = 512, .rope_freq_base = 1000000.0f, .tied_output = true, .head_dim = 32, .n_swa = 16,
       .init_gain = 1.0f},
      // 3 layers: sliding (0, 2) and global (1); n_head * head_dim = 128 != n_embd; MXFP4 experts
      // (rows of 64: two blocks); YaRN x4 beyond 64 positions, so the 64-token tests cross it.
      {.name = "gpt-oss-tiny", .arch = "gpt-oss", .n_embd = 64, .n_ff = 64, .n_layer = 3, .n_head = 4, .n_head_kv = 2,
       .n_vocab = 512, .n_ctx = 512, .rope_freq_base = 150000.0f, .head_dim = 32, .n_expert = 4, .n_expert_used = 2,
       .n_ff_exp = 64, .n_swa = 16, .yarn_factor = 4.0f, .yarn_ctx_orig = 64, .init_gain = 1.0f},
      {.name = "mamba-tiny", .arch = "mamba", .n_embd = 64, .n_layer = 3, .n_vocab = 512, .n_ctx = 1 << 20,
       .tied_output = true, .ssm_d_inner = 128, .ssm_d_state = 16, .ssm_d_conv = 4, .ssm_dt_rank = 8, .init_gain = 1.0f},
      // Mamba-2: 8 heads of 16 in 2 groups (heads 0-3 read group 0's B and C, 4-7 group 1's).
      {.name = "mamba2-tiny", .arch = "mamba2", .n_embd = 64, .n_layer = 3, .n_vocab = 512, .n_ctx = 1 << 20,
       .tied_output = true, .ssm_d_inner = 128, .ssm_d_state = 16, .ssm_d_conv = 4, .ssm_dt_rank = 8,
       .ssm_n_group = 2, .init_gain = 1.0f},
      // RWKV-7 at test size: 2 heads of 64, 3 layers (value residual mixes in two), LoRA ranks
      // all different (so a swapped rank is a shape error). Heads of 64, not smaller: ggml's CPU
      // WKV-7 walks a head in steps of GGML_F32_STEP floats (64 with AVX-512), so llama.cpp
      // computes smaller heads wrongly (it reads and writes past them).
      {.name = "rwkv7-tiny", .arch = "rwkv7", .n_embd = 128, .n_ff = 224, .n_layer = 3, .n_vocab = 512,
       .n_ctx = 1 << 20, .rwkv_head_size = 64, .rwkv_lora_decay = 32, .rwkv_lora_iclr = 24, .rwkv_lora_value = 16,
       .rwkv_lora_gate = 40, .init_gain = 1.0f},
      // RWKV-6 at test size: 2 heads of 64 (the released models' size), 3 layers, the
      // converter's FFN for 128 (3.5x, 448), LoRA ranks 16 (mixes) and 24 (decay), so a swapped
      // rank is a shape error; the stream halved after layer 1.
      {.name = "rwkv6-tiny", .arch = "rwkv6", .n_embd = 128, .n_ff = 448, .n_layer = 3, .n_vocab = 512,
       .n_ctx = 1 << 20, .rwkv_head_size = 64, .rwkv_mix_extra = 16, .rwkv_decay_extra = 24, .rwkv_rescale_every = 2,
       .init_gain = 1.0f},
      // DeepSeek-V2 at test size: query compression (q_lora_rank 32), a latent of 32 and keys of
      // 16 + 16 (nope + rope), values of 24; layer 0 dense, then 4 experts (2 per token, softmax)
      // and one shared; YaRN x4 beyond 64 positions with mscale_all_dim 0.707 (the 64-token
      // tests cross it).
      {.name = "deepseek2-tiny", .arch = "deepseek2", .n_embd = 64, .n_ff = 96, .n_layer = 3, .n_head = 4,
       .n_head_kv = 1, .n_vocab = 512, .n_ctx = 512, .n_expert = 4, .n_expert_used = 2, .n_ff_exp = 32,
       .yarn_factor = 4.0f, .yarn_ctx_orig = 64, .mla_q_lora = 32, .mla_kv_lora = 32, .mla_nope = 16, .mla_rope = 16,
       .mla_v = 24, .n_dense_lead = 1, .n_expert_shared = 1, .expert_weights_scale = 1.0f,
       .yarn_mscale_all_dim = 0.707f, .init_gain = 1.0f},
      // DeepSeek-V2-Lite's attention at test size: no query compression (attn_q), 2 layers.
      // (llama.cpp takes a file without q_lora_rank for V2-Lite only when it has 27 layers, so
      // this one is checked against the numpy oracle and the non-absorbed path, not the peer.)
      {.name = "deepseek2-lite-tiny", .arch = "deepseek2", .n_embd = 64, .n_ff = 96, .n_layer = 2, .n_head = 4,
       .n_head_kv = 1, .n_vocab = 512, .n_ctx = 512, .n_expert = 4, .n_expert_used = 2, .n_ff_exp = 32,
       .yarn_factor = 4.0f, .yarn_ctx_orig = 64, .mla_kv_lora = 32, .mla_nope = 16, .mla_rope = 16, .mla_v = 16,
       .n_dense_lead = 1, .n_expert_shared = 2, .expert_weights_scale = 1.0f, .yarn_mscale_all_dim = 0.707f,
       .init_gain = 1.0f},
      // DeepSeek-V3's routing at test size: sigmoid gates with the selection bias exp_probs_b, 8
      // experts in 4 groups (the best 2 groups kept), 2 per token renormalised and scaled by 2.5.
      {.name = "deepseek3-tiny", .arch = "deepseek2", .n_embd = 64, .n_ff = 96, .n_layer = 3, .n_head = 4,
       .n_head_kv = 1, .n_vocab = 512, .n_ctx = 512, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 32,
       .mla_q_lora = 32, .mla_kv_lora = 32, .mla_nope = 16, .mla_rope = 16, .mla_v = 16, .n_dense_lead = 1,
       .n_expert_shared = 1, .expert_gating = 2, .n_expert_groups = 4, .n_group_used = 2,
       .expert_weights_scale = 2.5f, .expert_weights_norm = true, .init_gain = 1.0f},
      // Granite 4.0-H at test size: Mamba-2, attention, Mamba-2, attention; 8 SSM heads of 16 in
      // one group; 4 query heads of 16 over 2 KV heads; 4 experts of 32 (2 per token) and a
      // shared expert of 48; every multiplier away from 1 (the attention scale from 1/sqrt(16); the
      // embedding scale 0.25, not Granite's 12: with test-size embeddings, 12 would leave the
      // layers too little of the residual stream to change the argmax anywhere); a
      // context of 4096, not the converter's 2^20 (a session's default context sizes its K/V).
      {.name = "granitehybrid-tiny", .arch = "granitehybrid", .n_embd = 64, .n_ff = 32, .n_layer = 4, .n_head = 4,
       .n_head_kv = 2, .n_vocab = 512, .n_ctx = 4096, .tied_output = true, .n_expert = 4, .n_expert_used = 2,
       .n_ff_exp = 32, .n_ff_shexp = 48, .ssm_d_inner = 128, .ssm_d_state = 16, .ssm_d_conv = 4, .ssm_dt_rank = 8,
       .ssm_n_group = 1, .layer_kinds = "MAMA", .embd_scale = 0.25f, .residual_scale = 0.22f, .attn_scale = 0.125f,
       .logit_scale = 6.0f, .init_gain = 1.0f},
      // The dense variant (granite-4.0-h-micro's FFN): attention, Mamba-2, Mamba-2, attention.
      {.name = "granitehybrid-dense-tiny", .arch = "granitehybrid", .n_embd = 64, .n_ff = 96, .n_layer = 4,
       .n_head = 4, .n_head_kv = 2, .n_vocab = 512, .n_ctx = 4096, .tied_output = true, .ssm_d_inner = 128,
       .ssm_d_state = 16, .ssm_d_conv = 4, .ssm_dt_rank = 8, .ssm_n_group = 1, .layer_kinds = "AMMA",
       .embd_scale = 0.25f, .residual_scale = 0.22f, .attn_scale = 0.125f, .logit_scale = 6.0f, .init_gain = 1.0f},
      // Qwen3-Next at test size: gated delta-net, attention, gated delta-net, attention
      // (full_attention_interval 2); the delta-net's 2 key heads each serve 2 of its 4 value heads
      // (of 32); 4 query heads of 32 over 2 KV heads, 8 of each head's 32 channels roped; 4 experts
      // of 32 (2 per token) and a gated shared expert of 48.
      {.name = "qwen3next-tiny", .arch = "qwen3next", .n_embd = 64, .n_ff = 96, .n_layer = 4, .n_head = 4,
       .n_head_kv = 2, .n_vocab = 512, .n_ctx = 4096, .rope_freq_base = 10000000.0f, .head_dim = 32, .n_expert = 4,
       .n_expert_used = 2, .n_ff_exp = 32, .n_ff_shexp = 48, .ssm_d_inner = 128, .ssm_d_state = 32, .ssm_d_conv = 4,
       .ssm_dt_rank = 4, .ssm_n_group = 2, .full_attn_interval = 2, .n_rot = 8, .init_gain = 1.0f},
  };
  return kShapes;
}

const SynthShape& find_synth_shape(const std::string& name) {
  std::string known;
  for (const auto& s : synth_shapes()) {
    if (name == s.name) return s;
    known += std::string(known.empty() ? "" : ", ") + s.name;
  }
  fail("unknown shape '", name, "' (known: ", known, ")");
}

namespace {

// splitmix64: a fast, seedable generator; each row gets its own stream so the output does not
// depend on the thread count.
inline uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Approximately normal(0, stddev): sum of 4 uniforms (Irwin-Hall), variance 4/12.
void fill_normal(float* dst, int64_t n, uint64_t seed, float stddev) {
  uint64_t s = seed;
  const float k = stddev * std::sqrt(3.0f) / float(1u << 16);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = splitmix(s);
    const int32_t sum = int32_t(r & 0xFFFF) + int32_t((r >> 16) & 0xFFFF) + int32_t((r >> 32) & 0xFFFF) +
                        int32_t(r >> 48) - 2 * 65536;
    dst[i] = float(sum) * k;
  }
}

uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

void add_generated_vocab(GgufWriter& w, int64_t n_vocab, const std::vector<std::string>& extra_control) {
  if (n_vocab < 259 + 3) fail("a generated vocabulary needs at least 262 tokens, asked for ", n_vocab);
  std::vector<GgufValue> tokens, scores, types;
  auto add = [&](const std::string& piece, float score, int32_t type) {
    tokens.push_back(GgufValue::string(piece));
    scores.push_back(GgufValue::f32(score));
    types.push_back(GgufValue::i32(type));
  };
  add("<unk>", 0, 2);
  add("<s>", 0, 3);
  add("</s>", 0, 3);
  char buf[16];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    add(buf, 0, 6);
  }
  const std::string space = "\xE2\x96\x81";  // '▁'
  std::vector<std::string> pieces;
  pieces.push_back(space);
  for (char c = 'a'; c <= 'z'; ++c) pieces.push_back(std::string(1, c));
  for (char c = 'A'; c <= 'Z'; ++c) pieces.push_back(std::string(1, c));
  for (const char* p : {".", ",", "!", "?", "'", "\"", "-", ":", ";", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9"})
    pieces.push_back(p);
  for (char c = 'a'; c <= 'z'; ++c) pieces.push_back(space + c);
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b) pieces.push_back(std::string{a, b});
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b) pieces.push_back(space + a + b);
  float score = -1.0f;
  for (const auto& p : pieces) {
    if (int64_t(tokens.size() + extra_control.size()) >= n_vocab) break;
    add(p, score, 1);
    score -= 0.01f;
  }
  // Filler pieces up to the size of real vocabularies ("▁w12345"): never produced by merges of
  // real text beyond their prefixes, but they make embedding and output tensors full size.
  for (int64_t i = 0; int64_t(tokens.size() + extra_control.size()) < n_vocab; ++i) {
    add(space + "w" + std::to_string(i), score, 1);
    score -= 0.001f;
  }
  for (const std::string& c : extra_control) add(c, 0, 3);
  w.set("tokenizer.ggml.model", GgufValue::string("llama"));
  w.set("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, std::move(tokens)));
  w.set("tokenizer.ggml.scores", GgufValue::array(GgufType::F32, std::move(scores)));
  w.set("tokenizer.ggml.token_type", GgufValue::array(GgufType::I32, std::move(types)));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(1));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(2));
  w.set("tokenizer.ggml.unknown_token_id", GgufValue::u32(0));
}

SynthReport synth_model(const SynthOptions& opts, const std::string& out_path) {
  SynthShape sh = find_synth_shape(opts.shape);
  if (opts.n_layer > 0) sh.n_layer = opts.n_layer;  // the shape's layers, fewer of them (tests)
  const ArchSpec& spec = find_architecture(sh.arch, "synth shape " + std::string(sh.name));
  const QuantTraits& want = require_quant_traits(opts.type, "synth weights");
  if (!want.from_float) fail("tern cannot quantize to ", dtype_name(opts.type));
  if (opts.relu_ffn && (spec.activation != FfnActivation::Silu || spec.stack != LayerStack::Decoder))
    fail("--relu: ", sh.name, " (", sh.arch, ") has no SwiGLU decoder FFN to make ReGLU");
  SynthReport rep;

  // Keys as llama.cpp's converter writes them for the architecture.
  const std::string a = std::string(sh.arch) + ".";
  const bool moe = sh.n_expert > 0;
  const int64_t hd = sh.head_dim > 0 ? sh.head_dim : sh.n_head > 0 ? sh.n_embd / sh.n_head : 0;
  const bool mamba2 = spec.stack == LayerStack::Mamba2;
  const bool mamba = spec.stack == LayerStack::Mamba || mamba2;
  const bool hybrid = spec.hybrid_ssm2;
  if (hybrid && (!sh.layer_kinds || int64_t(std::strlen(sh.layer_kinds)) < sh.n_layer))
    fail("synth shape ", sh.name, ": layer_kinds must name the kind of each of its ", sh.n_layer, " layers");
  const auto ssm_layer = [&](int64_t il) { return hybrid && sh.layer_kinds[il] == 'M'; };
  const bool mla = spec.stack == LayerStack::Mla;
  const bool delta = spec.hybrid_delta_net;
  if (delta && sh.full_attn_interval < 1) fail("synth shape ", sh.name, ": full_attn_interval must be at least 1");
  const auto delta_layer = [&](int64_t il) { return delta && (il + 1) % sh.full_attn_interval != 0; };
  const bool rwkv7 = spec.stack == LayerStack::Rwkv7;
  const bool rwkv6 = spec.stack == LayerStack::Rwkv6;
  GgufWriter w(3);
  w.set("general.architecture", GgufValue::string(sh.arch));
  w.set("general.name", GgufValue::string(std::string("tern-synth-") + sh.name));
  w.set("general.file_type", GgufValue::u32(llama_file_type(opts.type)));
  if (opts.relu_ffn) w.set(kFfnActivationKey, GgufValue::string("relu"));
  w.set(a + "context_length", GgufValue::u32(uint32_t(opts.n_ctx_train > 0 ? opts.n_ctx_train : sh.n_ctx)));
  w.set(a + "embedding_length", GgufValue::u32(uint32_t(sh.n_embd)));
  w.set(a + "feed_forward_length", GgufValue::u32(uint32_t(sh.n_ff)));
  w.set(a + "block_count", GgufValue::u32(uint32_t(sh.n_layer)));
  w.set(a + "attention.head_count", GgufValue::u32(uint32_t(sh.n_head)));
  if (hybrid) {
    // GraniteHybridModel: Granite's keys, the Mamba-2 ones, head_count_kv per layer (0 on the
    // Mamba-2 layers), no RoPE (rope.scaling.finetuned false) and the 2^20 context with it.
    std::vector<GgufValue> kv_heads;
    for (int64_t il = 0; il < sh.n_layer; ++il) kv_heads.push_back(GgufValue::u32(ssm_layer(il) ? 0 : uint32_t(sh.n_head_kv)));
    w.set(a + "attention.head_count_kv", GgufValue::array(GgufType::U32, std::move(kv_heads)));
    w.set(a + "rope.freq_base", GgufValue::f32(sh.rope_freq_base));
    w.set(a + "rope.dimension_count", GgufValue::u32(uint32_t(hd)));
    w.set(a + "rope.scaling.finetuned", GgufValue::boolean(false));
    w.set(a + "attention.layer_norm_rms_epsilon", GgufValue::f32(1e-5f));
    if (sh.attn_scale != 0) w.set(a + "attention.scale", GgufValue::f32(sh.attn_scale));
    if (sh.embd_scale != 0) w.set(a + "embedding_scale", GgufValue::f32(sh.embd_scale));
    if (sh.residual_scale != 0) w.set(a + "residual_scale", GgufValue::f32(sh.residual_scale));
    if (sh.logit_scale != 0) w.set(a + "logit_scale", GgufValue::f32(sh.logit_scale));
    if (moe) {
      w.set(a + "expert_count", GgufValue::u32(uint32_t(sh.n_expert)));
      w.set(a + "expert_used_count", GgufValue::u32(uint32_t(sh.n_expert_used)));
    }
    if (sh.n_ff_shexp > 0) w.set(a + "expert_shared_feed_forward_length", GgufValue::u32(uint32_t(sh.n_ff_shexp)));
    w.set(a + "ssm.conv_kernel", GgufValue::u32(uint32_t(sh.ssm_d_conv)));
    w.set(a + "ssm.state_size", GgufValue::u32(uint32_t(sh.ssm_d_state)));
    w.set(a + "ssm.group_count", GgufValue::u32(uint32_t(sh.ssm_n_group)));
    w.set(a + "ssm.inner_size", GgufValue::u32(uint32_t(sh.ssm_d_inner)));
    w.set(a + "ssm.time_step_rank", GgufValue::u32(uint32_t(sh.ssm_dt_rank)));
  } else if (delta) {
    // Qwen3NextModel (Qwen2MoeModel's keys, then the ssm.* ones, full_attention_interval and the
    // partial rotary dimension count), in its order.
    w.set(a + "attention.head_count_kv", GgufValue::u32(uint32_t(sh.n_head_kv)));
    w.set(a + "rope.freq_base", GgufValue::f32(sh.rope_freq_base));
    w.set(a + "attention.layer_norm_rms_epsilon", GgufValue::f32(1e-6f));
    w.set(a + "expert_count", GgufValue::u32(uint32_t(sh.n_expert)));
    w.set(a + "expert_used_count", GgufValue::u32(uint32_t(sh.n_expert_used)));
    w.set(a + "attention.key_length", GgufValue::u32(uint32_t(hd)));
    w.set(a + "attention.value_length", GgufValue::u32(uint32_t(hd)));
    w.set(a + "expert_feed_forward_length", GgufValue::u32(uint32_t(sh.n_ff_exp)));
    w.set(a + "expert_shared_feed_forward_length", GgufValue::u32(uint32_t(sh.n_ff_shexp)));
    w.set(a + "ssm.conv_kernel", GgufValue::u32(uint32_t(sh.ssm_d_conv)));
    w.set(a + "ssm.state_size", GgufValue::u32(uint32_t(sh.ssm_d_state)));
    w.set(a + "ssm.group_count", GgufValue::u32(uint32_t(sh.ssm_n_group)));
    w.set(a + "ssm.time_step_rank", GgufValue::u32(uint32_t(sh.ssm_dt_rank)));
    w.set(a + "ssm.inner_size", GgufValue::u32(uint32_t(sh.ssm_d_inner)));
    w.set(a + "full_attention_interval", GgufValue::u32(uint32_t(sh.full_attn_interval)));
    w.set(a + "rope.dimension_count", GgufValue::u32(uint32_t(sh.n_rot > 0 ? sh.n_rot : hd)));
  } else if (mamba) {  // (the converter writes head_count and feed_forward_length 0)
    w.set(a + "ssm.conv_kernel", GgufValue::u32(uint32_t(sh.ssm_d_conv)));
    w.set(a + "ssm.inner_size", GgufValue::u32(uint32_t(sh.ssm_d_inner)));
    w.set(a + "ssm.state_size", GgufValue::u32(uint32_t(sh.ssm_d_state)));
    w.set(a + "ssm.time_step_rank", GgufValue::u32(uint32_t(sh.ssm_dt_rank)));
    if (mamba2) w.set(a + "ssm.group_count", GgufValue::u32(uint32_t(sh.ssm_n_group)));
    else w.set(a + "ssm.dt_b_c_rms", GgufValue::boolean(false));
    w.set(a + "attention.layer_norm_rms_epsilon", GgufValue::f32(1e-5f));
  } else if (rwkv7) {
    // As convert_hf_to_gguf.py's Rwkv7Model writes them (head_count 0, no token_shift_count).
    w.set(a + "attention.layer_norm_epsilon", GgufValue::f32(1e-5f));
    w.set(a + "wkv.head_size", GgufValue::u32(uint32_t(sh.rwkv_head_size)));
    w.set(a + "attention.decay_lora_rank", GgufValue::u32(uint32_t(sh.rwkv_lora_decay)));
    w.set(a + "attention.iclr_lora_rank", GgufValue::u32(uint32_t(sh.rwkv_lora_iclr)));
    w.set(a + "attention.value_residual_mix_lora_rank", GgufValue::u32(uint32_t(sh.rwkv_lora_value)));
    w.set(a + "attention.gate_lora_rank", GgufValue::u32(uint32_t(sh.rwkv_lora_gate)));
  } else if (rwkv6) {
    // As convert_hf_to_gguf.py's Rwkv6Model writes them (head_count 0, no token_shift_count).
    w.set(a + "attention.layer_norm_epsilon", GgufValue::f32(1e-5f));
    if (sh.rwkv_rescale_every > 0) w.set(a + "rescale_every_n_layers", GgufValue::u32(uint32_t(sh.rwkv_rescale_every)));
    w.set(a + "wkv.head_size", GgufValue::u32(uint32_t(sh.rwkv_head_size)));
    w.set(a + "time_mix_extra_dim", GgufValue::u32(uint32_t(sh.rwkv_mix_extra)));
    w.set(a + "time_decay_extra_dim", GgufValue::u32(uint32_t(sh.rwkv_decay_extra)));
  } else if (mla) {
    // As convert_hf_to_gguf.py's DeepseekV2Model writes them: the cache as MQA (one KV head of
    // latent + rope, values the latent), the per-head sizes in *_mla.
    w.set(a + "attention.head_count_kv", GgufValue::u32(1));
    w.set(a + "rope.freq_base", GgufValue::f32(sh.rope_freq_base));
    w.set(a + "attention.layer_norm_rms_epsilon", GgufValue::f32(1e-6f));
    w.set(a + "expert_count", GgufValue::u32(uint32_t(sh.n_expert)));
    w.set(a + "expert_used_count", GgufValue::u32(uint32_t(sh.n_expert_used)));
    if (sh.expert_gating > 0) w.set(a + "expert_gating_func", GgufValue::u32(uint32_t(sh.expert_gating)));
    if (sh.yarn_factor > 0) {
      w.set(a + "rope.scaling.type", GgufValue::string("yarn"));
      w.set(a + "rope.scaling.factor", GgufValue::f32(sh.yarn_factor));
      w.set(a + "rope.scaling.original_context_length", GgufValue::u32(uint32_t(sh.yarn_ctx_orig)));
    }
    w.set(a + "leading_dense_block_count", GgufValue::u32(uint32_t(sh.n_dense_lead)));
    w.set(a + "vocab_size", GgufValue::u32(uint32_t(sh.n_vocab)));
    if (sh.mla_q_lora > 0) w.set(a + "attention.q_lora_rank", GgufValue::u32(uint32_t(sh.mla_q_lora)));
    w.set(a + "attention.kv_lora_rank", GgufValue::u32(uint32_t(sh.mla_kv_lora)));
    w.set(a + "attention.key_length", GgufValue::u32(uint32_t(sh.mla_kv_lora + sh.mla_rope)));
    w.set(a + "attention.value_length", GgufValue::u32(uint32_t(sh.mla_kv_lora)));
    w.set(a + "attention.key_length_mla", GgufValue::u32(uint32_t(sh.mla_nope + sh.mla_rope)));
    w.set(a + "attention.value_length_mla", GgufValue::u32(uint32_t(sh.mla_v)));
    w.set(a + "expert_feed_forward_length", GgufValue::u32(uint32_t(sh.n_ff_exp)));
    w.set(a + "expert_shared_count", GgufValue::u32(uint32_t(sh.n_expert_shared)));
    if (sh.expert_weights_scale != 0) w.set(a + "expert_weights_scale", GgufValue::f32(sh.expert_weights_scale));
    if (sh.expert_weights_norm) w.set(a + "expert_weights_norm", GgufValue::boolean(true));
    if (sh.n_expert_groups > 0) {
      w.set(a + "expert_group_count", GgufValue::u32(uint32_t(sh.n_expert_groups)));
      w.set(a + "expert_group_used_count", GgufValue::u32(uint32_t(sh.n_group_used)));
    }
    w.set(a + "rope.dimension_count", GgufValue::u32(uint32_t(sh.mla_rope)));
    if (sh.yarn_mscale_all_dim != 0)
      w.set(a + "rope.scaling.yarn_log_multiplier", GgufValue::f32(0.1f * sh.yarn_mscale_all_dim));
  } else {
    w.set(a + "attention.head_count_kv", GgufValue::u32(uint32_t(sh.n_head_kv)));
    if (spec.rope_layout == RopeLayout::Norm || spec.fused_qkv)  // llama's and phi3's converters
      w.set(a + "rope.dimension_count", GgufValue::u32(uint32_t(hd)));
    w.set(a + "rope.freq_base", GgufValue::f32(sh.rope_freq_base));
    w.set(a + "attention.layer_norm_rms_epsilon", GgufValue::f32(std::string(sh.arch) == "llama" ? 1e-5f : 1e-6f));
    if (sh.head_dim > 0) {
      w.set(a + "attention.key_length", GgufValue::u32(uint32_t(hd)));
      w.set(a + "attention.value_length", GgufValue::u32(uint32_t(hd)));
    }
    if (sh.n_swa > 0) w.set(a + "attention.sliding_window", GgufValue::u32(uint32_t(sh.n_swa)));
    if (sh.yarn_factor > 0) {
      w.set(a + "rope.scaling.type", GgufValue::string("yarn"));
      w.set(a + "rope.scaling.factor", GgufValue::f32(sh.yarn_factor));
      w.set(a + "rope.scaling.original_context_length", GgufValue::u32(uint32_t(sh.yarn_ctx_orig)));
    }
    if (sh.attn_softcap > 0) w.set(a + "attn_logit_softcapping", GgufValue::f32(sh.attn_softcap));
    if (sh.final_softcap > 0) w.set(a + "final_logit_softcapping", GgufValue::f32(sh.final_softcap));
    if (moe) {
      w.set(a + "expert_count", GgufValue::u32(uint32_t(sh.n_expert)));
      w.set(a + "expert_used_count", GgufValue::u32(uint32_t(sh.n_expert_used)));
      if (std::string(sh.arch) != "llama")  // Mixtral's experts are feed_forward_length wide
        w.set(a + "expert_feed_forward_length", GgufValue::u32(uint32_t(sh.n_ff_exp)));
      if (sh.n_ff_shexp > 0) w.set(a + "expert_shared_feed_forward_length", GgufValue::u32(uint32_t(sh.n_ff_shexp)));
    }
  }

  int64_t n_vocab = sh.n_vocab;
  std::unique_ptr<GgufFile> vocab_file;
  if (!opts.vocab_gguf.empty()) {
    vocab_file = std::make_unique<GgufFile>(GgufFile::open(opts.vocab_gguf));
    const GgufValue& toks = vocab_file->get("tokenizer.ggml.tokens");
    n_vocab = int64_t(toks.as_array("tokenizer.ggml.tokens").items.size());
    for (const auto& [k, v] : vocab_file->metadata())
      if (k.rfind("tokenizer.", 0) == 0) w.set(k, v);
  } else {
    // llama.cpp looks up Phi-3's <|endoftext|> by text when general.name says phi3.
    add_generated_vocab(w, n_vocab, spec.fused_qkv ? std::vector<std::string>{"<|endoftext|>"} : std::vector<std::string>{});
  }
  rep.n_vocab = n_vocab;

  ThreadPool pool(opts.n_threads > 0 ? opts.n_threads : default_thread_count());
  std::vector<std::vector<uint8_t>> buffers;
  buffers.reserve(size_t(8 + 24 * sh.n_layer));
  const float gain = sh.init_gain;

  // A matrix of n_expert (1: 2-D) x n_out rows of n_in, N(0, stddev^2) by row.
  auto add_matrix = [&](const std::string& name, int64_t n_in, int64_t n_out, float out_gain = 1.0f,
                        int64_t n_expert = 0, bool keep_f32 = false) {
    DType type = keep_f32 ? DType::F32 : opts.type;
    // Experts in the architecture's own format whatever --type says (gpt-oss: MXFP4, as released).
    if (n_expert > 0 && spec.expert_type != DType::F32) type = spec.expert_type;
    if (dtype_row_bytes(type, n_in) < 0) {
      // Rows that do not fit the block size: llama-quantize's substitute (q4_k -> q5_0, ...).
      type = fit_row_type(type, n_in);
      rep.fallbacks.emplace_back(name, type);
    }
    const QuantTraits& q = require_quant_traits(type, name.c_str());
    const int64_t rb = dtype_row_bytes(type, n_in);
    const int64_t rows = n_out * std::max<int64_t>(1, n_expert);
    buffers.emplace_back(size_t(rb * rows));
    uint8_t* dst = buffers.back().data();
    const uint64_t seed = opts.seed ^ hash_name(name);
    const float stddev = gain > 0 ? gain * out_gain / std::sqrt(float(n_in)) : 0.02f;
    pool.parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
      std::vector<float> row(static_cast<size_t>(n_in));
      for (int64_t r = r0; r < r1; ++r) {
        fill_normal(row.data(), n_in, seed + uint64_t(r) * 0x9E3779B97F4A7C15ull, stddev);
        q.from_float(row.data(), dst + r * rb, n_in);
      }
    });
    std::vector<int64_t> ne = {n_in, n_out};
    if (n_expert > 0) ne.push_back(n_expert);
    w.add_tensor(name, type, ne, dst, uint64_t(rb * rows));
    rep.n_params += n_in * rows;
    rep.weight_bytes += rb * rows;
  };
  // An f32 vector: `center` + N(0, jitter^2) (jitter only for test shapes).
  auto add_vector = [&](const std::string& name, int64_t n, float center, float jitter) {
    buffers.emplace_back(size_t(n) * 4);
    float* f = reinterpret_cast<float*>(buffers.back().data());
    if (gain > 0 && jitter > 0) fill_normal(f, n, opts.seed ^ hash_name(name), jitter);
    else std::fill(f, f + n, 0.0f);
    for (int64_t i = 0; i < n; ++i) f[i] += center;
    w.add_tensor(name, DType::F32, {n}, f, uint64_t(n) * 4);
    rep.n_params += n;
    rep.weight_bytes += n * 4;
  };
  auto add_norm = [&](const std::string& name, int64_t n) { add_vector(name, n, 1.0f, 0.1f); };
  // count f32 vectors of n as one [n, count] tensor (gpt-oss's expert biases), N(0, jitter^2).
  auto add_vectors = [&](const std::string& name, int64_t n, int64_t count, float jitter) {
    buffers.emplace_back(size_t(n * count) * 4);
    float* f = reinterpret_cast<float*>(buffers.back().data());
    if (gain > 0) fill_normal(f, n * count, opts.seed ^ hash_name(name), jitter);
    else std::fill(f, f + n * count, 0.0f);
    w.add_tensor(name, DType::F32, {n, count}, f, uint64_t(n * count) * 4);
    rep.n_params += n * count;
    rep.weight_bytes += n * count * 4;
  };

  const int64_t E = sh.n_embd, Eq = sh.n_head * hd, Ekv = sh.n_head_kv * hd, F = sh.n_ff;
  add_matrix(tensor_name(Tensor::TokenEmbd), E, n_vocab, sh.tied_output ? 4.0f : 1.0f);
  add_norm(tensor_name(Tensor::OutputNorm), E);
  if (!sh.tied_output) add_matrix(tensor_name(Tensor::Output), E, n_vocab, 4.0f);
  if (sh.llama3_rope_ctx > 0) {
    // Llama 3.1's frequency factors, as the converter computes them from rope_scaling
    // (factor 32, low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings).
    const double factor = 32.0, low = 1.0, high = 4.0, orig = double(sh.llama3_rope_ctx);
    std::vector<float> ff;
    for (int64_t i = 0; i < hd; i += 2) {
      const double freq = 1.0 / std::pow(double(sh.rope_freq_base), double(i) / double(hd));
      const double wavelen = 2.0 * M_PI / freq;
      if (wavelen < orig / high) ff.push_back(1.0f);
      else if (wavelen > orig / low) ff.push_back(float(factor));
      else {
        const double smooth = (orig / wavelen - low) / (high - low);
        ff.push_back(float(1.0 / ((1.0 - smooth) / factor + smooth)));
      }
    }
    buffers.emplace_back(ff.size() * 4);
    std::memcpy(buffers.back().data(), ff.data(), ff.size() * 4);
    w.add_tensor(tensor_name(Tensor::RopeFreqs), DType::F32, {int64_t(ff.size())}, buffers.back().data(), ff.size() * 4);
  }
  // An f32 tensor of shape ne, N(center, stddev^2) per element (the SSM's own parameters).
  auto add_f32 = [&](const std::string& name, std::vector<int64_t> ne, float center, float stddev) {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    buffers.emplace_back(size_t(n) * 4);
    float* f = reinterpret_cast<float*>(buffers.back().data());
    fill_normal(f, n, opts.seed ^ hash_name(name), stddev);
    for (int64_t i = 0; i < n; ++i) f[i] += center;
    w.add_tensor(name, DType::F32, ne, f, uint64_t(n) * 4);
    rep.n_params += n;
    rep.weight_bytes += n * 4;
    return f;
  };
  // Mamba-2's initialisation where it shapes the dynamics: A = -(1 ... 16) over the heads, time
  // steps softplus(dt_bias) around 0.1, D = 1, conv taps ~ 1/sqrt(taps); every SSM parameter
  // f32 (ssm_a and ssm_d [1, H], ssm_norm [d_inner / G, G]), as the converter writes them.
  const auto add_ssm2_mixer = [&](int64_t il) {
    const int64_t DI = sh.ssm_d_inner, DS = sh.ssm_d_state, K = sh.ssm_d_conv, H = sh.ssm_dt_rank;
    const int64_t G = sh.ssm_n_group, CC = DI + 2 * G * DS;
    const float jitter = gain > 0 ? 0.1f : 0.0f;
    {
      add_matrix(tensor_name(Tensor::SsmIn, il), E, DI + CC + H);
      add_f32(tensor_name(Tensor::SsmConv1d, il), {K, CC}, 0.0f, 1.0f / std::sqrt(float(K)));
      add_f32(tensor_name(Tensor::SsmConv1d, il, "bias"), {CC}, 0.0f, 0.1f);
      add_f32(tensor_name(Tensor::SsmDt, il, "bias"), {H}, -2.0f, 0.5f);
      float* a_log = add_f32(tensor_name(Tensor::SsmA, il, ""), {1, H}, 0.0f, jitter);
      for (int64_t h = 0; h < H; ++h)
        a_log[h] = -(1.0f + 15.0f * float(h) / float(std::max<int64_t>(1, H - 1))) * (1.0f + a_log[h]);
      add_f32(tensor_name(Tensor::SsmD, il, ""), {1, H}, 1.0f, jitter);
      add_f32(tensor_name(Tensor::SsmNorm, il), {DI / G, G}, 1.0f, jitter);
      add_matrix(tensor_name(Tensor::SsmOut, il), DI, E);
    }
  };
  if (delta) {
    // The tensors llama.cpp's qwen3next loads, as Qwen3NextModel writes them (in_proj_qkvz as
    // attn_qkv + attn_gate): per layer the input norm, the gated delta-net's or the gated
    // attention's tensors, post_attention_norm (the FFN's input norm), the router (f32), the
    // experts, the shared expert's gate [n_embd, 1] (f32) and its matrices. Initialisation where it
    // shapes the dynamics: ssm_a = -(0.5 ... 8) over the value heads, softplus(dt_bias) around 0.1,
    // conv taps ~ 1/sqrt(taps); ssm_norm around 1 (the converter adds 1 to the other norms, not it).
    const int64_t S = sh.ssm_d_state, Hk = sh.ssm_n_group, Hv = sh.ssm_dt_rank, K = sh.ssm_d_conv;
    const int64_t C = 2 * Hk * S + Hv * S, DV = sh.ssm_d_inner, NE = sh.n_expert, FX = sh.n_ff_exp;
    const float jitter = gain > 0 ? 0.1f : 0.0f;
    for (int64_t il = 0; il < sh.n_layer; ++il) {
      add_norm(tensor_name(Tensor::AttnNorm, il), E);
      if (delta_layer(il)) {
        add_matrix(tensor_name(Tensor::AttnQkv, il), E, C);
        add_matrix(tensor_name(Tensor::AttnGate, il), E, DV);
        add_f32(tensor_name(Tensor::SsmConv1d, il), {K, C}, 0.0f, 1.0f / std::sqrt(float(K)));
        add_f32(tensor_name(Tensor::SsmDt, il, "bias"), {Hv}, -2.0f, 0.5f);
        float* a = add_f32(tensor_name(Tensor::SsmA, il, ""), {Hv}, 0.0f, jitter);
        for (int64_t h = 0; h < Hv; ++h)
          a[h] = -(0.5f + 7.5f * float(h) / float(std::max<int64_t>(1, Hv - 1))) * (1.0f + a[h]);
        add_matrix(tensor_name(Tensor::SsmBetaAlpha, il), E, 2 * Hv);
        add_norm(tensor_name(Tensor::SsmNorm, il), S);
        add_matrix(tensor_name(Tensor::SsmOut, il), DV, E);
      } else {
        add_matrix(tensor_name(Tensor::AttnQ, il), E, 2 * Eq);
        add_matrix(tensor_name(Tensor::AttnK, il), E, Ekv);
        add_matrix(tensor_name(Tensor::AttnV, il), E, Ekv);
        add_matrix(tensor_name(Tensor::AttnOutput, il), Eq, E);
        add_norm(tensor_name(Tensor::AttnQNorm, il), hd);
        add_norm(tensor_name(Tensor::AttnKNorm, il), hd);
      }
      add_norm(tensor_name(Tensor::AttnPostNorm, il), E);
      add_matrix(tensor_name(Tensor::FfnGateInp, il), E, NE, 1.0f, 0, /*keep_f32=*/true);
      add_matrix(tensor_name(Tensor::FfnGateExps, il), E, FX, 1.0f, NE);
      add_matrix(tensor_name(Tensor::FfnUpExps, il), E, FX, 1.0f, NE);
      add_matrix(tensor_name(Tensor::FfnDownExps, il), FX, E, 1.0f, NE);
      add_matrix(tensor_name(Tensor::FfnGateInpShexp, il), E, 1, 1.0f, 0, /*keep_f32=*/true);
      add_matrix(tensor_name(Tensor::FfnGateShexp, il), E, sh.n_ff_shexp);
      add_matrix(tensor_name(Tensor::FfnUpShexp, il), E, sh.n_ff_shexp);
      add_matrix(tensor_name(Tensor::FfnDownShexp, il), sh.n_ff_shexp, E);
    }
    w.write(out_path);
    return rep;
  }
  if (mamba2) {
    for (int64_t il = 0; il < sh.n_layer; ++il) {
      add_norm(tensor_name(Tensor::AttnNorm, il), E);
      add_ssm2_mixer(il);
    }
    w.write(out_path);
    return rep;
  }
  if (rwkv7) {
    // The tensors llama.cpp's rwkv7 loads, typed as its converter writes them: every vector f32,
    // time_mix_w1 / w2 and time_mix_lerp_fused f32, the other matrices in --type. Layer 0's
    // v0 / v1 / v2 are unused (the converter writes copies of a0 / a1 / a2, with their shapes).
    // Initialisation where it shapes the dynamics: token-shift mixes around 0.5, decays
    // exp(-0.6 sigmoid(w0 + ...)) with w0 ~ N(0, 1), k_k and k_a around 1.
    const int64_t RD = sh.rwkv_lora_decay, RA = sh.rwkv_lora_iclr, RV = sh.rwkv_lora_value, RG = sh.rwkv_lora_gate;
    auto add_ln = [&](Tensor t, int64_t il) {
      add_norm(tensor_name(t, il), E);
      add_vector(tensor_name(t, il, "bias"), E, 0.0f, 0.1f);
    };
    add_vector(tensor_name(Tensor::OutputNorm, -1, "bias"), E, 0.0f, 0.1f);
    add_norm(tensor_name(Tensor::TokenEmbdNorm), E);
    add_vector(tensor_name(Tensor::TokenEmbdNorm, -1, "bias"), E, 0.0f, 0.1f);
    for (int64_t il = 0; il < sh.n_layer; ++il) {
      add_ln(Tensor::AttnNorm, il);
      add_ln(Tensor::AttnNorm2, il);
      add_f32(tensor_name(Tensor::TimeMixLerpFused, il), {E, 1, 1, 6}, 0.5f, 0.2f);
      add_f32(tensor_name(Tensor::TimeMixW0, il), {E}, 0.0f, 1.0f);
      add_matrix(tensor_name(Tensor::TimeMixW1, il), E, RD, 1.0f, 0, /*keep_f32=*/true);
      add_matrix(tensor_name(Tensor::TimeMixW2, il), RD, E, 1.0f, 0, /*keep_f32=*/true);
      add_f32(tensor_name(Tensor::TimeMixA0, il), {E}, 0.0f, 0.5f);
      add_matrix(tensor_name(Tensor::TimeMixA1, il), E, RA);
      add_matrix(tensor_name(Tensor::TimeMixA2, il), RA, E);
      const int64_t rv = il == 0 ? RA : RV;
      add_f32(tensor_name(Tensor::TimeMixV0, il), {E}, 0.0f, 0.5f);
      add_matrix(tensor_name(Tensor::TimeMixV1, il), E, rv);
      add_matrix(tensor_name(Tensor::TimeMixV2, il), rv, E);
      add_matrix(tensor_name(Tensor::TimeMixG1, il), E, RG);
      add_matrix(tensor_name(Tensor::TimeMixG2, il), RG, E);
      add_f32(tensor_name(Tensor::TimeMixKK, il), {E}, 1.0f, 0.1f);
      add_f32(tensor_name(Tensor::TimeMixKA, il), {E}, 1.0f, 0.1f);
      add_f32(tensor_name(Tensor::TimeMixRK, il), {E}, 0.0f, 0.1f);
      add_matrix(tensor_name(Tensor::TimeMixKey, il), E, E);
      add_matrix(tensor_name(Tensor::TimeMixValue, il), E, E);
      add_matrix(tensor_name(Tensor::TimeMixReceptance, il), E, E);
      add_ln(Tensor::TimeMixLn, il);
      add_matrix(tensor_name(Tensor::TimeMixOutput, il), E, E);
      add_f32(tensor_name(Tensor::ChannelMixLerpK, il), {E}, 0.5f, 0.2f);
      add_matrix(tensor_name(Tensor::ChannelMixKey, il), E, sh.n_ff);
      add_matrix(tensor_name(Tensor::ChannelMixValue, il), sh.n_ff, E);
    }
    w.write(out_path);
    return rep;
  }
  if (rwkv6) {
    // The tensors llama.cpp's rwkv6 loads, typed as its converter writes them: every vector f32
    // (the mixes' lerp_x, channel_mix_lerp_k / _r and time_mix_decay as 1-D [E], as the converter
    // squeezes them), time_mix_first [N, H], time_mix_w1 [E, 5 D], time_mix_w2 [D, E, 5],
    // time_mix_decay_w1 / _w2 and time_mix_lerp_fused [E, 1, 1, 5] f32, the other matrices in
    // --type; time_mix_output and channel_mix_value divided by 2^(il / rescale_every), as the
    // converter divides them. Initialisation where it shapes the dynamics: token-shift mixes
    // around 0.5, decays exp(-exp(-2 + ...)), the bonus u around 0.5.
    const int64_t D = sh.rwkv_mix_extra, DD = sh.rwkv_decay_extra, N = sh.rwkv_head_size, H = E / N;
    auto add_ln = [&](Tensor t, int64_t il) {
      add_norm(tensor_name(t, il), E);
      add_vector(tensor_name(t, il, "bias"), E, 0.0f, 0.1f);
    };
    add_vector(tensor_name(Tensor::OutputNorm, -1, "bias"), E, 0.0f, 0.1f);
    add_norm(tensor_name(Tensor::TokenEmbdNorm), E);
    add_vector(tensor_name(Tensor::TokenEmbdNorm, -1, "bias"), E, 0.0f, 0.1f);
    for (int64_t il = 0; il < sh.n_layer; ++il) {
      const float rescale = sh.rwkv_rescale_every > 0 ? std::ldexp(1.0f, -int(il / sh.rwkv_rescale_every)) : 1.0f;
      add_ln(Tensor::AttnNorm, il);
      add_ln(Tensor::AttnNorm2, il);
      add_matrix(tensor_name(Tensor::TimeMixW1, il), E, 5 * D, 1.0f, 0, /*keep_f32=*/true);
      add_matrix(tensor_name(Tensor::TimeMixW2, il), D, E, 0.5f, 5, /*keep_f32=*/true);
      add_f32(tensor_name(Tensor::TimeMixLerpX, il), {E}, 0.5f, 0.2f);
      add_f32(tensor_name(Tensor::TimeMixLerpFused, il), {E, 1, 1, 5}, 0.5f, 0.2f);
      add_f32(tensor_name(Tensor::TimeMixFirst, il), {N, H}, 0.5f, 0.3f);
      add_f32(tensor_name(Tensor::TimeMixDecay, il), {E}, -2.0f, 1.0f);
      add_matrix(tensor_name(Tensor::TimeMixDecayW1, il), E, DD, 1.0f, 0, /*keep_f32=*/true);
      add_matrix(tensor_name(Tensor::TimeMixDecayW2, il), DD, E, 0.5f, 0, /*keep_f32=*/true);
      add_matrix(tensor_name(Tensor::TimeMixKey, il), E, E);
      add_matrix(tensor_name(Tensor::TimeMixValue, il), E, E);
      add_matrix(tensor_name(Tensor::TimeMixReceptance, il), E, E);
      add_matrix(tensor_name(Tensor::TimeMixGate, il), E, E);
      add_ln(Tensor::TimeMixLn, il);
      add_matrix(tensor_name(Tensor::TimeMixOutput, il), E, E, rescale);
      add_f32(tensor_name(Tensor::ChannelMixLerpK, il), {E}, 0.5f, 0.2f);
      add_f32(tensor_name(Tensor::ChannelMixLerpR, il), {E}, 0.5f, 0.2f);
      add_matrix(tensor_name(Tensor::ChannelMixKey, il), E, sh.n_ff);
      add_matrix(tensor_name(Tensor::ChannelMixValue, il), sh.n_ff, E, rescale);
      add_matrix(tensor_name(Tensor::ChannelMixReceptance, il), E, E);
    }
    w.write(out_path);
    return rep;
  }
  if (mla) {
    // The tensors llama.cpp's deepseek2 loads (attn_k_b [nope, C, H] and attn_v_b [C, dv, H] as
    // the converter splits kv_b_proj), in its converter's order per layer.
    const int64_t H = sh.n_head, C = sh.mla_kv_lora, RD = sh.mla_rope, DK = sh.mla_nope + sh.mla_rope;
    const int64_t QR = sh.mla_q_lora, NE = sh.n_expert, FX = sh.n_ff_exp;
    for (int64_t il = 0; il < sh.n_layer; ++il) {
      add_norm(tensor_name(Tensor::AttnNorm, il), E);
      if (QR > 0) {
        add_matrix(tensor_name(Tensor::AttnQA, il), E, QR);
        add_norm(tensor_name(Tensor::AttnQANorm, il), QR);
        add_matrix(tensor_name(Tensor::AttnQB, il), QR, H * DK);
      } else {
        add_matrix(tensor_name(Tensor::AttnQ, il), E, H * DK);
      }
      add_matrix(tensor_name(Tensor::AttnKvAMqa, il), E, C + RD);
      add_norm(tensor_name(Tensor::AttnKvANorm, il), C);
      add_matrix(tensor_name(Tensor::AttnKB, il), sh.mla_nope, C, 1.0f, H);
      add_matrix(tensor_name(Tensor::AttnVB, il), C, sh.mla_v, 1.0f, H);
      add_matrix(tensor_name(Tensor::AttnOutput, il), H * sh.mla_v, E);
      add_norm(tensor_name(Tensor::FfnNorm, il), E);
      if (il < sh.n_dense_lead) {
        add_matrix(tensor_name(Tensor::FfnGate, il), E, sh.n_ff);
        add_matrix(tensor_name(Tensor::FfnDown, il), sh.n_ff, E);
        add_matrix(tensor_name(Tensor::FfnUp, il), E, sh.n_ff);
        continue;
      }
      add_matrix(tensor_name(Tensor::FfnGateInp, il), E, NE, 1.0f, 0, /*keep_f32=*/true);
      if (sh.expert_gating == 2) add_vector(tensor_name(Tensor::FfnExpProbsB, il, "bias"), NE, 0.0f, 0.1f);
      add_matrix(tensor_name(Tensor::FfnGateExps, il), E, FX, 1.0f, NE);
      add_matrix(tensor_name(Tensor::FfnUpExps, il), E, FX, 1.0f, NE);
      add_matrix(tensor_name(Tensor::FfnDownExps, il), FX, E, 1.0f, NE);
      if (sh.n_expert_shared > 0) {
        add_matrix(tensor_name(Tensor::FfnGateShexp, il), E, FX * sh.n_expert_shared);
        add_matrix(tensor_name(Tensor::FfnUpShexp, il), E, FX * sh.n_expert_shared);
        add_matrix(tensor_name(Tensor::FfnDownShexp, il), FX * sh.n_expert_shared, E);
      }
    }
    w.write(out_path);
    return rep;
  }
  if (mamba) {
    // Mamba's initialisation where it shapes the dynamics: A = -(s + 1) for state s (S4D-real),
    // time steps softplus(dt_bias) around 0.1, D = 1, conv taps ~ 1/sqrt(taps).
    const int64_t DI = sh.ssm_d_inner, DS = sh.ssm_d_state, K = sh.ssm_d_conv, R = sh.ssm_dt_rank;
    const float jitter = gain > 0 ? 0.1f : 0.0f;
    for (int64_t il = 0; il < sh.n_layer; ++il) {
      add_norm(tensor_name(Tensor::AttnNorm, il), E);
      add_matrix(tensor_name(Tensor::SsmIn, il), E, 2 * DI);
      add_f32(tensor_name(Tensor::SsmConv1d, il), {K, DI}, 0.0f, 1.0f / std::sqrt(float(K)));
      add_f32(tensor_name(Tensor::SsmConv1d, il, "bias"), {DI}, 0.0f, 0.1f);
      add_matrix(tensor_name(Tensor::SsmX, il), DI, R + 2 * DS);
      add_matrix(tensor_name(Tensor::SsmDt, il), R, DI);
      add_f32(tensor_name(Tensor::SsmDt, il, "bias"), {DI}, -2.0f, 0.5f);
      float* a_log = add_f32(tensor_name(Tensor::SsmA, il, ""), {DS, DI}, 0.0f, jitter);
      for (int64_t c = 0; c < DI; ++c)
        for (int64_t k = 0; k < DS; ++k) a_log[c * DS + k] = -float(k + 1) * (1.0f + a_log[c * DS + k]);
      add_f32(tensor_name(Tensor::SsmD, il, ""), {DI}, 1.0f, jitter);
      add_matrix(tensor_name(Tensor::SsmOut, il), DI, E);
    }
    w.write(out_path);
    return rep;
  }
  for (int64_t il = 0; il < sh.n_layer; ++il) {
    add_norm(tensor_name(Tensor::AttnNorm, il), E);
    if (ssm_layer(il)) {
      add_ssm2_mixer(il);
    } else if (spec.fused_qkv) {
      add_matrix(tensor_name(Tensor::AttnQkv, il), E, Eq + 2 * Ekv);
    } else {
      add_matrix(tensor_name(Tensor::AttnQ, il), E, Eq);
      add_matrix(tensor_name(Tensor::AttnK, il), E, Ekv);
      add_matrix(tensor_name(Tensor::AttnV, il), E, Ekv);
    }
    if (spec.qkv_bias) {
      add_vector(tensor_name(Tensor::AttnQ, il, "bias"), Eq, 0.0f, 0.1f);
      add_vector(tensor_name(Tensor::AttnK, il, "bias"), Ekv, 0.0f, 0.1f);
      add_vector(tensor_name(Tensor::AttnV, il, "bias"), Ekv, 0.0f, 0.1f);
    }
    if (spec.qk_norm) {
      add_norm(tensor_name(Tensor::AttnQNorm, il), hd);
      add_norm(tensor_name(Tensor::AttnKNorm, il), hd);
    }
    if (!ssm_layer(il)) add_matrix(tensor_name(Tensor::AttnOutput, il), Eq, E);
    if (spec.out_bias) add_vector(tensor_name(Tensor::AttnOutput, il, "bias"), E, 0.0f, 0.1f);
    // Sinks about the scores' own size, so that they take a visible share of each softmax.
    if (spec.attn_sinks) add_vector(tensor_name(Tensor::AttnSinks, il), sh.n_head, 0.0f, 1.0f);
    if (spec.post_norms) add_norm(tensor_name(Tensor::AttnPostNorm, il), E);
    add_norm(tensor_name(spec.ffn_norm, il), E);
    if (moe) {
      const int64_t NE = sh.n_expert, FX = sh.n_ff_exp;
      add_matrix(tensor_name(Tensor::FfnGateInp, il), E, NE, 1.0f, 0, /*keep_f32=*/true);
      if (spec.expert_biases) add_vector(tensor_name(Tensor::FfnGateInp, il, "bias"), NE, 0.0f, 0.1f);
      add_matrix(tensor_name(Tensor::FfnGateExps, il), E, FX, 1.0f, NE);
      add_matrix(tensor_name(Tensor::FfnUpExps, il), E, FX, 1.0f, NE);
      add_matrix(tensor_name(Tensor::FfnDownExps, il), FX, E, 1.0f, NE);
      if (spec.expert_biases) {
        add_vectors(tensor_name(Tensor::FfnGateExps, il, "bias"), FX, NE, 0.1f);
        add_vectors(tensor_name(Tensor::FfnUpExps, il, "bias"), FX, NE, 0.1f);
        add_vectors(tensor_name(Tensor::FfnDownExps, il, "bias"), E, NE, 0.1f);
      }
      if (sh.n_ff_shexp > 0) {
        if (spec.shared_expert_gate) add_vector(tensor_name(Tensor::FfnGateInpShexp, il), E, 0.0f, 1.0f / std::sqrt(float(E)));
        add_matrix(tensor_name(Tensor::FfnGateShexp, il), E, sh.n_ff_shexp);
        add_matrix(tensor_name(Tensor::FfnUpShexp, il), E, sh.n_ff_shexp);
        add_matrix(tensor_name(Tensor::FfnDownShexp, il), sh.n_ff_shexp, E);
      }
    } else if (spec.fused_gate_up) {
      add_matrix(tensor_name(Tensor::FfnUp, il), E, 2 * F);
      add_matrix(tensor_name(Tensor::FfnDown, il), F, E);
    } else {
      add_matrix(tensor_name(Tensor::FfnGate, il), E, F);
      add_matrix(tensor_name(Tensor::FfnDown, il), F, E);
      add_matrix(tensor_name(Tensor::FfnUp, il), E, F);
    }
    if (spec.post_norms) add_norm(tensor_name(Tensor::FfnPostNorm, il), E);
  }
  w.write(out_path);
  return rep;
}

}  // namespace tern
