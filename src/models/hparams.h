#pragma once
// Hyper-parameters of a decoder-only model, read from GGUF metadata (`<arch>.*` keys as
// llama.cpp's converter writes them) for every registered architecture (models/arch.h).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace tern {

// Pair layout of RoPE (llama.cpp's LLAMA_ROPE_TYPE_NORM / _NEOX): Norm rotates (2i, 2i+1),
// NeoX rotates (i, i + n_rot/2).
enum class RopeLayout { Norm, Neox };
// SwiGLU, GeGLU, gpt-oss's clamped SwiGLU (llama.cpp's swiglu_oai: with g = min(gate, 7)
// and u = clamp(up, -7, 7), g * sigmoid(1.702 g) * (u + 1)), and ReGLU, max(gate, 0) * up: a
// ReLU-fied SwiGLU model (`tern sparsify --relufy`), whose neurons with gate <= 0 are exactly
// zero (activation sparsity, docs/sparsity.md).
enum class FfnActivation { Silu, GeluTanh, SwigluOai, Relu };
// "silu", "gelu_tanh", "swiglu_oai", "relu".
const char* ffn_activation_name(FfnActivation a);
// The GGUF key of a file whose FFN activation is not its architecture's (HParams::ffn_activation).
inline constexpr const char* kFfnActivationKey = "tern.ffn_activation";
// Softmax: softmax over every expert, then the top k; Sigmoid: sigmoid per expert, top k;
// SoftmaxWeight (gpt-oss, llama.cpp's 3): the top k of the router logits, then softmax over those k.
enum class ExpertGating { Softmax, Sigmoid, SoftmaxWeight };

// Position scaling of RoPE beyond the training context (`<arch>.rope.scaling.*`).
struct RopeScaling {
  enum class Kind { None, Linear, Yarn } kind = Kind::None;
  float factor = 1.0f;          // rope.scaling.factor; freq_scale = 1 / factor
  int64_t n_ctx_orig = 0;       // rope.scaling.original_context_length
  float ext_factor = 0.0f;      // YaRN: 1 for yarn (llama.cpp's default), 0 otherwise
  float attn_factor = 1.0f;     // rope.scaling.attn_factor
  float beta_fast = 32.0f, beta_slow = 1.0f;
};

struct HParams {
  std::string arch;             // general.architecture
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  // Largest over the layers (per-layer values: head_count(il) etc.); a file may give
  // head_count, head_count_kv and feed_forward_length as one value or one per layer.
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t n_ff = 0;
  std::vector<int64_t> n_head_per_layer, n_head_kv_per_layer, n_ff_per_layer;  // [n_layer]
  int64_t head_dim = 0;         // attention.key_length, else n_embd / n_head
  int64_t n_rot = 0;            // rope.dimension_count
  RopeLayout rope_layout = RopeLayout::Norm;
  float rope_freq_base = 10000.0f;
  float rope_freq_base_swa = 0.0f;  // sliding-window layers' base (Gemma 3: 10000); 0: the same
  RopeScaling rope_scaling;
  float rms_eps = 1e-5f;

  int64_t n_swa = 0;                // attention.sliding_window (0: none)
  std::vector<uint8_t> swa_layers;  // [n_layer] 1 where the layer attends through the window
  float attn_softcap = 0.0f;        // attention.logit_softcapping (0: none)
  float final_softcap = 0.0f;       // final_logit_softcapping (0: none)
  float attn_scale = 0.0f;          // query scale; 0: 1 / sqrt(head_dim)
  float embd_scale = 0.0f;          // token embeddings multiplied by this (Gemma: sqrt(n_embd)); 0: none
  float residual_scale = 0.0f;      // Granite: each block's output times this before its residual add; 0: none
  float logit_scale = 0.0f;         // Granite: logits divided by this; 0: none
  // `<arch>.pooling_type` as the file gives it (llama.cpp's numbering: 0 none, 1 mean, 2 cls,
  // 3 last, 4 rank), -1 when absent: how an embedding model pools its hidden states
  // (engine/engine.h, EmbeddingParams).
  int64_t pooling_type = -1;
  // `tern.ffn_activation` ("relu"): the dense FFN's activation when the file changes its
  // architecture's (a ReLU-fied SwiGLU model). Only SwiGLU architectures take it; nullopt: the
  // architecture's own.
  std::optional<FfnActivation> ffn_activation;

