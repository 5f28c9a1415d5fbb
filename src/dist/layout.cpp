#include "dist/layout.h"

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

ModelPartition partition_of(const ParallelLayout& layout, int rank, int64_t n_layer) {
  ModelPartition p;
  const SplitRange layers = stage_layers(n_layer, layout.stage_of(rank), layout.pp);
  p.layer_begin = layers.begin;
  p.layer_end = layout.pp > 1 ? layers.end : -1;
  p.tp_rank = layout.tp_rank_of(rank);
  p.tp_size = layout.tp;
  return p;
}

}  // namespace tern::dist
