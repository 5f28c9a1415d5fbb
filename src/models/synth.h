#pragma once
// Random-weight models with real architecture shapes, written directly in a storage type:
// how benchmarks get realistic sizes without downloading weights (`tern synth`).
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gguf/gguf.h"

namespace tern {

struct SynthShape {
  const char* name;
  const char* arch = "llama";       // general.architecture (models/arch.h)
  int64_t n_embd = 0, n_ff = 0, n_layer = 0, n_head = 0, n_head_kv = 0, n_vocab = 0, n_ctx = 0;
  float rope_freq_base = 10000.0f;
  bool tied_output = false;
  int64_t head_dim = 0;             // attention.key_length; 0: n_embd / n_head, not written
  int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
  int64_t n_swa = 0;                // attention.sliding_window (0: not written)
  float attn_softcap = 0.0f, final_softcap = 0.0f;
  // Llama 3.1-style rope_freqs.weight (factor 32, low/high frequency factors 1 / 4) for this
  // original context; 0: none.
  int64_t llama3_rope_ctx = 0;
  // YaRN RoPE scaling (rope.scaling.type yarn) by this factor beyond this original context; 0: none.
  float yarn_factor = 0.0f;
  int64_t yarn_ctx_orig = 0;
  // State-space layers (arch "mamba"): inner width, state per channel, conv taps, dt rank;
  // "mamba2": ssm_dt_rank is the number of heads and ssm_n_group the B/C groups.
  int64_t ssm_d_inner = 0, ssm_d_state = 0, ssm_d_conv = 0, ssm_dt_rank = 0, ssm_n_group = 0;
  // A hybrid (arch "granitehybrid"): the kind of each layer, 'M' Mamba-2 or 'A' attention (at
  // least n_layer characters; `--layers N` takes the first N). Granite's multipliers (0: not written).
  const char* layer_kinds = nullptr;
  float embd_scale = 0.0f, residual_scale = 0.0f, attn_scale = 0.0f, logit_scale = 0.0f;
  // Qwen3-Next (arch "qwen3next"): every full_attention_interval-th layer attends, the others are
  // gated delta-net layers of ssm_n_group key heads and ssm_dt_rank value heads, each of
  // ssm_d_state (ssm_d_inner = ssm_dt_rank * ssm_d_state); n_rot: rope.dimension_count (the
  // partial rotary factor times head_dim; 0: head_dim).
  int64_t full_attn_interval = 0, n_rot = 0;
  // Multi-head latent attention (arch "deepseek2"): kv_lora_rank > 0. q_lora_rank 0: attn_q
  // directly; per-head nope / rope / v sizes; leading dense layers (n_ff wide); shared experts
  // (n_ff_exp each); expert_weights_scale / _norm; gating 1 softmax, 2 sigmoid (with the
  // selection bias exp_probs_b); expert groups; YaRN's mscale_all_dim (yarn_factor > 0).
  int64_t mla_q_lora = 0, mla_kv_lora = 0, mla_nope = 0, mla_rope = 0, mla_v = 0;
  int64_t n_dense_lead = 0, n_expert_shared = 0, expert_gating = 0, n_expert_groups = 0, n_group_used = 0;
  float expert_weights_scale = 0.0f, yarn_mscale_all_dim = 0.0f;
  bool expert_weights_norm = false;
  // RWKV-7 (arch "rwkv7"): wkv.head_size > 0 and the LoRA ranks of w (decay), a (iclr), v (value
  // residual mix) and g (gate).
  int64_t rwkv_head_size = 0, rwkv_lora_decay = 0, rwkv_lora_iclr = 0, rwkv_lora_value = 0, rwkv_lora_gate = 0;
  // RWKV-6 (arch "rwkv6"): rwkv_head_size, the token-shift mixes' LoRA rank (time_mix_extra_dim),
  // the decay's (time_decay_extra_dim) and rescale_every_n_layers (0: not written).
  int64_t rwkv_mix_extra = 0, rwkv_decay_extra = 0, rwkv_rescale_every = 0;
  // > 0: weights N(0, (gain^2 / n_in)) and norm weights 1 + N(0, 0.1^2), biases N(0, 0.1^2)
  // (tests: decisive logits, every norm and bias visible in the output); 0: weights N(0, 0.02^2)
  // and norms 1 (benchmarks: the shapes of real models).
  float init_gain = 0.0f;
};

// The known shapes: Llama-architecture ones ("stories260k", "tinyllama-1.1b", "llama2-7b",
// "llama3-8b", "qwen2-0.5b"), real released models of every architecture ("qwen2.5-0.5b",
// "qwen3-0.6b", "llama3.2-1b", "phi3-mini", "gemma2-2b", "gemma3-1b", "mixtral-mini",
// "qwen3moe-mini", "gpt-oss-20b", "gpt-oss-120b") and tiny ones with each architecture's features
// for tests ("qwen2-tiny", ...).
const std::vector<SynthShape>& synth_shapes();
const SynthShape& find_synth_shape(const std::string& name);  // throws listing the known names

struct SynthOptions {
  std::string shape = "stories260k";
  DType type = DType::F32;     // type of the 2-D weights (norms stay f32)
  std::string vocab_gguf;      // copy tokenizer.* from this file; empty: generate a vocabulary
  uint64_t seed = 1234;
  int n_threads = 0;
  int64_t n_ctx_train = 0;     // llama.context_length to write; 0: the shape's
  int64_t n_layer = 0;         // layers to write; 0: the shape's (fewer: a shape's layers at test size)
  bool relu_ffn = false;       // write tern.ffn_activation "relu": a ReLU-fied (ReGLU) model of the shape
};

struct SynthReport {
  int64_t n_params = 0;
  int64_t weight_bytes = 0;
  int64_t n_vocab = 0;
  // Tensors whose rows did not fit the requested type's block size and the type used instead.
  std::vector<std::pair<std::string, DType>> fallbacks;
};

// Writes the model to `out_path`. Throws tern::Error for an unknown shape or unquantizable type.
SynthReport synth_model(const SynthOptions& opts, const std::string& out_path);

// Adds a generated SentencePiece-style ("llama") vocabulary of n_vocab tokens to `w`:
// <unk>, <s>, </s>, the 256 byte tokens, then single characters and word pieces, then the
// `extra_control` tokens (control type) as the last ids.
void add_generated_vocab(GgufWriter& w, int64_t n_vocab, const std::vector<std::string>& extra_control = {});

}  // namespace tern
