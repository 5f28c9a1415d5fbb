// Phi-3 / Phi-4 ("phi3"): one fused attn_qkv matrix (q rows, then k, then v), one fused ffn_up
// (gate rows, then up rows) feeding SwiGLU, NeoX RoPE. Phi-3-mini's files carry
// attention.sliding_window (2047), which llama.cpp reads and then does not apply (every layer
// attends to the whole context); tern does the same, so the two agree token for token.
#include "models/arch.h"

namespace tern {

const ArchSpec kArchPhi3 = [] {
  ArchSpec s{"phi3", "Phi-3 / Phi-4"};
  s.rope_layout = RopeLayout::Neox;
  s.fused_qkv = true;
  s.fused_gate_up = true;
  s.swa = SwaPattern::None;
  return s;
}();

}  // namespace tern
