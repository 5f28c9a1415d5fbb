#include "models/hparams.h"

#include <cmath>

#include "core/error.h"
#include "models/arch.h"

namespace tern {

const char* ffn_activation_name(FfnActivation a) {
  switch (a) {
    case FfnActivation::Silu: return "silu";
    case FfnActivation::GeluTanh: return "gelu_tanh";
    case FfnActivation::SwigluOai: return "swiglu_oai";
    case FfnActivation::Relu: return "relu";
  }
  return "?";
}

namespace {

// A key that is one number for every layer or an array of one number per layer (llama.cpp's
// get_key_or_arr): what structured pruning writes when layers lose heads or FFN rows.
std::vector<int64_t> per_layer(const GgufFile& f, const std::string& key, int64_t n_layer,
                               const std::vector<int64_t>* fallback) {
  const GgufValue* v = f.find(key);
  if (!v) {
    if (fallback) return *fallback;
    fail(f.path(), ": missing key ", key);
  }
  if (v->type == GgufType::ARRAY) {
    const GgufArray& a = v->as_array(key);
    if (int64_t(a.items.size()) != n_layer)
      fail(f.path(), ": ", key, " has ", a.items.size(), " values for ", n_layer, " layers");
    std::vector<int64_t> out;
    for (const GgufValue& x : a.items) out.push_back(x.as_int(key));
    return out;
  }
  return std::vector<int64_t>(size_t(n_layer), v->as_int(key));
}

int64_t max_of(const std::vector<int64_t>& v) {
  int64_t m = 0;
  for (int64_t x : v) m = x > m ? x : m;
  return m;
}

// n_vocab from the embedding tensor (the tokenizer may be absent or larger).
void read_vocab_size(const GgufFile& f, HParams& hp) {
  const std::string& p = f.path();
  const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb) fail(p, ": missing tensor token_embd.weight");
  if (emb->ne.size() != 2) fail(p, ": token_embd.weight must be 2-D, has ", emb->ne.size(), " dimensions");
  if (emb->ne[0] != hp.n_embd)
    fail(p, ": token_embd.weight is ", emb->shape_string(), ", expected rows of embedding_length ", hp.n_embd);
  hp.n_vocab = emb->ne[1];
}

// A state-space model (Mamba, Mamba-2): no attention, no FFN; `<arch>.ssm.*` as llama.cpp's converter
// writes them (the head counts and feed_forward_length it writes are 0).
// The `<arch>.ssm.*` keys (Mamba, Mamba-2, and a hybrid's Mamba-2 layers).
void read_ssm_keys(const GgufFile& f, HParams& hp, bool mamba2) {
  const std::string& p = f.path();
  const std::string a = hp.arch + ".";
  HParams::Ssm& s = hp.ssm;
  s.d_conv = int64_t(f.get_uint(a + "ssm.conv_kernel"));
  s.d_inner = int64_t(f.get_uint(a + "ssm.inner_size"));
  s.d_state = int64_t(f.get_uint(a + "ssm.state_size"));
  s.dt_rank = int64_t(f.get_uint(a + "ssm.time_step_rank"));
  if (const GgufValue* v = f.find(a + "ssm.dt_b_c_rms")) s.dt_b_c_rms = v->as_bool(a + "ssm.dt_b_c_rms");
  if (s.d_conv < 1 || s.d_conv > 64) fail(p, ": bad ", a, "ssm.conv_kernel ", s.d_conv);
  if (s.d_inner < 1 || s.d_inner > (1 << 20)) fail(p, ": bad ", a, "ssm.inner_size ", s.d_inner);
  if (s.d_state < 1 || s.d_state > 1024) fail(p, ": bad ", a, "ssm.state_size ", s.d_state);
  if (s.dt_rank < 1 || s.dt_rank > s.d_inner) fail(p, ": bad ", a, "ssm.time_step_rank ", s.dt_rank);
  if (mamba2) {  // time_step_rank: the SSM's heads; group_count: B/C groups, each a run of heads
    s.n_group = int64_t(f.get_uint(a + "ssm.group_count"));
    if (s.d_inner % s.dt_rank != 0)
      fail(p, ": ", a, "ssm.inner_size ", s.d_inner, " is not a whole number of heads (ssm.time_step_rank ", s.dt_rank,
           ")");
    if (s.n_group < 1 || s.d_inner % s.n_group != 0)
      fail(p, ": ", a, "ssm.group_count ", s.n_group, " does not divide ssm.inner_size ", s.d_inner);
    if (s.dt_rank % s.n_group != 0)
      fail(p, ": ", a, "ssm.group_count ", s.n_group, " does not divide the ", s.dt_rank,
           " heads (ssm.time_step_rank)");
  }
}

HParams read_ssm_hparams(const GgufFile& f, HParams hp, bool mamba2) {
  const std::string& p = f.path();
  const std::string a = hp.arch + ".";
  hp.n_ctx_train = int64_t(f.get_uint(a + "context_length", 1 << 20));
  hp.rms_eps = float(f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5));
  if (!(hp.rms_eps > 0.0f)) fail(p, ": bad ", a, "attention.layer_norm_rms_epsilon");
  read_ssm_keys(f, hp, mamba2);
  hp.n_head_per_layer.assign(size_t(hp.n_layer), 0);
  hp.n_head_kv_per_layer.assign(size_t(hp.n_layer), 0);
  hp.n_ff_per_layer.assign(size_t(hp.n_layer), 0);
  hp.swa_layers.assign(size_t(hp.n_layer), 0);
  read_vocab_size(f, hp);
  return hp;
}

