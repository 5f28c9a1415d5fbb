#pragma once
// Requantizing a model file (`tern quantize`) and the pieces every compression method shares:
// choosing each tensor's type the way llama-quantize does by default, encoding f32 rows into a
// storage type, and writing the result as a GGUF file that tern and llama.cpp load.
//
// Type rules (llama-quantize's defaults, see docs/quantize.md):
//   - 1-D tensors (norms) and the matrices of quantize.cpp's kKeptMatrices table (2-D norms such
//     as Mamba-2's ssm_norm, ssm_conv1d taps, RWKV-7's LoRAs and token-shift mixes, MoE routers)
//     are copied as they are;
//   - for a quantized target, output.weight (or token_embd.weight when the output is tied) gets
//     q6_k when its rows fit 256-element super-blocks, else q8_0 (a q8_0 target keeps q8_0);
//   - mxfp4 means llama.cpp's MXFP4_MOE: the 3-D expert tensors get mxfp4, every other matrix
//     (the output included) q8_0;
//   - tq1_0 / tq2_0 (llama.cpp's MOSTLY_TQ1_0 / _TQ2_0): the output as above (q6_k), an untied
//     token_embd.weight q4_k, every other matrix the ternary type;
//   - q4_k means llama.cpp's Q4_K_M mix: attn_v and ffn_down of the "more bits" layers get q6_k;
//   - a tensor whose rows do not fit the chosen type's block size falls back to the nearest type
//     that fits and is at least as precise (k-quant -> q8_0 -> f16; tq1_0 / tq2_0 -> q4_0, as
//     llama.cpp), reported per tensor;
//   - --pure: every 2-D tensor gets the requested type (llama-quantize --pure), still with the
//     per-tensor fallback (llama.cpp refuses such tensors instead).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "quant/quant_traits.h"

namespace tern {

// Progress of long work, reported by the compress layer and drawn by the caller (tools/ has the
// progress bar): done out of total units, and a note (the tensor or layer being worked on).
using ProgressFn = std::function<void(int64_t done, int64_t total, const std::string& note)>;

struct QuantizeOptions {
  DType type = DType::Q8_0;           // requested type of the 2-D weights
  std::vector<std::string> keep;      // glob patterns (fnmatch): tensors copied unchanged
  bool pure = false;                  // no output/embedding/mix rules (llama-quantize --pure)
  bool allow_requantize = false;      // quantized source -> another quantized type
  std::optional<DType> output_type;   // override for output.weight
  std::optional<DType> embd_type;     // override for token_embd.weight
  int n_threads = 0;                  // 0: all cores
  ProgressFn progress;                // optional
};

// What happened to one tensor.
struct TensorReport {
  std::string name;
  std::vector<int64_t> ne;
  DType src_type = DType::F32;
  DType requested = DType::F32;  // what the rules asked for
  DType type = DType::F32;       // what was written (differs from requested after a fallback)
  std::string reason;            // why this type: "default", "output rule", "fallback: ...", "kept"
  int64_t src_bytes = 0;
  int64_t bytes = 0;
};

struct QuantizeReport {
  std::vector<TensorReport> tensors;
  int64_t src_bytes = 0;       // all tensor data of the source
  int64_t bytes = 0;           // all tensor data written
  uint32_t file_type = 0;      // general.file_type written (llama_ftype)
  double seconds = 0;
  int n_fallbacks() const;
};

// Names the types `tern quantize --type` accepts, for messages ("f32, f16, ...").
std::string quantize_type_names();
// Parses a --type value; throws tern::Error("unknown type 'x' (known: ...)").
DType parse_quantize_type(const std::string& name);

// llama_file_type and fit_row_type: quant/quant_traits.h.

// The type llama-quantize's default rules give tensor `t` of `src` for the target `opts.type`
// (before the row-size fallback), and why.
std::pair<DType, std::string> default_tensor_type(const GgufFile& src, const GgufTensorInfo& t,
                                                  const QuantizeOptions& opts);
// The same for a tensor of a model that is not a file yet (quantization-aware training plans its
// types before there is one): has_output = the model has output.weight, n_layer its block count.
std::pair<DType, std::string> default_tensor_type(const std::string& name, const std::vector<int64_t>& ne,
                                                  bool has_output, int n_layer, const QuantizeOptions& opts);

// Whether `name` matches one of the glob patterns.
bool matches_any(const std::string& name, const std::vector<std::string>& globs);

// Dequantizes a whole tensor to f32: [n_rows, ne[0]].
std::vector<float> tensor_to_f32(const GgufTensorInfo& t, ThreadPool& pool);
// Encodes rows of f32 into `type` (round-to-nearest quantizer of the traits table), in parallel:
// x is [n_rows, n_in]; returns n_rows * dtype_row_bytes(type, n_in) bytes.
std::vector<uint8_t> encode_rows(const float* x, int64_t n_in, int64_t n_rows, DType type, ThreadPool& pool);

// A tensor of the output file: its bytes are either borrowed (`data`, e.g. the source mapping)
// or owned.
struct OutTensor {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> ne;
  const uint8_t* data = nullptr;
  uint64_t n_bytes = 0;
  std::vector<uint8_t> owned;

  void own(std::vector<uint8_t> bytes) {
    owned = std::move(bytes);
    data = owned.data();
    n_bytes = owned.size();
  }
};

// Writes `src`'s metadata (with `set_kv` applied on top, in order) and `tensors` to `path`.
void write_model(const GgufFile& src, const std::vector<OutTensor>& tensors,
                 const std::vector<std::pair<std::string, GgufValue>>& set_kv, const std::string& path);

// Requantizes IN into OUT. Throws tern::Error for a bad input, an unquantizable type or a
// requantization that was not allowed.
QuantizeReport quantize_model(const std::string& in_path, const std::string& out_path,
                              const QuantizeOptions& opts);
// The same into memory: the GGUF image of `src` requantized (a self-speculation draft is the
// target's own weights in a cheaper type, docs/speculative.md).
std::vector<uint8_t> quantize_model_image(const GgufFile& src, const QuantizeOptions& opts,
                                          QuantizeReport* report = nullptr);

// Writes the tensor values of VALUES (e.g. a training checkpoint in f32) to OUT in LAYOUT's form:
// LAYOUT's metadata (with set_kv on top) and tensor order, each tensor in LAYOUT's type, or
// `linear_type` for the layers' 2-D weights ("blk.*") when given (row-size fallbacks as above).
// Both files must hold the same tensors with the same shapes. Exact zeros stay exact in every type.
QuantizeReport store_in_layout(const std::string& layout, const std::string& values, const std::string& out,
                               std::optional<DType> linear_type,
                               const std::vector<std::pair<std::string, GgufValue>>& set_kv, int n_threads);

}  // namespace tern
