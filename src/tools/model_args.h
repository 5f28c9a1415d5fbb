#pragma once
// Options shared by every command that loads a model (-m, --tokenizer, --threads, --ctx,
// --batch, --kv-type).
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
  std::string kv_type = "f32";  // KV cache element type: f32 or f16

  // default_kv_type: --kv-type's default for this command (f16 for serve, f32 elsewhere).
  void add_to(CLI::App& app, bool with_ctx = true, KvType default_kv_type = KvType::F32);
};

// Adds `--kv-type f32|f16` to `app`, writing the name to `name` (a bad value is a usage error).
void add_kv_type_option(CLI::App& app, std::string& name, KvType default_type);

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
