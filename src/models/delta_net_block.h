#pragma once
// Qwen3-Next's gated delta-net (linear attention) layer as a block (llama.cpp's
// build_layer_attn_linear less its input norm and residual): the hybrid decoder
// (models/decoder.cpp) runs it on the layers HParams::ssm_layers marks (ssm.gated_delta). With
// Hk key heads and Hv value heads (r = Hv / Hk value heads per key head), all of S channels,
// on xn (the layer's normalised input):
//   [q | k | v] = attn_qkv xn        q, k: [Hk][S], v: [Hv][S]   (C = 2 Hk S + Hv S conv channels)
//   z = attn_gate xn                 [Hv][S]
//   ba = ssm_ba xn                   per key head: its r value heads' b, then their a
//   [q | k | v] = silu(conv1d(q | k | v))   causal, d_conv taps per channel, no bias
//   q, k = L2-normalised per head (eps: the RMS norm's)
//   beta = sigmoid(b), g = softplus(a + dt_bias) ssm_a      per value head (ssm_a = -exp(A_log))
//   the gated delta rule per value head h on key head h / r (ops.h gated_delta; q scaled by
//   1 / sqrt(S))
//   y = RMSNorm per value head (ssm_norm) times silu(z)
//   out = ssm_out y
// Older files have ssm_in (q, k, v, z grouped per key head) in place of attn_qkv and attn_gate;
// the block regroups its rows. A sequence's state in layer il (HParams::state_floats: the conv
// window's last d_conv - 1 inputs of every channel, then the value heads' [S][S] states) is
// kv.state(il, state_slot); the caller zeroes it when the sequence starts. Prefill and decode run
// the same recurrence token by token, so a prompt in one step, in chunks or token by token gives
// the same bits.
#include <span>
#include <string>
#include <vector>

#include "models/linear.h"
#include "models/model.h"
#include "models/weight_loader.h"

namespace tern {

struct DeltaNetWeights {
  Linear qkv;                      // attn_qkv [n_embd -> C]: q, k, v rows (absent with ssm_in)
  Linear gate;                     // attn_gate [n_embd -> Hv S]: z
  Linear qkvz;                     // ssm_in [n_embd -> C + Hv S], older files: per key head q, k, v, z
  Linear ba;                       // ssm_ba [n_embd -> 2 Hv]
  const float* conv = nullptr;     // [C][d_conv], tap 0 the oldest input
  const float* dt_bias = nullptr;  // [Hv]
  const float* a = nullptr;        // [Hv] -exp(A_log) (<= 0)
  const float* norm = nullptr;     // [S] the output norm's weight, shared by the value heads
  Linear out;                      // [Hv S -> n_embd]
};

// Binds layer il's tensors (names, shapes and types checked by the loader; ssm_a must be <= 0);
// throws naming the layer when it has neither attn_qkv + attn_gate nor ssm_in.
DeltaNetWeights bind_delta_net(WeightLoader& ld, const HParams& hp, int64_t il, const std::string& path);

// The block's scratch (sized by reserve) and its pass. Not thread-safe: one pass at a time.
class DeltaNetBlock {
 public:
  void reserve(const HParams& hp, int64_t n_tokens);
  // out [T, n_embd] = the layer il's mixer over xn [T, n_embd] (out may be xn), the tokens of
  // `seqs` one after another; reads and advances each sequence's state in kv.
  void run(const DeltaNetWeights& L, const HParams& hp, int64_t il, std::span<const SeqBatch> seqs, KvStore& kv,
           const float* xn, float* out, int64_t T, ThreadPool& pool, const LinearHooks& hooks);

 private:
  std::vector<float> qkv_;   // [T, C] q, k, v as the projection gives them
  std::vector<float> z_;     // [T, Hv S]
  std::vector<float> ba_;    // [T, 2 Hv]
  std::vector<float> qkvz_;  // [T, C + Hv S] ssm_in's rows (older files)
  std::vector<float> conv_;  // [T, C] the conv's output: q, k (L2-normalised), v
  std::vector<float> g_;     // [T, Hv] log decay
  std::vector<float> beta_;  // [T, Hv]
  std::vector<float> y_;     // [T, Hv S]
};

}  // namespace tern
