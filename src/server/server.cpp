#include "server/server.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "server/api_error.h"
#include "server/mailbox.h"
#include "server/http_server.h"
#include "server/embeddings_api.h"
#include "server/ollama_format.h"
#include "server/openai_format.h"
#include "server/skeleton_api.h"
#include "server/structured_output.h"
#include "server/tool_calls.h"
#include "server/web_assets.h"

namespace tern::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// How often a waiting handler looks at its connection, the shutdown flag and its deadline
// between engine outputs: bounds how long a vanished client's KV blocks stay allocated.
constexpr auto kPollInterval = std::chrono::milliseconds(50);

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Constant-time comparison, so the API key cannot be guessed byte by byte from timings.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < a.size(); ++i) diff |= unsigned(uint8_t(a[i]) ^ uint8_t(i < b.size() ? b[i] : 0));
  return diff == 0;
}

const char* error_type_for(int status) {
  if (status == 401) return "authentication_error";
  if (status == 404) return "not_found_error";
  if (status == 429) return "rate_limit_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

void set_json(HttpResponse& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump_json(j), "application/json");
}

void set_error(HttpResponse& res, int status, const std::string& message, const std::string& param = "",
               const std::string& code = "") {
  set_json(res, status, error_json(message, error_type_for(status), param, code));
}

void set_api_error(HttpResponse& res, const ApiError& e) { set_json(res, e.status(), error_json(e)); }

// Ollama's routes, whose errors are {"error": "..."} (what its clients show as the message).
bool is_ollama_path(const std::string& path) { return path.rfind("/api/", 0) == 0; }

// The per-request label of tern_requests_total: known routes by name, the rest as one value
// so that random paths cannot grow the metric without bound.
std::string endpoint_label(const std::string& path) {
  static const char* known[] = {"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models",
                                "/health",          "/metrics",             "/tokenize",      "/detokenize",
                                "/api/chat",        "/api/generate",        "/api/embed",     "/api/embeddings",
                                "/api/tags",        "/api/ps",              "/api/show",      "/api/version",
                                "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/admin/swap_base"};
  for (const char* k : known)
    if (path == k) return k;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  for (const auto& a : web_assets())
    if (path == a.path) return "static";
  if (path == "/") return "static";
  return "other";
}

// Set when a generation request's job has counted it in tern_requests_total, for the logger
// that runs next on the same worker thread (the HTTP layer runs handler, stream and logger of
// one request on one thread).
thread_local bool t_counted_by_job = false;
// Set by a generation request whose answer was large, for the worker's after-request hook:
// glibc keeps freed memory in the arena of the thread that freed it, so without a trim each
// of the HTTP workers would hold on to the peak of the largest answer it ever built.
thread_local bool t_trim_after = false;
// Tokens x (1 + alternatives) past which a finished request trims the allocator.
constexpr int64_t kTrimAfterEntries = 4096;

// Response entries of a request: every token of every choice, with its logprob alternatives.
int64_t response_entries(int64_t choices, int64_t max_tokens, int n_logprobs) {
  return choices * max_tokens * (1 + (n_logprobs >= 0 ? 1 + n_logprobs : 0));
}

// One engine output, tagged with the prompt (of a batched /v1/completions) it belongs to.
struct Event {
  int prompt = 0;
  RequestOutput out;
};

using EventMailbox = Mailbox<Event>;

}  // namespace

struct Server::Impl {
  std::unique_ptr<ModelProvider> own_provider;  // Server(Backend&): its one model
  ModelProvider& provider;
  ServerConfig cfg;
  HttpServer http;
  ServerMetrics metrics;
  std::thread listen_thread;
  int bound_port = -1;
  const int64_t started = unix_now();

  std::atomic<bool> draining{false};   // refusing new requests
  std::atomic<bool> abort_all{false};  // grace period over: in-flight requests abort
  std::atomic<int64_t> in_flight{0};
  std::mutex drain_mu;
  std::condition_variable drain_cv;
  std::once_flag shutdown_once;
  // Unloads models whose keep_alive ran out (provider.collect()) about once a second.
  std::thread collector;
  std::mutex collector_mu;
  std::condition_variable collector_cv;
  bool collector_stop = false;

  static HttpServerConfig http_config(const ServerConfig& c) {
    HttpServerConfig h;
    h.host = c.host;
    h.port = c.port;
    h.limits.max_body_bytes = c.max_body_bytes;
    h.limits.max_header_bytes = c.max_header_bytes;
    h.header_timeout_s = c.header_timeout_s;
    h.read_timeout_s = c.read_timeout_s;
    h.idle_timeout_s = c.keep_alive_timeout_s;
    h.write_timeout_s = c.write_timeout_s;
    h.workers = std::max(c.http_threads, 4);
    h.max_connections = c.max_connections;
    h.max_connections_per_client = c.max_connections_per_client;
    h.backlog = c.listen_backlog;
    return h;
  }

  Impl(ModelProvider& p, ServerConfig c, std::unique_ptr<ModelProvider> own = nullptr)
      : own_provider(std::move(own)), provider(p), cfg(std::move(c)), http(http_config(cfg)) {}

  void start_collector() {
    collector = std::thread([this] {
      std::unique_lock lock(collector_mu);
      while (!collector_cv.wait_for(lock, std::chrono::seconds(1), [this] { return collector_stop; })) {
        lock.unlock();
        try {
          provider.collect();
        } catch (const std::exception& e) {
          std::fprintf(stderr, "tern serve: unloading idle models failed: %s\n", e.what());
        }
        lock.lock();
      }
    });
  }
  void stop_collector() {
    {
      std::lock_guard lock(collector_mu);
      collector_stop = true;
    }
    collector_cv.notify_all();
    if (collector.joinable()) collector.join();
  }

  // Counts a generation request in flight from construction to destruction; shutdown waits
  // for the count to reach zero.
  struct InFlight {
    Impl* impl;
    explicit InFlight(Impl* i) : impl(i) {
      impl->in_flight.fetch_add(1);
      impl->metrics.request_started();
    }
    ~InFlight() {
      impl->metrics.request_ended();
      {
        std::lock_guard lock(impl->drain_mu);
        impl->in_flight.fetch_sub(1);
      }
      impl->drain_cv.notify_all();
    }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;
  };

  // Everything one generation request owns once it has been submitted to the engine.
  struct Job {
    // First member, so destroyed last: the model stays loaded until everything below that
    // talks to its engine (the destructor's aborts included) is done.
    ModelRef model;
    int64_t load_ns = 0;                  // this request's wait for the model's load
    Impl* impl = nullptr;
    std::unique_ptr<InFlight> in_flight;
    // "organize": "skeleton": the run that answers instead of the choices below (ids stays
    // empty). Declared after `model` and `in_flight`: its destructor's aborts reach the engine
    // before the request leaves the in-flight count (which shutdown waits on) and the model goes.
    std::unique_ptr<SkeletonOfThought> sot;
    // Which API answers: OpenAI's (error objects, SSE) or Ollama's ({"error"}, NDJSON).
    bool ollama = false;
    // Ollama's "model" in answers: the name as the request gave it ("x:latest" stays so), as
    // Ollama echoes it.
    std::string answer_name;
    std::string endpoint;                 // the tern_requests_total label of the route
    bool keep_answer_ids = false;         // /api/generate's "context": the answer's token ids
    std::vector<int32_t> answer_ids;      // of choice 0
    std::vector<int32_t> prompt_ids;      // of prompt 0 (with keep_answer_ids)
    Clock::time_point started = Clock::now();
    std::shared_ptr<EventMailbox> mailbox = std::make_shared<EventMailbox>();
    OpenAiRequest req;
    ResponseMeta meta;
    std::vector<uint64_t> ids;            // engine request id per prompt
    std::vector<int64_t> prompt_tokens;   // per prompt
    std::vector<std::string> echo;        // per prompt ("" unless echo)
    std::vector<ChoiceResult> choices;    // [prompt * n + index]
    std::vector<int> unfinished;          // per prompt: choices still running
    std::vector<int64_t> cached;          // per prompt: prefix-cache hits
    // Chat with tools (tool_choice not none): answers are parsed for calls; a stream keeps one
    // parser per choice.
    bool parse_tools = false;
    // tool_choice required or a named function: the grammar allows nothing but calls, so text
    // outside complete calls (a call cut by max_tokens) is not content.
    bool forced_tools = false;
    std::vector<std::unique_ptr<ToolCallParser>> tool_parsers;  // [choices] when streaming
    int n_done = 0;
    std::function<bool()> peer_closed;  // the client went away
    Clock::time_point deadline;
    bool live = false;     // accepted and being served: its end must be accounted for
    bool counted = false;  // finish_accounting() ran

    ~Job() {
      abort_unfinished();
      // A job torn down without an answer written: the connection broke under it.
      if (live && !counted) finish_accounting(499, /*from_destructor=*/true);
    }

    bool all_done() const { return n_done == int(choices.size()); }

    void abort_unfinished() {
      if (sot && !sot->done()) sot->abort();
      for (size_t p = 0; p < ids.size(); ++p)
        if (ids[p] != 0 && unfinished[p] > 0) model->backend->abort(ids[p]);
      std::fill(unfinished.begin(), unfinished.end(), 0);
    }

    Usage usage() const {
      if (sot) return skeleton_usage(sot->result());
      Usage u;
      for (size_t p = 0; p < prompt_tokens.size(); ++p) {
        u.prompt_tokens += prompt_tokens[p];
        u.cached_tokens += cached[p];
      }
      for (const auto& c : choices) u.completion_tokens += c.n_tokens;
      return u;
    }

    // Token counters and the status of the request, once, whatever way it ends. Counted
    // here, before the answer is written and before the request leaves the in-flight gauge,
    // so a client that has its answer (or gave up) already finds it in /metrics.
    void finish_accounting(int status, bool from_destructor = false) {
      counted = true;
      const Usage u = usage();
      impl->metrics.add_tokens(u.prompt_tokens, u.completion_tokens);
      if (model) impl->metrics.count_model_request(model->id, status, u.prompt_tokens, u.completion_tokens);
      if (!from_destructor && response_entries(1, u.completion_tokens, req.n_logprobs) > kTrimAfterEntries)
        t_trim_after = true;
      impl->metrics.count_request(endpoint, status);
      // The logger runs later on this thread (unless the connection broke, when the job is
      // torn down after it) and must not count the same request again.
      if (!from_destructor) t_counted_by_job = true;
    }

