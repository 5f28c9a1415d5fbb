// Gemma 2 ("gemma2"): embeddings scaled by sqrt(n_embd); RMSNorm before and after attention and
// FFN (the converter stores Gemma's (1 + w) norm weights with the 1 added, so they are plain
// RMSNorm weights here); GeGLU (tanh GELU); NeoX RoPE; attention-logit and final-logit
// soft-capping; layers 0, 2, 4, ... attend through the sliding window.
#include "models/arch.h"

namespace tern {

const ArchSpec kArchGemma2 = [] {
  ArchSpec s{"gemma2", "Gemma 2"};
  s.rope_layout = RopeLayout::Neox;
  s.activation = FfnActivation::GeluTanh;
  s.post_norms = true;
  s.embd_scale = true;
  s.softcaps = true;
  s.gemma_query_scale = true;
  s.swa = SwaPattern::EveryOther;
  return s;
}();

}  // namespace tern
