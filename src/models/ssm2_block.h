#pragma once
// The Mamba-2 mixer as a block (llama.cpp's build_mamba2_layer less its input norm and residual):
// models/mamba2.cpp runs it on every layer, the hybrid decoder (Granite 4.0-H, models/decoder.cpp)
// on the layers whose attention.head_count_kv is 0. On xn (the layer's normalised input), with H
// heads of P = d_inner / H channels and G groups of H / G heads:
//   [z | xBC | dt] = ssm_in xn            z: [d_inner], xBC: [d_inner + 2 G d_state], dt: [H]
//   xBC = silu(conv1d(xBC) + conv_bias)   causal, d_conv taps per channel (x, B and C alike)
//   [x | B | C] = xBC                     B, C: [G][d_state], group g for heads g H/G ...
//   dt = softplus(dt + dt_bias)           one time step per head
//   h[c][s] = h[c][s] exp(dt[hd] A[hd]) + dt[hd] B[g][s] x[c]   the scan (ops.h ssm2_scan)
//   y[c] = (sum_s h[c][s] C[g][s] + D[hd] x[c]) silu(z[c])       (hd: c's head, g: its group)
//   y = RMSNorm per group of d_inner / G channels, times ssm_norm
//   out = ssm_out y
// A sequence's state in layer il (HParams::state_floats: the conv window's last d_conv - 1 inputs
// of every conv channel, then the heads' [head_dim][d_state] states) is kv.state(il, state_slot);
// the caller zeroes it when the sequence starts.
// The scan has two forms: the recurrence token by token (ops.h ssm2_scan) and the chunked "SSD"
// form (ssm2_scan_chunked: chunks of kSsm2Chunk tokens as small matrix products, the state
// updated once per chunk). A sequence whose step has at least kSsm2ChunkedMinTokens tokens
// (prefill) takes the chunked form, a shorter one (decode) the recurrence; TERN_SSM_SCAN=
// recurrent or chunked (read when the block is made, i.e. at model load) takes one form for
// every step, auto (or unset) the default rule. The two forms agree to float rounding (~1e-6
// relative), not bit for bit: a prompt in one step, in chunks or token by token gives the same
// logits within ~1e-5 relative and the same greedy ids (tests/models/
// test_ssm2_chunked_prefill.cpp); with TERN_SSM_SCAN=recurrent the same bits, as before.
#include <span>
#include <string>
#include <vector>

#include "models/linear.h"
#include "models/model.h"
#include "models/weight_loader.h"

namespace tern {

struct Ssm2Weights {
  Linear in;                         // [n_embd -> 2 d_inner + 2 G d_state + H]
  const float* conv = nullptr;       // [conv channels][d_conv], tap 0 the oldest input
  const float* conv_bias = nullptr;  // [conv channels]
  const float* dt_bias = nullptr;    // [H]
  const float* a = nullptr;          // [H]
  const float* d = nullptr;          // [H]
  const float* group_norm = nullptr; // [d_inner], group g's weights at g d_inner / G
  Linear out;                        // [d_inner -> n_embd]
};

// Binds layer il's ssm_* tensors (names, shapes and types checked by the loader; A must be <= 0).
Ssm2Weights bind_ssm2(WeightLoader& ld, const HParams& hp, int64_t il, const std::string& path);

// Which form of the scan a step's sequences take (see the top of the file).
enum class Ssm2ScanMode { Auto, Recurrent, Chunked };
// TERN_SSM_SCAN: unset, empty or "auto" -> Auto; "recurrent"; "chunked"; anything else fails.
Ssm2ScanMode ssm2_scan_mode_from_env();
// Tokens per chunk of the chunked form, and the fewest tokens of a sequence's step that take it
// under Auto (measured on AVX-512, docs/models.md "State-space models").
inline constexpr int64_t kSsm2Chunk = 64;
inline constexpr int64_t kSsm2ChunkedMinTokens = 8;

// The block's scratch (sized by reserve) and its pass. Not thread-safe: one pass at a time.
class Ssm2Block {
 public:
  Ssm2Block() : mode_(ssm2_scan_mode_from_env()) {}
  // Whether a sequence's step of n tokens takes the chunked form.
  bool chunked(int64_t n) const {
    return mode_ == Ssm2ScanMode::Chunked || (mode_ == Ssm2ScanMode::Auto && n >= kSsm2ChunkedMinTokens);
  }
  void reserve(const HParams& hp, int64_t n_tokens);
  // out [T, n_embd] = the mixer of layer il over xn [T, n_embd] (out may be xn), the tokens of
  // `seqs` one after another; reads and advances each sequence's state in kv.
  void run(const Ssm2Weights& L, const HParams& hp, int64_t il, std::span<const SeqBatch> seqs, KvStore& kv,
           const float* xn, float* out, int64_t T, ThreadPool& pool, const LinearHooks& hooks);
  // ssm_in's rows: z, xBC, dt.
  static int64_t in_width(const HParams& hp) { return hp.ssm.d_inner + hp.ssm.conv_channels() + hp.ssm.dt_rank; }

 private:
  std::vector<float> proj_;  // [T, in_width] z, xBC, dt as ssm_in gives them
  std::vector<float> xbc_;   // [T, conv channels] the conv's output: x, B, C
  std::vector<float> dt_;    // [T, H] dt + dt_bias
  std::vector<float> y_;     // [T, d_inner]
  Ssm2ScanMode mode_;
};

}  // namespace tern