  // Mixture of experts (0 experts: a dense FFN).
  int64_t n_expert = 0, n_expert_used = 0;
  int64_t n_ff_exp = 0;             // expert_feed_forward_length (else feed_forward_length)
  int64_t n_ff_shexp = 0;           // expert_shared_feed_forward_length (0: no shared expert)
  ExpertGating expert_gating = ExpertGating::Softmax;
  bool expert_norm_topk = true;     // the chosen experts' weights renormalised to sum 1

  // State-space layers (Mamba, `<arch>.ssm.*`): the causal conv1d's width, the inner width, the
  // SSM state per channel, the rank of the time step's projection; FalconMamba RMS-normalises
  // dt, B and C (ssm.dt_b_c_rms). A model with them keeps a fixed-size state per sequence.
  // Mamba-2 (n_group > 0, ssm.group_count): dt_rank is the number of SSM heads (llama.cpp's
  // time_step_rank; head_dim = d_inner / dt_rank), and B and C, n_group of each, pass through
  // the conv beside x.
  struct Ssm {
    int64_t d_conv = 0, d_inner = 0, d_state = 0, dt_rank = 0;
    int64_t n_group = 0;  // Mamba-2's B/C groups; 0: Mamba-1
    bool dt_b_c_rms = false;
    // Qwen3-Next's gated delta-net layers (models/delta_net_block.h), as llama.cpp reads the same
    // keys: n_group key heads and dt_rank value heads, each of d_state (= d_inner / dt_rank); the
    // conv runs over q, k and v (2 n_group d_state + d_inner channels, conv_channels() below); the
    // state of a value head is [d_state][d_state] (d_state * d_inner in all, as Mamba-2's).
    bool gated_delta = false;
    // Channels through the causal conv: x, then (Mamba-2) B and C of every group.
    int64_t conv_channels() const { return d_inner + 2 * n_group * d_state; }
  } ssm;
  // RWKV-7 (`<arch>.wkv.head_size`, `<arch>.attention.{decay,iclr,value_residual_mix,gate}_lora_rank`,
  // `<arch>.attention.layer_norm_epsilon`, as llama.cpp's converter writes them): n_embd / head_size
  // WKV heads, each with a [head_size][head_size] state, and the LoRA ranks of the w, a, v and g
  // projections. The model's norms are LayerNorms with biases (eps norm_eps).
  // RWKV-6 (`<arch>.wkv.head_size`, `<arch>.time_mix_extra_dim`, `<arch>.time_decay_extra_dim`,
  // `<arch>.rescale_every_n_layers`): the same heads and state; the rank of the token-shift mixes'
  // LoRA (five of them) and of the decay's, and the halving of the residual stream after every
  // rescale_every-th layer (0: never).
  struct Rwkv {
    int64_t head_size = 0;  // > 0: an RWKV-6 or RWKV-7 model
    int64_t lora_decay = 0, lora_iclr = 0, lora_value_res = 0, lora_gate = 0;  // RWKV-7
    int64_t mix_extra_dim = 0, decay_extra_dim = 0, rescale_every = 0;         // RWKV-6
    float norm_eps = 1e-5f;
  } rwkv;
  bool is_rwkv() const { return rwkv.head_size > 0; }
  bool recurrent() const { return ssm.d_inner > 0 || is_rwkv(); }
  // A hybrid stack (Granite 4.0-H): Mamba-2 layers where attention.head_count_kv is 0, attention
  // on the others; ssm_layers[il] = 1 on the Mamba-2 ones. Empty: every layer is of one kind.
  // Qwen3-Next: ssm_layers marks its gated delta-net layers (ssm.gated_delta), whose
  // head_count_kv(il) is set to 0 (no K/V rows).
  std::vector<uint8_t> ssm_layers;
  bool hybrid() const { return !ssm_layers.empty(); }
  bool is_ssm_layer(int64_t il) const { return hybrid() ? ssm_layers[size_t(il)] != 0 : recurrent(); }

