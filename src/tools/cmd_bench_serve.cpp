// tern bench-serve: vLLM's benchmark_serving, in-process. Replays prompts (ShareGPT-style JSON
// or synthetic lengths) against the serving engine at a fixed concurrency (closed loop) or a
// Poisson request rate (open loop), and reports request and token throughput, TTFT / TBT / E2E
// latency, KV memory used and wasted, the prefix-cache hit rate and peak RSS. With a drafter
// (--lookup N, --draft FILE) it reports speculative decoding's acceptance too; --spec-compare
// runs the same workload plainly and then speculatively, on two engines in turn, and reports
// both with their ratios. --organize skeleton asks every prompt as a Skeleton-of-Thought
// question and compares it with the same tokens decoded one after another (bench_skeleton.h).
//
// The engine is driven from this thread (Engine::step()), so arrivals are injected between
// steps exactly when due and no thread is spent on a client.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/output_file.h"
#include "core/read_file.h"
#include "core/stats.h"
#include "engine/engine.h"
#include "kernels/matmul.h"
#include "models/hparams.h"
#include "models/model.h"
#include "prompt/session_scorer.h"
#include "runtime/session.h"
#include "server/engines_backend.h"
#include "tools/cli_util.h"
#include "tools/bench_skeleton.h"
#include "tools/latency_args.h"
#include "tools/commands.h"
#include "tools/model_args.h"
#include "tools/pipeline_engines.h"
#include "tools/progress.h"
#include "tools/prompt_compression.h"
#include "tools/serve_models.h"
#include "tools/sot_args.h"
#include "tools/spec_args.h"

namespace tern {
namespace {

// First human turn of each conversation of a ShareGPT-format file.
std::vector<std::string> read_sharegpt(const std::string& path) {
  const std::string raw = read_file_text(path, "prompts file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(raw);
  } catch (const std::exception& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
  if (!j.is_array()) fail(path, ": expected a JSON array of conversations");
  std::vector<std::string> out;
  for (const auto& item : j) {
    if (!item.is_object()) continue;
    const auto it = item.find("conversations");
    if (it == item.end() || !it->is_array() || it->empty()) continue;
    const auto& turn = (*it)[0];
    if (!turn.is_object() || !turn.contains("value") || !turn["value"].is_string()) continue;
    const std::string text = turn["value"].get<std::string>();
    if (!text.empty()) out.push_back(text);
  }
  if (out.empty()) fail(path, ": no conversations with a first turn");
  return out;
}

// vLLM's --goodput: "ttft:MS", "tpot:MS", "e2el:MS" (time to first token, mean time per
// output token, end-to-end latency), and "tbt:MS": no gap between two of the request's tokens
// longer than MS (a stream that never freezes longer; the mean of tpot hides a stall); a
// request is good when it meets every one given.
struct GoodputSlo {
  double ttft_ms = 0, tpot_ms = 0, e2el_ms = 0, tbt_ms = 0;
};

GoodputSlo parse_goodput(const std::vector<std::string>& items) {
  GoodputSlo g;
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    const std::string key = item.substr(0, colon);
    double* slot = key == "ttft"   ? &g.ttft_ms
                   : key == "tpot" ? &g.tpot_ms
                   : key == "e2el" ? &g.e2el_ms
                   : key == "tbt"  ? &g.tbt_ms
                                   : nullptr;
    char* end = nullptr;
    const std::string val = colon == std::string::npos ? "" : item.substr(colon + 1);
    const double v = std::strtod(val.c_str(), &end);
    if (!slot || val.empty() || end != val.c_str() + val.size() || !std::isfinite(v) || v <= 0)
      fail("--goodput takes KEY:MS with KEY one of ttft, tpot, e2el, tbt and MS > 0, got '", item, "'");
    *slot = v;
  }
  return g;
}

struct Record {
  int64_t n_prompt = 0, n_generated = 0, n_cached = 0;
  int64_t n_drafted = 0, n_accepted = 0, n_spec_steps = 0;
  double ttft_ms = 0, e2e_ms = 0, queue_ms = 0;
  double compress_ms = 0;  // --compress-prompt: the scorer's time for this prompt (in ttft_ms and e2e_ms)
  std::vector<double> tbt_ms;
  FinishReason reason = FinishReason::None;
  bool done = false;
};

// What every run of the benchmark replays (--spec-compare runs it twice, on two engines).
struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<double> arrival_s;       // open loop: when each request arrives (else all 0)
  double request_rate = 0;
  int64_t in_flight_cap = 0;
  int64_t max_tokens = 0, seed = 0, warmup = 0;
  float temperature = 0;
  bool ignore_eos = true;
  std::vector<LoraSet> lora_sets;      // requests rotate over them (empty set: the base's turn)
  GoodputSlo slo;
  bool slo_from_engine = false;        // tpot from the engine's TBT target (no --goodput given)
  // --compress-prompt: each prompt's compression time, added to its TTFT and latency (a server
  // compresses a prompt before the engine sees it).
  std::vector<double> compress_ms;
};

// The figures of one run.
struct RunStats {
  EngineMetrics base, m;               // after the warm-up, and at the end
  GoodputSlo slo;
  double duration_s = 0;
  std::vector<double> ttft, tbt, e2e, queue, step_ms;
  int64_t n_in = 0, n_out = 0, n_cached = 0, n_failed = 0;
  double waste_pct = 0, hit_rate = 0;
  int64_t preempted = 0, kv_used_peak = 0, max_running_seen = 0;
  // Sequences running while requests wait (the arena, not the offered load, is the limit),
  // averaged over those steps' time; 0 when no request ever waited.
  double running_while_waiting = 0;
  int64_t n_good = 0, good_tokens = 0, tbt_within = 0, steps_over = 0, steps_cut = 0;
  int64_t drafted = 0, accepted = 0, spec_steps = 0;  // this run's requests (not the warm-up's)
  double req_s = 0, out_tok_s = 0, total_tok_s = 0, goodput_req_s = 0, goodput_tok_s = 0;

