#pragma once
// A model spread over the ranks of an MPI job (docs/distributed.md). Rank 0 runs the command
// (tern run, bench, ppl) as usual, with a Model whose forward() broadcasts each step's plan
// (dist/step_plan.h) and runs its own part of the step; the other ranks run worker_main(), which
// loads their parts when rank 0 says so and runs every step it announces:
//   - tensor parallelism: each rank of a stage runs all of the stage's layers on its heads and
//     FFN channels, summing the partial outputs of attn_output and ffn_down with one all-reduce
//     each (models/partition.h);
//   - pipeline parallelism: the step is cut into micro-batches (dist/step_plan.h); stage s runs
//     micro-batch i while stage s + 1 runs micro-batch i - 1, activations going from each stage's
//     tensor-parallel rank r to the next stage's rank r, the logits from the last stage to rank 0.
// Each rank keeps the K/V of its heads and layers only. A job may hold several models at once (a
// live base swap: the new base's parts load while the old one finishes its requests); every
// message names its model, and a model's parts go when rank 0 destroys its view of it.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/layout.h"
#include "models/model.h"

namespace tern::dist {

// Rank 0 (any thread: the ranks are spoken to one turn at a time): checks the layout against the
// model and the job (errors name the flag; every model of a job has the same layout), tells every
// rank to load its part of `file` (each opens the same path, or its $TERN_RANK_MODEL: a node's own
// copy of the model; a rank whose file differs from rank 0's (size, tensors), or whose
// load fails, makes this throw tern::Error naming the rank and the reason, and no rank waits),
// and returns rank 0's view of the whole model. n_threads: each rank's thread pool (0: its cores).
std::unique_ptr<Model> load_parallel_model(std::shared_ptr<const GgufFile> file, const ParallelLayout& layout,
                                           int n_threads);

// Rank 0: another view of a model load_parallel_model returned, for another engine over the same
// ranks and parts (tern serve's pipeline engines: docs/distributed.md). Each view's steps may be
// in the pipeline at once; the ranks let go of the model when its last view is destroyed. Throws
// tern::Error for a model that is no such view.
std::unique_ptr<Model> share_parallel_model(const Model& model);

// Ranks other than 0: serves rank 0 until it releases them; the process's exit status. A failure
// while running a step ends the whole job with a message (abort_all): the other ranks would
// otherwise wait for this one's part forever.
int worker_main();
// Rank 0: tells the workers to run a data-parallel job (dist/jobs.h; the message is the job's
// name, a NUL, and its payload).
void announce_job(const std::string& message);
// Rank 0, on its way out (success or error): lets the workers exit. Idempotent; a no-op alone.
void release_workers();

// What each rank holds of the model load_parallel_model loaded last (rank 0's view; empty before).
struct RankInfo {
  int rank = 0, stage = 0, tp_rank = 0;
  int64_t layer_begin = 0, layer_end = 0;
  int64_t weight_bytes = 0;   // the matrices and embedding rows this rank reads
  int64_t kv_bytes_per_token = 0;  // f32 K/V of its heads and layers
};
std::vector<RankInfo> rank_infos();
const ParallelLayout* active_layout();  // nullptr when no parallel model is loaded

// The busy intervals of every rank's forward work since the last call (collective: rank 0
// asks, every rank answers). Times are seconds on the steady clock, which all ranks of one
// machine share; across machines only each rank's durations compare.
struct BusyInterval {
  int rank = 0, stage = 0, tp_rank = 0;
  int64_t step = 0;      // rank 0's step counter
  int micro_batch = 0;
  int64_t n_tokens = 0;
  double t0 = 0, t1 = 0;
};
std::vector<BusyInterval> collect_timeline();

}  // namespace tern::dist
