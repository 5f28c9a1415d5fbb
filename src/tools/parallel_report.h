#pragma once
// What `tern bench` adds under a parallel layout (--tp / --pp under mpirun, docs/distributed.md):
// each rank's layers, weight bytes and K/V bytes per token, and for a pipeline one more prompt
// step timed per rank and micro-batch: its bubble fraction beside (p - 1) / (m + p - 1), and
// the timeline.
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace tern {

struct ParallelBenchReport {
  nlohmann::json json;  // {"layout", "ranks": [...], "pipeline": {...}}
  std::string text;     // the same as tables and a chart
};

// Empty when no parallel model is loaded. run_prompt_step: one prompt step to time (nullptr: no
// pipeline figures).
ParallelBenchReport parallel_bench_report(const std::function<void()>& run_prompt_step);

}  // namespace tern
