// Qwen3 ("qwen3"): no biases; each q and k head RMS-normalised (attn_q_norm / attn_k_norm)
// before NeoX RoPE; head_dim from attention.key_length (n_head * head_dim may differ from
// n_embd). Qwen3-MoE ("qwen3moe"): the same attention, experts routed by softmax, top-k,
// renormalised, no shared expert.
#include "models/arch.h"

namespace tern {

const ArchSpec kArchQwen3 = [] {
  ArchSpec s{"qwen3", "Qwen3"};
  s.rope_layout = RopeLayout::Neox;
  s.qk_norm = true;
  return s;
}();

const ArchSpec kArchQwen3Moe = [] {
  ArchSpec s{"qwen3moe", "Qwen3-MoE"};
  s.rope_layout = RopeLayout::Neox;
  s.qk_norm = true;
  s.moe = ArchSpec::Moe::Required;
  s.expert_norm_topk = true;
  return s;
}();

}  // namespace tern