// RWKV-7 as llama.cpp's converter (Rwkv7Model) writes it: wkv.head_size, the four LoRA ranks,
// attention.layer_norm_epsilon, feed_forward_length; head_count is written as 0 (unused).
HParams read_rwkv7_hparams(const GgufFile& f, HParams hp) {
  const std::string& p = f.path();
  const std::string a = hp.arch + ".";
  HParams::Rwkv& r = hp.rwkv;
  hp.n_ctx_train = int64_t(f.get_uint(a + "context_length", 1 << 20));
  r.head_size = int64_t(f.get_uint(a + "wkv.head_size"));
  r.lora_decay = int64_t(f.get_uint(a + "attention.decay_lora_rank"));
  r.lora_iclr = int64_t(f.get_uint(a + "attention.iclr_lora_rank"));
  r.lora_value_res = int64_t(f.get_uint(a + "attention.value_residual_mix_lora_rank"));
  r.lora_gate = int64_t(f.get_uint(a + "attention.gate_lora_rank"));
  r.norm_eps = float(f.get_float(a + "attention.layer_norm_epsilon", 1e-5));
  hp.n_ff = int64_t(f.get_uint(a + "feed_forward_length"));
  if (r.head_size < 1 || r.head_size > 1024) fail(p, ": bad ", a, "wkv.head_size ", r.head_size);
  if (hp.n_embd % r.head_size != 0)
    fail(p, ": ", a, "wkv.head_size ", r.head_size, " does not divide embedding_length ", hp.n_embd);
  for (auto [key, v] : {std::pair{"decay", r.lora_decay}, std::pair{"iclr", r.lora_iclr},
                        std::pair{"value_residual_mix", r.lora_value_res}, std::pair{"gate", r.lora_gate}})
    if (v < 1 || v > hp.n_embd) fail(p, ": bad ", a, "attention.", key, "_lora_rank ", v);
  if (hp.n_ff < 1 || hp.n_ff > (1 << 22)) fail(p, ": bad ", a, "feed_forward_length ", hp.n_ff);
  if (f.has(a + "token_shift_count") && f.get_uint(a + "token_shift_count") != 2)
    fail(p, ": ", a, "token_shift_count ", f.get_uint(a + "token_shift_count"), " is not 2 (RWKV-7 shifts two inputs)");
  if (!(r.norm_eps > 0.0f && r.norm_eps < 1.0f)) fail(p, ": bad ", a, "attention.layer_norm_epsilon ", r.norm_eps);
  hp.n_head_per_layer.assign(size_t(hp.n_layer), 0);
  hp.n_head_kv_per_layer.assign(size_t(hp.n_layer), 0);
  hp.n_ff_per_layer.assign(size_t(hp.n_layer), hp.n_ff);
  hp.swa_layers.assign(size_t(hp.n_layer), 0);
  read_vocab_size(f, hp);
  return hp;
}

