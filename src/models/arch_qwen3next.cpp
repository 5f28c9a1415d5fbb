// Qwen3-Next ("qwen3next": Qwen3-Next-80B-A3B): a hybrid of gated delta-net layers (linear
// attention with a per-head k x v state, models/delta_net_block.h) and, every
// full_attention_interval-th layer, gated full attention: q projection with a per-head output
// gate (sigmoid(gate) times the attention output), q/k RMS norms, partial NeoX RoPE
// (rope.dimension_count of head_dim). Every layer's FFN is routed experts (softmax, top-k
// renormalised) plus a shared expert scaled by sigmoid(xn . ffn_gate_inp_shexp), its input norm
// post_attention_norm. Run by the shared decoder (models/decoder.cpp), as llama.cpp's qwen3next
// graph (src/models/qwen3next.cpp); the file as convert_hf_to_gguf.py's Qwen3NextModel writes it.
#include "models/arch.h"

namespace tern {

const ArchSpec kArchQwen3Next = [] {
  ArchSpec s{"qwen3next", "Qwen3-Next (hybrid gated delta-net / attention, MoE)"};
  s.rope_layout = RopeLayout::Neox;
  s.qk_norm = true;
  s.moe = ArchSpec::Moe::Required;
  s.shared_expert = true;
  s.ffn_norm = Tensor::AttnPostNorm;
  s.hybrid_delta_net = true;
  s.attn_output_gate = true;
  return s;
}();

}  // namespace tern
