#pragma once
// Options shared by every command that loads a model (-m, --tokenizer, --threads, --ctx).
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "runtime/session.h"
#include "tokenizer/tokenizer.h"

namespace tern {

struct ModelArgs {
  std::string model;
  std::string tokenizer_bin;  // llama2.c tokenizer.bin (only with a .bin model)
  int threads = 0;
  int64_t ctx = 0;
  int64_t batch = 512;

  void add_to(CLI::App& app, bool with_ctx = true);
};

struct LoadedSession {
  std::shared_ptr<const GgufFile> file;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Session> session;
};

// Opens the model file (GGUF, or llama2.c .bin + --tokenizer), its tokenizer and a session.
LoadedSession open_session(const ModelArgs& args);

// Human-readable byte counts: "1.23 MiB".
std::string format_bytes(int64_t bytes);

}  // namespace tern
