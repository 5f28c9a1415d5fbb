#include "server/server.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
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
#include "server/openai_format.h"
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

// The per-request label of tern_requests_total: known routes by name, the rest as one value
// so that random paths cannot grow the metric without bound.
std::string endpoint_label(const std::string& path) {
  static const char* known[] = {"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models",
                                "/health",          "/metrics",             "/tokenize",      "/detokenize"};
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
  Backend& backend;
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
  StructuredOutput structured{backend.tokenizer()};  // grammars of constrained answers

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

  Impl(Backend& b, ServerConfig c) : backend(b), cfg(std::move(c)), http(http_config(cfg)) {}
  // (structured is initialised after backend: members are constructed in declaration order.)

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
    Impl* impl = nullptr;
    std::unique_ptr<InFlight> in_flight;
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
      for (size_t p = 0; p < ids.size(); ++p)
        if (ids[p] != 0 && unfinished[p] > 0) impl->backend.abort(ids[p]);
      std::fill(unfinished.begin(), unfinished.end(), 0);
    }

    Usage usage() const {
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
      if (!from_destructor && response_entries(1, u.completion_tokens, req.n_logprobs) > kTrimAfterEntries)
        t_trim_after = true;
      impl->metrics.count_request(req.kind == ApiKind::Chat ? "/v1/chat/completions" : "/v1/completions", status);
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

  bool is_served_name(const std::string& model) const {
    if (model == cfg.model_id) return true;
    for (const auto& n : cfg.model_names)
      if (model == n) return true;
    return false;
  }

  // The "model" of a request: any name while the server has one model and no alias, else
  // one of its names (404 as OpenAI answers).
  void check_model(const std::string& model) const {
    if (model.empty() || !cfg.strict_model_names || is_served_name(model)) return;
    throw ApiError(404, "invalid_request_error", "model", "model_not_found",
                   str_cat("The model `", model, "` does not exist. This server serves `", cfg.model_id, "`."));
  }

  std::vector<int32_t> checked_ids(const std::vector<int64_t>& ids, const std::string& param) const {
    const int64_t n_vocab = backend.tokenizer().n_vocab();
    std::vector<int32_t> out;
    out.reserve(ids.size());
    for (int64_t id : ids) {
      if (id < 0 || id >= n_vocab) bad_request(param, "token id ", id, " is outside the vocabulary [0, ", n_vocab, ").");
      out.push_back(int32_t(id));
    }
    return out;
  }

  // Parses, tokenizes and validates against the model; the Job is ready to submit.
  std::shared_ptr<Job> prepare(const std::string& body, ApiKind kind) {
    auto job = std::make_shared<Job>();
    job->impl = this;
    job->req = parse_openai_request(body, kind, cfg.limits);
    OpenAiRequest& r = job->req;
    check_model(r.model);
    for (const auto& [id, bias] : r.sampling.logit_bias)
      if (id >= backend.tokenizer().n_vocab())
        bad_request("logit_bias", "token id ", id, " is outside the vocabulary [0, ", backend.tokenizer().n_vocab(), ").");
    job->meta = {kind, new_response_id(kind), unix_now(), cfg.model_id, cfg.system_fingerprint, cfg.timings};
    job->parse_tools = kind == ApiKind::Chat && !r.tools.empty() && r.tool_choice.mode != ToolChoiceMode::None;
    job->forced_tools = job->parse_tools && (r.tool_choice.mode == ToolChoiceMode::Required ||
                                             r.tool_choice.mode == ToolChoiceMode::Named);
    // Before any tokenizing: a grammar that does not parse or a schema that cannot be converted
    // is the client's 400, whatever else the request holds.
    const std::shared_ptr<const TokenConstraint> constraint = structured.constraint_for(r, cfg.chat_template.tool_format);

    const Tokenizer& tok = backend.tokenizer();
    std::vector<std::vector<int32_t>> prompts;
    if (kind == ApiKind::Chat) {
      // The template's markers are special tokens, the messages' contents only text: a message
      // cannot close its turn or end the generation by writing "</s>" or "<|im_end|>".
      // Tools are shown to the model unless tool_choice is none (it is not to call them then);
      // calls and results already in the history are rendered either way.
      static const std::vector<ToolDef> kNoTools;
      const bool show_tools = r.tool_choice.mode != ToolChoiceMode::None;
      prompts.push_back(cfg.chat_template.encode(r.messages, tok, tok.add_bos_default(), show_tools ? r.tools : kNoTools));
      job->echo.push_back("");
    } else {
      for (size_t i = 0; i < r.prompts.size(); ++i) {
        const Prompt& p = r.prompts[i];
        const std::string param = r.prompts.size() > 1 ? str_cat("prompt[", i, "]") : "prompt";
        if (p.is_tokens) {
          prompts.push_back(checked_ids(p.tokens, param));
          job->echo.push_back(r.echo ? tok.decode(prompts.back()) : "");
        } else {
          // Special-token texts in a raw prompt become those tokens, as in llama.cpp's server:
          // a client can write its own template.
          prompts.push_back(tok.encode(p.text, tok.add_bos_default(), true));
          job->echo.push_back(r.echo ? p.text : "");
        }
      }
    }

    const int64_t n_ctx = backend.n_ctx();
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
    int64_t max_tokens = r.max_tokens.value_or(r.kind == ApiKind::Chat ? n_ctx : 16);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int64_t n_prompt = int64_t(prompts[i].size());
      if (n_prompt == 0) bad_request("prompt", "the prompt is empty and this model adds no BOS token.");
      if (n_prompt >= n_ctx)
        throw ApiError(400, "invalid_request_error", r.kind == ApiKind::Chat ? "messages" : "prompt",
                       "context_length_exceeded",
                       str_cat("This model's maximum context length is ", n_ctx, " tokens. However, your ",
                               r.kind == ApiKind::Chat ? "messages resulted in " : "prompt has ", n_prompt,
                               " tokens. Please reduce the length of the ",
                               r.kind == ApiKind::Chat ? "messages" : "prompt",
                               ", or set truncate_prompt_tokens to keep only its last tokens."));
      if (r.max_tokens && n_prompt + *r.max_tokens > n_ctx)
        throw ApiError(400, "invalid_request_error", max_param, "context_length_exceeded",
                       str_cat("This model's maximum context length is ", n_ctx, " tokens. However, you requested ",
                               n_prompt + *r.max_tokens, " tokens (", n_prompt, " in the prompt, ", *r.max_tokens,
                               " for the completion). Please reduce the prompt or the completion length."));
      // Defaults are clipped to what fits; an explicit value that does not fit was refused above.
      max_tokens = std::min(max_tokens, n_ctx - n_prompt);
    }
    // A whole (not streamed) answer is built in memory: its size is bounded by a budget of
    // tokens x (1 + logprob alternatives) over every choice. An explicit max_tokens over it is
    // refused; the default is clipped to it.
    const int64_t n_choices = int64_t(prompts.size()) * r.n;
    if (!r.stream && response_entries(n_choices, max_tokens, r.n_logprobs) > cfg.max_response_entries) {
      const int64_t per_token = response_entries(n_choices, 1, r.n_logprobs);
      const int64_t fits = cfg.max_response_entries / per_token;
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
    }
    if (job->parse_tools && r.stream)
      for (size_t i = 0; i < job->choices.size(); ++i)
        job->tool_parsers.push_back(std::make_unique<ToolCallParser>(cfg.chat_template.tool_format, tool_parser_options(r)));

    // Submit. A refusal of any prompt takes the whole request back.
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
      params.priority = r.priority;
      params.n = r.n;
      params.constraint = constraint;
      std::weak_ptr<EventMailbox> weak = job->mailbox;
      const int prompt_index = int(i);
      uint64_t id = 0;
      try {
        id = backend.add_request(std::move(params), [weak, prompt_index](const RequestOutput& out) {
          if (auto mb = weak.lock()) mb->push({prompt_index, out});
        });
      } catch (const ApiError&) {
        throw;
      } catch (const Error& e) {
        bad_request("", e.what());
      }
      if (id == 0)
        throw ApiError(429, "rate_limit_error", "", "queue_full",
                       "The server's request queue is full. Please retry after a short wait.");
      job->ids[i] = id;
    }
    return job;
  }

  // ---- generation handlers ---------------------------------------------------------------

  // 503 + Retry-After when more requests are in flight than the HTTP threads can serve.
  bool refuse_when_busy(HttpResponse& res) const {
    if (cfg.max_in_flight <= 0 || in_flight.load() <= cfg.max_in_flight) return false;
    res.headers.set("Retry-After", std::to_string(cfg.retry_after_s));
    set_error(res, 503, "The server is busy (too many requests in flight). Please retry after a short wait.", "",
              "server_busy");
    return true;
  }

  void handle_generate(const HttpRequest& hreq, HttpResponse& res, ApiKind kind) {
    auto guard = std::make_unique<InFlight>(this);
    if (refuse_when_busy(res)) return;
    std::shared_ptr<Job> job;
    try {
      job = prepare(hreq.body, kind);
    } catch (const ApiError& e) {
      if (e.status() == 429 || e.status() == 503) res.headers.set("Retry-After", std::to_string(cfg.retry_after_s));
      set_api_error(res, e);
      return;
    } catch (const Error& e) {
      set_error(res, 400, e.what());
      return;
    }
    job->in_flight = std::move(guard);
    job->live = true;
    job->peer_closed = hreq.peer_closed;
    job->deadline = Clock::now() + std::chrono::milliseconds(int64_t(cfg.request_timeout_s * 1000));
    if (job->req.stream) start_stream(job, res);
    else wait_whole(job, res);
  }

  void wait_whole(const std::shared_ptr<Job>& job, HttpResponse& res) {
    std::deque<Event> events;
    while (!job->all_done()) {
      job->mailbox->take(events, kPollInterval);
      for (const auto& ev : events) job->apply(ev);
      events.clear();
      if (job->all_done()) break;
      if (const char* why = job->interrupted()) {
        job->abort_unfinished();
        finish_interrupted(*job, res, why);
        return;
      }
    }
    for (const auto& c : job->choices) {
      if (c.finish == FinishReason::Error) {
        job->finish_accounting(500);
        set_error(res, 500, "generation failed: " + c.error);
        return;
      }
      if (c.finish == FinishReason::Abort) {
        job->finish_accounting(503);
        res.headers.set("Retry-After", std::to_string(cfg.retry_after_s));
        set_error(res, 503, "the request was aborted by the server.");
        return;
      }
    }
    if (job->parse_tools)
      for (auto& c : job->choices) {
        ToolParseResult parsed = parse_tool_calls(cfg.chat_template.tool_format, c.text, tool_parser_options(job->req));
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
    job->finish_accounting(200);
    set_json(res, 200,
             completion_response(job->meta, job->choices, job->usage(), job->req.n_logprobs >= 0, backend.tokenizer()));
  }

  void finish_interrupted(Job& job, HttpResponse& res, const std::string& why) {
    if (why == "disconnected") {
      job.finish_accounting(499);
      res.status = 499;  // nobody reads it (nginx's "client closed request")
    } else if (why == "timeout") {
      job.finish_accounting(503);
      set_error(res, 503, str_cat("the request ran past the server's time limit (", cfg.request_timeout_s, " s)."), "",
                "timeout");
    } else {
      job.finish_accounting(503);
      res.headers.set("Retry-After", std::to_string(cfg.retry_after_s));
      set_error(res, 503, "the server is shutting down.", "", "shutting_down");
    }
  }

  void start_stream(const std::shared_ptr<Job>& job, HttpResponse& res) {
    res.status = 200;
    res.headers.set("Cache-Control", "no-cache");
    res.headers.set("X-Accel-Buffering", "no");
    res.content_type = "text/event-stream";
    res.stream = [this, job](HttpStreamSink& sink) {
      try {
        stream_body(*job, sink);
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
    json lp = r.n_logprobs >= 0 && !o.tokens.empty() ? logprobs_json(r.kind, o.tokens, backend.tokenizer()) : json(nullptr);
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

  bool stream_body(Job& job, HttpStreamSink& sink) {
    const OpenAiRequest& r = job.req;
    const bool chat = r.kind == ApiKind::Chat;
    auto send = [&](const std::string& s) { return sink.write(s); };
    auto fail_stream = [&]() {
      job.abort_unfinished();
      if (!job.counted) job.finish_accounting(499);
      return false;
    };
    for (const auto& c : job.choices) {
      if (chat && !send(sse_event(role_chunk(job.meta, c.index, r.include_usage)))) return fail_stream();
      if (!c.text.empty() && !send(sse_event(text_chunk(job.meta, c.index, c.text, nullptr, r.include_usage))))
        return fail_stream();
    }
    std::deque<Event> events;
    std::string error;  // first error of any choice; ends the stream with an error event
    int error_status = 0;
    while (!job.all_done()) {
      job.mailbox->take(events, kPollInterval);
      std::string out;
      for (const auto& ev : events) {
        ChoiceResult& c = job.apply(ev);
        const auto& o = ev.out;
        bool called_tools = false;
        if (job.parse_tools) {
          called_tools = stream_tool_events(job, c.index, o, out);
        } else if (!o.text.empty() || (!o.tokens.empty() && r.n_logprobs >= 0)) {
          const json lp = r.n_logprobs >= 0 ? logprobs_json(r.kind, o.tokens, backend.tokenizer()) : json(nullptr);
          out += sse_event(text_chunk(job.meta, c.index, o.text, lp, r.include_usage));
        }
        if (o.finished) {
          if (o.finish_reason == FinishReason::Error && error.empty()) {
            error = "generation failed: " + o.error;
            error_status = 500;
          } else if (o.finish_reason == FinishReason::Abort && error.empty()) {
            error = "the request was aborted by the server.";
            error_status = 503;
          } else {
            out += sse_event(finish_chunk(job.meta, c.index, o.finish_reason, r.include_usage, &o.metrics, called_tools));
          }
        }
      }
      events.clear();
      // One write per wake-up: chunks that arrived together leave in one TCP segment.
      if (!out.empty() && !send(out)) return fail_stream();
      if (!error.empty()) break;
      if (job.all_done()) break;
      if (const char* why = job.interrupted()) {
        const std::string w = why;
        job.abort_unfinished();
        if (w == "disconnected") return fail_stream();
        error = w == "timeout" ? str_cat("the request ran past the server's time limit (", cfg.request_timeout_s, " s).")
                               : "the server is shutting down.";
        error_status = 503;
        break;
      }
    }
    if (!error.empty()) {
      job.abort_unfinished();
      job.finish_accounting(error_status == 500 ? 500 : 503);
      // OpenAI's clients raise an API error for a data event carrying "error".
      send(sse_event(error_json(error, error_type_for(error_status))) + kSseDone);
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
  // once so they share steps (server/embeddings_api.h).
  void handle_embeddings(const HttpRequest& hreq, HttpResponse& res) {
    InFlight guard(this);
    if (refuse_when_busy(res)) return;
    EmbeddingsOptions o;
    o.model_name = cfg.model_id;
    o.timeout = std::chrono::milliseconds(int64_t(cfg.request_timeout_s * 1000));
    o.check_model = [this](const std::string& m) { check_model(m); };
    o.interrupted = [this, &hreq]() -> const char* {
      if (abort_all.load()) return "shutdown";
      if (hreq.peer_closed && hreq.peer_closed()) return "disconnected";
      return nullptr;
    };
    EmbeddingsResult r;
    try {
      r = serve_embeddings(hreq.body, backend, o);
    } catch (const ApiError& e) {
      if (e.status() == 429 || e.status() == 503) res.headers.set("Retry-After", std::to_string(cfg.retry_after_s));
      set_api_error(res, e);
      return;
    } catch (const Error& e) {
      set_error(res, 400, e.what());
      return;
    }
    metrics.add_tokens(r.prompt_tokens, 0);
    if (r.status == 503) res.headers.set("Retry-After", std::to_string(cfg.retry_after_s));
    res.status = r.status;
    if (!r.body.empty()) res.set_content(r.body, "application/json");
  }

  void handle_models(const HttpRequest& req, HttpResponse& res) {
    const json model = {{"id", cfg.model_id}, {"object", "model"}, {"created", started}, {"owned_by", "tern"},
                        {"max_model_len", backend.n_ctx()}};
    if (!req.path_param.empty()) {
      const std::string id = req.path_param;
      if (!is_served_name(id)) {
        set_json(res, 404, error_json(str_cat("The model `", id, "` does not exist. This server serves `",
                                              cfg.model_id, "`."),
                                      "invalid_request_error", "model", "model_not_found"));
        return;
      }
      set_json(res, 200, model);
      return;
    }
    set_json(res, 200, {{"object", "list"}, {"data", json::array({model})}});
  }

  void handle_tokenize(const HttpRequest& req, HttpResponse& res) {
    const TokenizeRequest r = parse_tokenize_request(req.body, cfg.limits);
    check_model(r.model);
    const Tokenizer& tok = backend.tokenizer();
    std::vector<int32_t> ids;
    if (r.has_messages) ids = cfg.chat_template.encode(r.messages, tok, r.add_special && tok.add_bos_default());
    else ids = tok.encode(r.text, r.add_special && tok.add_bos_default(), true);
    json j = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", backend.n_ctx()}};
    if (r.with_pieces) {
      json pieces = json::array();
      for (int32_t id : ids) pieces.push_back(tok.token_to_piece(id, true));
      j["pieces"] = pieces;
    }
    set_json(res, 200, j);
  }

  void handle_detokenize(const HttpRequest& req, HttpResponse& res) {
    const DetokenizeRequest r = parse_detokenize_request(req.body, cfg.limits);
    check_model(r.model);
    const std::string text = backend.tokenizer().decode(checked_ids(r.tokens, "tokens"));
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
    set_error(res, 404, str_cat("Unknown path: GET ", req.path));
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
  bool authorized(const HttpRequest& req) const {
    const std::string& auth = req.headers.get("Authorization");
    const size_t sp = auth.find(' ');
    if (sp == std::string::npos || !iequals(auth.substr(0, sp), "Bearer")) return false;
    size_t key_start = auth.find_first_not_of(' ', sp);
    if (key_start == std::string::npos) return false;
    std::string key = auth.substr(key_start);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    return same_secret(key, cfg.api_key);
  }

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
    if (!cfg.api_key.empty() && !open && !authorized(req)) {
      res.headers.set("WWW-Authenticate", "Bearer");
      set_error(res, 401, "Incorrect or missing API key. Send it as 'Authorization: Bearer KEY'.", "",
                "invalid_api_key");
      return true;
    }
    if (draining.load() && req.path != "/health" && req.path != "/metrics") {
      res.headers.set("Retry-After", std::to_string(cfg.retry_after_s));
      set_error(res, 503, "The server is shutting down.", "", "shutting_down");
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
      res.set_content(metrics.render(backend.metrics(), conns), "text/plain; version=0.0.4; charset=utf-8");
    }, /*fast=*/true);
    http.route("POST", "/tokenize", guard([this](HttpRequest& req, HttpResponse& res) { handle_tokenize(req, res); }));
    http.route("POST", "/detokenize",
               guard([this](HttpRequest& req, HttpResponse& res) { handle_detokenize(req, res); }));
    http.set_fallback([this](HttpRequest& req, HttpResponse& res) { handle_static(req, res); });
    // Errors the HTTP layer answers itself (400 malformed, 404, 405, 408, 413, 414, 431, 503
    // over a connection cap) get an OpenAI-style body too.
    http.set_error_renderer([](HttpResponse& res, int status, const std::string& message) {
      set_error(res, status, message);
    });
    http.set_logger([this](const HttpRequest& req, const HttpResponse& res) {
      // Generation requests that got as far as the engine were counted by their job (a
      // stream always is, by its end or, when its connection broke first, by its teardown).
      const bool stream = res.content_type == "text/event-stream";
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

Server::Server(Backend& backend, ServerConfig config) : impl_(std::make_unique<Impl>(backend, std::move(config))) {
  impl_->setup();
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
  });
}

int Server::port() const { return impl_->bound_port; }
const ServerMetrics& Server::metrics() const { return impl_->metrics; }
int64_t Server::in_flight() const { return impl_->in_flight.load(); }

}  // namespace tern::server