// RWKV-6 as llama.cpp's converter (Rwkv6Model) writes it: wkv.head_size, time_mix_extra_dim,
// time_decay_extra_dim, rescale_every_n_layers, attention.layer_norm_epsilon, feed_forward_length;
// head_count is written as 0 (unused), token_shift_count not at all (llama.cpp's default 2).
HParams read_rwkv6_hparams(const GgufFile& f, HParams hp) {
  const std::string& p = f.path();
  const std::string a = hp.arch + ".";
  HParams::Rwkv& r = hp.rwkv;
  hp.n_ctx_train = int64_t(f.get_uint(a + "context_length", 1 << 20));
  r.head_size = int64_t(f.get_uint(a + "wkv.head_size"));
  r.mix_extra_dim = int64_t(f.get_uint(a + "time_mix_extra_dim"));
  r.decay_extra_dim = int64_t(f.get_uint(a + "time_decay_extra_dim"));
  r.rescale_every = int64_t(f.get_uint(a + "rescale_every_n_layers", 0));
  r.norm_eps = float(f.get_float(a + "attention.layer_norm_epsilon", 1e-5));
  hp.n_ff = int64_t(f.get_uint(a + "feed_forward_length"));
  if (r.head_size < 1 || r.head_size > 1024) fail(p, ": bad ", a, "wkv.head_size ", r.head_size);
  if (hp.n_embd % r.head_size != 0)
    fail(p, ": ", a, "wkv.head_size ", r.head_size, " does not divide embedding_length ", hp.n_embd);
  if (r.mix_extra_dim < 1 || r.mix_extra_dim > hp.n_embd) fail(p, ": bad ", a, "time_mix_extra_dim ", r.mix_extra_dim);
  if (r.decay_extra_dim < 1 || r.decay_extra_dim > hp.n_embd)
    fail(p, ": bad ", a, "time_decay_extra_dim ", r.decay_extra_dim);
  if (r.rescale_every < 0 || r.rescale_every > (1 << 20)) fail(p, ": bad ", a, "rescale_every_n_layers ", r.rescale_every);
  if (hp.n_ff < 1 || hp.n_ff > (1 << 22)) fail(p, ": bad ", a, "feed_forward_length ", hp.n_ff);
  if (f.has(a + "token_shift_count") && f.get_uint(a + "token_shift_count") != 2)
    fail(p, ": ", a, "token_shift_count ", f.get_uint(a + "token_shift_count"), " is not 2 (RWKV-6 shifts two inputs)");
  if (!(r.norm_eps > 0.0f && r.norm_eps < 1.0f)) fail(p, ": bad ", a, "attention.layer_norm_epsilon ", r.norm_eps);
  hp.n_head_per_layer.assign(size_t(hp.n_layer), 0);
  hp.n_head_kv_per_layer.assign(size_t(hp.n_layer), 0);
  hp.n_ff_per_layer.assign(size_t(hp.n_layer), hp.n_ff);
  hp.swa_layers.assign(size_t(hp.n_layer), 0);
  read_vocab_size(f, hp);
  return hp;
}