    // Applies one engine output to its choice; returns that choice's index.
    ChoiceResult& apply(const Event& ev) {
      const int index = ev.prompt * req.n + ev.out.index;
      ChoiceResult& c = choices.at(size_t(index));
      c.n_tokens += int64_t(ev.out.tokens.size());
      // A stream sends each output as it comes and keeps nothing of it: its memory does not
      // grow with its length.
      if (!req.stream) {
        c.text += ev.out.text;
        if (req.n_logprobs >= 0) c.tokens.insert(c.tokens.end(), ev.out.tokens.begin(), ev.out.tokens.end());
      }
      // The engine sends a prompt's scores once (with completion 0): every choice of the prompt
      // shows them.
      if (!ev.out.prompt_logprobs.empty())
        for (int k = 0; k < req.n; ++k) choices.at(size_t(ev.prompt * req.n + k)).prompt_scores = ev.out.prompt_logprobs;
      if (keep_answer_ids && index == 0)
        for (const auto& t : ev.out.tokens) answer_ids.push_back(t.id);
      if (ev.out.finished && !c.finished) {
        c.finished = true;
        c.finish = ev.out.finish_reason;
        c.error = ev.out.error;
        c.metrics = ev.out.metrics;
        cached[size_t(ev.prompt)] = std::max(cached[size_t(ev.prompt)], ev.out.metrics.n_cached_prompt);
        if (unfinished[size_t(ev.prompt)] > 0) --unfinished[size_t(ev.prompt)];
        ++n_done;
        if (c.finish == FinishReason::Stop || c.finish == FinishReason::Length) impl->metrics.observe_completion(c.metrics);
      }
      return c;
    }

    // Why the handler must stop waiting, or nullptr to go on.
    const char* interrupted() const {
      if (impl->abort_all.load()) return "shutdown";
      if (peer_closed && peer_closed()) return "disconnected";
      if (Clock::now() > deadline) return "timeout";
      return nullptr;
    }
  };

  // ---- request preparation ---------------------------------------------------------------

  static ToolParserOptions tool_parser_options(const OpenAiRequest& r) {
    ToolParserOptions o;
    for (const auto& t : r.tools) {
      // tool_choice naming one function: only its calls are calls.
      if (r.tool_choice.mode == ToolChoiceMode::Named && t.name != r.tool_choice.name) continue;
      o.tool_names.push_back(t.name);
    }
    o.parallel = r.parallel_tool_calls;
    return o;
  }

  static std::vector<int32_t> checked_ids(const Tokenizer& tok, const std::vector<int64_t>& ids,
                                          const std::string& param) {
    const int64_t n_vocab = tok.n_vocab();
    std::vector<int32_t> out;
    out.reserve(ids.size());
    for (int64_t id : ids) {
      if (id < 0 || id >= n_vocab) bad_request(param, "token id ", id, " is outside the vocabulary [0, ", n_vocab, ").");
      out.push_back(int32_t(id));
    }
    return out;
  }

  // What a route adds to the OpenAI body it prepares.
  struct PrepareOptions {
    Acquired model;                  // set: the route acquired it already (Ollama's routes)
    bool ollama = false;
    std::string endpoint;            // "" : the OpenAI route of the kind
    bool until_context_end = false;  // no max_tokens: generate to the end of the context (Ollama's generate)
    bool keep_answer_ids = false;
  };

  // Parses, tokenizes and validates against the model; the Job is ready to submit.
  std::shared_ptr<Job> prepare(const std::string& body, ApiKind kind) { return prepare(body, kind, PrepareOptions()); }
  std::shared_ptr<Job> prepare(const std::string& body, ApiKind kind, PrepareOptions opt) {
    auto job = std::make_shared<Job>();
    job->impl = this;
    job->ollama = opt.ollama;
    job->endpoint = !opt.endpoint.empty() ? opt.endpoint : kind == ApiKind::Chat ? "/v1/chat/completions" : "/v1/completions";
    job->keep_answer_ids = opt.keep_answer_ids;
    job->req = parse_openai_request(body, kind, cfg.limits);
    OpenAiRequest& r = job->req;
    if (!opt.model.model) opt.model = provider.acquire(r.model);
    job->model = std::move(opt.model.model);
    job->load_ns = opt.model.load_ns;
    const ServedModel& m = *job->model;
    const Tokenizer& tok = m.backend->tokenizer();
    for (const auto& [id, bias] : r.sampling.logit_bias)
      if (id >= tok.n_vocab())
        bad_request("logit_bias", "token id ", id, " is outside the vocabulary [0, ", tok.n_vocab(), ").");
    job->meta.kind = kind;
    job->meta.id = new_response_id(kind);
    job->meta.created = unix_now();
    job->meta.model = m.id;
    job->meta.system_fingerprint = m.system_fingerprint;
    job->meta.timings = cfg.timings;
    job->parse_tools = kind == ApiKind::Chat && !r.tools.empty() && r.tool_choice.mode != ToolChoiceMode::None;
    job->forced_tools = job->parse_tools && (r.tool_choice.mode == ToolChoiceMode::Required ||
                                             r.tool_choice.mode == ToolChoiceMode::Named);
    // Before any tokenizing: a grammar that does not parse or a schema that cannot be converted
    // is the client's 400, whatever else the request holds.
    const std::shared_ptr<const TokenConstraint> constraint = m.structured->constraint_for(r, m.chat_template.tool_format);

    // Prompt compression (the request's, or the server's default): a chat's user and system
    // messages are compressed one by one, before the template renders them (its markup stays
    // whole); a completion's prompts after tokenizing, below.
    std::optional<prompt::CompressOptions> compress;
    prompt::PromptOptions compress_popts;
    if (const auto& pc = r.prompt_compression ? r.prompt_compression : cfg.default_prompt_compression) {
      compress.emplace();
      compress->ratio = pc->ratio;
      compress->method = *prompt::method_from_name(pc->method);
      compress->unit = *prompt::unit_from_name(pc->unit);
      compress_popts = {pc->keep_numbers, pc->keep_names, true};
    }
    nlohmann::json compression_report;
    const auto add_report = [&](const nlohmann::json& rep) {
      if (compression_report.is_null()) {
        compression_report = rep;
        return;
      }
      for (const char* k : {"tokens", "kept_tokens", "tokens_saved", "scorer_tokens"})
        compression_report[k] = compression_report[k].get<int64_t>() + rep[k].get<int64_t>();
      compression_report["scorer_ms"] = compression_report["scorer_ms"].get<double>() + rep["scorer_ms"].get<double>();
      const int64_t kept = compression_report["kept_tokens"];
      compression_report["ratio_achieved"] = kept > 0 ? compression_report["tokens"].get<double>() / double(kept) : 0.0;
    };
    // The scorer: --scorer FILE's own session, else the request's model through its engine (its
    // scoring requests queue and batch with everyone else's; shutdown cancels the wait).
    BackendScorerOptions scorer_opts;
    scorer_opts.priority = r.priority;
    scorer_opts.lora = m.lora;
    scorer_opts.deadline = Clock::now() + std::chrono::milliseconds(int64_t(cfg.request_timeout_s * 1000));
    scorer_opts.cancelled = [this] { return abort_all.load(); };
    const auto compress_one = [&](const std::vector<int32_t>& ids, const std::string& text, bool parse_special) {
      if (cfg.prompt_compressor)
        return cfg.prompt_compressor->compress(tok, m.id, ids, text, parse_special, *compress, compress_popts);
      try {
        return compress_on_backend(*m.backend, scorer_opts, ids, text, parse_special, *compress, compress_popts);
      } catch (const EngineOverloaded& e) {
        throw overloaded_error(e);
      }
    };
    if (compress && kind == ApiKind::Chat) {
      for (ChatMessage& msg : r.messages) {
        if ((msg.role != "user" && msg.role != "system") || msg.content.empty()) continue;
        CompressedIds c = compress_one({}, msg.content, false);
        msg.content = std::move(c.text);
        add_report(c.report);
      }
    }
    // Skeleton-of-Thought builds its own prompts from the (compressed) messages.
    if (r.organize) {
      job->meta.prompt_compression = std::move(compression_report);
      job->sot = start_skeleton(r, m);
      return job;
    }

    std::vector<std::vector<int32_t>> prompts;
    if (kind == ApiKind::Chat) {
      // The template's markers are special tokens, the messages' contents only text: a message
      // cannot close its turn or end the generation by writing "</s>" or "<|im_end|>".
      // Tools are shown to the model unless tool_choice is none (it is not to call them then);
      // calls and results already in the history are rendered either way.
      static const std::vector<ToolDef> kNoTools;
      const bool show_tools = r.tool_choice.mode != ToolChoiceMode::None;
      prompts.push_back(m.chat_template.encode(r.messages, tok, tok.add_bos_default(), show_tools ? r.tools : kNoTools));
      job->echo.push_back("");
    } else {
      for (size_t i = 0; i < r.prompts.size(); ++i) {
        const Prompt& p = r.prompts[i];
        const std::string param = r.prompts.size() > 1 ? str_cat("prompt[", i, "]") : "prompt";
        if (p.is_tokens) {
          prompts.push_back(checked_ids(tok, p.tokens, param));
          job->echo.push_back(r.echo ? tok.decode(prompts.back()) : "");
        } else {
          // Special-token texts in a raw prompt become those tokens, as in llama.cpp's server:
          // a client can write its own template.
          prompts.push_back(tok.encode(p.text, tok.add_bos_default(), true));
          job->echo.push_back(r.echo ? p.text : "");
        }
      }
    }

    if (compress && kind != ApiKind::Chat) {
      for (size_t i = 0; i < prompts.size(); ++i) {
        const std::string& text = r.prompts[i].is_tokens ? std::string() : r.prompts[i].text;
        CompressedIds c = compress_one(prompts[i], text, true);
        prompts[i] = std::move(c.ids);
        add_report(c.report);
      }
    }
    job->meta.prompt_compression = std::move(compression_report);
    const int64_t n_ctx = m.backend->n_ctx();
    if (r.truncate_prompt_tokens) {
      // vLLM's left truncation: the last N tokens of the prompt (-1: as many as the context
      // takes with one token to generate). A leading BOS stays: models are trained to see it
      // first, and it is one of the N.
      const int64_t keep = *r.truncate_prompt_tokens == -1 ? n_ctx - 1 : *r.truncate_prompt_tokens;
      if (keep >= n_ctx)
        throw ApiError(400, "invalid_request_error", "truncate_prompt_tokens", "context_length_exceeded",
                       str_cat("truncate_prompt_tokens (", keep, ") must be below this model's maximum context length (",
                               n_ctx, " tokens) to leave room for the completion."));
      for (auto& p : prompts) {
        if (int64_t(p.size()) <= keep) continue;
        const bool bos = tok.add_bos_default() && !p.empty() && p[0] == tok.bos_id() && keep >= 2;
        std::vector<int32_t> kept;
        kept.reserve(size_t(keep));
        if (bos) kept.push_back(p[0]);
        kept.insert(kept.end(), p.end() - (keep - int64_t(bos)), p.end());
        p = std::move(kept);
      }
    }
    const char* max_param = r.kind == ApiKind::Chat ? "max_completion_tokens" : "max_tokens";
    int64_t max_tokens = r.max_tokens.value_or(r.kind == ApiKind::Chat || opt.until_context_end ? n_ctx : 16);
    const bool evicting = r.kv_policy ? r.kv_policy->evicts() : m.backend->evicts_by_default();
    // Prompt scores: echo with logprobs (completions, OpenAI's) and prompt_logprobs (vLLM's), one
    // engine request scoring with the alternatives of the larger.
    const int echo_logprobs = r.kind == ApiKind::Completion && r.echo ? r.n_logprobs : -1;
    const int engine_prompt_logprobs = std::max(echo_logprobs, r.prompt_logprobs);
    const char* score_param = r.prompt_logprobs >= 0 ? "prompt_logprobs" : "echo";
    const char* score_what = r.prompt_logprobs >= 0 ? "prompt_logprobs" : "echo with logprobs";
    if (engine_prompt_logprobs >= 0) {
      if (evicting)
        bad_request(score_param, "prompt scores (", score_what, ") need every prompt token to attend to the whole "
                    "prompt before it, and the KV policy ",
                    r.kv_policy ? "the request chose" : "this server runs (--kv-policy)", " evicts: send \"kv_policy\": {\"type\": \"none\"}.");
      // The engine sends a prompt's scores with its first completion only: a stream of several
      // could not show them on the others' first chunks.
      if (r.stream && r.n > 1)
        bad_request(score_param, "a stream with prompt scores (", score_what, ") takes n = 1, got ", r.n,
                    "; without \"stream\" every choice carries them.");
    }
    const bool scoring_only = engine_prompt_logprobs >= 0 && r.max_tokens == 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int64_t n_prompt = int64_t(prompts[i].size());
      if (n_prompt == 0) bad_request("prompt", "the prompt is empty and this model adds no BOS token.");
      // A request that only scores its prompt generates nothing: the prompt may fill the context.
      if (n_prompt > n_ctx || (n_prompt == n_ctx && !scoring_only))
        throw ApiError(400, "invalid_request_error", r.kind == ApiKind::Chat ? "messages" : "prompt",
                       "context_length_exceeded",
                       str_cat("This model's maximum context length is ", n_ctx, " tokens. However, your ",
                               r.kind == ApiKind::Chat ? "messages resulted in " : "prompt has ", n_prompt,
                               " tokens. Please reduce the length of the ",
                               r.kind == ApiKind::Chat ? "messages" : "prompt",
                               ", or set truncate_prompt_tokens to keep only its last tokens."));
      if (r.max_tokens && n_prompt + *r.max_tokens > n_ctx && !evicting)
        throw ApiError(400, "invalid_request_error", max_param, "context_length_exceeded",
                       str_cat("This model's maximum context length is ", n_ctx, " tokens. However, you requested ",
                               n_prompt + *r.max_tokens, " tokens (", n_prompt, " in the prompt, ", *r.max_tokens,
                               " for the completion). Please reduce the prompt or the completion length."));
      // Defaults are clipped to what fits; an explicit value that does not fit was refused above
      // (under an evicting KV policy the cache stays bounded: an explicit value may run past it).
      if (!(evicting && r.max_tokens)) max_tokens = std::min(max_tokens, n_ctx - n_prompt);
    }
    // A whole (not streamed) answer is built in memory: its size is bounded by a budget of
    // tokens x (1 + logprob alternatives) over every choice. An explicit max_tokens over it is
    // refused; the default is clipped to it.
    const int64_t n_choices = int64_t(prompts.size()) * r.n;
    // Prompt scores are copied to every choice of their prompt; they come first from the budget.
    int64_t score_entries = 0;
    if (engine_prompt_logprobs >= 0 && !r.stream) {
      // Per prompt token: the echoed token with its alternatives, vLLM's entry with its own.
      const int64_t per_token = (echo_logprobs >= 0 ? 1 + echo_logprobs : 0) +
                                (r.prompt_logprobs >= 0 ? 1 + r.prompt_logprobs : 0);
      for (const auto& p : prompts) score_entries += int64_t(p.size()) * r.n * per_token;
      if (score_entries > cfg.max_response_entries)
        throw ApiError(400, "invalid_request_error", score_param, "response_too_large",
                       str_cat("The prompt scores of this request would be ", score_entries,
                               " response entries (prompt tokens x choices x alternatives), over the server's limit of ",
                               cfg.max_response_entries, " for an answer that is not streamed. Set \"stream\": true, or "
                               "send fewer or shorter prompts, a lower n or fewer alternatives."));
    }
    const int64_t entries_left = cfg.max_response_entries - score_entries;
    if (!r.stream && max_tokens > 0 && response_entries(n_choices, max_tokens, r.n_logprobs) > entries_left) {
      const int64_t per_token = response_entries(n_choices, 1, r.n_logprobs);
      const int64_t fits = entries_left / per_token;
      if (r.max_tokens || fits < 1)
        throw ApiError(400, "invalid_request_error", max_param, "response_too_large",
                       str_cat("This request could produce ", response_entries(n_choices, max_tokens, r.n_logprobs),
                               " response entries (", n_choices, " choices x ", max_tokens, " tokens x ",
                               per_token / n_choices, " with logprobs), over the server's limit of ",
                               cfg.max_response_entries, " for an answer that is not streamed. Set \"stream\": true, "
                               "or lower n, ", max_param, " or the logprobs count (at most ", std::max<int64_t>(fits, 0),
                               " tokens here)."));
      max_tokens = fits;
    }

