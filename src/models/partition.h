#pragma once
// Which part of a model one process holds when a model is spread over several (dist/: tensor
// and pipeline parallelism over MPI). A pipeline stage holds the contiguous layers
// [layer_begin, layer_end); the first stage also the token embeddings, the last the output norm
// and projection. Within a stage, tensor parallelism splits every layer over tp_size ranks
// (Megatron's split): rank r holds its n_head / tp_size query heads and n_head_kv / tp_size KV
// heads (their q/k/v rows and attn_output's columns, so its K/V cache holds only its heads), and
// a contiguous range of the FFN's channels (gate/up rows, ffn_down's columns; in a mixture-of-
// experts layer, of every expert's and of the shared expert's, with the router whole on each
// rank). The outputs of attn_output, ffn_down and the experts' weighted sum are then partial
// sums, which `all_reduce` adds up over the stage's
// ranks (the same bits on each) before the residual. The output projection is split by vocabulary
// rows, the logits gathered. A default partition is the whole model.
#include <cstdint>
#include <span>
#include <vector>
#include <functional>
#include <string>

#include "models/hparams.h"

namespace tern {

struct ModelPartition {
  int64_t layer_begin = 0;
  int64_t layer_end = -1;  // -1: through the last layer
  int tp_rank = 0;
  int tp_size = 1;
  // x[0 .. n) := the sum of x over the stage's tensor-parallel ranks (in rank order, so every
  // rank gets the same bits). Required when tp_size > 1.
  std::function<void(float* x, int64_t n)> all_reduce;
  // all[r * n .. (r + 1) * n) := rank r's mine[0 .. n), for every rank of the stage. The output
  // projection is split by vocabulary rows, and each rank's logits are gathered with this.
  std::function<void(const float* mine, int64_t n, float* all)> all_gather;

  // The dense ReGLU FFN layers' gate, up and down stay out of memory: --ram-budget's neuron store
  // (models/neuron_store.h) serves them, through enable_sparse_ffn, which must follow the load.
  // Not a split: a model loaded so is still whole().
  bool ffn_in_store = false;

  bool whole() const { return tp_size == 1 && layer_begin == 0 && layer_end < 0; }
  bool first_stage() const { return layer_begin == 0; }
  bool last_stage(int64_t n_layer) const { return layer_end < 0 || layer_end == n_layer; }
};

// Elements [begin, end) of a dimension of `total` elements split over `parts` ranks in whole
// units of `unit` elements (total a multiple of unit): the first total/unit % parts ranks get
// one unit more. A rank's range may be empty when there are fewer units than ranks.
struct SplitRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
SplitRange split_range(int64_t total, int64_t unit, int part, int parts);

// The contiguous layers of pipeline stage `stage` of `n_stages` (layers split as evenly as they
// go, earlier stages taking the extra ones).
SplitRange stage_layers(int64_t n_layer, int stage, int n_stages);

// Layer bounds of `n_stages` pipeline stages balanced by cost: stage s runs layers
// [bounds[s], bounds[s + 1]) (n_stages + 1 bounds from 0 to the layer count; every stage at least
// one layer), chosen so that the costliest stage (its layers' costs, plus `last_stage_cost` on the
// last stage: the output projection, which every token's logits read) costs least; among such
// splits, the one whose earlier stages take the most layers. A pipeline runs at its slowest
// stage's pace. Throws tern::Error for a negative cost or
// n_stages outside [1, layers].
std::vector<int64_t> balanced_stage_bounds(std::span<const int64_t> layer_cost, int64_t last_stage_cost, int n_stages);

// Checks that `hp` can be split as `part` says, naming `path` and the reason: tensor
// parallelism needs every layer's query and KV head counts divisible by tp_size; pipeline
// stages need a non-empty layer range. Returns the hyper-parameters of the part: per-layer head
// counts and FFN widths of the rank's share (0 for layers outside its stage), so that K/V and
// activation buffers sized from them hold only the rank's part.
HParams partition_hparams(const HParams& hp, const ModelPartition& part, const std::string& path);

}  // namespace tern
