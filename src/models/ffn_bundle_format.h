#pragma once
// Neuron bundles (issue #31, docs/sparsity.md "Models larger than memory"): per dense ReGLU
// layer, neuron j's gate row, up row and down_t row (ffn_down's column j) side by side, so that
// one read from the file brings everything a sparse FFN needs of a neuron, and the bundles of
// neurons j, j + 1, ... are one contiguous read (LLM in a flash's row-column bundling). The
// neuron store (models/neuron_store.h) reads cold neurons from them under --ram-budget.
//
//   blk.{il}.ffn_bundle        I8, ne [bundle_bytes, n_ff]: row j = gate_j | up_j | down_t_j
//                              gate_j, up_j: ffn_gate's and ffn_up's row j, bytes unchanged;
//                              down_t_j: build_down_t (kernels/sparse_ffn.h) of ffn_down, row j
//   tern.ffn_bundle.down_type  u32 (the DType id of down_t's rows)
//   tern.ffn_bundle.model      string: ffn_gate_fingerprint() of the model they were made from
//
// `tern predictor bundle` writes them into a copy of the model (the dense tensors stay: the same
// file still runs dense and in full memory).
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gguf/gguf.h"

namespace tern {

inline constexpr const char* kFfnBundleDownTypeKey = "tern.ffn_bundle.down_type";
inline constexpr const char* kFfnBundleModelKey = "tern.ffn_bundle.model";

// "blk.{il}.ffn_bundle".
std::string ffn_bundle_name(int64_t il);
bool is_ffn_bundle_tensor(const std::string& name);
bool has_ffn_bundles(const GgufFile& f);

// Where a neuron's rows sit inside its bundle.
struct FfnBundleLayout {
  DType type = DType::Q4_0;         // gate and up rows
  DType down_t_type = DType::Q8_0;  // down_t rows
  int64_t n_embd = 0, n_ff = 0;
  int64_t gate_up_bytes = 0;        // one gate (or up) row
  int64_t down_t_bytes = 0;         // one down_t row
  int64_t bundle_bytes() const { return 2 * gate_up_bytes + down_t_bytes; }
  int64_t up_offset() const { return gate_up_bytes; }
  int64_t down_t_offset() const { return 2 * gate_up_bytes; }
};

// The bundles of layer il in `f` (the model file itself): checks the tensor against the layer's
// ffn_gate (type, n_embd, n_ff) and the down type key. Throws tern::Error naming the file and
// tensor; a file without bundles says how to write them.
struct FfnBundleTensor {
  FfnBundleLayout layout;
  uint64_t file_offset = 0;  // of row 0 in the file
};
FfnBundleTensor read_ffn_bundle(const GgufFile& f, int64_t il);

// The bytes of a model's own weights: every tensor but a predictor's and the bundles (what
// --ram-budget's percentages are of).
int64_t model_weight_bytes(const GgufFile& f);

// Writes `out`: every key and tensor of `model` unchanged (bundles it had are replaced), plus the
// bundles of every dense ReGLU layer (blk.{il}.ffn_gate, ffn_up, ffn_down present, gate and up
// of one type the sparse kernels read), down_t in `down_t_type`. Throws tern::Error when no
// layer qualifies or a type is not one the sparse kernels read.
struct FfnBundleReport {
  int64_t layers = 0, n_ff_total = 0, bundle_bytes = 0;  // bytes of all bundles written
  DType down_t_type = DType::Q8_0;
};
FfnBundleReport write_with_ffn_bundles(const GgufFile& model, DType down_t_type, const std::string& out);

// down_t's default type for a ffn_down of type `down` (SparseFfnConfig::down_t_type's).
DType default_down_t_type(DType down);

}  // namespace tern
