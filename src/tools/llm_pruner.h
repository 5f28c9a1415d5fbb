#pragma once
// LLM-Pruner's structure importance (Ma et al., 2023) from the training engine's gradients: for
// every weight, the first-order Taylor estimate of the loss change when it is removed,
// |w * dL/dw|, with dL/dw averaged over calibration windows; a structure's importance is the
// sum over its dependency group, in compress/structured.h's LayerScores layout:
//   attention input channel c of attn_output (query head h = c / head_dim): attn_q's row c and
//     attn_output's column c; the KV head's attn_k / attn_v rows are added to the channels of its
//     group's first query head (they go when the group goes);
//   FFN channel j: ffn_gate's and ffn_up's row j and ffn_down's column j.
// It lives in tools/ because compress/ sits below the training engine.
#include <cstdint>
#include <string>
#include <vector>

#include "compress/calibrate.h"
#include "compress/methods.h"
#include "compress/structured.h"

namespace tern {

struct LlmPrunerOptions {
  std::string text_file;   // calibration text (its last n_tokens tokens)
  int64_t n_tokens = 4096;
  int64_t n_ctx = 128;     // tokens per window
  int64_t n_seq = 4;       // windows per micro-batch
  int n_threads = 0;
  ProgressFn progress;
};

// The scores of `model_path` (a float llama/deci model the training engine loads).
std::vector<LayerScores> llm_pruner_scores(const std::string& model_path, const LlmPrunerOptions& opts);

// Lets `mopts` run llm-pruner methods: their scores from the calibration text and threads of
// `copts` (the text is checked when a method asks).
void enable_llm_pruner(MethodOptions& mopts, const CalibOptions& copts);

}  // namespace tern