  // Multi-head latent attention (DeepSeek-V2/V3, `<arch>.attention.kv_lora_rank` etc. as
  // llama.cpp's converter writes them). The cache row of a token is the latent (kv_lora_rank,
  // after attn_kv_a_norm) then the roped key shared by every head (n_rot): head_dim is their sum
  // (attention.key_length) and n_head_kv 1, one K row and no V row per token and layer.
  struct Mla {
    int64_t q_lora_rank = 0;       // 0: q from attn_q directly (V2-Lite)
    int64_t kv_lora_rank = 0;      // > 0: the model uses MLA
    int64_t head_dim_k = 0;        // attention.key_length_mla: nope + rope of each query/key head
    int64_t head_dim_v = 0;        // attention.value_length_mla
    int64_t n_dense_lead = 0;      // leading_dense_block_count: layers with a dense FFN
    int64_t n_expert_shared = 0;   // expert_shared_count (shared experts of n_ff_exp each)
    float expert_weights_scale = 0.0f;  // 0: none
    float yarn_log_mul = 0.0f;     // rope.scaling.yarn_log_multiplier / 0.1 (mscale_all_dim)
    int64_t n_expert_groups = 0, n_group_used = 0;  // group-limited routing (0: none)
    // The non-absorbed reference (TERN_MLA=full, tests and benchmarks): K and V decompressed per
    // head and cached as such, head_dim = head_dim_k (V padded to it), n_head_kv = n_head.
    bool full_kv = false;
  } mla;
  bool is_mla() const { return mla.kv_lora_rank > 0; }
  // One row per token and layer serves as K and V (the latent cache; KvStore k_only).
  bool kv_k_only() const { return is_mla() && !mla.full_kv; }
  // f32 of one sequence's recurrent state in a layer: the conv window's last d_conv - 1 inputs
  // and the SSM state, [d_conv - 1][conv_channels] then [d_inner][d_state] (Mamba-2: the heads'
  // [head_dim][d_state] states one after another, the same layout).
  // RWKV-6 and RWKV-7: the time mix's and the channel mix's shifted token (n_embd each), then
  // the heads' WKV states, [n_embd / head_size][head_size][head_size].
  // Qwen3-Next's gated delta-net: the conv window [d_conv - 1][conv_channels] (q, k, v), then the
  // value heads' states [dt_rank][d_state (value)][d_state (key)] (the same count).
  int64_t state_floats() const {
    if (is_rwkv()) return 2 * n_embd + n_embd * rwkv.head_size;
    return recurrent() ? (ssm.d_conv - 1) * ssm.conv_channels() + ssm.d_state * ssm.d_inner : 0;
  }
  // The state of layer il: state_floats() on a state-space layer, 0 on a hybrid's attention layers.
  int64_t state_floats(int64_t il) const { return is_ssm_layer(il) ? state_floats() : 0; }
  int64_t state_floats_per_sequence() const {  // summed over the layers
    int64_t n = 0;
    for (int64_t il = 0; il < n_layer; ++il) n += state_floats(il);
    return n;
  }

  // Per layer; an HParams built by hand without the per-layer arrays has n_head etc. everywhere.
  int64_t head_count(int64_t il) const { return n_head_per_layer.empty() ? n_head : n_head_per_layer[size_t(il)]; }
  int64_t head_count_kv(int64_t il) const {
    return n_head_kv_per_layer.empty() ? n_head_kv : n_head_kv_per_layer[size_t(il)];
  }
  int64_t ff_length(int64_t il) const { return n_ff_per_layer.empty() ? n_ff : n_ff_per_layer[size_t(il)]; }
  bool is_swa(int64_t il) const { return n_swa > 0 && !swa_layers.empty() && swa_layers[size_t(il)] != 0; }
  int64_t n_embd_q(int64_t il) const { return head_count(il) * head_dim; }
  int64_t n_embd_kv(int64_t il) const { return head_count_kv(il) * head_dim; }
  int64_t n_embd_kv() const { return n_head_kv * head_dim; }  // the widest layer's
  bool uniform_layers() const;  // every layer has the same head counts and FFN width
};

// Reads the hyper-parameters of a GGUF model of any registered architecture; throws naming
// the file and key for missing, malformed or inconsistent values, and the supported
// architectures for an unknown one.
HParams read_hparams(const GgufFile& file);

}  // namespace tern
