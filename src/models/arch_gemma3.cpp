// Gemma 3 ("gemma3", the text model): Gemma 2's layer without soft-capping, with q/k head norms;
// five sliding-window layers to one global (il % 6 == 5 is global); the sliding layers rotate
// with base 10000, the global ones with the file's rope.freq_base (and its scaling).
#include "models/arch.h"

namespace tern {

const ArchSpec kArchGemma3 = [] {
  ArchSpec s{"gemma3", "Gemma 3"};
  s.rope_layout = RopeLayout::Neox;
  s.activation = FfnActivation::GeluTanh;
  s.qk_norm = true;
  s.post_norms = true;
  s.embd_scale = true;
  s.gemma_query_scale = true;
  s.swa = SwaPattern::FiveToOne;
  s.swa_rope_base = 10000.0f;
  return s;
}();

}  // namespace tern
