#pragma once
// What distinguishes one architecture from another, as data: each architecture file
// (models/arch_*.cpp) fills one ArchSpec, and the shared decoder (models/decoder.cpp) composes
// its blocks from it. Adding an architecture = one file with its spec + its line in
// arch_registry.cpp (+ tensor names in tensor_names.h if it brings new ones).
#include <memory>
#include <string>
#include <vector>

#include "models/hparams.h"
#include "models/tensor_names.h"

namespace tern {

class Model;

// How a layer's sliding-window pattern is given (llama.cpp's per-architecture rule).
enum class SwaPattern {
  None,       // no sliding-window layers
  AllLayers,  // every layer, when the file sets attention.sliding_window (Mistral, Phi-3)
  EveryOther, // layers 0, 2, 4, ... (Gemma 2)
  FiveToOne,  // layers il % 6 < 5; every sixth is global (Gemma 3)
};

// Which layer stack runs the architecture: the transformer decoder (models/decoder.cpp) or a
// state-space stack (models/mamba.cpp, models/mamba2.cpp).
// DeepSeek-V2/V3's multi-head latent attention has its own stack (models/deepseek2.cpp).
// RWKV-7 ("rwkv7") and RWKV-6 ("rwkv6") have their own recurrent stacks (models/rwkv7.cpp,
// models/rwkv6.cpp).
enum class LayerStack { Decoder, Mamba, Mamba2, Mla, Rwkv7, Rwkv6 };

struct ArchSpec {
  const char* name;                        // general.architecture
  const char* family;                      // what people call it ("Qwen2 / Qwen2.5")
  LayerStack stack = LayerStack::Decoder;
  RopeLayout rope_layout = RopeLayout::Norm;
  FfnActivation activation = FfnActivation::Silu;
  bool qkv_bias = false;        // attn_q/k/v.bias required (Qwen2)
  bool optional_bias = false;   // biases used when present (Llama files may carry them)
  bool qk_norm = false;         // attn_q_norm / attn_k_norm: RMSNorm of each head before RoPE
  bool fused_qkv = false;       // attn_qkv holds q, k, v rows (Phi-3)
  bool fused_gate_up = false;   // ffn_up holds gate rows then up rows (Phi-3)
  bool post_norms = false;      // post_attention_norm and post_ffw_norm (Gemma 2/3)
  bool embd_scale = false;      // embeddings times sqrt(n_embd) (Gemma)
  bool softcaps = false;        // reads attention / final logit soft-capping (Gemma 2)
  bool gemma_query_scale = false;  // 1/sqrt(n_embd/n_head) for the 27B sizes, else 1/sqrt(head_dim)
  SwaPattern swa = SwaPattern::None;
  float swa_rope_base = 0.0f;   // sliding layers' RoPE base (0: the file's)
  // MoE: Required = every layer routes experts; Optional = when blk.N.ffn_gate_inp exists
  // (Llama / Mixtral); None = dense.
  enum class Moe { None, Optional, Required } moe = Moe::None;
  bool shared_expert = false;   // ffn_*_shexp with a sigmoid gate (Qwen2-MoE)
  bool expert_norm_topk = true; // renormalise the chosen experts' weights (llama.cpp's norm_w)
  bool norm_topk_key = false;   // <arch>.expert_weights_norm may override it
  ExpertGating gating = ExpertGating::Softmax;  // when the file has no expert_gating_func
  bool out_bias = false;        // attn_output.bias required (gpt-oss)
  bool attn_sinks = false;      // attn_sinks [n_head] required: softmax sinks (gpt-oss)
  bool expert_biases = false;   // ffn_gate_inp.bias and ffn_{gate,up,down}_exps.bias required (gpt-oss)
  Tensor ffn_norm = Tensor::FfnNorm;  // the FFN's input norm (gpt-oss: post_attention_norm)
  DType expert_type = DType::F32;     // F32: experts in `tern synth --type`; else always this (gpt-oss: MXFP4)
  bool shared_expert_gate = true;     // the shared expert scaled by sigmoid(xn . ffn_gate_inp_shexp) (not Granite's)
  // Granite's multipliers: <arch>.embedding_scale, residual_scale (each block's output before its
  // residual add) and logit_scale (logits divided by it) when the file has them.
  bool granite_scales = false;
  // A hybrid stack (Granite 4.0-H): layers whose attention.head_count_kv is 0 run a Mamba-2 mixer
  // (models/ssm2_block.h) in place of attention, with the same FFN after it; the others attend.
  bool hybrid_ssm2 = false;
  // A hybrid stack of gated delta-net and attention layers (Qwen3-Next): the layers that
  // <arch>.attention.recurrent_layers marks, else all but every full_attention_interval-th, run
  // the gated delta-net of models/delta_net_block.h in place of attention; the others attend.
  bool hybrid_delta_net = false;
  // attn_q holds each head's query then its output gate ([n_embd, 2 n_head head_dim], per head
  // head_dim query rows then head_dim gate rows); the attention output is times sigmoid(gate)
  // before attn_output (Qwen3-Next).
  bool attn_output_gate = false;
};

// The architectures tern runs, in the order `tern` lists them.
const std::vector<const ArchSpec*>& architectures();
// The spec of general.architecture = name; throws naming the file, the name and the list.
const ArchSpec& find_architecture(const std::string& name, const std::string& path);
std::string architecture_list();  // "llama, qwen2, ..."

extern const ArchSpec kArchLlama, kArchDeci, kArchQwen2, kArchQwen2Moe, kArchQwen3, kArchQwen3Moe, kArchPhi3,
    kArchGemma2, kArchGemma3, kArchGptOss, kArchMamba, kArchMamba2, kArchDeepseek2,
    kArchGraniteHybrid, kArchRwkv7, kArchRwkv6, kArchQwen3Next;

}  // namespace tern
