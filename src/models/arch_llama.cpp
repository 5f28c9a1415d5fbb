// Llama 2 / 3.x, TinyLlama, Mistral, Mixtral and llama2.c checkpoints (general.architecture
// "llama"): RMSNorm, RoPE in the "normal" pair layout (Llama-3.x frequency factors from
// rope_freqs.weight), GQA, SwiGLU; Mixtral-style experts (ffn_gate_inp + 3-D ffn_*_exps,
// softmax, top-k, renormalised) where the file has them; a sliding window where it says so.
#include "models/arch.h"

namespace tern {

const ArchSpec kArchLlama = [] {
  ArchSpec s{"llama", "Llama 2/3.x, Mistral, Mixtral"};
  s.rope_layout = RopeLayout::Norm;
  s.optional_bias = true;
  s.swa = SwaPattern::AllLayers;
  s.moe = ArchSpec::Moe::Optional;
  s.expert_norm_topk = true;
  return s;
}();

}  // namespace tern
