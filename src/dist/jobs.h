#pragma once
// Data parallelism's primitive: a job that every rank of the MPI job runs on its own share of
// the work, each with a whole model of its own (tern batch: a prompts file split over the
// ranks). Handlers are registered by name before the ranks start serving (the command line does
// it at start-up, so that the workers, which never parse a command, know them too).
#include <functional>
#include <string>
#include <vector>

namespace tern::dist {

// Runs on every rank with the same payload; returns that rank's result. A tern::Error it throws
// is reported to rank 0 (run_everywhere throws it, naming the rank).
using JobHandler = std::function<std::string(const std::string& payload, int rank, int n_ranks)>;
void register_job(const std::string& name, JobHandler handler);

// Rank 0: every rank (0 included, alone when not under mpirun) runs job `name` on `payload`;
// the results in rank order. Throws tern::Error naming the first rank that failed, after every
// rank has answered (no rank is left waiting).
std::vector<std::string> run_everywhere(const std::string& name, const std::string& payload);

// The worker loop's side (parallel_model.cpp): runs a job announced by rank 0 and sends the
// result back. Not for other callers.
void serve_job(const std::string& message);

}  // namespace tern::dist
