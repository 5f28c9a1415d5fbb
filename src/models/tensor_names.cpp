#include "models/tensor_names.h"

#include "core/error.h"

namespace tern {
namespace {

struct NameRow {
  Tensor tensor;
  const char* stem;
  bool per_layer;
};

constexpr NameRow kNames[] = {
    {Tensor::TokenEmbd, "token_embd", false},
    {Tensor::OutputNorm, "output_norm", false},
    {Tensor::Output, "output", false},
    {Tensor::RopeFreqs, "rope_freqs", false},
    {Tensor::AttnNorm, "attn_norm", true},
    {Tensor::AttnQ, "attn_q", true},
    {Tensor::AttnK, "attn_k", true},
    {Tensor::AttnV, "attn_v", true},
    {Tensor::AttnQkv, "attn_qkv", true},
    {Tensor::AttnOutput, "attn_output", true},
    {Tensor::AttnQNorm, "attn_q_norm", true},
    {Tensor::AttnKNorm, "attn_k_norm", true},
    {Tensor::AttnPostNorm, "post_attention_norm", true},
    {Tensor::AttnSinks, "attn_sinks", true},
    {Tensor::FfnNorm, "ffn_norm", true},
    {Tensor::FfnGate, "ffn_gate", true},
    {Tensor::FfnUp, "ffn_up", true},
    {Tensor::FfnDown, "ffn_down", true},
    {Tensor::FfnPostNorm, "post_ffw_norm", true},
    {Tensor::FfnGateInp, "ffn_gate_inp", true},
    {Tensor::FfnGateExps, "ffn_gate_exps", true},
    {Tensor::FfnUpExps, "ffn_up_exps", true},
    {Tensor::FfnDownExps, "ffn_down_exps", true},
    {Tensor::FfnGateInpShexp, "ffn_gate_inp_shexp", true},
    {Tensor::FfnGateShexp, "ffn_gate_shexp", true},
    {Tensor::FfnUpShexp, "ffn_up_shexp", true},
    {Tensor::FfnDownShexp, "ffn_down_shexp", true},
    {Tensor::SsmIn, "ssm_in", true},
    {Tensor::SsmConv1d, "ssm_conv1d", true},
    {Tensor::SsmX, "ssm_x", true},
    {Tensor::SsmDt, "ssm_dt", true},
    {Tensor::SsmA, "ssm_a", true},
    {Tensor::SsmD, "ssm_d", true},
    {Tensor::SsmOut, "ssm_out", true},
    {Tensor::SsmNorm, "ssm_norm", true},
    {Tensor::AttnGate, "attn_gate", true},
    {Tensor::SsmBetaAlpha, "ssm_ba", true},
    {Tensor::AttnQA, "attn_q_a", true},
    {Tensor::AttnQANorm, "attn_q_a_norm", true},
    {Tensor::AttnQB, "attn_q_b", true},
    {Tensor::AttnKvAMqa, "attn_kv_a_mqa", true},
    {Tensor::AttnKvANorm, "attn_kv_a_norm", true},
    {Tensor::AttnKB, "attn_k_b", true},
    {Tensor::AttnVB, "attn_v_b", true},
    {Tensor::AttnKvB, "attn_kv_b", true},
    {Tensor::FfnExpProbsB, "exp_probs_b", true},
    {Tensor::TokenEmbdNorm, "token_embd_norm", false},
    {Tensor::AttnNorm2, "attn_norm_2", true},
    {Tensor::TimeMixLerpFused, "time_mix_lerp_fused", true},
    {Tensor::TimeMixW0, "time_mix_w0", true},
    {Tensor::TimeMixW1, "time_mix_w1", true},
    {Tensor::TimeMixW2, "time_mix_w2", true},
    {Tensor::TimeMixA0, "time_mix_a0", true},
    {Tensor::TimeMixA1, "time_mix_a1", true},
    {Tensor::TimeMixA2, "time_mix_a2", true},
    {Tensor::TimeMixV0, "time_mix_v0", true},
    {Tensor::TimeMixV1, "time_mix_v1", true},
    {Tensor::TimeMixV2, "time_mix_v2", true},
    {Tensor::TimeMixG1, "time_mix_g1", true},
    {Tensor::TimeMixG2, "time_mix_g2", true},
    {Tensor::TimeMixKK, "time_mix_k_k", true},
    {Tensor::TimeMixKA, "time_mix_k_a", true},
    {Tensor::TimeMixRK, "time_mix_r_k", true},
    {Tensor::TimeMixKey, "time_mix_key", true},
    {Tensor::TimeMixValue, "time_mix_value", true},
    {Tensor::TimeMixReceptance, "time_mix_receptance", true},
    {Tensor::TimeMixLn, "time_mix_ln", true},
    {Tensor::TimeMixOutput, "time_mix_output", true},
    {Tensor::ChannelMixLerpK, "channel_mix_lerp_k", true},
    {Tensor::ChannelMixKey, "channel_mix_key", true},
    {Tensor::ChannelMixValue, "channel_mix_value", true},
    {Tensor::TimeMixLerpX, "time_mix_lerp_x", true},
    {Tensor::TimeMixLerpW, "time_mix_lerp_w", true},
    {Tensor::TimeMixLerpK, "time_mix_lerp_k", true},
    {Tensor::TimeMixLerpV, "time_mix_lerp_v", true},
    {Tensor::TimeMixLerpR, "time_mix_lerp_r", true},
    {Tensor::TimeMixLerpG, "time_mix_lerp_g", true},
    {Tensor::TimeMixFirst, "time_mix_first", true},
    {Tensor::TimeMixDecay, "time_mix_decay", true},
    {Tensor::TimeMixDecayW1, "time_mix_decay_w1", true},
    {Tensor::TimeMixDecayW2, "time_mix_decay_w2", true},
    {Tensor::TimeMixGate, "time_mix_gate", true},
    {Tensor::ChannelMixLerpR, "channel_mix_lerp_r", true},
    {Tensor::ChannelMixReceptance, "channel_mix_receptance", true},
};

const NameRow& row(Tensor t) {
  for (const NameRow& r : kNames)
    if (r.tensor == t) return r;
  TERN_ASSERT_MSG(false, "tensor missing from the name table");
  return kNames[0];
}

}  // namespace

const char* tensor_stem(Tensor t) { return row(t).stem; }
bool tensor_per_layer(Tensor t) { return row(t).per_layer; }

std::string tensor_name(Tensor t, int64_t il, const char* suffix) {
  const NameRow& r = row(t);
  TERN_ASSERT_MSG(r.per_layer == (il >= 0), "layer index given for a global tensor or missing for a layer's");
  std::string s = r.per_layer ? "blk." + std::to_string(il) + "." : std::string();
  s += r.stem;
  if (*suffix) {
    s += '.';
    s += suffix;
  }
  return s;
}

}  // namespace tern