    job->ids.assign(prompts.size(), 0);
    job->unfinished.assign(prompts.size(), r.n);
    job->cached.assign(prompts.size(), 0);
    for (const auto& p : prompts) job->prompt_tokens.push_back(int64_t(p.size()));
    job->choices.resize(prompts.size() * size_t(r.n));
    for (size_t i = 0; i < job->choices.size(); ++i) {
      job->choices[i].index = int(i);
      job->choices[i].text = job->echo[i / size_t(r.n)];
      if (engine_prompt_logprobs >= 0) job->choices[i].prompt_first = prompts[i / size_t(r.n)][0];
    }
    job->meta.echo_logprobs = echo_logprobs;
    job->meta.prompt_logprobs = r.prompt_logprobs;
    if (job->parse_tools && r.stream)
      for (size_t i = 0; i < job->choices.size(); ++i)
        job->tool_parsers.push_back(std::make_unique<ToolCallParser>(m.chat_template.tool_format, tool_parser_options(r)));

    // Submit. A refusal of any prompt takes the whole request back.
    if (job->keep_answer_ids && !prompts.empty()) job->prompt_ids = prompts[0];
    std::random_device rd;
    for (size_t i = 0; i < prompts.size(); ++i) {
      RequestParams params;
      params.prompt_ids = std::move(prompts[i]);
      params.max_tokens = max_tokens;
      params.sampling = r.sampling;
      if (!r.seed) params.sampling.seed = (uint64_t(rd()) << 32) ^ rd();
      params.stop = r.stop;
      params.ignore_eos = r.ignore_eos;
      params.n_logprobs = r.n_logprobs;
      params.prompt_logprobs = engine_prompt_logprobs;
      params.prompt_logprobs_from = 1;
      params.priority = r.priority;
      params.speculative = r.speculative;
      params.kv_policy = r.kv_policy;
      params.n = r.n;
      params.constraint = constraint;
      params.lora = m.lora;
      std::weak_ptr<EventMailbox> weak = job->mailbox;
      const int prompt_index = int(i);
      const uint64_t id = with_engine_errors("", [&] {
        return m.backend->add_request(std::move(params), [weak, prompt_index](const RequestOutput& out) {
          if (auto mb = weak.lock()) mb->push({prompt_index, out});
        });
      });
      if (id == 0)
        throw ApiError(429, "rate_limit_error", "", "queue_full",
                       "The server's request queue is full. Please retry after a short wait.");
      job->ids[i] = id;
    }
    return job;
  }

  // ---- generation handlers ---------------------------------------------------------------

  // A refusal's Retry-After: its own estimate (the engine's queue-time limit) or the default.
  std::string retry_after_value(const ApiError& e) const {
    return std::to_string(e.retry_after_s() > 0 ? int64_t(std::ceil(e.retry_after_s())) : int64_t(cfg.retry_after_s));
  }

  // 503 + Retry-After when more requests are in flight than the HTTP threads can serve.
  bool refuse_when_busy(HttpResponse& res, bool ollama = false) const {
    if (cfg.max_in_flight <= 0 || in_flight.load() <= cfg.max_in_flight) return false;
    res.headers.set("Retry-After", std::to_string(cfg.retry_after_s));
    const char* message = "The server is busy (too many requests in flight). Please retry after a short wait.";
    if (ollama) set_json(res, 503, ollama::error_body(message));
    else set_error(res, 503, message, "", "server_busy");
    return true;
  }

  // A prepared job becomes the request's: it is in flight until its answer is written.
  void go_live(Job& job, std::unique_ptr<InFlight> guard, const HttpRequest& hreq) {
    job.in_flight = std::move(guard);
    job.live = true;
    job.peer_closed = hreq.peer_closed;
    job.deadline = Clock::now() + std::chrono::milliseconds(int64_t(cfg.request_timeout_s * 1000));
  }

  void handle_generate(const HttpRequest& hreq, HttpResponse& res, ApiKind kind) {
    auto guard = std::make_unique<InFlight>(this);
    if (refuse_when_busy(res)) return;
    std::shared_ptr<Job> job;
    try {
      job = prepare(hreq.body, kind);
    } catch (const ApiError& e) {
      if (e.status() == 429 || e.status() == 503) res.headers.set("Retry-After", retry_after_value(e));
      set_api_error(res, e);
      return;
    } catch (const Error& e) {
      set_error(res, 400, e.what());
      return;
    }
    go_live(*job, std::move(guard), hreq);
    if (job->req.stream) start_stream(job, res);
    else if (job->sot) skeleton_whole(job, res);
    else wait_whole(job, res);
  }

  // A Skeleton-of-Thought run (server/skeleton_api.h), not streamed: polled on this thread
  // (the engine runs on its own) until it ends or the request is interrupted.
  void skeleton_whole(const std::shared_ptr<Job>& job, HttpResponse& res) {
    SkeletonOfThought& sot = *job->sot;
    while (!sot.done()) {
      sot.poll(kPollInterval);
      if (sot.done()) break;
      if (const char* why = job->interrupted()) {
        job->abort_unfinished();
        finish_interrupted(*job, res, why);
        return;
      }
    }
    if (!sot.result().error.empty()) {
      const SkeletonFailure f = skeleton_failure(sot.result());
      job->finish_accounting(f.status);
      job_error(*job, res, f.status, f.message);
      return;
    }
    job->finish_accounting(200);
    set_json(res, 200, skeleton_response(job->meta, sot.result(), job->model->backend->tokenizer()));
  }

  // The stream of a Skeleton-of-Thought run: as stream_body, with the run's own chunks.
  bool stream_skeleton(Job& job, HttpStreamSink& sink) {
    SkeletonOfThought& sot = *job.sot;
    SkeletonStream stream(job.meta, job.req.include_usage);
    std::string out = stream.begin(sot.result());
    std::string error;
    int error_status = 0;
    while (true) {
      if (!out.empty() && !sink.write(out)) {
        job.abort_unfinished();
        if (!job.counted) job.finish_accounting(499);
        return false;
      }
      if (sot.done()) break;
      if (const char* why = job.interrupted()) {
        const std::string w = why;
        job.abort_unfinished();
        if (w == "disconnected") {
          job.finish_accounting(499);
          return false;
        }
        error = w == "timeout" ? str_cat("the request ran past the server's time limit (", cfg.request_timeout_s, " s).")
                               : "the server is shutting down.";
        error_status = 503;
        break;
      }
      out = stream.render(sot.poll(kPollInterval), sot.result());
    }
    if (error.empty() && !sot.result().error.empty()) {
      const SkeletonFailure f = skeleton_failure(sot.result());
      error = f.message;
      error_status = f.status;
    }
    if (!error.empty()) {
      job.finish_accounting(error_status);
      sink.write(sse_event(error_json(error, error_type_for(error_status))) + kSseDone);
      return true;
    }
    job.finish_accounting(200);
    sink.write(stream.finish(sot.result()));
    return true;
  }

  // An error answer of a request in the shape of its API.
  void job_error(const Job& job, HttpResponse& res, int status, const std::string& message,
                 const std::string& code = "") {
    if (status == 429 || status == 503) res.headers.set("Retry-After", std::to_string(cfg.retry_after_s));
    if (job.ollama) set_json(res, status, ollama::error_body(message));
    else set_error(res, status, message, "", code);
  }

  void wait_whole(const std::shared_ptr<Job>& job, HttpResponse& res) {
    if (!collect_whole(job, res)) return;
    job->finish_accounting(200);
    set_json(res, 200,
             completion_response(job->meta, job->choices, job->usage(), job->req.n_logprobs >= 0,
                                 job->model->backend->tokenizer()));
  }

  // Waits for every choice of a request that is not streamed and parses tool calls out of
  // the answers. false: an error answer was written (and the request accounted for).
  bool collect_whole(const std::shared_ptr<Job>& job, HttpResponse& res) {
    std::deque<Event> events;
    while (!job->all_done()) {
      job->mailbox->take(events, kPollInterval);
      for (const auto& ev : events) job->apply(ev);
      events.clear();
      if (job->all_done()) break;
      if (const char* why = job->interrupted()) {
        job->abort_unfinished();
        finish_interrupted(*job, res, why);
        return false;
      }
    }
    for (const auto& c : job->choices) {
      if (c.finish == FinishReason::Error) {
        job->finish_accounting(500);
        job_error(*job, res, 500, "generation failed: " + c.error);
        return false;
      }
      if (c.finish == FinishReason::Abort) {
        job->finish_accounting(503);
        job_error(*job, res, 503, "the request was aborted by the server.");
        return false;
      }
    }
    if (job->parse_tools)
      for (auto& c : job->choices) {
        ToolParseResult parsed =
            parse_tool_calls(job->model->chat_template.tool_format, c.text, tool_parser_options(job->req));
        if (job->forced_tools) {
          parsed.content.clear();
          c.text.clear();
        }
        if (parsed.calls.empty()) continue;
        // parallel_tool_calls false: the first call is the answer (a model that wrote more is cut).
        if (!job->req.parallel_tool_calls) parsed.calls.resize(1);
        c.tool_calls = std::move(parsed.calls);
        c.text = std::move(parsed.content);
      }
    return true;
  }

  void finish_interrupted(Job& job, HttpResponse& res, const std::string& why) {
    if (why == "disconnected") {
      job.finish_accounting(499);
      res.status = 499;  // nobody reads it (nginx's "client closed request")
    } else if (why == "timeout") {
      job.finish_accounting(503);
      if (job.ollama) set_json(res, 503, ollama::error_body(str_cat("the request ran past the server's time limit (", cfg.request_timeout_s, " s).")));
      else set_error(res, 503, str_cat("the request ran past the server's time limit (", cfg.request_timeout_s, " s)."), "",
                     "timeout");
    } else {
      job.finish_accounting(503);
      job_error(job, res, 503, "the server is shutting down.", "shutting_down");
    }
  }

  void start_stream(const std::shared_ptr<Job>& job, HttpResponse& res) {
    res.status = 200;
    res.headers.set("Cache-Control", "no-cache");
    res.headers.set("X-Accel-Buffering", "no");
    res.content_type = "text/event-stream";
    res.stream = [this, job](HttpStreamSink& sink) {
      try {
        if (job->sot) stream_skeleton(*job, sink);
        else stream_body(*job, sink);
      } catch (const std::exception& e) {
        // It ends only this stream.
        std::fprintf(stderr, "tern serve: stream failed: %s\n", e.what());
        if (!job->counted) job->finish_accounting(500);
      }
      // A stream that never reached its end (a write failed, the client left) aborts what
      // is still running.
      job->abort_unfinished();
    };
  }

  // One engine output of a chat stream with tools, through the choice's call parser: content
  // as text chunks (a possible call marker held back), calls as OpenAI's tool_calls deltas.
  // Returns whether the choice has called a tool once its output is finished.
  bool stream_tool_events(Job& job, int index, const RequestOutput& o, std::string& out) {
    const OpenAiRequest& r = job.req;
    ToolCallParser& parser = *job.tool_parsers.at(size_t(index));
    std::vector<ToolCallEvent> events = parser.feed(o.text);
    if (o.finished) {
      ToolParseResult rest = parser.finish();
      events.insert(events.end(), std::make_move_iterator(rest.events.begin()), std::make_move_iterator(rest.events.end()));
    }
    json lp = r.n_logprobs >= 0 && !o.tokens.empty() ? logprobs_json(r.kind, o.tokens, job.model->backend->tokenizer())
                                                     : json(nullptr);
    for (auto& e : events) {
      // parallel_tool_calls false: calls after the first are not the answer's.
      if (!r.parallel_tool_calls && e.kind != ToolCallEvent::Kind::Content && e.index > 0) continue;
      switch (e.kind) {
        case ToolCallEvent::Kind::Content:
          if (job.forced_tools) break;
          out += sse_event(text_chunk(job.meta, index, e.text, lp, r.include_usage));
          lp = nullptr;
          break;
        case ToolCallEvent::Kind::CallStart:
          out += sse_event(tool_call_start_chunk(job.meta, index, e.index, e.id, e.name, r.include_usage));
          break;
        case ToolCallEvent::Kind::CallArguments:
          out += sse_event(tool_call_arguments_chunk(job.meta, index, e.index, e.text, r.include_usage));
          break;
      }
    }
    // Logprobs of tokens whose text is held back (or inside a call) still reach the client.
    if (!lp.is_null()) out += sse_event(text_chunk(job.meta, index, "", lp, r.include_usage));
    return o.finished && parser.n_calls() > 0;
  }

  // How a stream's waiting loop ended.
  struct StreamEnd {
    bool client_gone = false;  // a write failed or the client left: nothing more to send
    std::string error;         // first error of any choice, a timeout or shutdown: the last message
    int error_status = 0;
  };

  // The waiting loop every stream shares: engine outputs are applied to their choices and
  // rendered by `render(choice, output, out)` (which writes a normal finish itself), one write
  // per wake-up (outputs that arrived together leave in one TCP segment), until every choice
  // is done, an output fails, the client goes away, the deadline passes or the server shuts down.
  template <class Render>
  StreamEnd pump_stream(Job& job, HttpStreamSink& sink, Render&& render) {
    StreamEnd end;
    std::deque<Event> events;
    while (!job.all_done()) {
      job.mailbox->take(events, kPollInterval);
      std::string out;
      for (const auto& ev : events) {
        ChoiceResult& c = job.apply(ev);
        const RequestOutput& o = ev.out;
        render(c, o, out);
        if (o.finished && end.error.empty()) {
          if (o.finish_reason == FinishReason::Error) {
            end.error = "generation failed: " + o.error;
            end.error_status = 500;
          } else if (o.finish_reason == FinishReason::Abort) {
            end.error = "the request was aborted by the server.";
            end.error_status = 503;
          }
        }
      }
      events.clear();
      if (!out.empty() && !sink.write(out)) {
        end.client_gone = true;
        break;
      }
      if (!end.error.empty() || job.all_done()) break;
      if (const char* why = job.interrupted()) {
        const std::string w = why;
        job.abort_unfinished();
        if (w == "disconnected") {
          end.client_gone = true;
          break;
        }
        end.error = w == "timeout" ? str_cat("the request ran past the server's time limit (", cfg.request_timeout_s, " s).")
                                   : "the server is shutting down.";
        end.error_status = 503;
        break;
      }
    }
    if (end.client_gone) {
      job.abort_unfinished();
      if (!job.counted) job.finish_accounting(499);
    } else if (!end.error.empty()) {
      job.abort_unfinished();
      job.finish_accounting(end.error_status == 500 ? 500 : 503);
    }
    return end;
  }

  static bool normal_finish(const RequestOutput& o) {
    return o.finished && o.finish_reason != FinishReason::Error && o.finish_reason != FinishReason::Abort;
  }

  bool stream_body(Job& job, HttpStreamSink& sink) {
    const OpenAiRequest& r = job.req;
    const bool chat = r.kind == ApiKind::Chat;
    auto send = [&](const std::string& s) { return sink.write(s); };
    // With echo and logprobs the echoed prompt waits for its scores, to leave in one chunk.
    const bool echo_with_scores = job.meta.echo_logprobs >= 0;
    const bool prompt_scores = echo_with_scores || job.meta.prompt_logprobs >= 0;
    for (const auto& c : job.choices) {
      if ((chat && !send(sse_event(role_chunk(job.meta, c.index, r.include_usage)))) ||
          (!c.text.empty() && !echo_with_scores &&
           !send(sse_event(text_chunk(job.meta, c.index, c.text, nullptr, r.include_usage))))) {
        job.abort_unfinished();
        if (!job.counted) job.finish_accounting(499);
        return false;
      }
    }
    const StreamEnd end = pump_stream(job, sink, [&](ChoiceResult& c, const RequestOutput& o, std::string& out) {
      if (prompt_scores && !o.prompt_logprobs.empty())
        out += sse_event(prompt_scores_chunk(job.meta, c.index, c.text, c, job.model->backend->tokenizer(), r.include_usage));
      bool called_tools = false;
      if (job.parse_tools) {
        called_tools = stream_tool_events(job, c.index, o, out);
      } else if (!o.text.empty() || (!o.tokens.empty() && r.n_logprobs >= 0)) {
        const json lp =
            r.n_logprobs >= 0 ? logprobs_json(r.kind, o.tokens, job.model->backend->tokenizer()) : json(nullptr);
        out += sse_event(text_chunk(job.meta, c.index, o.text, lp, r.include_usage));
      }
      if (normal_finish(o))
        out += sse_event(finish_chunk(job.meta, c.index, o.finish_reason, r.include_usage, &o.metrics, called_tools));
    });
    if (end.client_gone) return false;
    if (!end.error.empty()) {
      // OpenAI's clients raise an API error for a data event carrying "error".
      send(sse_event(error_json(end.error, error_type_for(end.error_status))) + kSseDone);
      return true;
    }
    std::string tail;
    if (r.include_usage) tail += sse_event(usage_chunk(job.meta, job.usage()));
    tail += kSseDone;
    job.finish_accounting(200);
    send(tail);
    return true;
  }


  // ---- other endpoints -------------------------------------------------------------------

  // POST /v1/embeddings (and /embeddings): every input is one engine request, all submitted at
  // once so they share steps (server/embeddings_api.h). `body` is OpenAI's; `model` set: the
  // route (Ollama's) acquired it already.
  EmbeddingsResult run_embeddings(const HttpRequest& hreq, const std::string& body, Acquired model = {}) {
    EmbeddingsOptions o;
    if (!model.model) model = provider.acquire(parse_embeddings_request(body, o.limits).model);
    o.model_name = model.model->id;
    o.lora = model.model->lora;
    o.timeout = std::chrono::milliseconds(int64_t(cfg.request_timeout_s * 1000));
    o.interrupted = [this, &hreq]() -> const char* {
      if (abort_all.load()) return "shutdown";
      if (hreq.peer_closed && hreq.peer_closed()) return "disconnected";
      return nullptr;
    };
    EmbeddingsResult r = serve_embeddings(body, *model.model->backend, o);
    metrics.add_tokens(r.prompt_tokens, 0);
    return r;
  }

  void handle_embeddings(const HttpRequest& hreq, HttpResponse& res) {
    InFlight guard(this);
    if (refuse_when_busy(res)) return;
    EmbeddingsResult r;
    try {
      r = run_embeddings(hreq, hreq.body);
    } catch (const ApiError& e) {
      if (e.status() == 429 || e.status() == 503) res.headers.set("Retry-After", retry_after_value(e));
      set_api_error(res, e);
      return;
    } catch (const Error& e) {
      set_error(res, 400, e.what());
      return;
    }
    if (r.status == 503) res.headers.set("Retry-After", std::to_string(cfg.retry_after_s));
    res.status = r.status;
    if (!r.body.empty()) res.set_content(r.body, "application/json");
  }

  json model_object(const ModelEntry& e) const {
    json o = {{"id", e.name}, {"object", "model"}, {"created", started}, {"owned_by", "tern"},
              {"max_model_len", provider.n_ctx_of(e.name)}};
    // A LoRA adapter (--lora), as vLLM lists one: its file and its base; a models.json
    // variant: its base's file and its base.
    if (!e.parent.empty()) {
      o["root"] = e.path.string();
      o["parent"] = e.parent;
    }
    return o;
  }

  // POST /v1/load_lora_adapter {"lora_name", "lora_path"[, "scale"]} and
  // /v1/unload_lora_adapter {"lora_name"} (vLLM's names and bodies; plain-text success answers
  // as vLLM's). Unloading answers once the requests running the adapter have finished.
  void handle_lora_update(const HttpRequest& req, HttpResponse& res, bool load) {
    if (!cfg.allow_lora_updates) {
      set_error(res, 403, "Runtime LoRA updates are off on this server (start it with --allow-lora-updates).");
      return;
    }
    const json body = json::parse(req.body, nullptr, false);
    if (!body.is_object()) {
      set_error(res, 400, "The body must be a JSON object.");
      return;
    }
    const auto text_field = [&](const char* key) -> std::string {
      const auto it = body.find(key);
      if (it == body.end() || !it->is_string() || it->get<std::string>().empty())
        throw ApiError(400, "invalid_request_error", key, "", str_cat("`", key, "` must be a non-empty string."));
      return it->get<std::string>();
    };
    const std::string name = text_field("lora_name");
    if (load) {
      const std::string path = text_field("lora_path");
      float scale = 1.0f;
      if (const auto it = body.find("scale"); it != body.end()) {
        if (!it->is_number() || !std::isfinite(it->get<double>()))
          throw ApiError(400, "invalid_request_error", "scale", "", "`scale` must be a finite number.");
        scale = it->get<float>();
      }
      std::shared_ptr<const LoraAdapter> adapter;
      try {
        adapter = LoraAdapter::load(path);
      } catch (const Error& e) {
        throw ApiError(400, "invalid_request_error", "lora_path", "", e.what());
      }
      provider.add_adapter(name, std::move(adapter), scale);
      res.status = 200;
      res.set_content(str_cat("Success: LoRA adapter '", name, "' added successfully."), "text/plain; charset=utf-8");
      return;
    }
    std::weak_ptr<const ServedModel> gone = provider.remove_adapter(name);
    // Requests already running keep the adapter (their ModelRef); wait for the last of them.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(cfg.request_timeout_s);
    while (!gone.expired() && std::chrono::steady_clock::now() < deadline && !abort_all.load())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    res.status = 200;
    res.set_content(str_cat("Success: LoRA adapter '", name, "' removed successfully."), "text/plain; charset=utf-8");
  }

  // POST /admin/swap_base {"model": PATH, "lora": [{"lora_name", "lora_path", "scale"?}]?}:
  // replaces the base (and its adapters) while requests run (ModelProvider::swap_base). The
  // admin key was checked in pre_route.
  void handle_swap_base(const HttpRequest& req, HttpResponse& res) {
    const json body = json::parse(req.body, nullptr, false);
    if (!body.is_object()) throw ApiError(400, "invalid_request_error", "", "", "The body must be a JSON object.");
    SwapRequest sr;
    const auto it = body.find("model");
    if (it == body.end() || !it->is_string() || it->get<std::string>().empty())
      throw ApiError(400, "invalid_request_error", "model", "", "`model` must be the path of a model file on the server.");
    sr.path = it->get<std::string>();
    if (const auto l = body.find("lora"); l != body.end()) {
      if (!l->is_array())
        throw ApiError(400, "invalid_request_error", "lora", "",
                       "`lora` must be an array of {\"lora_name\", \"lora_path\", \"scale\"} objects.");
      sr.lora.emplace();
      for (size_t i = 0; i < l->size(); ++i) {
        const json& a = (*l)[i];
        const std::string param = str_cat("lora[", i, "]");
        if (!a.is_object()) throw ApiError(400, "invalid_request_error", param, "", str_cat("`", param, "` must be an object."));
        const auto text = [&](const char* key) {
          const auto f = a.find(key);
          if (f == a.end() || !f->is_string() || f->get<std::string>().empty())
            throw ApiError(400, "invalid_request_error", param, "", str_cat("`", param, ".", key, "` must be a non-empty string."));
          return f->get<std::string>();
        };
        SwapAdapter sa;
        sa.name = text("lora_name");
        sa.path = text("lora_path");
        if (const auto f = a.find("scale"); f != a.end()) {
          if (!f->is_number() || !std::isfinite(f->get<double>()))
            throw ApiError(400, "invalid_request_error", param, "", str_cat("`", param, ".scale` must be a finite number."));
          sa.scale = f->get<float>();
        }
        sr.lora->push_back(std::move(sa));
      }
    }
    SwapResult r;
    try {
      r = provider.swap_base(sr);
    } catch (const ApiError& e) {
      std::fprintf(stderr, "tern serve: base swap to %s refused (%d): %s\n", sr.path.c_str(), e.status(), e.what());
      throw;
    }
    std::string names;
    for (const auto& n : r.adapters) names += (names.empty() ? "" : ", ") + n;
    std::fprintf(stderr, "tern serve: base swapped to %s in %.2f s (fingerprint %s; adapters: %s); requests already "
                 "running finish on the old base\n", r.path.c_str(), r.load_seconds, r.fingerprint.c_str(),
                 names.empty() ? "none" : names.c_str());
    set_json(res, 200, {{"path", r.path}, {"fingerprint", r.fingerprint}, {"adapters", r.adapters},
                        {"load_seconds", r.load_seconds}});
  }

  std::vector<ModelGauges> model_gauges() const {
    std::vector<ModelGauges> out;
    const std::vector<LoadedModelInfo> loaded = provider.loaded();
    for (const auto& e : provider.models()) {
      ModelGauges g;
      g.model = e.name;
      // A variant or an adapter runs on its base's engine: loaded with it; its memory and
      // leases are the base's row, so they are not counted twice.
      const std::string& engine_name = e.parent.empty() ? e.name : e.parent;
      for (const auto& l : loaded)
        if (l.entry.name == engine_name) {
          g.loaded = true;
          if (e.parent.empty()) {
            g.bytes = l.bytes;
            g.leases = l.leases;
          }
        }
      out.push_back(std::move(g));
    }
    return out;
  }

  std::string served_names() const {
    std::string names;
    for (const auto& e : provider.models()) names += (names.empty() ? "`" : ", `") + e.name + "`";
    return names;
  }

  void handle_models(const HttpRequest& req, HttpResponse& res) {
    const std::vector<ModelEntry> entries = provider.models();
    if (!req.path_param.empty()) {
      const std::string& id = req.path_param;
      if (!provider.serves(id)) {
        set_json(res, 404, error_json(str_cat("The model `", id, "` does not exist. This server serves ", served_names(), "."),
                                      "invalid_request_error", "model", "model_not_found"));
        return;
      }
      // A name, an alias or (one model) its file's name: the entry it names.
      const ModelEntry* found = entries.size() == 1 ? &entries[0] : nullptr;
      for (const auto& e : entries) {
        if (e.name == id || std::find(e.defaults.aliases.begin(), e.defaults.aliases.end(), id) != e.defaults.aliases.end())
          found = &e;
      }
      if (found) set_json(res, 200, model_object(*found));
      else set_json(res, 200, {{"id", id}, {"object", "model"}, {"created", started}, {"owned_by", "tern"}});
      return;
    }
    json data = json::array();
    for (const auto& e : entries) data.push_back(model_object(e));
    set_json(res, 200, {{"object", "list"}, {"data", data}});
  }

  void handle_tokenize(const HttpRequest& req, HttpResponse& res) {
    const TokenizeRequest r = parse_tokenize_request(req.body, cfg.limits);
    const Acquired a = provider.acquire(r.model);
    const ServedModel& m = *a.model;
    const Tokenizer& tok = m.backend->tokenizer();
    std::vector<int32_t> ids;
    if (r.has_messages) ids = m.chat_template.encode(r.messages, tok, r.add_special && tok.add_bos_default());
    else ids = tok.encode(r.text, r.add_special && tok.add_bos_default(), true);
    json j = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", m.backend->n_ctx()}};
    if (r.with_pieces) {
      json pieces = json::array();
      for (int32_t id : ids) pieces.push_back(tok.token_to_piece(id, true));
      j["pieces"] = pieces;
    }
    set_json(res, 200, j);
  }

  void handle_detokenize(const HttpRequest& req, HttpResponse& res) {
    const DetokenizeRequest r = parse_detokenize_request(req.body, cfg.limits);
    const Acquired a = provider.acquire(r.model);
    const Tokenizer& tok = a.model->backend->tokenizer();
    const std::string text = tok.decode(checked_ids(tok, r.tokens, "tokens"));
    set_json(res, 200, {{"prompt", text}});
  }

  void handle_static(const HttpRequest& req, HttpResponse& res) {
    const std::string path = req.path == "/" ? "/index.html" : req.path;
    for (const auto& a : web_assets()) {
      if (path != a.path) continue;
      res.status = 200;
      res.headers.set("Cache-Control", "no-cache");
      res.headers.set("X-Content-Type-Options", "nosniff");
      res.set_content(std::string(reinterpret_cast<const char*>(a.data), a.size), a.mime);
      return;
    }
    const std::string message = str_cat("Unknown path: ", req.method, " ", req.path);
    if (is_ollama_path(req.path)) set_json(res, 404, ollama::error_body(message));
    else set_error(res, 404, message);
  }

  // ---- Ollama's API (server/ollama_format.h) ----------------------------------------------

  static std::string now_text() { return ollama::rfc3339(std::chrono::system_clock::now()); }
  static int64_t ns_since(Clock::time_point t0) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  }

  // Runs `fn`, a provider call about `name`, giving a name not served Ollama's wording.
  template <class Fn>
  auto ollama_named(const std::string& name, Fn&& fn) {
    try {
      return fn();
    } catch (const ApiError& e) {
      if (e.code() != "model_not_found") throw;
      throw ApiError(404, "invalid_request_error", "model", "model_not_found",
                     str_cat("model \"", name, "\" not found (this server serves ", served_names(), ")"));
    }
  }
  Acquired ollama_acquire(const std::string& name, std::optional<double> keep_alive_s) {
    return ollama_named(name, [&] { return provider.acquire(name, keep_alive_s); });
  }
  void ollama_unload(const std::string& name) {
    ollama_named(name, [&] {
      provider.unload(name);
      return 0;
    });
  }

  static const char* done_reason_of(FinishReason r) { return r == FinishReason::Length ? "length" : "stop"; }

  // Ollama's timings of a finished one-choice job.
  static ollama::Durations durations_of(const Job& job) {
    ollama::Durations d;
    d.total_ns = ns_since(job.started);
    d.load_ns = job.load_ns;
    if (job.choices.empty()) return d;
    const ChoiceResult& c = job.choices[0];
    const RequestMetrics& m = c.metrics;
    d.prompt_eval_count = job.prompt_tokens.empty() ? 0 : job.prompt_tokens[0];
    d.prompt_eval_ns = int64_t(std::max(0.0, m.ttft_ms - m.queue_ms) * 1e6);
    d.eval_count = c.n_tokens;
    d.eval_ns = int64_t(std::max(0.0, m.e2e_ms - m.ttft_ms) * 1e6);
    return d;
  }

  std::vector<int32_t> generate_context(const Job& job) const {
    std::vector<int32_t> ctx = job.prompt_ids;
    ctx.insert(ctx.end(), job.answer_ids.begin(), job.answer_ids.end());
    return ctx;
  }

  // POST /api/chat
  void handle_ollama_chat(const HttpRequest& hreq, HttpResponse& res) {
    auto guard = std::make_unique<InFlight>(this);
    if (refuse_when_busy(res, true)) return;
    const auto t0 = Clock::now();
    const ollama::ChatRequest r = ollama::parse_chat(hreq.body, cfg.limits.max_json_depth);
    if (r.unload_only) {
      ollama_unload(r.common.model);
      set_json(res, 200, ollama::chat_final(r.common.model, now_text(), "", {}, "unload", {}));
      return;
    }
    Acquired a = ollama_acquire(r.common.model, r.common.keep_alive_s);
    if (r.load_only) {
      ollama::Durations d;
      d.load_ns = a.load_ns;
      d.total_ns = ns_since(t0);
      set_json(res, 200, ollama::chat_final(r.common.model, now_text(), "", {}, "load", d));
      return;
    }
    nlohmann::ordered_json body = ollama::chat_to_openai(r, a.model->default_options, a.model->default_system);
    body["stream"] = r.common.stream;
    PrepareOptions opt;
    opt.model = std::move(a);
    opt.ollama = true;
    opt.endpoint = "/api/chat";
    auto job = prepare(body.dump(), ApiKind::Chat, std::move(opt));
    job->started = t0;
    job->answer_name = r.common.model;
    go_live(*job, std::move(guard), hreq);
    if (r.common.stream) {
      start_ndjson_stream(job, res, /*chat=*/true);
      return;
    }
    if (!collect_whole(job, res)) return;
    job->finish_accounting(200);
    const ChoiceResult& c = job->choices.at(0);
    set_json(res, 200, ollama::chat_final(job->answer_name, now_text(), c.text, c.tool_calls, done_reason_of(c.finish),
                                          durations_of(*job)));
  }

  // POST /api/generate: the prompt through the chat template (unless raw), after the ids of an
  // earlier answer's "context"; without num_predict the answer may run to the context's end.
  void handle_ollama_generate(const HttpRequest& hreq, HttpResponse& res) {
    auto guard = std::make_unique<InFlight>(this);
    if (refuse_when_busy(res, true)) return;
    const auto t0 = Clock::now();
    const ollama::GenerateRequest g = ollama::parse_generate(hreq.body, cfg.limits.max_json_depth);
    if (g.unload_only) {
      ollama_unload(g.common.model);
      set_json(res, 200, ollama::generate_final(g.common.model, now_text(), "", "unload", {}, {}));
      return;
    }
    Acquired a = ollama_acquire(g.common.model, g.common.keep_alive_s);
    if (g.load_only) {
      ollama::Durations d;
      d.load_ns = a.load_ns;
      d.total_ns = ns_since(t0);
      set_json(res, 200, ollama::generate_final(g.common.model, now_text(), "", "load", d, {}));
      return;
    }
    const ServedModel& m = *a.model;
    const Tokenizer& tok = m.backend->tokenizer();
    std::vector<int32_t> ids = checked_ids(tok, g.context, "context");
    const bool bos = ids.empty() && tok.add_bos_default();
    std::vector<int32_t> prompt;
    if (g.raw) {
      prompt = tok.encode(g.prompt, bos, true);
    } else {
      std::vector<ChatMessage> messages;
      const std::string& system = !g.system.empty() ? g.system : m.default_system;
      if (!system.empty()) messages.push_back({"system", system});
      messages.push_back({"user", g.prompt});
      prompt = m.chat_template.encode(messages, tok, bos);
    }
    ids.insert(ids.end(), prompt.begin(), prompt.end());
    nlohmann::ordered_json body = ollama::generate_to_openai(g, ids, m.default_options);
    body["stream"] = g.common.stream;
    PrepareOptions opt;
    opt.model = std::move(a);
    opt.ollama = true;
    opt.endpoint = "/api/generate";
    opt.until_context_end = true;
    opt.keep_answer_ids = true;
    auto job = prepare(body.dump(), ApiKind::Completion, std::move(opt));
    job->started = t0;
    job->answer_name = g.common.model;
    go_live(*job, std::move(guard), hreq);
    if (g.common.stream) {
      start_ndjson_stream(job, res, /*chat=*/false);
      return;
    }
    if (!collect_whole(job, res)) return;
    job->finish_accounting(200);
    const ChoiceResult& c = job->choices.at(0);
    set_json(res, 200, ollama::generate_final(job->answer_name, now_text(), c.text, done_reason_of(c.finish),
                                              durations_of(*job), generate_context(*job)));
  }

  void start_ndjson_stream(const std::shared_ptr<Job>& job, HttpResponse& res, bool chat) {
    res.status = 200;
    res.headers.set("Cache-Control", "no-cache");
    res.headers.set("X-Accel-Buffering", "no");
    res.content_type = "application/x-ndjson";
    res.stream = [this, job, chat](HttpStreamSink& sink) {
      try {
        ndjson_stream_body(*job, sink, chat);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "tern serve: stream failed: %s\n", e.what());
        if (!job->counted) job->finish_accounting(500);
      }
      job->abort_unfinished();
    };
  }

  // Ollama's stream: one JSON object per line, text as it comes; a chat's tool calls in one
  // message once the answer is complete; an error as {"error": ...} and the end.
  bool ndjson_stream_body(Job& job, HttpStreamSink& sink, bool chat) {
    const OpenAiRequest& r = job.req;
    const std::string& name = job.answer_name;
    auto line = [](const json& j) { return dump_json(j) + "\n"; };
    std::vector<ToolCall> calls;
    FinishReason finish = FinishReason::Stop;
    // The running figures every line carries (the last line's are the engine's own).
    std::optional<Clock::time_point> first_output;
    const auto so_far = [&](const ChoiceResult& c) {
      const auto now = Clock::now();
      if (!first_output) first_output = now;
      ollama::Durations d;
      d.total_ns = ns_since(job.started);
      d.load_ns = job.load_ns;
      d.prompt_eval_count = job.prompt_tokens.empty() ? 0 : job.prompt_tokens[0];
      const auto prompt_start = job.started + std::chrono::nanoseconds(job.load_ns);
      d.prompt_eval_ns = std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(*first_output - prompt_start).count());
      d.eval_count = c.n_tokens;
      d.eval_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - *first_output).count();
      return d;
    };
    const StreamEnd end = pump_stream(job, sink, [&](ChoiceResult& c, const RequestOutput& o, std::string& out) {
      std::string text;
      if (job.parse_tools) {
        ToolCallParser& parser = *job.tool_parsers.at(0);
        std::vector<ToolCallEvent> events = parser.feed(o.text);
        if (o.finished) {
          ToolParseResult rest = parser.finish();
          events.insert(events.end(), std::make_move_iterator(rest.events.begin()),
                        std::make_move_iterator(rest.events.end()));
        }
        for (auto& e : events) {
          if (!r.parallel_tool_calls && e.kind != ToolCallEvent::Kind::Content && e.index > 0) continue;
          if (e.kind == ToolCallEvent::Kind::Content) {
            if (!job.forced_tools) text += e.text;
          } else if (e.kind == ToolCallEvent::Kind::CallStart) {
            if (size_t(e.index) >= calls.size()) calls.resize(size_t(e.index) + 1);
            calls[size_t(e.index)].id = e.id;
            calls[size_t(e.index)].name = e.name;
          } else if (size_t(e.index) < calls.size()) {
            calls[size_t(e.index)].arguments += e.text;
          }
        }
      } else {
        text = o.text;
      }
      if (!text.empty())
        out += line(chat ? ollama::chat_chunk(name, now_text(), text, {}, so_far(c))
                         : ollama::generate_chunk(name, now_text(), text, so_far(c)));
      if (normal_finish(o)) finish = o.finish_reason;
    });
    if (end.client_gone) return false;
    if (!end.error.empty()) {
      sink.write(line(ollama::error_body(end.error)));
      return true;
    }
    std::string tail;
    if (!calls.empty()) tail += line(ollama::chat_chunk(name, now_text(), "", calls, so_far(job.choices.at(0))));
    const ollama::Durations d = durations_of(job);
    tail += line(chat ? ollama::chat_final(name, now_text(), "", {}, done_reason_of(finish), d)
                      : ollama::generate_final(name, now_text(), "", done_reason_of(finish), d, generate_context(job)));
    job.finish_accounting(200);
    sink.write(tail);
    return true;
  }


  // POST /api/embed, /api/embeddings (legacy: one prompt, {"embedding": [...]}).
  void handle_ollama_embed(const HttpRequest& hreq, HttpResponse& res, bool legacy) {
    InFlight guard(this);
    if (refuse_when_busy(res, true)) return;
    const auto t0 = Clock::now();
    const ollama::EmbedRequest e = ollama::parse_embed(hreq.body, legacy, cfg.limits.max_json_depth);
    Acquired a = ollama_acquire(e.common.model, e.common.keep_alive_s);
    const std::string name = a.model->id;
    const int64_t load_ns = a.load_ns;
    // Ollama cuts vectors to `dimensions` itself (after normalizing: ollama::embedding_vector),
    // so the engine's full vectors are asked for.
    json body = {{"input", e.inputs}, {"model", name}};
    if (e.truncate) body["truncate_prompt_tokens"] = -1;
    const EmbeddingsResult r = run_embeddings(hreq, body.dump(), std::move(a));
    if (r.status == 499) {
      res.status = 499;
      return;
    }
    json answer = r.body.empty() ? json::object() : json::parse(r.body, nullptr, false);
    if (r.status != 200) {
      std::string message = "embedding failed";
      if (answer.is_object() && answer.contains("error") && answer["error"].is_object())
        message = answer["error"].value("message", message);
      if (r.status == 429 || r.status == 503) res.headers.set("Retry-After", std::to_string(cfg.retry_after_s));
      set_json(res, r.status, ollama::error_body(message));
      return;
    }
    std::vector<std::vector<float>> vectors;
    for (const auto& item : answer.at("data")) {
      std::vector<float> v = item.at("embedding").get<std::vector<float>>();
      vectors.push_back(legacy ? std::move(v) : ollama::embedding_vector(std::move(v), e.dimensions));
    }
    ollama::Durations d;
    d.total_ns = ns_since(t0);
    d.load_ns = load_ns;
    d.prompt_eval_count = r.prompt_tokens;
    if (legacy) set_json(res, 200, ollama::legacy_embedding_response(vectors.empty() ? std::vector<float>{} : vectors[0]));
    else set_json(res, 200, ollama::embed_response(e.common.model, vectors, d));
  }

  // The rows point into `loaded`, which must outlive them.
  static std::vector<ollama::LoadedRow> loaded_rows(const std::vector<LoadedModelInfo>& loaded) {
    std::vector<ollama::LoadedRow> rows;
    for (const auto& l : loaded) rows.push_back({&l.entry, l.bytes, l.expires, l.n_ctx});
    return rows;
  }

  void handle_ollama_ps(HttpResponse& res) {
    const std::vector<LoadedModelInfo> loaded = provider.loaded();
    set_json(res, 200, ollama::ps_response(loaded_rows(loaded)));
  }

  // POST /api/show: from the file's header; the model is not loaded for it.
  void handle_ollama_show(const HttpRequest& hreq, HttpResponse& res) {
    const std::string name = ollama::parse_model_name(hreq.body, cfg.limits.max_json_depth);
    const ModelProvider::Description d = ollama_named(name, [&] { return provider.describe(name); });
    std::string template_text = d.entry.defaults.chat_template;
    if (template_text.empty() && !d.entry.parent.empty())  // a variant runs with its base's template
      for (const ModelEntry& base : provider.models())
        if (base.name == d.entry.parent) template_text = base.defaults.chat_template;
    if (template_text.empty() && d.metadata.is_object() && d.metadata.contains("tokenizer.chat_template") &&
        d.metadata["tokenizer.chat_template"].is_string())
      template_text = d.metadata["tokenizer.chat_template"].get<std::string>();
    set_json(res, 200, ollama::show_response(d.entry, template_text, d.metadata, {"completion", "tools"}));
  }


  // Runs an Ollama route, turning what it throws into {"error": message} with its status.
  template <class Fn>
  void ollama_guarded(HttpResponse& res, Fn&& fn) {
    try {
      fn();
    } catch (const ApiError& e) {
      if (e.status() == 429 || e.status() == 503) res.headers.set("Retry-After", retry_after_value(e));
      set_json(res, e.status(), ollama::error_body(e.what()));
    } catch (const Error& e) {
      set_json(res, 400, ollama::error_body(e.what()));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tern serve: internal error: %s\n", e.what());
      set_json(res, 500, ollama::error_body("internal server error"));
    }
  }

  void setup_ollama_routes() {
    using Handler = std::function<void(HttpRequest&, HttpResponse&)>;
    auto guard = [this](auto fn) -> Handler {
      return [this, fn](HttpRequest& req, HttpResponse& res) { ollama_guarded(res, [&] { fn(req, res); }); };
    };
    http.route("POST", "/api/chat", guard([this](HttpRequest& req, HttpResponse& res) { handle_ollama_chat(req, res); }));
    http.route("POST", "/api/generate",
               guard([this](HttpRequest& req, HttpResponse& res) { handle_ollama_generate(req, res); }));
    http.route("POST", "/api/embed",
               guard([this](HttpRequest& req, HttpResponse& res) { handle_ollama_embed(req, res, false); }));
    http.route("POST", "/api/embeddings",
               guard([this](HttpRequest& req, HttpResponse& res) { handle_ollama_embed(req, res, true); }));
    http.route("GET", "/api/tags", guard([this](HttpRequest&, HttpResponse& res) {
      const std::vector<LoadedModelInfo> loaded = provider.loaded();
      set_json(res, 200, ollama::tags_response(provider.models(), loaded_rows(loaded)));
    }));
    http.route("GET", "/api/ps", guard([this](HttpRequest&, HttpResponse& res) { handle_ollama_ps(res); }));
    http.route("POST", "/api/show", guard([this](HttpRequest& req, HttpResponse& res) { handle_ollama_show(req, res); }));
    http.route("GET", "/api/version", guard([this](HttpRequest&, HttpResponse& res) {
      set_json(res, 200, ollama::version_response(cfg.version));
    }));
    // Model management is the models directory's: tern never downloads or writes models.
    const HttpHandler not_managed = [](HttpRequest& req, HttpResponse& res) {
      set_json(res, 501, ollama::error_body(str_cat(req.path, " is not supported: tern serves the GGUF files of its "
                                                    "models directory (tern serve --models DIR); put files there.")));
    };
    for (const char* path : {"/api/pull", "/api/push", "/api/create", "/api/copy"}) http.route("POST", path, not_managed);
    http.route_prefix("POST", "/api/blobs/", not_managed);
    http.route_prefix("HEAD", "/api/blobs/", not_managed);
    http.route("DELETE", "/api/delete", [](HttpRequest&, HttpResponse& res) {
      set_json(res, 501, ollama::error_body("/api/delete is not supported: tern never deletes model files."));
    });
  }

  // ---- wiring ------------------------------------------------------------------------------

  // Runs `fn`, turning what it throws into an OpenAI-style error response.
  template <class Fn>
  void guarded(HttpResponse& res, Fn&& fn) {
    try {
      fn();
    } catch (const ApiError& e) {
      set_api_error(res, e);
    } catch (const Error& e) {
      set_error(res, 400, e.what());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tern serve: internal error: %s\n", e.what());
      set_error(res, 500, "internal server error");
    }
  }

  bool is_static_path(const std::string& path) const { return endpoint_label(path) == "static"; }

  // "Authorization: Bearer KEY": the scheme is case-insensitive (RFC 9110 11.1), the key is not.
  static bool bearer_matches(const HttpRequest& req, const std::string& secret) {
    const std::string& auth = req.headers.get("Authorization");
    const size_t sp = auth.find(' ');
    if (sp == std::string::npos || !iequals(auth.substr(0, sp), "Bearer")) return false;
    size_t key_start = auth.find_first_not_of(' ', sp);
    if (key_start == std::string::npos) return false;
    std::string key = auth.substr(key_start);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    return same_secret(key, secret);
  }
  bool authorized(const HttpRequest& req) const { return bearer_matches(req, cfg.api_key); }

  bool cors_allows(const std::string& origin) const {
    for (const auto& o : cfg.cors_origins)
      if (o == "*" || o == origin) return true;
    return false;
  }

  // CORS: the allowed origin's requests get Access-Control-Allow-Origin; a preflight (OPTIONS
  // with Access-Control-Request-Method) is answered here, before the key is asked for, since
  // browsers send no Authorization header with it. An origin not allowed gets no CORS
  // header, so the browser keeps the answer from the page.
  bool handle_cors(const HttpRequest& req, HttpResponse& res) const {
    const std::string& origin = req.headers.get("Origin");
    const bool allowed = !origin.empty() && cors_allows(origin);
    if (allowed) {
      const bool any = std::find(cfg.cors_origins.begin(), cfg.cors_origins.end(), "*") != cfg.cors_origins.end();
      res.headers.set("Access-Control-Allow-Origin", any ? "*" : origin);
      if (!any) res.headers.set("Vary", "Origin");
    }
    if (req.method != "OPTIONS") return false;
    res.status = 204;
    res.headers.set("Allow", "GET, HEAD, POST, OPTIONS");
    if (allowed && req.headers.has("Access-Control-Request-Method")) {
      res.headers.set("Access-Control-Allow-Methods", "GET, HEAD, POST, OPTIONS");
      const std::string& asked = req.headers.get("Access-Control-Request-Headers");
      res.headers.set("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type" : asked);
      res.headers.set("Access-Control-Max-Age", "600");
    }
    return true;
  }

  bool pre_route(const HttpRequest& req, HttpResponse& res) {
    t_counted_by_job = false;  // a request whose logger never ran must not silence this one's
    t_trim_after = false;
    if (handle_cors(req, res)) return true;
    // /health answers without a key (load balancers probe it); so do the chat page's static
    // files, which hold no data: the page itself asks for the key and sends it with each call.
    const bool open = req.path == "/health" || ((req.method == "GET" || req.method == "HEAD") && is_static_path(req.path));
    // Ollama's routes answer {"error": "..."}, which its clients show as the message.
    const bool ollama = is_ollama_path(req.path);
    // The admin routes have a key of their own, and only it opens them: the API key, which
    // every client holds, must not be enough to replace the model.
    if (req.path.rfind("/admin/", 0) == 0) {
      if (cfg.admin_key.empty()) {
        set_error(res, 403, "The admin endpoints are off on this server (start it with --admin-key KEY, or set "
                            "TERN_ADMIN_KEY).");
        return true;
      }
      if (!bearer_matches(req, cfg.admin_key)) {
        res.headers.set("WWW-Authenticate", "Bearer");
        set_error(res, 401, "Incorrect or missing admin key. Send it as 'Authorization: Bearer ADMIN_KEY'.", "",
                  "invalid_admin_key");
        return true;
      }
    } else if (!cfg.api_key.empty() && !open && !authorized(req)) {
      res.headers.set("WWW-Authenticate", "Bearer");
      const char* message = "Incorrect or missing API key. Send it as 'Authorization: Bearer KEY'.";
      if (ollama) set_json(res, 401, ollama::error_body(message));
      else set_error(res, 401, message, "", "invalid_api_key");
      return true;
    }
    if (draining.load() && req.path != "/health" && req.path != "/metrics") {
      res.headers.set("Retry-After", std::to_string(cfg.retry_after_s));
      if (ollama) set_json(res, 503, ollama::error_body("The server is shutting down."));
      else set_error(res, 503, "The server is shutting down.", "", "shutting_down");
      return true;
    }
    return false;
  }

  void setup() {
    if (cfg.max_in_flight <= 0) cfg.max_in_flight = std::max(1, cfg.http_threads - 8);
    // glibc gives each thread that allocates under contention an arena of its own (up to 8
    // per core) and keeps what is freed there: with a hundred HTTP workers building large
    // answers, RSS grew to the sum of their peaks and stayed. A few arenas are enough for a
    // server whose hot loops (the engine's) allocate nothing per token.
    mallopt(M_ARENA_MAX, 4);
    // Blocks of 1 MiB and more (an answer's body, its JSON) come from mmap and go back to the
    // system when freed. Setting the threshold also stops glibc from raising it after each
    // such free, which moved later large bodies into the arenas, where they fragmented.
    mallopt(M_MMAP_THRESHOLD, 1 << 20);

    using Handler = std::function<void(HttpRequest&, HttpResponse&)>;
    auto guard = [this](auto fn) -> Handler {
      return [this, fn](HttpRequest& req, HttpResponse& res) { guarded(res, [&] { fn(req, res); }); };
    };
    http.set_pre_route([this](HttpRequest& req, HttpResponse& res) { return pre_route(req, res); });
    http.route("POST", "/v1/completions",
               guard([this](HttpRequest& req, HttpResponse& res) { handle_generate(req, res, ApiKind::Completion); }));
    http.route("POST", "/v1/chat/completions",
               guard([this](HttpRequest& req, HttpResponse& res) { handle_generate(req, res, ApiKind::Chat); }));
    for (const char* path : {"/v1/embeddings", "/embeddings"})
      http.route("POST", path,
                 guard([this](HttpRequest& req, HttpResponse& res) { handle_embeddings(req, res); }));
    http.route("GET", "/v1/models", guard([this](HttpRequest& req, HttpResponse& res) { handle_models(req, res); }));
    http.route("POST", "/v1/load_lora_adapter",
               guard([this](HttpRequest& req, HttpResponse& res) { handle_lora_update(req, res, true); }));
    http.route("POST", "/v1/unload_lora_adapter",
               guard([this](HttpRequest& req, HttpResponse& res) { handle_lora_update(req, res, false); }));
    http.route("POST", "/admin/swap_base",
               guard([this](HttpRequest& req, HttpResponse& res) { handle_swap_base(req, res); }));
    http.route_prefix("GET", "/v1/models/",
                      guard([this](HttpRequest& req, HttpResponse& res) { handle_models(req, res); }));
    // Health and metrics run on the HTTP layer's own threads: they answer while every worker
    // holds a stream.
    http.route("GET", "/health", [this](HttpRequest&, HttpResponse& res) {
      if (draining.load()) set_json(res, 503, {{"status", "shutting_down"}});
      else set_json(res, 200, {{"status", "ok"}});
    }, /*fast=*/true);
    http.route("GET", "/metrics", [this](HttpRequest&, HttpResponse& res) {
      const HttpServerStats& hs = http.stats();
      const ConnectionCounts conns{hs.connections_open.load(), hs.connections_accepted.load(),
                                   hs.connections_refused.load(), hs.connections_evicted.load(),
                                   hs.requests_timed_out.load()};
      std::string text = metrics.render(provider.metrics(), conns, model_gauges());
      if (cfg.extra_metrics) text += cfg.extra_metrics();
      res.set_content(std::move(text), "text/plain; version=0.0.4; charset=utf-8");
    }, /*fast=*/true);
    http.route("POST", "/tokenize", guard([this](HttpRequest& req, HttpResponse& res) { handle_tokenize(req, res); }));
    http.route("POST", "/detokenize",
               guard([this](HttpRequest& req, HttpResponse& res) { handle_detokenize(req, res); }));
    setup_ollama_routes();
    http.set_fallback([this](HttpRequest& req, HttpResponse& res) { handle_static(req, res); });
    // Errors the HTTP layer answers itself (400 malformed, 404, 405, 408, 413, 414, 431, 503
    // over a connection cap) get the body of the API the path belongs to: Ollama's
    // {"error": "..."} under /api/, OpenAI's error object elsewhere.
    http.set_error_renderer([](HttpResponse& res, int status, const std::string& message, const std::string& path) {
      if (is_ollama_path(path)) set_json(res, status, ollama::error_body(message));
      else set_error(res, status, message);
    });
    http.set_logger([this](const HttpRequest& req, const HttpResponse& res) {
      // Generation requests that got as far as the engine were counted by their job (a
      // stream always is, by its end or, when its connection broke first, by its teardown).
      const bool stream = res.content_type == "text/event-stream" || res.content_type == "application/x-ndjson";
      if (!t_counted_by_job && !stream) metrics.count_request(endpoint_label(req.path), res.status);
      t_counted_by_job = false;
      if (cfg.log_requests || res.status >= 500)
        std::fprintf(stderr, "%s %s %s -> %d\n", req.remote_addr.c_str(), req.method.c_str(), req.path.c_str(),
                     res.status);
    });
    http.set_after_request([] {
      if (t_trim_after) malloc_trim(0);
      t_trim_after = false;
    });
  }
};

