#pragma once
// Structured pruning: whole attention heads (with GQA: one KV head and the query heads that read
// it) and whole FFN channels are removed, so the result is a smaller *dense* model that runs on
// the ordinary kernels, with per-layer head counts and FFN widths in its metadata
// (<arch>.attention.head_count / head_count_kv / feed_forward_length as arrays, as llama.cpp
// reads them).
//
// Methods:
//   flap       FLaP (An et al., 2024): importance of an input channel j of attn_output / ffn_down
//              S_j = Var_calib(x_j) * ||W[:, j]||^2 (a head: the sum over its channels), scores
//              standardized (per layer by default, as FLaP's code; or per structure kind over all
//              layers, StructuredOptions::standardize), the globally lowest removed until
//              `ratio` of the parameters is gone (of the model's, or of the layers' weights:
//              StructuredOptions::ratio_of); the removed channels' mean
//              contribution W[:, removed] . mean(x[removed]) becomes the output projection's bias.
//   llm-pruner LLM-Pruner (Ma et al., 2023): a structure's score is the first-order Taylor
//              importance sum |w * dL/dw| over all its weights (StructuredOptions::scores), the
//              same search, no compensation (the method recovers by fine-tuning instead).
//   magnitude  the baseline without calibration: a structure's score is the sum of squares of
//              all its weights (q/k/v rows and attn_output columns; gate/up rows and the ffn_down
//              column), same standardization and search, no bias compensation.
// A Llama whose layers end up different is written as architecture "deci" (llama.cpp's Llama with
// per-layer shapes; its llama loader sizes every layer by layer 0). Formulas, keys and measured
// figures: docs/compression.md.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compress/calibrate.h"
#include "compress/quantize.h"
#include "gguf/gguf.h"

namespace tern {

struct StructuredOptions {
  std::string method = "flap";    // "flap" or "magnitude"
  double ratio = 0.2;             // fraction of the parameters to remove (of what: ratio_of), in (0, 1)
  // What `ratio` is a fraction of. "model": every parameter of the file (embeddings, output,
  // norms and the layers), as LLM-Pruner and FLaP count theirs (LLaMA-7B at 20%: 6.7B -> 5.4B
  // parameters), all of it taken out of the layers' heads and FFN channels, so the file shrinks
  // by about `ratio`. "layers": the layers' attention and FFN weights only (embedding and output
  // are never pruned, so the file shrinks by less).
  std::string ratio_of = "model";
  bool bias_compensation = true;  // flap only: removed channels' mean output -> output bias
  int64_t min_ffn = 0;            // FFN channels every layer keeps; 0: max(1, n_ff / 16)
  // How scores become comparable across layers and kinds: "global" standardizes the heads' and
  // the FFN channels' scores over all layers; "layer" standardizes every layer's channel scores
  // on their own (a head: the mean of its channels' z), as FLaP's reference code does.
  std::string standardize = "layer";
  int64_t ffn_multiple = 1;       // kept FFN widths rounded down to a multiple of this (e.g. 32
                                  // so that a later q8_0/q4_0 quantization fits ffn_down's rows;
                                  // 256 for the K-quants), removing a little more than `ratio`
  // method "llm-pruner": the structures' scores come from outside (LLM-Pruner's first-order
  // Taylor importance needs gradients, which the training engine computes:
  // tools/llm_pruner.h), in structured_scores' layout; no bias compensation.
  const std::vector<struct LayerScores>* scores = nullptr;
  int n_threads = 0;
  ProgressFn progress;
};

// The scores of one layer's structures (raw, before standardization).
struct LayerScores {
  std::vector<double> attn_ch;   // [n_head * head_dim] one input channel of attn_output
  std::vector<double> kv_group;  // [n_head_kv] one KV head with the query heads reading it (sum of attn_ch)
  std::vector<double> ffn;       // [n_ff] one FFN channel
};

struct StructuredLayer {
  int64_t n_head_before = 0, n_head_kv_before = 0, n_ff_before = 0;
  int64_t n_head = 0, n_head_kv = 0, n_ff = 0;
  std::vector<int64_t> kept_kv;   // KV heads kept, ascending (their query heads go with them)
  std::vector<int64_t> kept_ffn;  // FFN channels kept, ascending
};

struct StructuredReport {
  std::string method;
  double ratio = 0;
  std::vector<StructuredLayer> layers;
  std::string ratio_of;
  int64_t model_params = 0;                                 // every tensor's elements, before
  int64_t layer_params_before = 0, layer_params_after = 0;  // attention + FFN weights
  int64_t bytes_before = 0, bytes_after = 0;                // all tensor data
  std::vector<std::string> notes;
  double seconds = 0;
};

// Throws unless `src` can be pruned: a supported architecture (llama, qwen2, qwen3) with
// separate q/k/v and gate/up/down matrices, no experts, float (f32/f16/bf16) layer weights.
// Callers check first to fail before calibration.
void check_structured_source(const GgufFile& src);

// The FFN width multiple that lets a pruned model's ffn_down rows be stored whole in `stored`:
// its block (q8_0 32, the K-quants 256), 1 for float types or none.
int64_t ffn_multiple_for(std::optional<DType> stored);

// The raw scores of every layer's structures (`calib` is required for flap, unused by magnitude).
std::vector<LayerScores> structured_scores(const GgufFile& src, const CalibStats* calib, const std::string& method,
                                           int n_threads = 0, const ProgressFn& progress = {});

// Prunes IN into OUT. Throws tern::Error for an unsupported or quantized source, a ratio outside
// (0, 1) or too large for the per-layer minimums, an unknown ratio_of or method, missing
// calibration for flap, or OUT naming IN.
StructuredReport structured_prune(const std::string& in_path, const std::string& out_path, const CalibStats* calib,
                                  const StructuredOptions& opts);

}  // namespace tern
