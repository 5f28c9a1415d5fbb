#pragma once
// A parallel layout: tp x pp ranks, rank = stage * tp + tp_rank (world rank 0 is stage 0's first
// tensor-parallel rank, the one that runs the command), and how a step is cut into micro-batches.
// Pure logic: tested without MPI.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "models/hparams.h"
#include "models/partition.h"

namespace tern::dist {

struct ParallelLayout {
  int tp = 1;             // tensor-parallel ranks per stage (--tp)
  int pp = 1;             // pipeline stages (--pp)
  int micro_batches = 0;  // micro-batches a step is cut into (--micro-batches; 0: pp)
  int ranks() const { return tp * pp; }
  bool parallel() const { return ranks() > 1; }
  int stage_of(int rank) const { return rank / tp; }
  int tp_rank_of(int rank) const { return rank % tp; }
  int rank_of(int stage, int tp_rank) const { return stage * tp + tp_rank; }
  int micro_batch_count() const { return micro_batches > 0 ? micro_batches : pp; }
  std::string describe() const;  // "tp 2 x pp 2 (4 ranks), 4 micro-batches"
  bool operator==(const ParallelLayout&) const = default;
};

// Throws tern::Error naming the flag and the model (`path`): --tp or --pp below 1, more stages
// than layers, a --tp that does not divide every layer's head counts, or a world of another size
// than tp x pp (`world_size`).
void check_layout(const ParallelLayout& layout, const HParams& hp, const std::string& path, int world_size);

// Rank `rank`'s part of the model (without its all-reduce, which the caller binds), its stage's
// layers [stage_bounds[s], stage_bounds[s + 1]) (layout.pp + 1 bounds: model_stage_bounds).
ModelPartition partition_of(const ParallelLayout& layout, int rank, std::span<const int64_t> stage_bounds);
// The same with the layers split as evenly as they go (stage_layers).
ModelPartition partition_of(const ParallelLayout& layout, int rank, int64_t n_layer);

// The stages' layer bounds for `file`: balanced by the weight bytes each token reads
// (balanced_stage_bounds): each layer's tensors, and on the last stage the output projection (the
// token embedding where the model ties them; the first stage reads only its rows). The same on
// every rank of the same file.
std::vector<int64_t> model_stage_bounds(const GgufFile& file, const HParams& hp, int pp);

}  // namespace tern::dist
