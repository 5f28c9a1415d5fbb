#pragma once
// The speculative-decoding options every decoding command shares (tern run, serve, bench,
// bench-serve; docs/speculative.md): --lookup N, --draft FILE, --draft-max K, --draft-min K,
// --draft-fixed.
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "gguf/gguf.h"
#include "spec/speculative.h"

namespace tern {

struct SpecArgs {
  int lookup = 0;           // n-gram length of prompt lookup; 0: off
  std::string draft;        // draft model file; empty: none
  std::string draft_self;   // self-speculation: the model requantized to this type; empty: none
  int draft_max = 8;
  int draft_min = 0;
  bool draft_fixed = false;
};

void add_spec_options(CLI::App& app, SpecArgs& args);
// The configuration the options describe (source None when neither --lookup nor --draft).
// Throws tern::Error naming the option: both drafters at once, --lookup out of [1, 16], a draft
// length out of range, a draft file that does not exist.
SpecConfig spec_config_from_args(const SpecArgs& args);
// Self-speculation (--draft-self TYPE): when `spec` asks for it and has no draft file yet, the
// target's weights requantized to that type in memory become the draft (compress/quantize.h
// quantize_model_image; the memory of a model of that type). Otherwise nothing happens.
void resolve_self_draft(SpecConfig& spec, const std::shared_ptr<const GgufFile>& target, int n_threads);
// Opens --draft FILE (a GGUF; a llama2.c .bin is refused with the `tern convert` command that
// makes one). Errors name --draft.
std::shared_ptr<const GgufFile> open_draft_file(const std::string& path);

}  // namespace tern
