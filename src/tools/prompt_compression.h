#pragma once
// The options and the run of prompt compression that `tern compress-prompt`, `run
// --compress-prompt`, `serve` and `tern compare --prompt-compression` share (prompt/compress.h
// has the methods; docs/data-level.md the user's view).
#include <CLI/CLI.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "prompt/compress.h"
#include "prompt/prompt_tokens.h"

namespace tern {
class Session;
class Tokenizer;

// --compress-method, --compress-unit, --coarse-factor, --compress-segment, --keep-numbers,
// --keep-names (their names carry "compress" where a command has other options of that name).
struct PromptCompressArgs {
  double ratio = 0;     // --compress-prompt R (commands that run a model: add_command_options)
  std::string scorer;   // --scorer FILE
  std::string method = "llmlingua";
  std::string unit = "word";
  double coarse_factor = 2.0;
  int64_t segment = 32;
  uint64_t seed = 1;
  bool keep_numbers = false;
  bool keep_names = false;
  // method_flag: the name of the method option ("": none, the command lists methods itself).
  void add_to(CLI::App& app, const std::string& method_flag = "--method");
  // What `run`, `serve` and `bench-serve` add: --compress-prompt R (ratio_help says what it does
  // there), --scorer FILE (scorer_help: its default) and add_to's options with --compress-method.
  void add_command_options(CLI::App& app, const std::string& ratio_help, const std::string& scorer_help);
  // Whether --compress-prompt was given (after parsing), and --scorer was not given without it
  // (tern::Error).
  bool given(const CLI::App& app) const;
  // Throws tern::Error naming the flag for an unknown method or unit, or a bad ratio.
  prompt::CompressOptions options(double ratio) const;
  prompt::PromptOptions prompt_options() const { return {keep_numbers, keep_names, true}; }
};

// Throws tern::Error when the scorer's vocabulary is not the target's (compression hands the
// target text, but a scorer of another vocabulary measures other units): names both files, the
// sizes, and the first token that differs.
void check_same_vocabulary(const Tokenizer& scorer, const std::string& scorer_path, const Tokenizer& target,
                           const std::string& target_path);

struct CompressedPrompt {
  std::string text;             // the compressed prompt
  prompt::CompressResult result;
  double scorer_ms = 0;         // the scorer's wall time
  // The report's JSON object (method, ratio asked and achieved, tokens, savings, scorer cost).
  nlohmann::json report(const prompt::CompressOptions& opts) const;
  // One line for people: "compress-prompt: llmlingua 2x: 412 -> 206 tokens (...)".
  std::string summary(const prompt::CompressOptions& opts) const;
};

// Compresses `parts` with `session` as the scorer (its sequence is reset first and left holding
// the scorer's last context).
CompressedPrompt compress_with_session(Session& session, const Tokenizer& tok, const prompt::PromptParts& parts,
                                       const prompt::CompressOptions& opts, const prompt::PromptOptions& popts);

}  // namespace tern
