#pragma once
// `tern serve`: the OpenAI-compatible HTTP server in front of a serving engine.
//
//   POST /v1/completions, /v1/chat/completions   (stream: true -> Server-Sent Events)
//   GET  /v1/models, /v1/models/{id}, /health, /metrics (Prometheus)
//   POST /tokenize, /detokenize
//   POST /api/chat, /api/generate (NDJSON streams), /api/embed, /api/embeddings, /api/show;
//   GET  /api/tags, /api/ps, /api/version   (Ollama's API, server/ollama_format.h)
//   GET  /  and the chat page's files (embedded, see web_assets.h)
//   POST /admin/swap_base   (a live base swap; off unless ServerConfig::admin_key is set)
//
// Models come from a ModelProvider (server/model_provider.h): one model, or many loaded on
// demand; each request holds the model it names until its answer is written.
//
// Threads: the HTTP layer (http_server.h) receives requests on its event loop and runs each
// whole one on a worker; a generation request keeps its worker while it waits on a
// per-request queue that the engine's callbacks fill.
// The server never blocks the engine thread. See docs/server.md for the whole contract.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <functional>
#include <string>
#include <vector>

#include "server/backend.h"
#include "server/chat_template.h"
#include "server/metrics.h"
#include "server/model_provider.h"
#include "server/openai_request.h"
#include "server/prompt_compressor.h"

namespace tern::server {

struct ServerConfig {
  std::string host = "127.0.0.1";       // loopback unless told otherwise
  int port = 8080;                      // 0: any free port (see Server::port())
  std::string api_key;                  // non-empty: "Authorization: Bearer KEY" required
  std::string model_id = "tern";        // what /v1/models reports
  std::vector<std::string> model_names; // other names accepted in "model" (file name, path)
  // false (one model, no alias): a request naming any model is served by this one, as
  // llama.cpp's server does (clients send "gpt-3.5-turbo" by default); true (an alias was
  // given): a name that is neither model_id nor in model_names is 404 model_not_found.
  bool strict_model_names = false;
  // Origins a browser page may call the API from (CORS): exact origins such as
  // "http://localhost:3000", or "*" for any. Empty: none (same-origin only, the chat page).
  std::vector<std::string> cors_origins;
  ChatTemplate chat_template;
  // OpenAI's system_fingerprint on every response ("" leaves it out); cmd_serve derives it
  // from tern's build, the model file and the K/V type.
  std::string system_fingerprint;
  bool timings = true;                  // llama.cpp's "timings" object on responses (--no-timings)
  ParseLimits limits;
  size_t max_body_bytes = size_t(8) << 20;     // larger bodies: 413
  size_t max_header_bytes = size_t(64) << 10;  // all header lines together: 431
  double header_timeout_s = 10;         // a request's head must arrive within this of its first byte: 408
  double read_timeout_s = 30;           // the whole request within this: 408
  double write_timeout_s = 60;          // a client not reading its response for this long is dropped
  double keep_alive_timeout_s = 5;      // an idle keep-alive connection is closed after this
  int max_connections = 1024;           // open at once; at the cap idle and slow ones make room
  int max_connections_per_client = 128; // open at once from one address; more: 503
  int listen_backlog = 0;               // 0: max(512, max_connections)
  // Budget of a response that is not streamed: choices x tokens x (1 + logprob alternatives).
  // An explicit max_tokens over it is a 400, a default one is clipped; streams are not bounded
  // (they keep nothing).
  int64_t max_response_entries = int64_t(1) << 18;
  double request_timeout_s = 600;       // a generation still running after this is aborted
  int http_threads = 128;               // requests handled at once (each stream holds one)
  int max_in_flight = 0;                // generation requests at once; 0: http_threads - 8; more: 503
  int retry_after_s = 1;                // Retry-After of 429/503 answers
  bool log_requests = false;            // one stderr line per request (errors are always logged)
  std::string version = "0.1.0";        // GET /api/version
  // More Prometheus text for /metrics (tern serve under a parallel layout: per-rank metrics).
  // Called on the request's thread: must be quick and thread-safe.
  std::function<std::string()> extra_metrics;
  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's runtime LoRA updates; the
  // provider must serve adapters): off unless set (--allow-lora-updates), as a request names a
  // file on the server's disk.
  bool allow_lora_updates = false;
  // The /admin/ routes (POST /admin/swap_base): "Authorization: Bearer ADMIN_KEY" required, the
  // API key does not open them. Empty: they answer 403 (off).
  std::string admin_key;
  // Prompt compression (docs/data-level.md): the scorer of --scorer FILE (null: each request's
  // own model scores through its engine, server/backend_scorer.h), and what every request that
  // does not ask gets (--compress-prompt R; none when unset).
  std::shared_ptr<PromptCompressor> prompt_compressor;
  std::optional<PromptCompressionRequest> default_prompt_compression;
};

class Server {
 public:
  // `provider` must outlive the server.
  Server(ModelProvider& provider, ServerConfig config);
  // One model: `backend` (which must outlive the server) named and templated by config's
  // model_id, model_names, strict_model_names, chat_template and system_fingerprint.
  Server(Backend& backend, ServerConfig config);
  ~Server();  // shutdown with no grace period
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket; returns the port. Throws tern::Error when it cannot.
  int bind();
  // Serves until shutdown(); binds first if bind() was not called. Blocks.
  void listen();
  // listen() on a background thread; returns once the socket is bound.
  void start();
  // Graceful stop, callable from any thread (not from a handler): new requests get 503, requests
  // in flight get up to `grace` to finish, then the rest are aborted (a stream ends with an
  // error event and [DONE], a waiting client gets 503), then the listener closes and the
  // workers are joined. Idempotent.
  void shutdown(std::chrono::milliseconds grace);

  int port() const;
  const ServerMetrics& metrics() const;
  int64_t in_flight() const;  // generation requests being served

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tern::server
