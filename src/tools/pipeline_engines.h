#pragma once
// Pipeline engines (docs/distributed.md): under --pp, several engines over the one parallel
// model, so that one engine's step enters the pipeline while another's is in the later stages.
// `tern serve` and `tern bench-serve` build them the same way.
#include <CLI/CLI.hpp>
#include <memory>
#include <vector>

#include "engine/engine.h"

namespace tern {

// --pipeline-engines N (0: the default the command chooses, said in `default_note`).
void add_pipeline_engines_option(CLI::App& app, int& n, const char* default_note);

// The settings of each of `n` pipeline engines sharing what `ecfg` gives one engine: 1/n of the
// K/V memory, of the sequences it is sized for, of the running and waiting limits.
EngineConfig pipeline_engine_config(EngineConfig ecfg, int n);

// `n` engines (n >= 2) of pipeline_engine_config(ecfg, n): the first loads the model with
// ecfg.load (over the ranks), the others run their steps through views of it
// (dist::share_parallel_model). Not started.
std::vector<std::unique_ptr<Engine>> make_pipeline_engines(std::shared_ptr<const GgufFile> file,
                                                           std::shared_ptr<const Tokenizer> tok,
                                                           const EngineConfig& ecfg, int n);

}  // namespace tern