namespace {

// Server(Backend&): the one model as a provider, named and templated by the config.
std::unique_ptr<ModelProvider> single_model_provider(Backend& backend, const ServerConfig& c) {
  auto m = std::make_shared<ServedModel>();
  m->id = c.model_id;
  m->backend = &backend;
  m->chat_template = c.chat_template;
  m->system_fingerprint = c.system_fingerprint;
  m->structured = std::make_unique<StructuredOutput>(backend.tokenizer());
  m->entry.name = c.model_id;
  return std::make_unique<SingleModelProvider>(std::move(m), c.model_names, c.strict_model_names);
}

}  // namespace

Server::Server(ModelProvider& provider, ServerConfig config)
    : impl_(std::make_unique<Impl>(provider, std::move(config))) {
  impl_->setup();
  impl_->start_collector();
}

Server::Server(Backend& backend, ServerConfig config) {
  auto own = single_model_provider(backend, config);
  ModelProvider& p = *own;
  impl_ = std::make_unique<Impl>(p, std::move(config), std::move(own));
  impl_->setup();
  impl_->start_collector();
}

Server::~Server() { shutdown(std::chrono::milliseconds(0)); }

int Server::bind() {
  if (impl_->bound_port < 0) impl_->bound_port = impl_->http.bind();
  return impl_->bound_port;
}

