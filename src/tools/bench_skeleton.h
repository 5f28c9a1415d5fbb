#pragma once
// tern bench-serve --organize skeleton: Skeleton-of-Thought against sequential decoding of the
// same tokens.
//
//   1. skeleton phase: each question runs as one Skeleton-of-Thought run (server/
//      skeleton_of_thought.h) over the bench's engine, `concurrency` runs in flight (closed
//      loop), the driver polled after every Engine::step();
//   2. sequential phase, on a fresh engine of the same configuration (warmed up the same way, no
//      prefix-cache entries carried over): for each run, the very prompts its points were
//      expanded from, decoded one after another (a run that fell back: its plain prompt), with
//      the same sampling and seeds; `concurrency` questions in flight again.
//
// Each point's tokens must equal the sequential ones (greedy: the engine's batch invariance);
// the report counts those that do not. The speedup is bounded by how much a decode step of the
// batch costs over one of a single sequence: B points take B * t1 / tB times less than one
// after another at best.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/chat_template.h"
#include "server/skeleton_of_thought.h"

namespace tern {

struct SkeletonBenchSetup {
  std::string model_path;
  std::string prompts_desc;             // "synthetic" or the ShareGPT file
  std::vector<std::string> questions;   // one Skeleton-of-Thought run each
  server::ChatTemplate chat_template;
  server::SkeletonOptions sot;          // budgets, router, given points (base params set here)
  int64_t concurrency = 1;              // runs (questions) in flight
  int64_t warmup = 1;                   // short requests before each phase's clock
  float temperature = 0;
  uint64_t seed = 0;
  bool ignore_eos = true;
  int n_threads = 0;
  bool json = false;
  std::string chart_path;               // "" for none (checked by the caller)
};

// Step times by the tokens each step generated: the decode-step time at the batch the phase
// mostly ran (the most frequent tokens-per-step; ties: the larger), its median.
struct DecodeBatch {
  int64_t batch = 0;       // tokens per step (running sequences of a decode step)
  double step_ms = 0;      // median step time of the steps at that batch
  int64_t steps = 0;       // how many
};
DecodeBatch decode_batch(const std::vector<int64_t>& tokens_per_step, const std::vector<double>& step_ms);

// A bar chart of each question's end-to-end latency, skeleton against sequential.
std::string skeleton_chart_svg(const std::vector<double>& skeleton_e2e_ms, const std::vector<double>& sequential_e2e_ms,
                               const std::string& title);

// Runs both phases, prints the table (or one JSON object with setup.json), writes the chart,
// and returns the exit status: 0, or 1 when a run failed or (greedy) a point's tokens differ
// from its sequential decode. `engine` (warm or cold) runs the skeleton phase and is released
// before `make_engine` builds the sequential phase's. Throws tern::Error naming the chat
// template when the model has none and no --chat-template was given.
int run_skeleton_bench(std::unique_ptr<Engine> engine, const std::function<std::unique_ptr<Engine>()>& make_engine,
                       const Tokenizer& tok, const SkeletonBenchSetup& setup);

}  // namespace tern
