#include "tools/model_args.h"

#include <cstdio>

#include "core/error.h"

namespace tern {

void ModelArgs::add_to(CLI::App& app, bool with_ctx, KvType default_kv_type) {
  app.add_option("-m,--model", model, "model file: GGUF, or a llama2.c .bin with --tokenizer")->required();
  app.add_option("--tokenizer", tokenizer_bin, "llama2.c tokenizer.bin (for a .bin model)");
  app.add_option("-t,--threads", threads, "worker threads (default: all cores)")->check(CLI::Range(0, 1024));
  if (with_ctx) {
    app.add_option("-c,--ctx", ctx, "context size in tokens (default: the model's training context)")
        ->check(CLI::Range(int64_t(0), int64_t(1) << 24));
  }
  app.add_option("-b,--batch", batch, "most prompt tokens per forward pass (default 512)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 16));
  add_kv_type_option(app, kv_type, default_kv_type);
}

void add_kv_type_option(CLI::App& app, std::string& name, KvType default_type) {
  name = kv_type_name(default_type);
  app.add_option("--kv-type", name, "K/V cache element type: f32, or f16 (half the bytes per token)")
      ->check(CLI::IsMember({"f32", "f16"}))
      ->capture_default_str();
}

LoadedSession open_session(const ModelArgs& args) {
  LoadedSession s;
  s.file = open_model_file(args.model, args.tokenizer_bin);
  s.tokenizer = Tokenizer::from_gguf(*s.file);
  SessionConfig cfg;
  cfg.n_ctx = args.ctx;
  cfg.n_threads = args.threads;
  cfg.n_batch = args.batch;
  cfg.kv_type = kv_type_from_name(args.kv_type);
  s.session = std::make_unique<Session>(s.file, cfg);
  if (s.tokenizer->n_vocab() > s.session->hparams().n_vocab)
    fail(args.model, ": the tokenizer has ", s.tokenizer->n_vocab(), " tokens but the model's embedding only ",
         s.session->hparams().n_vocab);
  return s;
}

std::string format_bytes(int64_t bytes) {
  char buf[64];
  const double b = double(bytes);
  if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1024.0 * 1024));
  else if (b >= 1024.0) std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  return buf;
}

}  // namespace tern
