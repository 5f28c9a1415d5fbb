#pragma once
// The latency-objective options of `tern serve` and `tern bench-serve` (docs/serving.md,
// "Latency targets"): --tbt-target-ms MS|auto|off, --ttft-target-ms MS, --max-queue-ms MS.
#include <CLI/CLI.hpp>
#include <string>

#include "engine/engine.h"

namespace tern {

struct LatencyArgs {
  std::string tbt_target = "auto";
  double ttft_target_ms = 0;
  double max_queue_ms = 0;
};

// Adds the three options; with_queue_limit: --max-queue-ms too (a server's; a benchmark that
// replays every request has no use for refusals).
void add_latency_options(CLI::App& app, LatencyArgs& args, bool with_queue_limit);
// Into the engine's configuration. Throws tern::Error naming the option for a bad value
// (zero, negative, not a number: the accepted forms are listed).
void apply_latency_args(const LatencyArgs& args, EngineConfig& cfg);
// --tbt-target-ms's value: a positive number of ms, "auto" (EngineConfig::kTbtAuto) or "off" (0).
double parse_tbt_target(const std::string& text);

}  // namespace tern