  double acceptance() const { return drafted > 0 ? double(accepted) / double(drafted) : 0; }
  // Tokens a verify step emits: its accepted drafts and the one token every step draws.
  double tokens_per_step() const { return spec_steps > 0 ? double(accepted + spec_steps) / double(spec_steps) : 0; }
};

RequestParams make_params(const Workload& w, const std::vector<int32_t>& ids, int64_t n_out, uint64_t seed) {
  RequestParams p;
  p.prompt_ids = ids;
  p.max_tokens = n_out;
  p.sampling.temperature = w.temperature;
  p.sampling.seed = seed;
  p.ignore_eos = w.ignore_eos;
  return p;
}

// Requests finished and in flight, and when the last one ended: written by the requests'
// callbacks (on the engines' threads when several engines run).
struct Progression {
  std::atomic<int64_t> n_done{0}, in_flight{0}, t_end{0};
  std::mutex mu;
  std::condition_variable ended;  // a request ended (for a thread that waits to add the next)
};

// Request i's callback: its figures into records[i] when it ends.
OutputCallback record_of(std::vector<Record>& records, Progression& pr, size_t i) {
  return [&records, &pr, i](const RequestOutput& o) {
    if (!o.finished) return;
    Record& r = records[i];
    r.done = true;
    r.reason = o.finish_reason;
    r.n_generated = o.metrics.n_generated;
    r.n_cached = o.metrics.n_cached_prompt;
    r.ttft_ms = o.metrics.ttft_ms + r.compress_ms;
    r.e2e_ms = o.metrics.e2e_ms + r.compress_ms;
    r.queue_ms = o.metrics.queue_ms;
    r.tbt_ms = o.metrics.tbt_ms;
    r.n_drafted = o.metrics.n_drafted;
    r.n_accepted = o.metrics.n_accepted;
    r.n_spec_steps = o.metrics.n_spec_steps;
    pr.t_end = now_ns();
    pr.in_flight.fetch_sub(1);
    pr.n_done.fetch_add(1);
    pr.ended.notify_one();
  };
}

// The warm-up requests: short prompts of their own tokens (no prefix hits later).
std::vector<std::vector<int32_t>> warmup_prompts(const Workload& w, const Tokenizer& tok) {
  std::mt19937_64 warm_rng(uint64_t(w.seed) ^ 0x5741524Dull);
  std::vector<std::vector<int32_t>> out;
  for (int64_t i = 0; i < w.warmup; ++i) {
    std::vector<int32_t> ids;
    if (tok.add_bos_default()) ids.push_back(tok.bos_id());
    while (ids.size() < 16) ids.push_back(int32_t(3 + warm_rng() % uint64_t(tok.n_vocab() - 3)));
    out.push_back(std::move(ids));
  }
  return out;
}

// Adds the workload's requests due `elapsed_s` into the run (open loop: by their arrival times;
// closed loop: while fewer than the cap are in flight) through add(params, callback), which
// returns 0 for a full queue (the request is tried again later). next: the first not yet added.
template <class Add>
void add_due_requests(const Workload& w, std::vector<Record>& records, Progression& pr, int64_t& next,
                      double elapsed_s, Add&& add) {
  const int64_t num_prompts = int64_t(w.prompts.size());
  while (next < num_prompts && pr.in_flight < w.in_flight_cap &&
         (w.request_rate <= 0 || w.arrival_s[size_t(next)] <= elapsed_s)) {
    const size_t i = size_t(next);
    records[i].n_prompt = int64_t(w.prompts[i].size());
    records[i].compress_ms = w.compress_ms.empty() ? 0.0 : w.compress_ms[i];
    RequestParams params = make_params(w, w.prompts[i], w.max_tokens, uint64_t(w.seed) + i);
    if (!w.lora_sets.empty()) params.lora = w.lora_sets[i % w.lora_sets.size()];
    pr.in_flight.fetch_add(1);
    if (add(std::move(params), record_of(records, pr, i)) == 0) {
      pr.in_flight.fetch_sub(1);
      return;
    }
    ++next;
  }
}

// A run's figures before its first request: the engines' metrics after the warm-up, and the
// objectives (the TPOT one from the engine's TBT target unless --goodput set it).
RunStats begin_run(const EngineMetrics& base, const Workload& w) {
  RunStats st;
  st.base = base;
  st.slo = w.slo;
  if (w.slo_from_engine) st.slo.tpot_ms = st.base.tbt_target_ms;
  return st;
}

void summarize(RunStats& st, const Workload& w, const std::vector<Record>& records);

// Warms `engine` up, replays the workload through it (driven from this thread, arrivals
// injected between steps when due) and measures. `records` ([num prompts]) outlives the engine:
// its callbacks write there.
RunStats run_workload(Engine& engine, const Workload& w, const Tokenizer& tok, std::vector<Record>& records) {
  const int64_t num_prompts = int64_t(w.prompts.size());
  records.assign(size_t(num_prompts), Record{});

  // Warm-up: page the weights in and size every buffer before the clock starts.
  for (const std::vector<int32_t>& ids : warmup_prompts(w, tok)) engine.add_request(make_params(w, ids, 4, 1), {});
  while (engine.has_work()) engine.step();
  RunStats st = begin_run(engine.metrics(), w);

  int64_t next = 0;
  Progression pr;
  double waste_sum = 0;
  int64_t waste_samples = 0;
  double waiting_ms = 0, running_ms = 0;  // step time with requests waiting, and running x that time
  const int64_t t0 = now_ns();
  pr.t_end = t0;
  while (pr.n_done < num_prompts) {
    // (A full queue: the request is tried again after the next step.)
    add_due_requests(w, records, pr, next, double(now_ns() - t0) / 1e9,
                     [&](RequestParams p, OutputCallback cb) { return engine.add_request(std::move(p), std::move(cb)); });
    const int64_t t_step = now_ns();
    if (engine.step()) {
      const double step_ms = double(now_ns() - t_step) / 1e6;
      st.step_ms.push_back(step_ms);
      const EngineMetrics m = engine.metrics();
      if (m.n_waiting > 0) {
        waiting_ms += step_ms;
        running_ms += step_ms * double(m.n_running);
      }
      if (m.n_running > 0) {
        waste_sum += m.kv_waste_pct;
        ++waste_samples;
      }
      st.kv_used_peak = std::max(st.kv_used_peak, m.kv_blocks_used);
      st.max_running_seen = std::max(st.max_running_seen, m.n_running);
    } else if (w.request_rate > 0 && next < num_prompts) {
      // Idle until the next arrival.
      const double wait_s = w.arrival_s[size_t(next)] - double(now_ns() - t0) / 1e9;
      if (wait_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(std::min(wait_s, 0.05)));
    }
  }
  st.duration_s = double(pr.t_end - t0) / 1e9;
  st.running_while_waiting = waiting_ms > 0 ? running_ms / waiting_ms : 0;
  st.waste_pct = waste_samples ? waste_sum / double(waste_samples) : 0;
  st.m = engine.metrics();
  summarize(st, w, records);
  return st;
}

// run_workload over several engines (pipeline engines, --pp): requests routed as `tern serve`
// routes them (server::EnginesBackend), each engine stepped on a thread of its own so that their
// steps overlap in the pipeline; arrivals injected from this thread, which samples the engines'
// summed gauges (at most every millisecond: the time-weighted means are those samples' means)
// while it waits. step_ms: every engine's steps.
RunStats run_workload_engines(std::span<Engine* const> engines, const Workload& w, const Tokenizer& tok,
                              std::vector<Record>& records) {
  const int64_t num_prompts = int64_t(w.prompts.size());
  records.assign(size_t(num_prompts), Record{});
  server::EnginesBackend backend(std::vector<Engine*>(engines.begin(), engines.end()));
  std::atomic<bool> stop{false};
  std::vector<std::vector<double>> step_ms(engines.size());
  std::vector<std::thread> drivers;
  std::mutex error_mu;
  std::string error;
  for (size_t e = 0; e < engines.size(); ++e)
    drivers.emplace_back([&, e] {
      try {
        while (!stop) {
          const int64_t t = now_ns();
          if (engines[e]->step()) step_ms[e].push_back(double(now_ns() - t) / 1e6);
          else std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
      } catch (const std::exception& x) {
        std::lock_guard lock(error_mu);
        if (error.empty()) error = x.what();
        stop = true;
      }
    });
  struct Join {
    std::atomic<bool>& stop;
    std::vector<std::thread>& drivers;
    ~Join() {
      stop = true;
      for (auto& d : drivers) d.join();
    }
  } join{stop, drivers};
  const auto failed = [&] {
    std::lock_guard lock(error_mu);
    if (!error.empty()) fail("an engine's step failed: ", error);
  };
  const auto busy = [&] {
    for (Engine* e : engines)
      if (e->has_work()) return true;
    return false;
  };

  std::atomic<int64_t> warm_left{w.warmup};
  for (const std::vector<int32_t>& ids : warmup_prompts(w, tok))
    backend.add_request(make_params(w, ids, 4, 1), [&warm_left](const RequestOutput& o) {
      if (o.finished) warm_left.fetch_sub(1);
    });
  while (warm_left > 0 || busy()) {
    failed();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::vector<size_t> warm_steps;  // (the drivers append to step_ms: the warm-up's are skipped, not cleared)
  for (const auto& v : step_ms) warm_steps.push_back(v.size());
  RunStats st = begin_run(backend.metrics(), w);

  int64_t next = 0;
  Progression pr;
  double waste_sum = 0;
  int64_t waste_samples = 0, waiting_samples = 0, running_sum = 0;
  const int64_t t0 = now_ns();
  pr.t_end = t0;
  while (pr.n_done < num_prompts) {
    failed();
    add_due_requests(w, records, pr, next, double(now_ns() - t0) / 1e9,
                     [&](RequestParams p, OutputCallback cb) { return backend.add_request(std::move(p), std::move(cb)); });
    // Fixed-interval samples: their means are time-weighted.
    const EngineMetrics m = backend.metrics();
    if (m.n_running > 0) {
      waste_sum += m.kv_waste_pct;
      ++waste_samples;
    }
    if (m.n_waiting > 0) {
      ++waiting_samples;
      running_sum += m.n_running;
    }
    st.kv_used_peak = std::max(st.kv_used_peak, m.kv_blocks_used);
    st.max_running_seen = std::max(st.max_running_seen, m.n_running);
    // Until a request ends (the next one goes in at once) or 1 ms passes: each sample takes
    // every engine's metrics lock, which its steps take too.
    std::unique_lock lock(pr.mu);
    pr.ended.wait_for(lock, std::chrono::milliseconds(1));
  }
  st.duration_s = double(pr.t_end - t0) / 1e9;
  stop = true;
  for (auto& d : drivers) d.join();
  drivers.clear();
  failed();
  for (size_t e = 0; e < step_ms.size(); ++e)
    st.step_ms.insert(st.step_ms.end(), step_ms[e].begin() + std::ptrdiff_t(warm_steps[e]), step_ms[e].end());
  st.running_while_waiting = waiting_samples > 0 ? double(running_sum) / double(waiting_samples) : 0;
  st.waste_pct = waste_samples ? waste_sum / double(waste_samples) : 0;
  st.m = backend.metrics();
  summarize(st, w, records);
  return st;
}

// The figures of a run from its records and the engines' metrics (st.base, st.m).
void summarize(RunStats& st, const Workload& w, const std::vector<Record>& records) {
  const int64_t num_prompts = int64_t(w.prompts.size());
  const EngineMetrics& m = st.m;

  for (const Record& r : records) {
    st.ttft.push_back(r.ttft_ms);
    st.e2e.push_back(r.e2e_ms);
    st.queue.push_back(r.queue_ms);
    st.tbt.insert(st.tbt.end(), r.tbt_ms.begin(), r.tbt_ms.end());
    st.n_in += r.n_prompt;
    st.n_out += r.n_generated;
    st.n_cached += r.n_cached;
    st.drafted += r.n_drafted;
    st.accepted += r.n_accepted;
    st.spec_steps += r.n_spec_steps;
    if (r.reason == FinishReason::Error || r.reason == FinishReason::Abort) ++st.n_failed;
  }
  const double d = st.duration_s;
  st.req_s = d > 0 ? double(num_prompts) / d : 0;
  st.out_tok_s = d > 0 ? double(st.n_out) / d : 0;
  st.total_tok_s = d > 0 ? double(st.n_in + st.n_out) / d : 0;
  st.hit_rate = st.n_in > 0 ? double(st.n_cached) / double(st.n_in) : 0;
  st.preempted = m.n_preempted_total - st.base.n_preempted_total;
  // Goodput: requests (and their output tokens) that met every objective.
  const GoodputSlo& slo = st.slo;
  for (const Record& r : records) {
    if (r.reason == FinishReason::Error || r.reason == FinishReason::Abort) continue;
    const double tpot = r.tbt_ms.empty() ? 0 : mean(r.tbt_ms);
    const double longest = r.tbt_ms.empty() ? 0 : *std::max_element(r.tbt_ms.begin(), r.tbt_ms.end());
    const bool good = (slo.ttft_ms <= 0 || r.ttft_ms <= slo.ttft_ms) && (slo.tpot_ms <= 0 || tpot <= slo.tpot_ms) &&
                      (slo.e2el_ms <= 0 || r.e2e_ms <= slo.e2el_ms) && (slo.tbt_ms <= 0 || longest <= slo.tbt_ms);
    if (good) {
      ++st.n_good;
      st.good_tokens += r.n_generated;
    }
  }
  st.goodput_req_s = d > 0 ? double(st.n_good) / d : 0;
  st.goodput_tok_s = d > 0 ? double(st.good_tokens) / d : 0;
  for (double g : st.tbt) st.tbt_within += m.tbt_target_ms > 0 && g <= m.tbt_target_ms ? 1 : 0;
  st.steps_over = m.steps_over_target - st.base.steps_over_target;
  st.steps_cut = m.steps_prefill_cut - st.base.steps_prefill_cut;
}

// The speculative figures of a run, as the JSON report names them.
void add_spec_json(nlohmann::json& j, const RunStats& st) {
  j["spec_drafted"] = st.drafted;
  j["spec_accepted"] = st.accepted;
  j["spec_verify_steps"] = st.spec_steps;
  j["spec_acceptance_rate"] = st.acceptance();
  j["spec_tokens_per_step"] = st.tokens_per_step();
  j["spec_draft_ms"] = st.m.spec_draft_ms - st.base.spec_draft_ms;
}

// b / a, or 0 when a is 0 (a run too short to time).
double ratio(double b, double a) { return a > 0 ? b / a : 0; }

}  // namespace

int cmd_bench_serve(int argc, char** argv) {
  CLI::App app{"Serving benchmark (vLLM's benchmark_serving, in-process): replay prompts through the "
               "continuous-batching engine and report throughput, latency and KV figures."};
  std::string model_path, tokenizer_bin, prompts_file, kv_memory, kv_type;
  EngineConfig ecfg;
  int64_t num_prompts = 64, concurrency = 0, max_tokens = 128, input_len = 128, max_prompt_tokens = 0;
  double request_rate = 0;
  int64_t seed = 0, warmup = 1;
  float temperature = 0;
  bool json = false, no_prefix_cache = false, ignore_eos_off = false;
  app.add_option("-m,--model", model_path, "model file: GGUF, or a llama2.c .bin with --tokenizer")->required();
  app.add_option("--tokenizer", tokenizer_bin, "llama2.c tokenizer.bin (for a .bin model)");
  dist::ParallelLayout layout;
  add_parallel_options(app, layout);
  int pipeline_engines = 0;
  add_pipeline_engines_option(app, pipeline_engines,
                              "--pp of them, as tern serve runs them, each stepped on a thread of its own; 1 with "
                              "--spec-compare or --organize");
  app.add_option("-t,--threads", ecfg.n_threads, "worker threads (default: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--prompts", prompts_file, "ShareGPT-format JSON (first human turn of each conversation); "
                                            "default: synthetic prompts of --input-len random tokens");
  app.add_option("--num-prompts", num_prompts, "requests to send")->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  app.add_option("--input-len", input_len, "tokens of a synthetic prompt (without --prompts)")->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  app.add_option("--max-prompt-tokens", max_prompt_tokens, "truncate longer prompts (default: what the context allows)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24));
  auto* conc = app.add_option("--concurrency", concurrency, "requests in flight (closed loop); default: all at once")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  app.add_option("--request-rate", request_rate, "Poisson arrivals at R requests/s (open loop)")
      ->check(CLI::PositiveNumber)->excludes(conc);
  app.add_option("--max-tokens", max_tokens, "tokens generated per request (EOS ignored, as vLLM's benchmark)")
      ->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  app.add_flag("--stop-at-eos", ignore_eos_off, "stop a request at EOS instead of generating --max-tokens");
  app.add_option("--temp", temperature, "sampling temperature (0: greedy)")->capture_default_str();
  app.add_option("-s,--seed", seed, "seed of the prompt order, arrivals and sampling")->capture_default_str();
  auto* ctx_opt = app.add_option("-c,--ctx", ecfg.n_ctx,
                                 "most tokens of one request (0: the model's training context, at most 4096, "
                                 "less if memory is short)")
                      ->check(CLI::Range(int64_t(0), int64_t(1) << 24));
  app.add_option("--parallel", ecfg.n_parallel, "contexts the default KV arena holds (ctx x parallel tokens)")
      ->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 16));
  app.add_option("--kv-memory", kv_memory,
                 "KV arena size: MiB, or with a unit (512M, 2G); default: ctx x parallel tokens");
  add_kv_type_option(app, kv_type, KvType::F16);
  KvPolicyArgs kv_policy_args;
  kv_policy_args.add_to(app);
  app.add_option("--kv-block-size", ecfg.kv_block_size, "tokens per KV block (0: 16, or 32 with --kv-type kivi2)")->capture_default_str()
      ->check(CLI::Range(int64_t(0), int64_t(4096)));
  app.add_option("--batch-tokens", ecfg.max_batch_tokens, "token budget of one step")->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 16));
  app.add_option("--max-running", ecfg.max_running, "most sequences decoding at once")->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 16));
  app.add_flag("--no-prefix-cache", no_prefix_cache, "disable prefix caching");
  LatencyArgs latency;
  add_latency_options(app, latency, /*with_queue_limit=*/false);
  SpecArgs spec_args;
  add_spec_options(app, spec_args);
  bool spec_compare = false;
  app.add_flag("--spec-compare", spec_compare,
               "run the workload twice, plainly and then with the drafter of --lookup / --draft, and report both "
               "and their ratios");
  std::vector<std::string> goodput_args;
  app.add_option("--goodput", goodput_args,
                 "objectives a request must meet to count in the goodput, as vLLM's benchmark: ttft:MS tpot:MS "
                 "e2el:MS, and tbt:MS (its longest gap between tokens) (default: ttft from --ttft-target-ms, tpot "
                 "from the TBT target in force)");
  app.add_option("--warmup", warmup, "short requests run before timing (page in the weights)")->capture_default_str()
      ->check(CLI::Range(int64_t(0), int64_t(64)));
  std::string save_prompts;
  app.add_option("--save-prompts", save_prompts, "write the prompts' token ids as JSON (to replay them on a peer engine)");
  app.add_flag("--json", json, "print one JSON object instead of the report");
  std::vector<std::string> lora_files;
  std::string lora_random;
  bool lora_with_base = false;
  app.add_option("--lora", lora_files,
                 "LoRA adapter FILE[:SCALE]; repeatable: request i runs adapter i mod N (multi-LoRA batching)");
  app.add_option("--lora-random", lora_random,
                 "N:RANK: N random adapters of rank RANK on every attention and FFN matrix (seeded, F16 as llama.cpp's "
                 "converter writes them), as --lora");
  app.add_flag("--lora-with-base", lora_with_base, "the base model takes a turn in the round robin too");
  PromptCompressArgs compress_args;
  compress_args.add_command_options(app,
                                    "compress every prompt to about 1/R of its tokens first (the scorer's time is added "
                                    "to each request's TTFT and latency)",
                                    "with --compress-prompt; default: -m itself");
  std::string organize = "none", chart_path;
  app.add_option("--organize", organize,
                 "output organization: none (each prompt one request), or skeleton (each prompt a Skeleton-of-Thought "
                 "question, compared with its points decoded one after another; concurrency 1 by default)")
      ->capture_default_str()->check(CLI::IsMember({"none", "skeleton"}));
  SotArgs sot_args;
  sot_args.add_to(app);
  app.add_option("--chart", chart_path, "with --organize skeleton: an SVG bar chart of each question's latency");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  const bool skeleton = organize == "skeleton";
  if (!skeleton) {
    for (const char* flag : {"--skeleton", "--chat-template", "--skeleton-tokens", "--point-tokens", "--plain-tokens",
                             "--min-points", "--max-points", "--chart"})
      if (app.count(flag) > 0) fail(flag, " needs --organize skeleton");
  } else {
    // A Skeleton-of-Thought run is a closed-loop client of its own: one workload, plain requests.
    for (const char* flag : {"--request-rate", "--spec-compare", "--lora", "--lora-random", "--save-prompts"})
      if (app.count(flag) > 0) fail(flag, " does not combine with --organize skeleton");
    if (compress_args.given(app)) fail("--compress-prompt does not combine with --organize skeleton");
    if (!conc->count()) concurrency = 1;  // one question at a time: the latency SoT is about
  }
  if (pipeline_engines > 1 && layout.pp < 2)
    fail("--pipeline-engines ", pipeline_engines, " needs a pipeline (--pp 2 or more, under mpirun)");
  if (pipeline_engines > 1 && (spec_compare || skeleton))
    fail("--pipeline-engines does not combine with ", spec_compare ? "--spec-compare" : "--organize skeleton",
         " (their runs take one engine at a time)");
  if (pipeline_engines == 0) pipeline_engines = spec_compare || skeleton ? 1 : std::max(1, layout.pp);
  // As tern serve: with engines keeping the stages busy, a step is cut into fewer micro-batches.
  if (pipeline_engines > 1 && layout.micro_batches == 0)
    layout.micro_batches = (layout.pp + pipeline_engines - 1) / pipeline_engines;
  const bool compress = compress_args.given(app);
  const prompt::CompressOptions compress_opts = compress_args.options(compress ? compress_args.ratio : 2.0);
  const std::string& scorer_path = compress_args.scorer;
  (void)active_isa();  // a bad TERN_FORCE_ISA is a usage error, before loading anything
  ecfg.kv_memory_bytes = kv_memory.empty() ? 0 : parse_memory_size(kv_memory);
  ecfg.kv_type = kv_type_from_name(kv_type);
  ecfg.kv_policy = kv_policy_args.config();
  ecfg.prefix_caching = !no_prefix_cache;
  ecfg.max_waiting = std::max<int64_t>(ecfg.max_waiting, num_prompts + warmup + 1);
  // A Skeleton-of-Thought run submits all its points (up to --max-points) at once.
  if (skeleton) ecfg.max_waiting = std::max<int64_t>(ecfg.max_waiting, num_prompts * (sot_args.max_points + 1) + warmup + 1);
  apply_latency_args(latency, ecfg);
  // The auto TBT target is sized for --parallel sequences: it would split a run's points over
  // several steps, and batching them is what Skeleton-of-Thought measures.
  if (skeleton && app.count("--tbt-target-ms") == 0) ecfg.tbt_target_ms = 0;
  const SpecConfig spec = spec_config_from_args(spec_args);
  const bool speculative = spec.source != DraftSource::None;
  if (spec_compare && !speculative) fail("--spec-compare needs a drafter to compare with: --lookup N or --draft FILE");
  Workload w;
  w.slo = parse_goodput(goodput_args);
  w.slo_from_engine = goodput_args.empty();
  if (w.slo_from_engine) w.slo.ttft_ms = ecfg.ttft_target_ms;
  if (!save_prompts.empty()) {
    // Before the model loads: a path that cannot be written, or that is one of the inputs.
    check_output_path(save_prompts);
    check_output_not_input(save_prompts, {model_path, tokenizer_bin, prompts_file, spec.draft_path});
  }
  // Before the model loads: a bad --skeleton file or budget, and a chart path that cannot be written.
  server::SkeletonOptions sot_options;
  if (skeleton) sot_options = sot_args.options();
  if (!chart_path.empty()) {
    check_output_path(chart_path);
    check_output_not_input(chart_path, {model_path, tokenizer_bin, prompts_file, sot_args.skeleton_file,
                                        sot_args.chat_template});
  }

  // Before the engine: its callbacks write here, and ~Engine would call them for anything
  // unfinished.
  std::vector<Record> records;
  auto file = open_model_file(model_path, tokenizer_bin);
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  ContextRequest ctx_req;
  ctx_req.kv_type = ecfg.kv_type;
  ctx_req.n_ctx = ecfg.n_ctx;
  ctx_req.n_parallel = ecfg.n_parallel;
  ctx_req.kv_memory_bytes = ecfg.kv_memory_bytes;
  ctx_req.serving = true;
  ecfg.n_ctx = plan_model_context(*file, ctx_req, app.get_name(), ctx_opt->count() > 0).n_ctx;
  // --spec-compare: the plain run first, on an engine with no drafter; then the speculative one
  // on a fresh engine (same configuration otherwise), so neither inherits the other's prefix
  // cache.
  ecfg.load = parallel_loader(layout, ecfg.n_threads);
  EngineConfig spec_ecfg = ecfg;
  spec_ecfg.spec = spec;
  resolve_self_draft(spec_ecfg.spec, file, ecfg.n_threads);  // --draft-self: the model requantized
  if (!spec_compare) ecfg.spec = spec_ecfg.spec;
  // Pipeline engines: `engine` and `more_engines` (destroyed first; each holds a view of the
  // model the ranks keep until the last one goes).
  std::unique_ptr<Engine> engine;
  std::vector<std::unique_ptr<Engine>> more_engines;
  if (pipeline_engines > 1) {
    std::vector<std::unique_ptr<Engine>> all = make_pipeline_engines(file, tok, ecfg, pipeline_engines);
    engine = std::move(all[0]);
    for (size_t e = 1; e < all.size(); ++e) more_engines.push_back(std::move(all[e]));
  } else {
    engine = std::make_unique<Engine>(file, tok, ecfg);
  }
  const int64_t n_ctx = engine->n_ctx();
  // The adapters requests rotate over (empty set: the base model's turn).
  std::vector<LoraSet>& lora_sets = w.lora_sets;
  for (LoraUse& u : load_lora_args(lora_files, *file)) lora_sets.push_back({std::move(u)});
  if (!lora_random.empty()) {
    const size_t colon = lora_random.find(':');
    int64_t n_random = 0, rank = 0;
    try {
      if (colon == std::string::npos) throw std::invalid_argument("no colon");
      n_random = std::stoll(lora_random.substr(0, colon));
      rank = std::stoll(lora_random.substr(colon + 1));
    } catch (const std::exception&) {
      fail("--lora-random ", lora_random, ": expected N:RANK, e.g. 4:8");
    }
    if (n_random < 1 || n_random > 1024 || rank < 1 || rank > 4096)
      fail("--lora-random ", lora_random, ": N must be in [1, 1024] and RANK in [1, 4096]");
    for (int64_t a = 0; a < n_random; ++a)
      lora_sets.push_back({LoraUse{LoraAdapter::from_pairs(str_cat("random-", a), file->get_string("general.architecture"),
                                                           float(rank),
                                                           LoraAdapter::random_pairs(*file, rank, uint64_t(seed) + uint64_t(a)),
                                                           /*half=*/true),
                                   1.0f}});
  }
  for (const LoraSet& s : lora_sets) engine->check_lora(*s[0].adapter);
  if (lora_with_base && !lora_sets.empty()) lora_sets.push_back({});
  if (max_tokens >= n_ctx) fail("--max-tokens ", max_tokens, " leaves no room for a prompt in a context of ", n_ctx);
  const int64_t prompt_cap = std::min(max_prompt_tokens > 0 ? max_prompt_tokens : n_ctx, n_ctx - max_tokens);

  // Prompts: ShareGPT texts in a seeded random order (as vLLM samples them), or random tokens.
  std::mt19937_64 rng{uint64_t(seed)};
  std::vector<std::vector<int32_t>>& prompts = w.prompts;
  int64_t n_truncated = 0;
  if (!prompts_file.empty()) {
    std::vector<std::string> texts = read_sharegpt(prompts_file);
    std::shuffle(texts.begin(), texts.end(), rng);
    for (int64_t i = 0; i < num_prompts; ++i) {
      std::vector<int32_t> ids = tok->encode(texts[size_t(i) % texts.size()], tok->add_bos_default());
      if (int64_t(ids.size()) > prompt_cap) {
        ids.resize(size_t(prompt_cap));
        ++n_truncated;
      }
      if (ids.empty()) ids.push_back(tok->bos_id());
      prompts.push_back(std::move(ids));
    }
  } else {
    const int64_t len = std::min(input_len, prompt_cap);
    // Ordinary tokens only (no BOS/EOS/byte tokens in the middle of a prompt).
    const int32_t lo = std::min<int32_t>(259, tok->n_vocab() - 1), hi = tok->n_vocab();
    for (int64_t i = 0; i < num_prompts; ++i) {
      std::vector<int32_t> ids;
      if (tok->add_bos_default()) ids.push_back(tok->bos_id());
      while (int64_t(ids.size()) < len) ids.push_back(lo + int32_t(rng() % uint64_t(hi - lo)));
      prompts.push_back(std::move(ids));
    }
  }

  if (skeleton) {
    // The questions are the prompts' text: ShareGPT turns as truncated, or the synthetic
    // prompts' random tokens decoded.
    SkeletonBenchSetup setup;
    setup.model_path = model_path;
    setup.prompts_desc = prompts_file.empty() ? "synthetic" : prompts_file;
    for (std::vector<int32_t> ids : prompts) {
      if (!ids.empty() && ids.front() == tok->bos_id()) ids.erase(ids.begin());
      setup.questions.push_back(tok->decode(ids));
    }
    setup.chat_template = sot_chat_template(sot_args.chat_template, *file, *tok);
    setup.sot = std::move(sot_options);
    setup.concurrency = concurrency;
    setup.warmup = warmup;
    setup.temperature = temperature;
    setup.seed = uint64_t(seed);
    setup.ignore_eos = !ignore_eos_off;
    setup.n_threads = ecfg.n_threads;
    setup.json = json;
    setup.chart_path = chart_path;
    return run_skeleton_bench(std::move(engine), [&] { return std::make_unique<Engine>(file, tok, ecfg); }, *tok, setup);
  }

  // Prompt compression, before the clock starts: each prompt's scorer time is charged to its
  // request.
  nlohmann::json compression_json;
  if (compress) {
    const std::string spath = scorer_path.empty() ? model_path : scorer_path;
    auto sfile = open_model_file(spath);
    const auto stok = Tokenizer::from_gguf(*sfile);
    check_same_vocabulary(*stok, spath, *tok, model_path);
    SessionConfig scfg;
    scfg.n_threads = ecfg.n_threads;
    scfg.n_ctx = std::min(read_hparams(*sfile).n_ctx_train, prompt_cap + 8);
    Session scorer_session(sfile, scfg);
    prompt::SessionScorer scorer(scorer_session);
    int64_t n_before = 0, n_after = 0;
    Progress progress("compress", num_prompts, !json);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int64_t t0 = now_ns();
      const prompt::PromptTokens p = prompt::prompt_from_ids(*stok, prompts[i], compress_args.prompt_options());
      scorer_session.reset();
      const prompt::CompressResult r = prompt::compress(p, scorer, compress_opts);
      n_before += int64_t(prompts[i].size());
      prompts[i] = prompt::kept_ids(p, r.keep);
      n_after += int64_t(prompts[i].size());
      w.compress_ms.push_back(double(now_ns() - t0) / 1e6);
      progress.update(int64_t(i) + 1);
    }
    progress.finish();
    compression_json = {{"method", prompt::method_name(compress_opts.method)},
                        {"ratio", compress_opts.ratio},
                        {"scorer", spath},
                        {"prompt_tokens_before", n_before},
                        {"prompt_tokens_after", n_after},
                        {"scorer_ms_mean", mean(w.compress_ms)}};
    if (!json)
      std::printf("prompt compression: %s %gx by %s: %lld -> %lld prompt tokens, %.2f ms per prompt (in each TTFT)\n",
                  prompt::method_name(compress_opts.method), compress_opts.ratio, spath.c_str(), (long long)n_before,
                  (long long)n_after, mean(w.compress_ms));
  }

  // Arrival times (open loop): exponential gaps at request_rate.
  w.arrival_s.assign(size_t(num_prompts), 0.0);
  if (request_rate > 0) {
    std::exponential_distribution<double> gap(request_rate);
    double t = 0;
    for (auto& a : w.arrival_s) {
      a = t;
      t += gap(rng);
    }
  }
  w.request_rate = request_rate;
  w.in_flight_cap = request_rate > 0 ? num_prompts : (concurrency > 0 ? concurrency : num_prompts);
  w.max_tokens = max_tokens;
  w.seed = seed;
  w.warmup = warmup;
  w.temperature = temperature;
  w.ignore_eos = !ignore_eos_off;
  const int64_t in_flight_cap = w.in_flight_cap;
  if (!save_prompts.empty()) {
    // The token ids, and with --request-rate the arrival times, for a peer engine to replay
    // (bench/llamacpp_serve.mjs --open-loop).
    nlohmann::json j{{"max_tokens", max_tokens}, {"prompts", prompts}};
    if (request_rate > 0) {
      j["request_rate"] = request_rate;
      j["arrival_s"] = w.arrival_s;
    }
    write_output_file(save_prompts, j.dump() + "\n");
  }

  const int64_t kv_block_size = engine->config().kv_block_size;
  std::vector<Engine*> engines{engine.get()};
  for (const auto& e : more_engines) engines.push_back(e.get());
  const RunStats first =
      engines.size() > 1 ? run_workload_engines(engines, w, *tok, records) : run_workload(*engine, w, *tok, records);
  std::optional<RunStats> second;
  if (spec_compare) {
    engine.reset();  // one engine's memory at a time
    engine = std::make_unique<Engine>(file, tok, spec_ecfg);
    second = run_workload(*engine, w, *tok, records);
  }
  // What the context costs (as tern run and tern bench report it): K/V bytes per token (0 for a
  // state-space model; MLA's latent) and the fixed recurrent state per sequence (0 for a transformer).
  const HParams model_hp = read_hparams(*file);
  const int64_t kv_per_token = kv_bytes_per_token(model_hp, ecfg.kv_type);
  const int64_t state_per_seq = model_hp.state_floats_per_sequence() * int64_t(sizeof(float));
  const int64_t block_bytes = kv_per_token * kv_block_size;
  const int64_t rss = peak_rss_bytes();
  const int n_threads = ecfg.n_threads > 0 ? ecfg.n_threads : default_thread_count();
  const int64_t n_lora = int64_t(lora_sets.size()) - (lora_with_base && !lora_sets.empty() ? 1 : 0);

  // What the workload was: the head of every JSON report.
  const auto workload_json = [&] {
    nlohmann::json j;
    j["model"] = model_path;
    j["prompts"] = prompts_file.empty() ? "synthetic" : prompts_file;
    j["num_prompts"] = num_prompts;
    j["concurrency"] = request_rate > 0 ? nlohmann::json(nullptr) : nlohmann::json(in_flight_cap);
    j["request_rate"] = request_rate > 0 ? nlohmann::json(request_rate) : nlohmann::json(nullptr);
    j["max_tokens"] = max_tokens;
    return j;
  };
  // One run's JSON object (the whole report without --spec-compare).
  const auto run_json = [&](const RunStats& st) {
    const EngineMetrics& m = st.m;
    const GoodputSlo& slo = st.slo;
    const double tbt_target = m.tbt_target_ms;
    nlohmann::json j = workload_json();
    j["threads"] = n_threads;
    j["isa"] = active_isa();
    j["duration_s"] = st.duration_s;
    j["completed"] = num_prompts - st.n_failed;
    j["failed"] = st.n_failed;
    j["prompt_tokens"] = st.n_in;
    j["output_tokens"] = st.n_out;
    j["truncated_prompts"] = n_truncated;
    j["request_throughput"] = st.req_s;
    j["output_tok_s"] = st.out_tok_s;
    j["total_tok_s"] = st.total_tok_s;
    j["ttft_ms_mean"] = mean(st.ttft);
    j["ttft_ms_p50"] = percentile(st.ttft, 50);
    j["ttft_ms_p99"] = percentile(st.ttft, 99);
    j["tbt_ms_mean"] = mean(st.tbt);
    j["tbt_ms_p50"] = percentile(st.tbt, 50);
    j["tbt_ms_p99"] = percentile(st.tbt, 99);
    j["e2e_ms_mean"] = mean(st.e2e);
    j["e2e_ms_p50"] = percentile(st.e2e, 50);
    j["e2e_ms_p99"] = percentile(st.e2e, 99);
    j["queue_ms_mean"] = mean(st.queue);
    j["tbt_target_ms"] = tbt_target;
    j["ttft_target_ms"] = ecfg.ttft_target_ms;
    j["decode_step_ms"] = m.decode_step_ms;
    j["goodput_slo"] = {{"ttft_ms", slo.ttft_ms}, {"tpot_ms", slo.tpot_ms}, {"e2el_ms", slo.e2el_ms}, {"tbt_ms", slo.tbt_ms}};
    j["good_requests"] = st.n_good;
    j["goodput_req_s"] = st.goodput_req_s;
    j["goodput_tok_s"] = st.goodput_tok_s;
    j["slo_attainment_pct"] = num_prompts > 0 ? 100.0 * double(st.n_good) / double(num_prompts) : 0;
    j["tbt_within_target_pct"] = st.tbt.empty() || tbt_target <= 0
                                     ? nlohmann::json(nullptr)
                                     : nlohmann::json(100.0 * double(st.tbt_within) / double(st.tbt.size()));
    j["steps"] = int64_t(st.step_ms.size());
    j["step_ms_p50"] = percentile(st.step_ms, 50);
    j["step_ms_p90"] = percentile(st.step_ms, 90);
    j["step_ms_p99"] = percentile(st.step_ms, 99);
    j["step_ms_max"] = st.step_ms.empty() ? 0.0 : *std::max_element(st.step_ms.begin(), st.step_ms.end());
    j["steps_over_target"] = st.steps_over;
    j["steps_prefill_cut"] = st.steps_cut;
    j["step_cost_error_p50"] = m.step_cost_error_p50;
    j["step_cost_error_p90"] = m.step_cost_error_p90;
    j["lora_adapters"] = n_lora;
    j["lora_with_base"] = lora_with_base;
    j["pipeline_engines"] = int64_t(engines.size());
    j["kv_type"] = kv_type_name(ecfg.kv_type);
    j["kv_policy"] = ecfg.kv_policy.describe();
    j["kv_bytes"] = m.kv_bytes;
    j["kv_blocks_total"] = m.kv_blocks_total;
    j["kv_block_size"] = kv_block_size;
    j["kv_bytes_per_token"] = kv_per_token;
    j["prompt_compression"] = compression_json;
    j["state_bytes_per_sequence"] = state_per_seq;
    j["kv_used_bytes_peak"] = st.kv_used_peak * block_bytes;
    j["kv_waste_pct"] = st.waste_pct;
    j["state_slots"] = m.state_slots_total;  // recurrent models: one state per running request
    j["state_snapshots"] = m.state_snapshots;
    j["prefix_hit_rate"] = st.hit_rate;
    j["preemptions"] = st.preempted;
    j["max_running"] = st.max_running_seen;
    j["mean_running_while_waiting"] = st.running_while_waiting;
    j["peak_rss_bytes"] = rss;
    // Only with a drafter, so that a plain benchmark's report is what it always was.
    if (speculative) add_spec_json(j, st);
    return j;
  };
  char load_desc[64];
  if (request_rate > 0) std::snprintf(load_desc, sizeof load_desc, "Poisson %g req/s", request_rate);
  else std::snprintf(load_desc, sizeof load_desc, "concurrency %lld", static_cast<long long>(in_flight_cap));

  if (spec_compare) {
    const RunStats& plain = first;
    const RunStats& sp = *second;
    const bool ok = plain.n_failed == 0 && sp.n_failed == 0;
    // Speculation's effect as the ratios a reader compares: output tok/s up (> 1 is faster),
    // TBT down (< 1 is faster; tokens of one verify step arrive together, 0 ms apart, so the
    // mean is the time per output token and p50 may drop far below the step time).
    const double speedup = ratio(sp.out_tok_s, plain.out_tok_s);
    const double tbt_mean_ratio = ratio(mean(sp.tbt), mean(plain.tbt));
    const double tbt_p50_ratio = ratio(percentile(sp.tbt, 50), percentile(plain.tbt, 50));
    if (json) {
      nlohmann::json j = workload_json();
      j["spec"] = {{"source", draft_source_name(spec.source)}, {"ngram_max", spec.ngram.ngram_max},
                   {"draft", spec.self_draft.empty() ? spec.draft_path : "self:" + spec.self_draft}, {"draft_max", spec.n_draft_max}, {"draft_min", spec.n_draft_min},
                   {"adaptive", spec.adaptive}};
      j["plain"] = run_json(plain);
      j["speculative"] = run_json(sp);
      j["speedup_output_tok_s"] = speedup;
      j["tbt_ratio"] = {{"mean", tbt_mean_ratio}, {"p50", tbt_p50_ratio}};
      std::printf("%s\n", j.dump().c_str());
      return ok ? 0 : 1;
    }
    std::printf("--- tern bench-serve --spec-compare: %lld requests (%s), %s, max %lld tokens, %d threads, isa %s, KV %s\n"
                "speculative run: %s\n",
                static_cast<long long>(num_prompts), prompts_file.empty() ? "synthetic" : "ShareGPT", load_desc,
                static_cast<long long>(max_tokens), n_threads, active_isa(), kv_type_name(ecfg.kv_type),
                spec_description(spec).c_str());
    std::printf("%-18s %12s %12s %12s %12s %12s %11s %11s %9s\n", "run", "output tok/s", "TBT mean ms", "TBT p50 ms",
                "TTFT mean ms", "E2E mean ms", "acceptance", "tokens/step", "failed");
    const auto row = [&](const char* name, const RunStats& st, bool with_spec) {
      const std::string acc = with_spec ? str_cat(int64_t(st.acceptance() * 1000) / 10.0, " %") : "-";
      const std::string tps = with_spec ? str_cat(int64_t(st.tokens_per_step() * 100) / 100.0) : "-";
      std::printf("%-18s %12.2f %12.2f %12.2f %12.2f %12.2f %11s %11s %9lld\n", name, st.out_tok_s, mean(st.tbt),
                  percentile(st.tbt, 50), mean(st.ttft), mean(st.e2e), acc.c_str(), tps.c_str(),
                  static_cast<long long>(st.n_failed));
    };
    row("plain", plain, false);
    row("speculative", sp, true);
    std::printf("%-18s %11.2fx %12.2f %12.2f %12.2f %12.2f\n", "speculative/plain", speedup, tbt_mean_ratio, tbt_p50_ratio,
                ratio(mean(sp.ttft), mean(plain.ttft)), ratio(mean(sp.e2e), mean(plain.e2e)));
    std::printf("speculative: %lld of %lld drafted tokens accepted in %lld verify steps\n",
                static_cast<long long>(sp.accepted), static_cast<long long>(sp.drafted),
                static_cast<long long>(sp.spec_steps));
    return ok ? 0 : 1;
  }

  const RunStats& st = first;
  const EngineMetrics& m = st.m;
  const GoodputSlo& slo = st.slo;
  const double tbt_target = m.tbt_target_ms;
  if (json) {
    std::printf("%s\n", run_json(st).dump().c_str());
    return st.n_failed == 0 ? 0 : 1;
  }
  if (!lora_sets.empty())
    std::printf("LoRA: requests rotate over %zu adapter set(s)%s\n", lora_sets.size() - (lora_with_base ? 1 : 0),
                lora_with_base ? " and the base model" : "");
  std::string target_desc = "off (token budget alone)";
  if (tbt_target > 0) target_desc = str_cat(int64_t(tbt_target * 100) / 100.0, " ms (one decode step: ", int64_t(m.decode_step_ms * 100) / 100.0, " ms)");
  std::string slo_desc;
  if (slo.ttft_ms > 0) slo_desc += str_cat("TTFT <= ", slo.ttft_ms, " ms ");
  if (slo.tpot_ms > 0) slo_desc += str_cat("TPOT <= ", int64_t(slo.tpot_ms * 100) / 100.0, " ms ");
  if (slo.e2el_ms > 0) slo_desc += str_cat("E2E <= ", slo.e2el_ms, " ms ");
  if (slo.tbt_ms > 0) slo_desc += str_cat("every gap <= ", slo.tbt_ms, " ms ");
  slo_desc = slo_desc.empty() ? "no objective" : slo_desc.substr(0, slo_desc.size() - 1);
  const std::vector<double>& ttft = st.ttft;
  const std::vector<double>& tbt = st.tbt;
  const std::vector<double>& e2e = st.e2e;
  const std::vector<double>& step_ms = st.step_ms;
  std::printf(
      "--- tern bench-serve: %lld requests (%s), %s, max %lld tokens, %d threads, isa %s, KV %s\n"
      "duration                %10.2f s\n"
      "requests                %10.2f req/s   (%lld completed, %lld failed)\n"
      "output tokens           %10.2f tok/s   (%lld tokens)\n"
      "total tokens            %10.2f tok/s   (%lld prompt tokens%s)\n"
      "TTFT mean/p50/p99       %10.2f / %.2f / %.2f ms\n"
      "TBT  mean/p50/p99       %10.2f / %.2f / %.2f ms\n"
      "E2E  mean/p50/p99       %10.2f / %.2f / %.2f ms\n"
      "queue time mean         %10.2f ms\n"
      "TBT target              %10s\n"
      "steps p50/p90/p99/max   %10.2f / %.2f / %.2f / %.2f ms   (%lld steps, %lld over the target, %lld with prefill cut)\n"
      "step-cost model error   %10.1f %% median, %.1f %% p90\n"
      "goodput                 %10.2f req/s   %.2f tok/s   (%lld of %lld requests met %s)\n"
      "running at once (max)   %10lld   (mean while requests wait %.1f)\n"
      "KV arena                %10s (%lld blocks x %lld tokens), peak used %s\n"
      "KV per token            %10s   recurrent state per sequence %s\n"
      "KV waste (mean)         %10.2f %%   (allocated but unfilled slots)\n"
      "prefix-cache hit rate   %10.2f %%\n"
      "preemptions             %10lld\n"
      "peak RSS                %10s\n",
      static_cast<long long>(num_prompts), prompts_file.empty() ? "synthetic" : "ShareGPT",
      load_desc,
      static_cast<long long>(max_tokens), n_threads,
      active_isa(), kv_type_name(ecfg.kv_type), st.duration_s, st.req_s, static_cast<long long>(num_prompts - st.n_failed),
      static_cast<long long>(st.n_failed), st.out_tok_s, static_cast<long long>(st.n_out), st.total_tok_s,
      static_cast<long long>(st.n_in), n_truncated ? (", " + std::to_string(n_truncated) + " truncated").c_str() : "",
      mean(ttft), percentile(ttft, 50), percentile(ttft, 99), mean(tbt), percentile(tbt, 50), percentile(tbt, 99),
      mean(e2e), percentile(e2e, 50), percentile(e2e, 99), mean(st.queue), target_desc.c_str(),
      percentile(step_ms, 50), percentile(step_ms, 90), percentile(step_ms, 99),
      step_ms.empty() ? 0.0 : *std::max_element(step_ms.begin(), step_ms.end()),
      static_cast<long long>(step_ms.size()), static_cast<long long>(st.steps_over), static_cast<long long>(st.steps_cut),
      100 * m.step_cost_error_p50, 100 * m.step_cost_error_p90, st.goodput_req_s, st.goodput_tok_s,
      static_cast<long long>(st.n_good), static_cast<long long>(num_prompts), slo_desc.c_str(),
      static_cast<long long>(st.max_running_seen), st.running_while_waiting,
      format_bytes(m.kv_bytes).c_str(), static_cast<long long>(m.kv_blocks_total),
      static_cast<long long>(kv_block_size), format_bytes(st.kv_used_peak * block_bytes).c_str(),
      format_bytes(kv_per_token).c_str(), format_bytes(state_per_seq).c_str(), st.waste_pct, 100.0 * st.hit_rate, static_cast<long long>(st.preempted), format_bytes(rss).c_str());
  if (engines.size() > 1)
    std::printf("pipeline engines        %10zu   (each with 1/%zu of the K/V memory; steps: all engines')\n",
                engines.size(), engines.size());
  if (m.state_slots_total > 0)
    std::printf("recurrent states        %10lld slots (one per running request; the KV arena holds them and %lld "
                "prefix snapshots)\n",
                static_cast<long long>(m.state_slots_total), static_cast<long long>(m.state_snapshots));
  if (speculative)
    std::printf("speculative             %10.2f %% accepted (%lld of %lld drafted), %.2f tokens per verify step; %s\n",
                100.0 * st.acceptance(), static_cast<long long>(st.accepted), static_cast<long long>(st.drafted),
                st.tokens_per_step(), spec_description(spec).c_str());
  return st.n_failed == 0 ? 0 : 1;
}

}  // namespace tern
