#pragma once
// Pipeline utilisation from the ranks' busy intervals (dist/parallel_model.h collect_timeline):
// the bubble fraction of a step, set beside GPipe's (p - 1) / (m + p - 1) for p stages and m
// micro-batches, and a timeline chart, one line per rank. Pure logic.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dist/parallel_model.h"

namespace tern::dist {

struct PipelineStats {
  int stages = 0;
  int micro_batches = 0;
  double makespan_s = 0;            // first start to last end of the step, over all ranks
  std::vector<double> stage_busy_s;  // [stages] the stage's forward work (its tp rank 0)
  double bubble = 0;                // 1 - sum(busy) / (stages * makespan): the idle share
  double ideal_bubble = 0;          // (p - 1) / (m + p - 1)
};

// The stats of step `step` (intervals of other steps are ignored); stages = layout.pp.
PipelineStats pipeline_stats(std::span<const BusyInterval> intervals, int64_t step, int stages);

// One line per rank, `width` columns from the step's first start to its last end: the digit of
// the micro-batch a rank works on (mod 10), '.' where it waits.
std::string timeline_chart(std::span<const BusyInterval> intervals, int64_t step, int width);

}  // namespace tern::dist
