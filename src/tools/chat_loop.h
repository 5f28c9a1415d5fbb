#pragma once
// The interactive conversation of `tern chat` and `tern run -i` (docs/chat.md).
//
// The conversation is kept as messages; every turn renders all of them with the chat template
// exactly as `tern serve` renders a /v1/chat/completions request (select_chat_template +
// ChatTemplate::encode, BOS as the vocabulary asks), so a conversation gets the tokens the
// server would give the same messages. The K/V of the tokens shared with the previous turn's
// prompt is kept; only the rest is prefilled.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "runtime/generate.h"
#include "tools/constraint_args.h"
#include "tools/model_args.h"

namespace tern {

struct ChatSettings {
  std::string system;          // --system: the first message (role "system"); empty: none
  std::string chat_template;   // --chat-template: as `tern serve` takes it
  bool metrics = true;         // a metrics line (stderr) after each reply
  std::string first_message;   // -p: sent as the first user turn before any input is read
  // n_predict (-1: until end of generation or a full context), sampling, stop, ignore_eos;
  // the seed is `seed` below.
  GenerateOptions gen;
  int64_t seed = -1;           // every reply is sampled from this seed; -1: a new random one each
  // --grammar / --grammar-file / --json-schema: every reply is constrained by it (built for the
  // model's tokenizer once it loads; each reply starts from the grammar's start).
  ConstraintArgs constraint;
};

// Adds the flags only the conversation has (--system, --chat-template, --no-metrics) to `app`;
// tern chat adds the constraint flags itself (tern run has them already);
// `help_suffix` ends their help texts (" (with -i)" in tern run).
void add_chat_flags(CLI::App& app, ChatSettings& s, const std::string& help_suffix = "");

// Loads the model of `margs` and runs the conversation on stdin/stdout until /exit, end of
// input or Ctrl-C at the prompt; returns the process exit code (0, or 130 after Ctrl-C).
// `command` names the tool in messages ("tern chat", "tern run").
int run_chat(const ModelArgs& margs, ChatSettings settings, const std::string& command);

}  // namespace tern
