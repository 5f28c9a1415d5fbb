#include "dist/layout.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "dist/comm.h"

namespace tern::dist {

std::string ParallelLayout::describe() const {
  return str_cat("tp ", tp, " x pp ", pp, " (", ranks(), " rank", ranks() == 1 ? "" : "s", ")",
                 pp > 1 ? str_cat(", ", micro_batch_count(), " micro-batches") : std::string());
}

void check_layout(const ParallelLayout& layout, const HParams& hp, const std::string& path, int world_size) {
  if (layout.tp < 1) fail("--tp ", layout.tp, ": needs at least 1 rank");
  if (layout.pp < 1) fail("--pp ", layout.pp, ": needs at least 1 stage");
  if (layout.micro_batches < 0) fail("--micro-batches ", layout.micro_batches, ": must be 0 (= --pp) or more");
  if (layout.pp > hp.n_layer)
    fail(path, ": --pp ", layout.pp, " asks for more pipeline stages than the model's ", hp.n_layer, " layers");
  if (hp.is_mla() && layout.ranks() > 1)
    fail(path, ": ", hp.arch, " (multi-head latent attention) models do not run split over processes (--tp / --pp) yet");
  for (int64_t il = 0; il < hp.n_layer; ++il)
    if (hp.head_count(il) % layout.tp != 0 || hp.head_count_kv(il) % layout.tp != 0)
      fail(path, ": --tp ", layout.tp, " does not divide layer ", il, "'s head counts (", hp.head_count(il),
           " query heads, ", hp.head_count_kv(il), " KV heads); each rank takes whole heads");
  if (world_size != layout.ranks()) {
    if (world_size == 1)
      fail(layout.describe(), " needs ", layout.ranks(), " processes, but this one runs alone: start it with "
           "`mpirun -np ", layout.ranks(), " tern ...`", (built_with_mpi() ? std::string() : std::string(" (and this tern was built without MPI: install libopenmpi-dev and rebuild)")));
    fail(layout.describe(), " needs ", layout.ranks(), " ranks, but mpirun started ", world_size,
         " (mpirun -np ", layout.ranks(), ")");
  }
}

ModelPartition partition_of(const ParallelLayout& layout, int rank, std::span<const int64_t> stage_bounds) {
  TERN_ASSERT(int64_t(stage_bounds.size()) == layout.pp + 1);
  ModelPartition p;
  const int s = layout.stage_of(rank);
  p.layer_begin = stage_bounds[size_t(s)];
  p.layer_end = layout.pp > 1 ? stage_bounds[size_t(s) + 1] : -1;
  p.tp_rank = layout.tp_rank_of(rank);
  p.tp_size = layout.tp;
  return p;
}

ModelPartition partition_of(const ParallelLayout& layout, int rank, int64_t n_layer) {
  std::vector<int64_t> bounds{0};
  for (int s = 0; s < layout.pp; ++s) bounds.push_back(stage_layers(n_layer, s, layout.pp).end);
  return partition_of(layout, rank, bounds);
}

std::vector<int64_t> model_stage_bounds(const GgufFile& file, const HParams& hp, int pp) {
  std::vector<int64_t> layer_bytes(size_t(hp.n_layer), 0);
  int64_t output = 0, embedding = 0, output_norm = 0;
  for (const auto& t : file.tensors()) {
    if (const int64_t il = tensor_layer_index(t.name); il >= 0) {
      // (A MoE layer's experts count whole: a batched step reads most of them.)
      if (il < hp.n_layer) layer_bytes[size_t(il)] += int64_t(t.n_bytes);
    } else if (t.name == "output.weight") {
      output = int64_t(t.n_bytes);
    } else if (t.name == "token_embd.weight") {
      embedding = int64_t(t.n_bytes);
    } else if (t.name == "output_norm.weight") {
      output_norm = int64_t(t.n_bytes);
    }
  }
  return balanced_stage_bounds(layer_bytes, (output > 0 ? output : embedding) + output_norm, pp);
}

}  // namespace tern::dist
