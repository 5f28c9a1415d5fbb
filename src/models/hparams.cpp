#include "models/hparams.h"

#include <cmath>

#include "core/error.h"
#include "models/arch.h"

namespace tern {
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

// A state-space model (Mamba): no attention, no FFN; `<arch>.ssm.*` as llama.cpp's converter
// writes them (the head counts and feed_forward_length it writes are 0).
HParams read_ssm_hparams(const GgufFile& f, HParams hp) {
  const std::string& p = f.path();
  const std::string a = hp.arch + ".";
  hp.n_ctx_train = int64_t(f.get_uint(a + "context_length", 1 << 20));
  hp.rms_eps = float(f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5));
  if (!(hp.rms_eps > 0.0f)) fail(p, ": bad ", a, "attention.layer_norm_rms_epsilon");
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
  hp.n_head_per_layer.assign(size_t(hp.n_layer), 0);
  hp.n_head_kv_per_layer.assign(size_t(hp.n_layer), 0);
  hp.n_ff_per_layer.assign(size_t(hp.n_layer), 0);
  hp.swa_layers.assign(size_t(hp.n_layer), 0);
  read_vocab_size(f, hp);
  return hp;
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
  if (spec.stack == LayerStack::Mamba) return read_ssm_hparams(f, std::move(hp));
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
  if (!f.has(a + "attention.key_length") && hp.head_count(0) > 0 && hp.n_embd % hp.head_count(0) != 0)
    fail(p, ": ", a, "attention.head_count ", hp.head_count(0), " does not divide embedding_length ", hp.n_embd);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const int64_t nh = hp.head_count(il), nkv = hp.head_count_kv(il), nff = hp.ff_length(il);
    if (nh <= 0 || nh > 4096) fail(p, ": bad ", a, "attention.head_count ", nh, " of layer ", il);
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
    if (hv != hp.head_dim)
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
    if (spec.shared_expert) {
      hp.n_ff_shexp = int64_t(f.get_uint(a + "expert_shared_feed_forward_length", 0));
      if (hp.n_ff_shexp <= 0 || hp.n_ff_shexp > (1 << 22))
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

  read_vocab_size(f, hp);
  return hp;
}

}  // namespace tern
