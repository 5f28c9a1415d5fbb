// tern serve: the OpenAI-compatible HTTP server (src/server) in front of the serving engine:
// one model (`-m FILE`, loaded at start-up), or many loaded on demand under a memory budget
// (`--models DIR`, several `-m NAME=FILE`: tools/serve_models.h).
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/parallel_model.h"
#include "engine/engine.h"
#include "models/model.h"
#include "server/backend.h"
#include "server/engines_backend.h"
#include "server/model_catalog.h"
#include "server/model_provider.h"
#include "server/openai_format.h"
#include "server/server.h"
#include "tools/cli_util.h"
#include "tools/latency_args.h"
#include "tools/commands.h"
#include "tools/replica_router.h"
#include "tools/model_args.h"
#include "tools/pipeline_engines.h"
#include "tools/prompt_compression.h"
#include "tools/rank_metrics.h"
#include "tools/serve_models.h"
#include "tools/spec_args.h"

namespace tern {
namespace {

// `-m NAME=FILE` (as models_from_args reads it: a path that holds '=' and exists is a file).
bool names_a_model(const std::string& arg) {
  std::error_code ec;
  return arg.find('=') != std::string::npos && !std::filesystem::exists(arg, ec);
}

// --keep-alive: a Go duration ("5m", "1h30m", "-1") or a number of seconds.
double keep_alive_seconds(const std::string& text) {
  try {
    size_t used = 0;
    const double s = std::stod(text, &used);
    if (used == text.size()) return server::parse_duration_seconds(s);
  } catch (const std::logic_error&) {
  }
  try {
    return server::parse_duration_seconds(text);
  } catch (const Error& e) {
    throw Error(str_cat("--keep-alive ", text, ": ", e.what()));
  }
}

// Signals are taken by one thread with sigwait(): blocked before any other thread exists so
// every thread inherits the mask. A vanished client must not kill the process either.
sigset_t block_stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return signals;
}

// Prints the listening line, serves until SIGINT / SIGTERM (or a failing listener), then shuts
// down with `grace_s` for the requests in flight.
void serve_until_signal(server::Server& srv, int port, const server::ServerConfig& scfg, sigset_t& signals,
                        double grace_s) {
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
}

// One base as `tern serve -m FILE` loads it: the file, its engine (started; under --pp, one per
// pipeline engine) and the backend the server talks to, owned by the ServedModel
// (ServedModel::owner) so that a base swapped away lives on until the last request using it has
// ended.
struct LoadedEngine {
  std::shared_ptr<const GgufFile> file;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::vector<std::unique_ptr<Engine>> engines;
  std::unique_ptr<server::Backend> backend;
  ~LoadedEngine() {
    for (auto& e : engines) e->stop();
  }
};

// The start-up settings every load of the base gets, at start-up and on each swap.
// The pool's load settings, and what only one model served with -m has.
struct SingleLoadSettings : ServeLoadSettings {
  std::optional<server::ToolFormat> parsed_tool_format;  // tool_format, checked at start-up
  std::string tokenizer_bin;        // --tokenizer: a llama2.c .bin's
  std::string model_id;
  int pipeline_engines = 1;         // engines over one parallel model (--pipeline-engines)
};

// Loads `path` with `s`; the engine is started. `note` (if given) gets the chat template's note.
server::SingleModelProvider::LoadedBase load_single_base(const std::string& path, const SingleLoadSettings& s,
                                                         std::string* note) {
  const std::filesystem::path model_path(path);
  auto owner = std::make_shared<LoadedEngine>();
  owner->file = open_model_file(path, s.tokenizer_bin);
  owner->tokenizer = Tokenizer::from_gguf(*owner->file);
  const GgufFile& file = *owner->file;
  const Tokenizer& tok = *owner->tokenizer;
  EngineConfig ecfg = s.engine;
  ContextRequest ctx_req;
  ctx_req.kv_type = ecfg.kv_type;
  ctx_req.n_ctx = s.ctx;
  ctx_req.n_parallel = ecfg.n_parallel;
  ctx_req.kv_memory_bytes = s.kv_memory_bytes;
  ctx_req.serving = true;
  ecfg.n_ctx = plan_model_context(file, ctx_req, s.command, s.ctx_given).n_ctx;
  ecfg.kv_memory_bytes = s.kv_memory_bytes;
  if (ecfg.max_running < ecfg.n_parallel) ecfg.max_running = ecfg.n_parallel;

  auto served = std::make_shared<server::ServedModel>();
  served->id = s.model_id;
  const auto token_text = [&](int32_t id) {
    return id >= 0 && id < tok.n_vocab() ? tok.tokens()[size_t(id)] : std::string();
  };
  std::string template_note;
  served->chat_template = server::select_chat_template(s.chat_template, file.get_string("tokenizer.chat_template", ""),
                                                       token_text(tok.bos_id()), token_text(tok.eos_id()), &template_note);
  if (note) *note = template_note;
  if (s.parsed_tool_format) served->chat_template.tool_format = *s.parsed_tool_format;
  {
    // Same build, same file, same K/V type and context: same fingerprint (OpenAI's meaning:
    // a change of it says that a seed may now give another answer).
    std::error_code ec;
    const auto size = std::filesystem::file_size(model_path, ec);
    served->system_fingerprint = server::system_fingerprint_of(
        str_cat(kVersion, "|", model_path.filename().string(), "|", ec ? 0 : size, "|",
                file.get_string("general.name", ""), "|", kv_type_name(ecfg.kv_type), "|", ecfg.n_ctx));
  }
  resolve_self_draft(ecfg.spec, owner->file, ecfg.n_threads);
  if (s.pipeline_engines > 1) {
    // Pipeline engines: the first loads the model over the ranks, the others run their steps
    // through views of it.
    owner->engines = make_pipeline_engines(owner->file, owner->tokenizer, ecfg, s.pipeline_engines);
    std::vector<Engine*> all;
    for (auto& e : owner->engines) all.push_back(e.get());
    owner->backend = std::make_unique<server::EnginesBackend>(std::move(all));
  } else {
    owner->engines.push_back(std::make_unique<Engine>(owner->file, owner->tokenizer, ecfg));
    owner->backend = std::make_unique<server::EngineBackend>(*owner->engines[0]);
  }
  served->backend = owner->backend.get();
  served->structured = std::make_shared<server::StructuredOutput>(tok);
  served->entry = server::inspect_model_file(model_path);
  served->entry.name = s.model_id;
  served->metadata = gguf_metadata_json(file);
  served->bytes = int64_t(file.file_size()) + owner->backend->metrics().kv_bytes;  // the arenas exist from construction
  if (ecfg.spec.source == DraftSource::DraftModel)
    for (const auto& e : owner->engines)
      served->bytes += draft_model_bytes(ecfg.spec.draft_file ? *ecfg.spec.draft_file : *open_model_file(ecfg.spec.draft_path),
                                         ecfg.kv_type, e->n_ctx(), std::min(e->config().n_parallel, e->config().max_running));
  // The check holds the engine by address: the provider uses it only while this base is the
  // one served, which its owner outlives.
  const Engine* engine = owner->engines[0].get();
  for (auto& e : owner->engines) e->start();
  server::SingleModelProvider::LoadedBase out;
  out.check = [engine](const LoraAdapter& a) { engine->check_lora(a); };
  out.other_names = {model_path.filename().string(), path};
  served->owner = std::move(owner);
  out.model = std::move(served);
  return out;
}

void print_stopped(const EngineMetrics& end) {
  std::fprintf(stderr, "tern serve: stopped (%lld requests finished, %lld aborted, %lld tokens generated)\n",
               static_cast<long long>(end.requests_finished), static_cast<long long>(end.requests_aborted),
               static_cast<long long>(end.generated_tokens_total));
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  CLI::App app{"Serve a model over the OpenAI API (completions, chat, streaming), with /metrics and a chat page at /; "
               "or many models loaded on demand (--models DIR, several -m NAME=FILE), as Ollama does."};
  ModelArgs margs;
  margs.add_to(app, /*with_ctx=*/true, /*default_kv_type=*/KvType::F16);
  margs.add_kv_policy_to(app);
  margs.add_parallel_to(app);
  margs.add_sparse_ffn_to(app);
  // -m is repeatable here, and optional with --models.
  std::vector<std::string> model_args;
  std::string models_dir, max_memory, keep_alive = "5m";
  int max_loaded = 0;
  app.remove_option(app.get_option("-m"));
  app.add_option("-m,--model", model_args,
                 "model file: GGUF, or a llama2.c .bin with --tokenizer; repeatable, and as NAME=FILE, to serve "
                 "several models loaded on demand");
  app.add_option("--models", models_dir,
                 "serve every *.gguf in this directory (and its models.json defaults), each loaded when a request "
                 "names it");
  app.add_option("--max-memory", max_memory,
                 "with several models: memory the loaded ones may hold together (MiB, or 512M, 8G); least recently "
                 "used idle models unload to make room (default: the machine's available memory)");
  app.add_option("--max-loaded", max_loaded, "with several models: most loaded at once (0: no limit)")
      ->check(CLI::Range(0, 1 << 20))->capture_default_str();
  app.add_option("--keep-alive", keep_alive,
                 "with several models: how long an idle model stays loaded (5m, 1h, 300 seconds; negative: forever; "
                 "0: unload when its last request ends); a request's keep_alive or models.json overrides it")
      ->capture_default_str();
  // --lora here names each adapter: NAME=FILE[:SCALE] (a request's "model" NAME runs it).
  std::vector<std::string> lora_args;
  app.remove_option(app.get_option("--lora"));
  app.add_option("--lora", lora_args,
                 "serve a LoRA adapter (llama.cpp's GGUF format) as a model of its own: NAME=FILE[:SCALE] or "
                 "FILE[:SCALE] (named by its file); a request's \"model\" selects it; repeatable");
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
  app.add_option("--kv-block-size", ecfg.kv_block_size, "tokens per KV block (0: 16, or 32 with --kv-type kivi2)")
      ->check(CLI::Range(int64_t(0), int64_t(4096)))->capture_default_str();
  app.add_option("--max-running", ecfg.max_running, "most requests decoding at once")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20))->capture_default_str();
  app.add_option("--max-waiting", ecfg.max_waiting, "waiting requests past which new ones get 429")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20))->capture_default_str();
  app.add_flag("--no-prefix-cache", no_prefix_cache, "do not share KV blocks of common prompt prefixes");
  LatencyArgs latency;
  add_latency_options(app, latency, /*with_queue_limit=*/true);
  // Speculative decoding for every request (a request opts out with "speculative": false);
  // with several models, for each of them (a --draft that does not fit one fails its loads).
  SpecArgs spec;
  add_spec_options(app, spec);
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
  int pipeline_engines = 0;
  add_pipeline_engines_option(app, pipeline_engines, "--pp of them");
  app.add_option("--admin-key", scfg.admin_key,
                 "enable the admin endpoints (POST /admin/swap_base: replace the model live), opened only by "
                 "'Authorization: Bearer KEY' (default: $TERN_ADMIN_KEY if set; without one they answer 403)");
  app.add_flag("--allow-lora-updates", scfg.allow_lora_updates,
               "allow POST /v1/load_lora_adapter and /v1/unload_lora_adapter (adapters from the server's disk)");
  RouterConfig router;
  app.add_option("--replicas", router.replicas,
                 "data parallelism: start N replicas of this server (each with these options and its own threads) "
                 "behind one front end that routes each request to the least-loaded replica, or to the one that "
                 "served its prompt prefix (docs/distributed.md)")
      ->check(CLI::Range(1, 256));
  app.add_option("--replica", router.remote, "data parallelism: also route to this server (http://HOST:PORT), repeatable");
  PromptCompressArgs compress_args;
  compress_args.add_command_options(app,
                                    "compress every request's prompt to about 1/R of its tokens unless the request "
                                    "asks otherwise (\"prompt_compression\": {...})",
                                    "default: each request's own model, scoring through its serving engine (batched "
                                    "with the other requests, sharing the prefix cache)");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  const double compress_ratio = compress_args.ratio;
  std::string scorer_path = compress_args.scorer;
  if (router.replicas > 0 || !router.remote.empty()) {
    router.host = scfg.host;
    router.port = scfg.port;
    router.serve_args = replica_serve_args(std::vector<std::string>(argv + 1, argv + argc));
    block_stop_signals();
    return run_replica_router(router);
  }
  if (models_dir.empty() && model_args.empty()) {
    std::fprintf(stderr, "tern serve: give -m FILE, or several models: --models DIR or -m NAME=FILE (repeatable)\n");
    return 2;
  }
  if (scfg.api_key.empty())
    if (const char* k = std::getenv("TERN_API_KEY")) scfg.api_key = k;
  if (scfg.admin_key.empty())
    if (const char* k = std::getenv("TERN_ADMIN_KEY")) scfg.admin_key = k;
  const int64_t kv_memory_bytes = kv_memory.empty() ? 0 : parse_memory_size(kv_memory);
  const bool single = models_dir.empty() && model_args.size() == 1 && !names_a_model(model_args[0]);
  if (single) margs.model = model_args[0];
  if (!single && !margs.tokenizer_bin.empty())
    throw Error("--tokenizer is for one llama2.c .bin model (-m FILE --tokenizer tokenizer.bin), not several models");
  if (!single && (!lora_args.empty() || scfg.allow_lora_updates))
    throw Error("LoRA adapters (--lora, --allow-lora-updates) run on one base model: tern serve -m BASE --lora NAME=FILE");
  if (!single && !alias.empty())
    throw Error("--alias names one model: with several, name them -m NAME=FILE or by aliases in models.json");

  if (app.count("--compress-prompt") > 0) {
    (void)compress_args.options(compress_ratio);  // a bad ratio, method or unit before anything loads
    server::PromptCompressionRequest d;
    d.ratio = compress_ratio;
    d.method = compress_args.method;
    d.unit = compress_args.unit;
    d.keep_numbers = compress_args.keep_numbers;
    d.keep_names = compress_args.keep_names;
    scfg.default_prompt_compression = d;
  }
  // Without --scorer, prompt compression scores through each request's model's own engine.
  if (!scorer_path.empty()) {
    auto sfile = open_model_file(scorer_path);
    // The longest prompt it may score: the served context (or the scorer's own, if shorter).
    const int64_t scorer_ctx = std::min<int64_t>(margs.ctx > 0 ? margs.ctx : read_hparams(*sfile).n_ctx_train,
                                                 read_hparams(*sfile).n_ctx_train);
    scfg.prompt_compressor = std::make_shared<server::PromptCompressor>(sfile, scorer_path, margs.threads, scorer_ctx);
    std::fprintf(stderr, "tern serve: prompt compression scorer %s (context %lld)%s\n", scorer_path.c_str(),
                 static_cast<long long>(scorer_ctx),
                 scfg.default_prompt_compression
                     ? str_cat(", every prompt compressed ", compress_ratio, "x by ", compress_args.method).c_str()
                     : "");
  }

  sigset_t signals = block_stop_signals();

  ecfg.n_threads = margs.threads;
  ecfg.max_batch_tokens = margs.batch;
  ecfg.kv_type = kv_type_from_name(margs.kv_type);
  ecfg.kv_policy = margs.kv_policy_config();
  ecfg.prefix_caching = !no_prefix_cache;
  apply_latency_args(latency, ecfg);
  ecfg.spec = spec_config_from_args(spec);
  // Pipeline engines: --pp of them unless told. Their steps follow each other through the stages,
  // so a step need not be cut into micro-batches to keep the stages busy: each cut reads the
  // stage's weights once more, which a decode step (bandwidth-bound) pays in full. Unless told,
  // a step is cut into --pp / engines micro-batches (one, by default).
  if (pipeline_engines > 1 && margs.layout.pp < 2)
    throw Error(str_cat("--pipeline-engines ", pipeline_engines, " needs a pipeline (--pp 2 or more, under mpirun)"));
  if (pipeline_engines == 0) pipeline_engines = std::max(1, margs.layout.pp);
  if (pipeline_engines > 1 && margs.layout.micro_batches == 0)
    margs.layout.micro_batches = (margs.layout.pp + pipeline_engines - 1) / pipeline_engines;
  if (margs.layout.parallel()) {
    // One model over the ranks of `mpirun` (docs/distributed.md): rank 0 serves, every step runs
    // on all ranks.
    if (!single) throw Error("--tp / --pp serve one model (-m FILE), not a pool of models");
    if (margs.sparse.enabled) throw Error("--sparse-ffn is not supported with --tp / --pp yet");
    ecfg.load = parallel_loader(margs.layout, margs.threads);
  }
  // --sparse-ffn: every model served decodes with its predictor (each must be a ReLU-fied model
  // with one; a --predictor file belongs to one model, so it serves one).
  if (margs.sparse.enabled && !margs.sparse.predictor.empty() && !single)
    throw Error("--predictor names one model's predictor: serve that model alone (-m FILE), or store each "
                "model's predictor in its file (tern predictor train)");
  if (!margs.sparse.ram_budget.empty() && (!lora_args.empty() || scfg.allow_lora_updates))
    throw Error(kLoraWithRamBudget);
  ecfg.load = sparse_ffn_loader(margs.sparse, ecfg.load);
  scfg.timings = !no_timings;
  // /api/version: the number of `tern --version` ("tern 0.1.0").
  scfg.version = std::string(kVersion).substr(std::string(kVersion).find(' ') + 1);

  // Several models: a pool of them, loaded on demand.
  std::unique_ptr<PoolModelProvider> pool;
  // How a model is loaded, for the pool's models and for the one model of -m alike.
  ServeLoadSettings load_settings;
  load_settings.engine = ecfg;
  load_settings.ctx = margs.ctx;
  load_settings.ctx_given = margs.ctx_given();
  load_settings.kv_memory_bytes = kv_memory_bytes;
  load_settings.chat_template = chat_template;
  load_settings.tool_format = tool_format;
  load_settings.command = margs.command();

  if (!single) {
    std::vector<server::ModelEntry> entries;
    if (!models_dir.empty()) entries = server::scan_models_dir(models_dir);
    if (!model_args.empty()) {
      std::vector<server::ModelEntry> named = server::models_from_args(model_args);
      entries.insert(entries.end(), std::make_move_iterator(named.begin()), std::make_move_iterator(named.end()));
      server::check_unique_names(entries);
    }
    if (entries.empty()) throw Error(str_cat("no GGUF files in ", models_dir));
    server::ModelPoolConfig pcfg;
    pcfg.max_memory_bytes = max_memory.empty() ? machine_memory().available : parse_memory_size(max_memory);
    pcfg.max_loaded = max_loaded;
    pcfg.default_keep_alive_s = keep_alive_seconds(keep_alive);
    try {
      pool = std::make_unique<PoolModelProvider>(std::move(entries), pcfg, load_settings);
    } catch (const std::invalid_argument& e) {  // the budget is below the smallest model
      std::fprintf(stderr, "tern serve: error: %s (raise --max-memory)\n", e.what());
      return 1;
    }
    for (size_t i = 0; i < pool->entries().size(); ++i) {
      const server::ModelEntry& e = pool->entries()[i];
      if (!e.parent.empty()) {  // runs on its base's engine: no memory of its own beyond adapters
        std::fprintf(stderr, "tern serve: model %s: variant of %s, %zu adapter(s)\n", e.name.c_str(),
                     e.parent.c_str(), e.defaults.adapters.size());
        continue;
      }
      std::fprintf(stderr, "tern serve: model %s: %s, %s %s, %s (about %s loaded)\n", e.name.c_str(),
                   e.path.string().c_str(), e.architecture.c_str(), e.file_type.c_str(),
                   format_bytes(e.file_bytes).c_str(), format_bytes(pool->estimated_bytes(i)).c_str());
    }
    const auto keep_text = pcfg.default_keep_alive_s < 0 ? std::string("forever")
                                                         : str_cat(pcfg.default_keep_alive_s, " s");
    std::fprintf(stderr, "tern serve: %zu models, loaded on demand; memory budget %s, %s, idle ones kept %s\n",
                 pool->entries().size(),
                 pcfg.max_memory_bytes > 0 ? format_bytes(pcfg.max_memory_bytes).c_str() : "unlimited",
                 max_loaded > 0 ? str_cat("at most ", max_loaded, " loaded").c_str() : "no limit on the count",
                 keep_text.c_str());
    if (ecfg.spec.source != DraftSource::None)
      std::fprintf(stderr, "tern serve: speculative decoding for every model: %s\n", spec_description(ecfg.spec).c_str());
    server::Server srv(*pool, scfg);
    const int port = srv.bind();
    serve_until_signal(srv, port, scfg, signals, grace_s);
    print_stopped(pool->metrics());
    return 0;
  }

  // One model, loaded now; the same loader replaces it on POST /admin/swap_base.
  SingleLoadSettings load;
  static_cast<ServeLoadSettings&>(load) = load_settings;
  if (!tool_format.empty()) {
    load.parsed_tool_format = server::tool_format_from_name(tool_format);
    if (!load.parsed_tool_format)
      throw Error(str_cat("--tool-format: unknown format '", tool_format, "' (hermes, llama3, mistral or generic)"));
  }
  load.tokenizer_bin = margs.tokenizer_bin;
  load.pipeline_engines = pipeline_engines;
  load.model_id = alias.empty() ? std::filesystem::path(margs.model).stem().string() : alias;

  std::string note;
  server::SingleModelProvider::LoadedBase first = load_single_base(margs.model, load, &note);
  scfg.model_id = load.model_id;
  scfg.strict_model_names = !alias.empty();
  scfg.model_names = first.other_names;
  scfg.chat_template = first.model->chat_template;
  scfg.system_fingerprint = first.model->system_fingerprint;
  // For the start-up line, read now: the provider owns the engine from here on (and a swap
  // may replace it).
  EngineConfig first_ecfg;
  EngineMetrics em;
  int64_t first_n_ctx = 0;
  {
    const LoadedEngine& loaded = *static_cast<const LoadedEngine*>(first.model->owner.get());
    first_ecfg = loaded.engines[0]->config();
    em = loaded.backend->metrics();
    first_n_ctx = loaded.engines[0]->n_ctx();
  }

  server::SingleModelProvider provider(first.model, first.other_names, scfg.strict_model_names);
  if (!lora_args.empty() || scfg.allow_lora_updates) {
    provider.enable_adapters(first.check);
    for (const std::string& arg : lora_args) {
      const size_t eq = arg.find('=');
      const std::string spec = eq == std::string::npos ? arg : arg.substr(eq + 1);
      const auto [path, scale] = parse_lora_arg(spec);
      const std::string name = eq == std::string::npos ? std::filesystem::path(path).stem().string() : arg.substr(0, eq);
      if (name.empty()) throw Error(str_cat("--lora ", arg, ": the adapter's name is empty"));
      try {
        provider.add_adapter(name, LoraAdapter::load(path), scale);
      } catch (const Error& e) {
        throw Error(str_cat("--lora ", arg, ": ", e.what()));
      }
      std::fprintf(stderr, "tern serve: LoRA adapter \"%s\": %s (scale %g)\n", name.c_str(), path.c_str(), double(scale));
    }
  }
  first = {};
  if (!scfg.admin_key.empty())
    provider.enable_swap([load](const std::string& path) {
      // --tokenizer goes with a llama2.c .bin only: a GGUF carries its own.
      SingleLoadSettings s = load;
      if (std::filesystem::path(path).extension() != ".bin") s.tokenizer_bin.clear();
      return load_single_base(path, s, nullptr);
    });
  // Under a layout: /metrics per rank.
  std::unique_ptr<RankMetrics> rank_metrics;
  if (margs.layout.parallel()) {
    rank_metrics = std::make_unique<RankMetrics>();
    scfg.extra_metrics = [m = rank_metrics.get()] { return m->render(); };
  }
  server::Server srv(provider, scfg);
  const int port = srv.bind();
  std::fprintf(stderr, "tern serve: model %s (id \"%s\"), context %lld tokens, KV %s (%s) in %lld blocks of %lld tokens\n",
               margs.model.c_str(), scfg.model_id.c_str(), static_cast<long long>(first_n_ctx),
               format_bytes(em.kv_bytes).c_str(), kv_type_name(first_ecfg.kv_type),
               static_cast<long long>(em.kv_blocks_total), static_cast<long long>(first_ecfg.kv_block_size));
  if (load.pipeline_engines > 1)
    std::fprintf(stderr, "tern serve: %d pipeline engines over the model, each with 1/%d of the K/V memory\n",
                 load.pipeline_engines, load.pipeline_engines);
  std::fprintf(stderr, "tern serve: %s\n", note.c_str());
  if (em.tbt_target_ms > 0)
    std::fprintf(stderr, "tern serve: steps kept under a TBT target of %.1f ms%s (a one-sequence decode step: %.1f ms)\n",
                 em.tbt_target_ms, latency.tbt_target == "auto" ? " (auto)" : "", em.decode_step_ms);
  else
    std::fprintf(stderr, "tern serve: no TBT target: steps bounded by --batch %lld tokens alone\n",
                 static_cast<long long>(first_ecfg.max_batch_tokens));
  if (first_ecfg.spec.source != DraftSource::None)
    std::fprintf(stderr, "tern serve: speculative decoding: %s\n", spec_description(first_ecfg.spec).c_str());
  if (!scfg.admin_key.empty()) std::fprintf(stderr, "tern serve: admin endpoints on (POST /admin/swap_base)\n");
  serve_until_signal(srv, port, scfg, signals, grace_s);
  // The totals of every base served, swapped-away ones included; the provider's end stops the
  // engines.
  print_stopped(provider.metrics());
  return 0;
}

}  // namespace tern