// Multi-head latent attention (DeepSeek-V2/V3) as llama.cpp's converter writes it: the cache's
// MQA view (head_count_kv 1, key_length = kv_lora_rank + rope, value_length = kv_lora_rank) and
// the per-head sizes (key_length_mla, value_length_mla). Files of older converters (attn_kv_b,
// no *_mla keys) are refused by name.
void read_mla_hparams(const GgufFile& f, HParams& hp) {
  const std::string& p = f.path();
  const std::string a = hp.arch + ".";
  HParams::Mla& m = hp.mla;
  m.kv_lora_rank = int64_t(f.get_uint(a + "attention.kv_lora_rank"));
  m.q_lora_rank = int64_t(f.get_uint(a + "attention.q_lora_rank", 0));
  if (!f.has(a + "attention.key_length_mla") || !f.has(a + "attention.value_length_mla"))
    fail(p, ": ", a, "attention.key_length_mla / value_length_mla missing: this file comes from an older converter "
         "(one attn_kv_b per layer); tern runs the absorbed layout (attn_k_b / attn_v_b), which current llama.cpp "
         "converters write (convert_hf_to_gguf.py)");
  m.head_dim_k = int64_t(f.get_uint(a + "attention.key_length_mla"));
  m.head_dim_v = int64_t(f.get_uint(a + "attention.value_length_mla"));
  m.n_dense_lead = int64_t(f.get_uint(a + "leading_dense_block_count", 0));
  m.n_expert_shared = int64_t(f.get_uint(a + "expert_shared_count", 0));
  m.expert_weights_scale = float(f.get_float(a + "expert_weights_scale", 0.0));
  // [llama.cpp: TAG_DEEPSEEK2_YARN_LOG_MUL_FIX] the converter stores 0.1 * mscale_all_dim.
  m.yarn_log_mul = float(f.get_float(a + "rope.scaling.yarn_log_multiplier", 0.0)) / 0.1f;
  m.n_expert_groups = int64_t(f.get_uint(a + "expert_group_count", 0));
  m.n_group_used = int64_t(f.get_uint(a + "expert_group_used_count", 0));
  const int64_t C = m.kv_lora_rank;
  if (C < 1 || C > 8192) fail(p, ": bad ", a, "attention.kv_lora_rank ", C);
  if (m.q_lora_rank < 0 || m.q_lora_rank > 65536) fail(p, ": bad ", a, "attention.q_lora_rank ", m.q_lora_rank);
  for (int64_t il = 0; il < hp.n_layer; ++il)
    if (hp.head_count_kv(il) != 1)
      fail(p, ": ", a, "attention.head_count_kv is ", hp.head_count_kv(il), " at layer ", il,
           "; a latent-attention file has 1 (the latent is shared by every head)");
  if (hp.head_dim != C + hp.n_rot)
    fail(p, ": ", a, "attention.key_length ", hp.head_dim, " is not kv_lora_rank ", C, " + rope.dimension_count ",
         hp.n_rot, " (the cached latent and roped key)");
  if (int64_t(f.get_uint(a + "attention.value_length", uint64_t(C))) != C)
    fail(p, ": ", a, "attention.value_length ", f.get_uint(a + "attention.value_length"), " is not kv_lora_rank ", C);
  if (m.head_dim_k <= hp.n_rot || m.head_dim_k > 1024)
    fail(p, ": ", a, "attention.key_length_mla ", m.head_dim_k, " must exceed rope.dimension_count ", hp.n_rot,
         " (nope + rope per head)");
  if (m.head_dim_v < 1 || m.head_dim_v > 1024) fail(p, ": bad ", a, "attention.value_length_mla ", m.head_dim_v);
  if (m.n_dense_lead < 0 || m.n_dense_lead > hp.n_layer)
    fail(p, ": ", a, "leading_dense_block_count ", m.n_dense_lead, " exceeds block_count ", hp.n_layer);
  for (int64_t il = 0; il < m.n_dense_lead; ++il)
    if (hp.ff_length(il) <= 0) fail(p, ": ", a, "feed_forward_length missing for the dense layer ", il);
  if (m.n_expert_shared < 0 || m.n_expert_shared > 64) fail(p, ": bad ", a, "expert_shared_count ", m.n_expert_shared);
  hp.n_ff_shexp = m.n_expert_shared * hp.n_ff_exp;
  if (m.n_expert_groups > 1) {
    if (hp.n_expert % m.n_expert_groups != 0 || m.n_group_used < 1 || m.n_group_used > m.n_expert_groups ||
        hp.n_expert / m.n_expert_groups < 2)
      fail(p, ": ", a, "expert_group_count ", m.n_expert_groups, " / expert_group_used_count ", m.n_group_used,
           " do not fit ", hp.n_expert, " experts");
  }
}

// Qwen3-Next's layer kinds, as llama.cpp decides them: attention.recurrent_layers (one flag per
// layer, MTP layers included) where the file has it, else every layer but each
// full_attention_interval-th (default 4) is a gated delta-net layer; the ssm.* keys (n_group key
// heads and dt_rank value heads of d_state); no K/V rows on the recurrent layers.
void read_delta_net_layers(const GgufFile& f, HParams& hp, int64_t n_layer_all) {
  const std::string& p = f.path();
  const std::string a = hp.arch + ".";
  hp.ssm_layers.assign(size_t(hp.n_layer), 0);
  const std::string rkey = a + "attention.recurrent_layers";
  if (const GgufValue* v = f.find(rkey)) {
    const GgufArray& flags = v->as_array(rkey);
    if (int64_t(flags.items.size()) != n_layer_all && int64_t(flags.items.size()) != hp.n_layer)
      fail(p, ": ", rkey, " has ", flags.items.size(), " values for ", n_layer_all, " layers");
    for (int64_t il = 0; il < hp.n_layer; ++il) hp.ssm_layers[size_t(il)] = flags.items[size_t(il)].as_bool(rkey);
  } else {
    const int64_t interval = int64_t(f.get_uint(a + "full_attention_interval", 4));
    if (interval < 1 || interval > 4096) fail(p, ": bad ", a, "full_attention_interval ", interval);
    for (int64_t il = 0; il < hp.n_layer; ++il) hp.ssm_layers[size_t(il)] = (il + 1) % interval != 0;
  }
  read_ssm_keys(f, hp, /*mamba2=*/true);
  HParams::Ssm& s = hp.ssm;
  s.gated_delta = true;
  if (s.d_inner / s.dt_rank != s.d_state)
    fail(p, ": ", a, "ssm.inner_size ", s.d_inner, " / ssm.time_step_rank ", s.dt_rank, " (the value heads' size) is "
         "not ssm.state_size ", s.d_state, " (the key heads' size): the gated delta-net needs square states");
  for (int64_t il = 0; il < hp.n_layer; ++il)
    if (hp.ssm_layers[size_t(il)]) hp.n_head_kv_per_layer[size_t(il)] = 0;
}

}  // namespace

