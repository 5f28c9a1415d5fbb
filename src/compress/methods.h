#pragma once
// The compression methods `tern quantize --method` and `tern compare` apply, one name each:
//
//   f32, f16, bf16, q8_0, q6_k, q5_k, q5_0,  llama.cpp's types and rules (quantize.h)
//   q4_k, q4_0, q3_k, q2_k, tq2_0, tq1_0
//   rtn-int4 / -int3 / -int8                  round-to-nearest into TQ (the baseline of GPTQ/AWQ)
//   gptq-int4 / -int3 / -int8                 GPTQ into TQ (gptq.h)
//   awq-int4 / -int3                          AWQ into TQ (awq.h)
//   llm.int8                                  LLM.int8(): TI8 with 16-bit outlier columns
//   smoothquant-w8a8 (smoothquant)            SmoothQuant: smoothing folded into norms and
//                                             linears, then TI8 W8A8
//   billm                                     BiLLM binarization with the Hessian (billm.h)
//                                             into BILLM_G64/G128 (quant/quant_billm.h)
//   billm-rtn, billm-sign                     the same format without calibration: BiLLM's
//                                             binarizers alone; plain sign binarization
//   magnitude|wanda|sparsegpt[-owl]-<s>       pruning (prune.h) of every linear to sparsity <s>
//                                             ("50": 50% unstructured, "2:4": N:M), stored in
//                                             the source's float type unless opts.prune_type
//
// Every method writes a GGUF file that tern runs with its own kernels. The tensors the methods
// were not designed for (token embedding, output) follow llama.cpp's rule for the method's bit
// width (q8_0 for 8-bit methods, q4_0's rules for 4- and 3-bit ones), so sizes compare like for
// like; the binarizations (billm*) follow q4_0's rules as the 3-bit ones do. Details, formulas and formats: docs/compression.md.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "compress/awq.h"
#include "compress/calibrate.h"
#include "compress/quantize.h"
#include "compress/structured.h"

namespace tern {

struct MethodInfo {
  const char* name;
  const char* summary;
  bool needs_calib;    // runs the model on a calibration text
  bool needs_hessian;  // ... and accumulates X^T X (GPTQ)
};

// Every method, in the order `tern compare` lists them.
const std::vector<MethodInfo>& compression_methods();
// The method of that name ("smoothquant" is an alias of "smoothquant-w8a8"; pruning methods
// are parsed from theirs); throws "unknown method 'x' (known: ...)" or the pattern's error.
const MethodInfo& find_method(const std::string& name);
// Whether `name` is a pruning method (unstructured, N:M or structured; "@type" allowed), the
// ones a recovery fine-tune can follow.
bool is_pruning_method(const std::string& name);
// The default method list of `tern compare` for a source of type `src_type`.
std::vector<std::string> default_compare_methods(DType src_type);

struct MethodOptions {
  double threshold = 6.0;   // LLM.int8(): outlier when calibration max|x_j| exceeds this
  double alpha = 0.5;       // SmoothQuant migration strength
  double damp = 0.01;       // GPTQ dampening (fraction of the mean Hessian diagonal)
  bool act_order = false;   // GPTQ act-order
  int64_t group = 128;      // GPTQ/AWQ/RTN group size (the row length when smaller)
  // false (tern compare --speed-only, random-weight models): GPTQ/AWQ/SmoothQuant write their
  // format with round-to-nearest values and no smoothing, which has the same size and speed.
  bool search = true;
  AwqOptions awq;
  // Pruning: the type the pruned linears are stored in (default: the source tensor's float
  // type); OWL's lambda (the spread of layer sparsities) and outlier multiple M; SparseGPT's
  // mask block.
  std::optional<DType> prune_type;
  double owl_lambda = 0.08;
  double owl_m = 5.0;
  int64_t sparsegpt_block = 128;
  // Pruning, sequential (as the papers prune): each layer's calibration inputs come from the
  // model with the layers before it already pruned: n_layer calibration runs with these
  // options (text, tokens) instead of one; unset: every layer uses `calib` (the dense model's).
  std::optional<CalibOptions> sequential;
  // Structured pruning: what the sparsity is a fraction of, StructuredOptions::ratio_of
  // ("model", as LLM-Pruner and FLaP report it, or "layers").
  std::string structured_ratio_of = "model";
  // Structured pruning: kept FFN widths a multiple of this (StructuredOptions::ffn_multiple);
  // 0: the block of the type the linears are stored in ("@q8_0": 32, "@q4_K": 256; 1 for
  // float), so that ffn_down's rows quantize without a fallback.
  int64_t structured_ffn_multiple = 0;
  // llm-pruner-<s>: the gradient scores of the model at the path (the training engine computes
  // them, above this layer: tools/llm_pruner.h sets this).
  std::function<std::vector<LayerScores>(const std::string&)> gradient_scores;
  int n_threads = 0;
  ProgressFn progress;
};

// Per linear layer details of a run.
struct LayerReport {
  std::string name;
  double err = -1;       // output error ||X W^T - X Q^T||^2 on calibration data (GPTQ, AWQ)
  double err_rtn = -1;   // the same for round-to-nearest at the same bits and group size
  int64_t outliers = -1; // LLM.int8() outlier columns
  double alpha = -1;     // AWQ's chosen exponent
  double sparsity = -1;  // pruning: fraction of the weights that are 0
};

struct MethodReport {
  std::string method;
  QuantizeReport quant;  // per-tensor types and bytes
  std::vector<LayerReport> layers;
  std::vector<std::string> notes;
  double seconds = 0;
};

// Throws when `method` cannot start from `src` (a source already quantized to another type);
// apply_method checks it too, callers check first to fail before slow work.
void check_method_source(const std::string& method, const GgufFile& src);

// Applies `method` to the float model IN and writes OUT. `calib` is required when the method
// needs calibration (find_method(..).needs_calib; with the Hessian for GPTQ when opts.search).
// Throws tern::Error for a source already quantized to a type the method cannot start from.
MethodReport apply_method(const std::string& method, const std::string& in_path, const std::string& out_path,
                          const CalibStats* calib, const MethodOptions& opts);

}  // namespace tern
