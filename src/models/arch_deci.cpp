// DeciLM / Nemotron-NAS ("deci"): llama.cpp's name for the Llama block with per-layer head
// counts and FFN widths. Its llama architecture sizes every layer by layer 0's counts, so a
// structured-pruned Llama (compress/structured.h) is written as "deci" to load there too. Tern
// reads it as Llama; layers without attention or FFN (n_head_kv or n_ff 0, NAS "no-op" blocks)
// are refused by the hyper-parameter checks.
#include "models/arch.h"

namespace tern {

const ArchSpec kArchDeci = [] {
  ArchSpec s{"deci", "Llama with per-layer shapes (DeciLM, structured-pruned Llama)"};
  s.rope_layout = RopeLayout::Norm;
  s.optional_bias = true;
  s.swa = SwaPattern::AllLayers;
  return s;
}();

}  // namespace tern