bool HParams::uniform_layers() const {
  for (int64_t il = 1; il < n_layer; ++il)
    if (head_count(il) != head_count(0) || head_count_kv(il) != head_count_kv(0) || ff_length(il) != ff_length(0))
      return false;
  return true;
}

HParams read_hparams(const GgufFile& f) {
  HParams hp;
  hp.arch = f.get_string("general.architecture");
  const std::string& p = f.path();
  const ArchSpec& spec = find_architecture(hp.arch, p);
  const std::string a = hp.arch + ".";
  hp.n_embd = int64_t(f.get_uint(a + "embedding_length"));
  hp.n_layer = int64_t(f.get_uint(a + "block_count"));
  if (hp.n_embd <= 0 || hp.n_embd > (1 << 20)) fail(p, ": bad ", a, "embedding_length ", hp.n_embd);
  if (hp.n_layer <= 0 || hp.n_layer > 4096) fail(p, ": bad ", a, "block_count ", hp.n_layer);
  if (spec.stack == LayerStack::Mamba || spec.stack == LayerStack::Mamba2)
    return read_ssm_hparams(f, std::move(hp), spec.stack == LayerStack::Mamba2);
  if (spec.stack == LayerStack::Rwkv7) return read_rwkv7_hparams(f, std::move(hp));
  if (spec.stack == LayerStack::Rwkv6) return read_rwkv6_hparams(f, std::move(hp));
  // Qwen3-Next's converter appends its multi-token-prediction block(s) to block_count
  // (nextn_predict_layers): the main pass runs the layers before them, as llama.cpp's does.
  const int64_t n_layer_all = hp.n_layer;
  if (spec.hybrid_delta_net) {
    const int64_t nextn = int64_t(f.get_uint(a + "nextn_predict_layers", 0));
    if (nextn < 0 || nextn >= hp.n_layer) fail(p, ": bad ", a, "nextn_predict_layers ", nextn);
    hp.n_layer -= nextn;
  }
  hp.n_head_per_layer = per_layer(f, a + "attention.head_count", hp.n_layer, nullptr);
  hp.n_head_kv_per_layer = per_layer(f, a + "attention.head_count_kv", hp.n_layer, &hp.n_head_per_layer);
  const std::vector<int64_t> no_dense_ffn(size_t(hp.n_layer), 0);  // MoE-only files may omit the key
  hp.n_ff_per_layer = per_layer(f, a + "feed_forward_length", hp.n_layer,
                                spec.moe == ArchSpec::Moe::Required ? &no_dense_ffn : nullptr);
  hp.n_head = max_of(hp.n_head_per_layer);
  hp.n_head_kv = max_of(hp.n_head_kv_per_layer);
  hp.n_ff = max_of(hp.n_ff_per_layer);
  hp.n_ctx_train = int64_t(f.get_uint(a + "context_length", 2048));
  hp.rope_freq_base = float(f.get_float(a + "rope.freq_base", 10000.0));
  hp.rms_eps = float(f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5));
  if (f.has(a + "pooling_type")) hp.pooling_type = int64_t(f.get_uint(a + "pooling_type"));
  if (f.has(kFfnActivationKey)) {
    const std::string act = f.get_string(kFfnActivationKey);
    if (act == "relu") hp.ffn_activation = FfnActivation::Relu;
    else if (act == "silu") hp.ffn_activation = FfnActivation::Silu;
    else fail(p, ": ", kFfnActivationKey, " is '", act, "'; tern knows \"relu\" (a ReLU-fied SwiGLU) and \"silu\"");
    if (spec.stack != LayerStack::Decoder)
      fail(p, ": ", kFfnActivationKey, " ", act, " is for decoder models with a SwiGLU FFN, not ", hp.arch);
    if (spec.activation != FfnActivation::Silu && *hp.ffn_activation != spec.activation)
      fail(p, ": ", kFfnActivationKey, " ", act, " replaces SwiGLU, and ", hp.arch, "'s FFN is ",
           ffn_activation_name(spec.activation));
  }
  if (!f.has(a + "attention.key_length") && hp.head_count(0) > 0 && hp.n_embd % hp.head_count(0) != 0)
    fail(p, ": ", a, "attention.head_count ", hp.head_count(0), " does not divide embedding_length ", hp.n_embd);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const int64_t nh = hp.head_count(il), nkv = hp.head_count_kv(il), nff = hp.ff_length(il);
    if (nh <= 0 || nh > 4096) fail(p, ": bad ", a, "attention.head_count ", nh, " of layer ", il);
    if (spec.hybrid_ssm2 && nkv == 0) continue;  // a Mamba-2 layer of a hybrid (its FFN checked below)
    if (nkv <= 0 || nh % nkv != 0)
      fail(p, ": ", a, "attention.head_count_kv ", nkv, " does not divide head_count ", nh, " (layer ", il, ")");
    if (nff < 0 || nff > (1 << 22) || (nff == 0 && spec.moe != ArchSpec::Moe::Required))
      fail(p, ": bad ", a, "feed_forward_length ", nff, " of layer ", il);
  }
  if (hp.n_ctx_train <= 0) fail(p, ": bad ", a, "context_length ", hp.n_ctx_train);
  if (!(hp.rms_eps > 0.0f) || !(hp.rope_freq_base > 0.0f)) fail(p, ": bad rms epsilon or rope base");

  // head_dim: attention.key_length where the file gives it (Gemma, Qwen3: n_head * head_dim
  // need not be n_embd), else n_embd / n_head.
  if (f.has(a + "attention.key_length")) {
    hp.head_dim = int64_t(f.get_uint(a + "attention.key_length"));
    const int64_t hv = int64_t(f.get_uint(a + "attention.value_length", uint64_t(hp.head_dim)));
    if (hv != hp.head_dim && spec.stack != LayerStack::Mla)  // (MLA: the latent, read below)
      fail(p, ": ", a, "attention.value_length ", hv, " differs from key_length ", hp.head_dim,
           " (tern needs equal K and V head sizes)");
  } else {
    if (hp.n_embd % hp.head_count(0) != 0)
      fail(p, ": ", a, "attention.head_count ", hp.head_count(0), " does not divide embedding_length ", hp.n_embd);
    hp.head_dim = hp.n_embd / hp.head_count(0);
  }
  if (hp.head_dim <= 0 || hp.head_dim > 1024 || hp.head_dim % 2 != 0)
    fail(p, ": bad head size ", hp.head_dim, " (", a, "attention.key_length)");
  hp.n_rot = int64_t(f.get_uint(a + "rope.dimension_count", uint64_t(hp.head_dim)));
  if (hp.n_rot <= 0 || hp.n_rot > hp.head_dim || hp.n_rot % 2 != 0)
    fail(p, ": ", a, "rope.dimension_count ", hp.n_rot, " must be even and <= head_dim ", hp.head_dim);
  hp.rope_layout = spec.rope_layout;

  // RoPE scaling: the type (none / linear / yarn), factor (or the older rope.scale_linear) and
  // YaRN's original context; llama.cpp's context defaults for the rest.
  {
    const std::string type = f.get_string(a + "rope.scaling.type", "");
    float factor = float(f.get_float(a + "rope.scaling.factor", f.get_float(a + "rope.scale_linear", 0.0)));
    RopeScaling& rs = hp.rope_scaling;
    if (type.empty() || type == "none" || type == "linear") {
      rs.kind = (type == "none" || factor == 0.0f || factor == 1.0f) ? RopeScaling::Kind::None : RopeScaling::Kind::Linear;
    } else if (type == "yarn") {
      rs.kind = RopeScaling::Kind::Yarn;
      rs.ext_factor = 1.0f;
    } else {
      fail(p, ": ", a, "rope.scaling.type '", type, "' is not supported (none, linear, yarn)");
    }
    if (rs.kind != RopeScaling::Kind::None && !(factor > 0.0f && factor <= 1024.0f))
      fail(p, ": bad ", a, "rope.scaling.factor ", factor);
    rs.factor = rs.kind == RopeScaling::Kind::None ? 1.0f : factor;
    rs.n_ctx_orig = int64_t(f.get_uint(a + "rope.scaling.original_context_length", uint64_t(hp.n_ctx_train)));
    rs.attn_factor = float(f.get_float(a + "rope.scaling.attn_factor", 1.0));
    if (!(rs.attn_factor > 0.0f)) fail(p, ": bad ", a, "rope.scaling.attn_factor");
  }

  // Sliding-window layers, by the architecture's rule.
  hp.swa_layers.assign(size_t(hp.n_layer), 0);
  if (spec.swa != SwaPattern::None) {
    const int64_t def = spec.swa == SwaPattern::EveryOther ? 4096 : 0;  // Gemma 2's default window
    hp.n_swa = int64_t(f.get_uint(a + "attention.sliding_window", uint64_t(def)));
    if (hp.n_swa < 0) fail(p, ": bad ", a, "attention.sliding_window");
    // Period P of the local/global pattern: layer il is local when il % P < P - 1. A file may
    // give P (attention.sliding_window_pattern, as llama.cpp reads it for Gemma 3) or one flag
    // per layer.
    int64_t period = spec.swa == SwaPattern::EveryOther ? 2 : spec.swa == SwaPattern::FiveToOne ? 6 : 1;
    const std::string pattern_key = a + "attention.sliding_window_pattern";
    const GgufValue* pattern = f.find(pattern_key);
    if (pattern && pattern->type != GgufType::ARRAY) {
      period = pattern->as_int(pattern_key);
      if (period <= 0 || period > 4096) fail(p, ": bad ", pattern_key, " ", period);
    }
    for (int64_t il = 0; il < hp.n_layer; ++il)
      hp.swa_layers[size_t(il)] = period == 1 ? 1 : uint8_t(il % period < period - 1);
    if (pattern && pattern->type == GgufType::ARRAY) {
      const GgufArray& flags = pattern->as_array(pattern_key);
      if (int64_t(flags.items.size()) != hp.n_layer)
        fail(p, ": ", pattern_key, " has ", flags.items.size(), " values for ", hp.n_layer, " layers");
      for (int64_t il = 0; il < hp.n_layer; ++il) hp.swa_layers[size_t(il)] = flags.items[size_t(il)].as_bool(pattern_key);
    }
  }
  if (spec.swa_rope_base > 0.0f)
    hp.rope_freq_base_swa = float(f.get_float(a + "rope.freq_base_swa", spec.swa_rope_base));
  if (spec.softcaps) {
    hp.attn_softcap = float(f.get_float(a + "attn_logit_softcapping", 50.0));
    hp.final_softcap = float(f.get_float(a + "final_logit_softcapping", 30.0));
    if (!(hp.attn_softcap >= 0.0f) || !(hp.final_softcap >= 0.0f)) fail(p, ": bad soft-capping values");
  }
  // Gemma's query scale: 1/sqrt(query_pre_attn_scalar), which the converter does not store;
  // llama.cpp takes n_embd / n_head for the 27B sizes (46 layers: Gemma 2, 62: Gemma 3) and
  // head_dim for the others.
  if (spec.gemma_query_scale) {
    const bool big = (hp.arch == "gemma2" && hp.n_layer == 46) || (hp.arch == "gemma3" && hp.n_layer == 62);
    hp.attn_scale = 1.0f / std::sqrt(float(big ? hp.n_embd / hp.head_count(0) : hp.head_dim));
  }
  if (f.has(a + "attention.scale")) hp.attn_scale = float(f.get_float(a + "attention.scale", 0.0));
  if (spec.embd_scale) hp.embd_scale = std::sqrt(float(hp.n_embd));
  if (spec.granite_scales) {  // (absent keys: no scaling, as llama.cpp reads them)
    hp.embd_scale = float(f.get_float(a + "embedding_scale", 0.0));
    hp.residual_scale = float(f.get_float(a + "residual_scale", 0.0));
    hp.logit_scale = float(f.get_float(a + "logit_scale", 0.0));
    if (!std::isfinite(hp.embd_scale) || !std::isfinite(hp.residual_scale) || !std::isfinite(hp.logit_scale))
      fail(p, ": bad ", a, "embedding_scale / residual_scale / logit_scale");
  }
  if (spec.hybrid_ssm2) {
    // The layer kinds from attention.head_count_kv (0: Mamba-2, as llama.cpp decides); the
    // Mamba-2 keys; RoPE only where rope.scaling.finetuned says so (llama.cpp's default true;
    // Granite 4.0-H's converter writes false: no positional encoding).
    hp.ssm_layers.assign(size_t(hp.n_layer), 0);
    int64_t n_ssm = 0;
    for (int64_t il = 0; il < hp.n_layer; ++il) n_ssm += (hp.ssm_layers[size_t(il)] = hp.head_count_kv(il) == 0);
    if (n_ssm == 0) fail(p, ": ", a, "attention.head_count_kv is not 0 at any layer: no Mamba-2 layers (a ", hp.arch,
                         " file marks them with 0)");
    read_ssm_keys(f, hp, /*mamba2=*/true);
    const std::string key = a + "rope.scaling.finetuned";
    if (const GgufValue* v = f.find(key); v && !v->as_bool(key)) hp.n_rot = 0;
  }

  if (spec.hybrid_delta_net) read_delta_net_layers(f, hp, n_layer_all);

  // Experts.
  hp.n_expert = int64_t(f.get_uint(a + "expert_count", 0));
  hp.n_expert_used = int64_t(f.get_uint(a + "expert_used_count", 0));
  if (spec.moe == ArchSpec::Moe::Required && hp.n_expert == 0) fail(p, ": missing key ", a, "expert_count");
  if (spec.moe == ArchSpec::Moe::None && hp.n_expert != 0)
    fail(p, ": ", a, "expert_count ", hp.n_expert, " but architecture ", hp.arch, " has no experts");
  if (hp.n_expert > 0) {
    if (hp.n_expert > 4096 || hp.n_expert_used <= 0 || hp.n_expert_used > hp.n_expert)
      fail(p, ": ", a, "expert_used_count ", hp.n_expert_used, " must be in 1..expert_count ", hp.n_expert);
    // Without the key: Mixtral's experts are feed_forward_length wide; llama.cpp divides it by
    // the experts used for the MoE-only architectures.
    const int64_t ff_default = spec.moe == ArchSpec::Moe::Required ? hp.ff_length(0) / hp.n_expert_used : hp.ff_length(0);
    hp.n_ff_exp = int64_t(f.get_uint(a + "expert_feed_forward_length", uint64_t(ff_default)));
    if (hp.n_ff_exp <= 0 || hp.n_ff_exp > (1 << 22)) fail(p, ": bad ", a, "expert_feed_forward_length ", hp.n_ff_exp);
    if (spec.shared_expert && spec.stack != LayerStack::Mla) {
      hp.n_ff_shexp = int64_t(f.get_uint(a + "expert_shared_feed_forward_length", 0));
      if (hp.n_ff_shexp < 0 || hp.n_ff_shexp > (1 << 22) || (hp.n_ff_shexp == 0 && spec.shared_expert_gate))
        fail(p, ": bad or missing ", a, "expert_shared_feed_forward_length ", hp.n_ff_shexp);
    }
    hp.expert_norm_topk = spec.expert_norm_topk;
    if (const GgufValue* v = f.find(a + "expert_weights_norm")) hp.expert_norm_topk = v->as_bool(a + "expert_weights_norm");
    // llama.cpp's numbering: 1 softmax, 2 sigmoid, 3 softmax over the chosen (the architecture's
    // own when the key is absent: gpt-oss's converter writes none).
    const uint64_t def = spec.gating == ExpertGating::Sigmoid ? 2 : spec.gating == ExpertGating::SoftmaxWeight ? 3 : 1;
    const uint64_t gating = f.get_uint(a + "expert_gating_func", def);
    if (gating < 1 || gating > 3)
      fail(p, ": ", a, "expert_gating_func ", gating, " is not 1 (softmax), 2 (sigmoid) or 3 (softmax of the chosen)");
    hp.expert_gating = gating == 2 ? ExpertGating::Sigmoid : gating == 3 ? ExpertGating::SoftmaxWeight : ExpertGating::Softmax;
  }

  if (spec.stack == LayerStack::Mla) read_mla_hparams(f, hp);
  read_vocab_size(f, hp);
  return hp;
}

}  // namespace tern