void Server::listen() {
  bind();
  impl_->http.run();
}

void Server::start() {
  bind();
  impl_->listen_thread = std::thread([this] { impl_->http.run(); });
  // run() sets running() once it enters its loop; wait for that so a shutdown() right after
  // start() cannot race with it.
  const auto give_up = Clock::now() + std::chrono::seconds(10);
  while (!impl_->http.running()) {
    if (Clock::now() > give_up) fail("the HTTP server did not start listening");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Server::shutdown(std::chrono::milliseconds grace) {
  Impl& s = *impl_;
  std::call_once(s.shutdown_once, [&] {
    s.draining.store(true);
    {
      std::unique_lock lock(s.drain_mu);
      s.drain_cv.wait_for(lock, grace, [&] { return s.in_flight.load() == 0; });
    }
    s.abort_all.store(true);
    {
      // Aborted requests end within one poll interval plus a write; the bound only guards
      // against a client that stopped reading (its write times out after write_timeout_s).
      std::unique_lock lock(s.drain_mu);
      s.drain_cv.wait_for(lock, std::chrono::milliseconds(int64_t((s.cfg.write_timeout_s + 5) * 1000)),
                          [&] { return s.in_flight.load() == 0; });
    }
    s.http.stop();
    if (s.listen_thread.joinable()) s.listen_thread.join();
    s.stop_collector();
  });
}

int Server::port() const { return impl_->bound_port; }
const ServerMetrics& Server::metrics() const { return impl_->metrics; }
int64_t Server::in_flight() const { return impl_->in_flight.load(); }

}  // namespace tern::server
