#pragma once
// tern bench's speculative comparison (--lookup N | --draft FILE with --spec-prompts FILE):
// greedy generation from each prompt, plainly and speculatively in alternating order, with the
// decode speeds side by side (docs/speculative.md).
#include <cstdint>
#include <string>

#include "spec/speculative.h"
#include "tools/model_args.h"

namespace tern {

struct SpecBenchArgs {
  std::string prompts_path;  // one prompt per line; "\n" and "\\" escapes
  int64_t n_gen = 128;       // tokens generated per prompt (fewer where EOS comes first)
  int reps = 3;
  bool json = false;
};

// Loads the model (and the draft), runs the comparison and prints its report. Returns 0.
int run_spec_bench(ModelArgs& margs, const SpecConfig& spec, const SpecBenchArgs& args);

}  // namespace tern
