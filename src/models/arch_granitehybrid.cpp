// IBM Granite 4.0-H ("granitehybrid": granite-4.0-h-micro, -h-tiny, -h-small): Mamba-2 layers
// with a few attention layers between them (those whose attention.head_count_kv is not 0), each
// followed by an FFN (dense SwiGLU, or routed experts plus an ungated shared expert); Granite's
// embedding / residual / attention / logit multipliers; no positional encoding (the converter
// writes rope.scaling.finetuned false). Run by the shared decoder (models/decoder.cpp) with the
// Mamba-2 block of models/ssm2_block.h on the recurrent layers.
#include "models/arch.h"

namespace tern {

const ArchSpec kArchGraniteHybrid = [] {
  ArchSpec s{"granitehybrid", "Granite 4.0-H (hybrid Mamba-2 / attention)"};
  s.moe = ArchSpec::Moe::Optional;  // routed where blk.N.ffn_gate_inp exists (h-tiny, h-small)
  s.shared_expert = true;           // ffn_*_shexp when expert_shared_feed_forward_length is set
  s.shared_expert_gate = false;
  s.granite_scales = true;
  s.hybrid_ssm2 = true;
  return s;
}();

}  // namespace tern
