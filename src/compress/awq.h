#pragma once
// AWQ (Lin et al., 2023): activation-aware weight quantization. A few input channels carry large
// activations; scaling their weights up by s_j before group quantization (and the activations
// down by 1/s_j, folded into the previous operation) shrinks their relative rounding error.
// The scales are s_j = mean|x_j|^alpha (normalised by sqrt(max s * min s)), with alpha chosen on
// a grid to minimise the output error of the linears that read the input, measured on
// calibration activations:
//
//     alpha* = argmin_alpha  sum_W || X W^T - (X diag(s)^-1) Q(W diag(s))^T ||^2
//
// then each (row, group)'s quantization range is shrunk ("clipped") by the factor in
// [1 - max_shrink, 1] that minimises that group's share of the output error.
#include <cstdint>
#include <vector>

#include "compress/calibrate.h"
#include "compress/group_quant.h"

namespace tern {

struct AwqOptions {
  int bits = 4;
  int64_t group = 128;
  int grid = 20;            // alpha in {0, 1/grid, ..., (grid-1)/grid}
  int clip_grid = 20;       // shrink factors 1, 1 - max_shrink/clip_grid, ...
  double max_shrink = 0.5;
  int64_t clip_tokens = 256;  // calibration rows the clipping search uses
  // AutoAWQ's "duo scaling": s_j = mean|x_j|^alpha / mean|w_j|^(1 - alpha), the weight term
  // being |w| relative to its group's max, averaged over rows. Off: on stories260K it raised the
  // perplexity (4.169 vs 4.155, 100 chunks).
  bool duo = false;
  bool mlp_objective = true;  // judge ffn_gate/up scales at the MLP's output (see awq_search)
};

struct AwqScales {
  std::vector<float> s;  // [n_in] per input channel (tied channels share a value)
  double alpha = 0;
  double err = 0;        // output error at the chosen alpha
  double err_rtn = 0;    // at alpha = 0 (s = 1): plain round-to-nearest
};

// Searches the scales for the linears `w` (each [n_out[k], n_in]) that read `site`. `tie`
// (empty, or a class id per channel) forces channels of one class to share a scale: the inputs
// of attn_output whose heads share a K/V head (GQA) must, since their scale folds into one
// attn_v row.
//
// With `down` (w = {ffn_gate, ffn_up}), the error is measured where llm-awq measures it for the
// MLP: at the block's output down(silu(x gate^T) * (x up^T)), down kept in f32.
//
// llm-awq also judges attn_q/k/v at the attention block's output; on stories260K that raised
// the perplexity (4.174 vs 4.153, 100 chunks), so tern judges them at their own outputs.
AwqScales awq_search(const std::vector<const float*>& w, const std::vector<int64_t>& n_out, int64_t n_in,
                     const SiteStats& site, const std::vector<int32_t>& tie, const AwqOptions& opts,
                     ThreadPool& pool, const float* down = nullptr, int64_t down_n_out = 0);

// Quantizes already scaled weights ws = W diag(s) ([n_out, n_in]) with the per-group clipping
// search on the scaled activations x / s (xs: [n_t, n_in]); clip = false is plain RTN.
GroupQuant awq_quantize(const float* ws, int64_t n_out, int64_t n_in, const float* xs, int64_t n_t, bool clip,
                        const AwqOptions& opts, ThreadPool& pool);

}  // namespace tern
