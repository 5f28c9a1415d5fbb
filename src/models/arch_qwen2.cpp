// Qwen2 / Qwen2.5 ("qwen2"): Llama's layer with q/k/v biases and NeoX RoPE; tied output in
// the small sizes. Qwen2-MoE / Qwen1.5-MoE ("qwen2moe"): every FFN routes experts (softmax,
// top-k, not renormalised) plus a shared expert scaled by a sigmoid gate.
#include "models/arch.h"

namespace tern {

const ArchSpec kArchQwen2 = [] {
  ArchSpec s{"qwen2", "Qwen2 / Qwen2.5"};
  s.rope_layout = RopeLayout::Neox;
  s.qkv_bias = true;
  return s;
}();

const ArchSpec kArchQwen2Moe = [] {
  ArchSpec s{"qwen2moe", "Qwen2-MoE / Qwen1.5-MoE"};
  s.rope_layout = RopeLayout::Neox;
  s.qkv_bias = true;
  s.moe = ArchSpec::Moe::Required;
  s.shared_expert = true;
  s.expert_norm_topk = false;
  return s;
}();

}  // namespace tern
