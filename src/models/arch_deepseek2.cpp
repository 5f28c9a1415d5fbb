// DeepSeek-V2 / V2-Lite / V3 ("deepseek2", llama.cpp's layout with attn_k_b / attn_v_b):
// multi-head latent attention (models/deepseek2.cpp: a compressed latent and one shared roped
// key per token in the cache, queries absorbed into the latent space), Norm-layout RoPE with
// YaRN, leading dense FFN layers, then routed experts (softmax V2, sigmoid + selection bias V3,
// optionally group-limited) plus shared experts.
#include "models/arch.h"

namespace tern {

const ArchSpec kArchDeepseek2 = [] {
  ArchSpec s{"deepseek2", "DeepSeek-V2 / V3"};
  s.stack = LayerStack::Mla;
  s.moe = ArchSpec::Moe::Required;
  s.shared_expert = true;
  s.expert_norm_topk = false;  // llama.cpp's default for deepseek2 (expert_weights_norm)
  s.norm_topk_key = true;
  return s;
}();

}  // namespace tern
