// gpt-oss ("gpt-oss", OpenAI's open-weight MoE: gpt-oss-20b / -120b). Every layer routes experts:
// the router has a bias, takes the top k of its logits and weighs them by a softmax over those
// k; each expert is a clamped SwiGLU (swiglu_oai) with biases on gate, up and down, stored in
// MXFP4. Attention: q/k/v and output biases, NeoX RoPE with YaRN scaling, a learned sink logit
// per head in every softmax, and layers 0, 2, 4, ... attending through a sliding window
// (128 tokens in the released models). The FFN's input norm is named post_attention_norm.
#include "models/arch.h"

namespace tern {

const ArchSpec kArchGptOss = [] {
  ArchSpec s{"gpt-oss", "gpt-oss"};
  s.rope_layout = RopeLayout::Neox;
  s.activation = FfnActivation::SwigluOai;
  s.qkv_bias = true;
  s.out_bias = true;
  s.attn_sinks = true;
  s.swa = SwaPattern::EveryOther;
  s.moe = ArchSpec::Moe::Required;
  s.gating = ExpertGating::SoftmaxWeight;
  s.expert_norm_topk = false;  // the softmax over the chosen already sums to 1
  s.expert_biases = true;
  s.ffn_norm = Tensor::AttnPostNorm;
  s.expert_type = DType::MXFP4;
  return s;
}();

}  // namespace tern
