// tern serve: the OpenAI-compatible HTTP server (src/server) in front of the serving engine.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "core/error.h"
#include "engine/engine.h"
#include "models/model.h"
#include "server/backend.h"
#include "server/openai_format.h"
#include "server/server.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/model_args.h"

namespace tern {

int cmd_serve(int argc, char** argv) {
  CLI::App app{"Serve a model over the OpenAI API (completions, chat, streaming), with /metrics and a chat page at /."};
  ModelArgs margs;
  margs.add_to(app, /*with_ctx=*/true, /*default_kv_type=*/KvType::F16);
  server::ServerConfig scfg;
  EngineConfig ecfg;
  std::string alias, chat_template, kv_memory;
  double grace_s = 30;
  bool no_prefix_cache = false;
  app.add_option("--host", scfg.host, "address to listen on (default: loopback only)")->capture_default_str();
  app.add_option("--port", scfg.port, "TCP port (0: any free port, printed at start-up)")
      ->check(CLI::Range(0, 65535))->capture_default_str();
  app.add_option("--parallel", ecfg.n_parallel, "sequences the default KV cache is sized for")
      ->check(CLI::Range(int64_t(1), int64_t(4096)))->capture_default_str();
  app.add_option("--api-key", scfg.api_key,
                 "require 'Authorization: Bearer KEY' on every endpoint but /health and the chat page's files "
                 "(default: $TERN_API_KEY if set)");
  app.add_option("--alias", alias,
                 "model name reported by /v1/models; with it, requests naming another model get 404 "
                 "(without it, any name is served by this model, as llama.cpp does)");
  app.add_option("--cors", scfg.cors_origins,
                 "origin a browser page may call the API from, e.g. http://localhost:3000, or * for any (repeatable)");
  app.add_option("--chat-template", chat_template,
                 "chatml|llama2|llama3|mistral|phi3|zephyr|gemma (a built-in template), or a file with a Jinja "
                 "template to render (default: the model's tokenizer.chat_template as Jinja, else chatml)");
  app.add_option("--kv-memory", kv_memory,
                 "KV arena size: MiB, or with a unit (512M, 2G); default: ctx x parallel tokens");
  app.add_option("--kv-block-size", ecfg.kv_block_size, "tokens per KV block")
      ->check(CLI::Range(int64_t(1), int64_t(4096)))->capture_default_str();
  app.add_option("--max-running", ecfg.max_running, "most requests decoding at once")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20))->capture_default_str();
  app.add_option("--max-waiting", ecfg.max_waiting, "waiting requests past which new ones get 429")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20))->capture_default_str();
  app.add_flag("--no-prefix-cache", no_prefix_cache, "do not share KV blocks of common prompt prefixes");
  std::string tool_format;
  app.add_option("--tool-format", tool_format,
                 "hermes|llama3|mistral|generic: the tool-call syntax the model answers in (default: from the chat template)");
  bool no_timings = false;
  app.add_flag("--no-timings", no_timings,
               "leave llama.cpp's \"timings\" object out of responses (it is added to every answer and final stream chunk)");
  app.add_option("--http-threads", scfg.http_threads, "requests handled at once (each stream holds one)")
      ->check(CLI::Range(4, 4096))->capture_default_str();
  app.add_option("--max-connections", scfg.max_connections,
                 "connections open at once; at the cap, idle and slow ones are closed to admit new ones")
      ->check(CLI::Range(8, 1 << 20))->capture_default_str();
  app.add_option("--max-connections-per-client", scfg.max_connections_per_client,
                 "connections open at once from one client address (more: 503)")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--header-timeout", scfg.header_timeout_s, "seconds a client may take to send a request's headers (408)")
      ->check(CLI::Range(0.1, 3600.0))->capture_default_str();
  app.add_option("--keep-alive-timeout", scfg.keep_alive_timeout_s, "seconds an idle keep-alive connection stays open")
      ->check(CLI::Range(0.1, 3600.0))->capture_default_str();
  app.add_option("--max-response-entries", scfg.max_response_entries,
                 "largest answer that is not streamed, in choices x tokens x (1 + logprob alternatives)")
      ->check(CLI::Range(int64_t(1024), int64_t(1) << 30))->capture_default_str();
  app.add_option("--timeout", scfg.request_timeout_s, "seconds a generation may run before it is aborted")
      ->check(CLI::Range(0.001, 1e7))->capture_default_str();
  app.add_option("--read-timeout", scfg.read_timeout_s, "seconds a client may take to send a whole request (408)")
      ->check(CLI::Range(0.1, 3600.0))->capture_default_str();
  app.add_option("--write-timeout", scfg.write_timeout_s, "seconds a client may leave its response unread")
      ->check(CLI::Range(0.1, 3600.0))->capture_default_str();
  app.add_option("--max-body", scfg.max_body_bytes, "largest request body in bytes (larger: 413)")
      ->check(CLI::Range(size_t(1024), size_t(1) << 30))->capture_default_str();
  app.add_option("--shutdown-grace", grace_s,
                 "on SIGTERM/SIGINT, seconds in-flight requests get to finish before they are aborted")
      ->check(CLI::Range(0.0, 3600.0))->capture_default_str();
  app.add_flag("-v,--verbose", scfg.log_requests, "log every request to stderr");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  if (scfg.api_key.empty())
    if (const char* k = std::getenv("TERN_API_KEY")) scfg.api_key = k;
  const int64_t kv_memory_bytes = kv_memory.empty() ? 0 : parse_memory_size(kv_memory);

  // Signals are taken by one thread with sigwait(): block them before any other thread exists
  // so every thread inherits the mask. A vanished client must not kill the process either.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  std::shared_ptr<const GgufFile> file = open_model_file(margs.model, margs.tokenizer_bin);
  std::shared_ptr<const Tokenizer> tokenizer = Tokenizer::from_gguf(*file);

  ecfg.n_threads = margs.threads;
  ecfg.max_batch_tokens = margs.batch;
  ecfg.kv_type = kv_type_from_name(margs.kv_type);
  ecfg.prefix_caching = !no_prefix_cache;
  ContextRequest ctx_req;
  ctx_req.kv_type = ecfg.kv_type;
  ctx_req.n_ctx = margs.ctx;
  ctx_req.n_parallel = ecfg.n_parallel;
  ctx_req.kv_memory_bytes = kv_memory_bytes;
  ctx_req.serving = true;
  ecfg.n_ctx = plan_model_context(*file, ctx_req, margs.command(), margs.ctx_given()).n_ctx;
  ecfg.kv_memory_bytes = kv_memory_bytes;
  if (ecfg.max_running < ecfg.n_parallel) ecfg.max_running = ecfg.n_parallel;

  const std::filesystem::path model_path(margs.model);
  scfg.model_id = alias.empty() ? model_path.stem().string() : alias;
  scfg.strict_model_names = !alias.empty();
  scfg.model_names = {model_path.filename().string(), margs.model};
  std::string note;
  const auto token_text = [&](int32_t id) {
    return id >= 0 && id < tokenizer->n_vocab() ? tokenizer->tokens()[size_t(id)] : std::string();
  };
  scfg.chat_template = server::select_chat_template(chat_template, file->get_string("tokenizer.chat_template", ""),
                                                    token_text(tokenizer->bos_id()), token_text(tokenizer->eos_id()),
                                                    &note);

  scfg.timings = !no_timings;
  if (!tool_format.empty()) {
    const auto f = server::tool_format_from_name(tool_format);
    if (!f) throw Error(str_cat("--tool-format: unknown format '", tool_format, "' (hermes, llama3, mistral or generic)"));
    scfg.chat_template.tool_format = *f;
  }
  {
    // Same build, same file, same K/V type and context: same fingerprint (OpenAI's meaning:
    // a change of it says that a seed may now give another answer).
    std::error_code ec;
    const auto size = std::filesystem::file_size(model_path, ec);
    scfg.system_fingerprint = server::system_fingerprint_of(
        str_cat(kVersion, "|", model_path.filename().string(), "|", ec ? 0 : size, "|",
                file->get_string("general.name", ""), "|", kv_type_name(ecfg.kv_type), "|", ecfg.n_ctx));
  }

  Engine engine(file, tokenizer, ecfg);
  server::EngineBackend backend(engine);
  server::Server srv(backend, scfg);
  const int port = srv.bind();
  engine.start();
  const EngineMetrics em = engine.metrics();
  std::fprintf(stderr, "tern serve: model %s (id \"%s\"), context %lld tokens, KV %s (%s) in %lld blocks of %lld tokens\n",
               margs.model.c_str(), scfg.model_id.c_str(), static_cast<long long>(engine.n_ctx()),
               format_bytes(em.kv_bytes).c_str(), kv_type_name(ecfg.kv_type), static_cast<long long>(em.kv_blocks_total),
               static_cast<long long>(ecfg.kv_block_size));
  std::fprintf(stderr, "tern serve: %s\n", note.c_str());
  if (!scfg.api_key.empty()) std::fprintf(stderr, "tern serve: API key required\n");
  std::fprintf(stderr, "tern serve: listening on http://%s:%d (chat page at /)\n", scfg.host.c_str(), port);
  std::fflush(stderr);

  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "tern serve: %s: finishing in-flight requests (up to %.0f s), then stopping\n",
                 sig == SIGINT ? "SIGINT" : "SIGTERM", grace_s);
    srv.shutdown(std::chrono::milliseconds(int64_t(grace_s * 1000)));
  });
  srv.listen();
  // listen() also returns when the listener fails: wake the signal thread so it shuts down
  // and can be joined (shutdown is idempotent).
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  engine.stop();
  const EngineMetrics end = engine.metrics();
  std::fprintf(stderr, "tern serve: stopped (%lld requests finished, %lld aborted, %lld tokens generated)\n",
               static_cast<long long>(end.requests_finished), static_cast<long long>(end.requests_aborted),
               static_cast<long long>(end.generated_tokens_total));
  return 0;
}

}  // namespace tern
