#include "tools/bench_skeleton.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "core/output_file.h"
#include "core/stats.h"
#include "core/svg_util.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "server/api_error.h"
#include "server/backend.h"
#include "tokenizer/tokenizer.h"

namespace tern {
namespace {

using server::SotResult;
using server::SotStage;

// The figures of one phase.
struct PhaseStats {
  std::vector<double> e2e_ms;          // per question, in question order (0 for a failed run)
  std::vector<double> first_point_ms;  // runs that expanded points: until the first was done
  // Steps while points were decoding: their time, the tokens they generated, and the sequences
  // running after each.
  std::vector<double> step_ms;
  std::vector<int64_t> step_tokens;
  std::vector<double> occupancy;
  int64_t max_running = 0;
  int64_t steps = 0;                   // every step of the phase
  int64_t answer_tokens = 0;           // points' and plain answers' tokens
  int64_t skeleton_tokens = 0;         // the skeleton stage's (SoT's overhead)
  int64_t prompt_tokens = 0, cached_tokens = 0;
  int64_t points = 0, runs_with_points = 0, fallbacks = 0, failed = 0;
  double duration_s = 0;
};

// What the warm-up of bench-serve does: short requests of their own random tokens (no prefix
// hits later) page the weights in and size the buffers before the clock starts. The same
// tokens for both phases, so that both engines start alike.
void warm_up(Engine& engine, const Tokenizer& tok, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x5741524Dull);
  for (int64_t i = 0; i < n; ++i) {
    RequestParams p;
    if (tok.add_bos_default()) p.prompt_ids.push_back(tok.bos_id());
    while (p.prompt_ids.size() < 16) p.prompt_ids.push_back(int32_t(3 + rng() % uint64_t(tok.n_vocab() - 3)));
    p.max_tokens = 4;
    p.sampling.temperature = 0;
    p.ignore_eos = true;
    engine.add_request(std::move(p), {});
  }
  while (engine.has_work()) engine.step();
}

// One engine step, timed; recorded as a point-decoding step when `expanding`.
bool timed_step(Engine& engine, bool expanding, PhaseStats& st) {
  const int64_t generated_before = engine.metrics().generated_tokens_total;
  const int64_t t = now_ns();
  if (!engine.step()) return false;
  const double ms = double(now_ns() - t) / 1e6;
  ++st.steps;
  const EngineMetrics m = engine.metrics();
  if (expanding) {
    st.step_ms.push_back(ms);
    st.step_tokens.push_back(m.generated_tokens_total - generated_before);
    st.occupancy.push_back(double(m.n_running));
    st.max_running = std::max(st.max_running, m.n_running);
  }
  return true;
}

// Question q's options: bench-serve's sampling, and seeds apart from the other questions'
// (a run's points take the base seed + their index + 1).
server::SkeletonOptions options_for(const SkeletonBenchSetup& s, size_t q) {
  server::SkeletonOptions o = s.sot;
  o.base.sampling.temperature = s.temperature;
  o.base.sampling.seed = s.seed + uint64_t(q) * 1000;
  o.base.ignore_eos = s.ignore_eos;
  return o;
}

PhaseStats run_skeleton_phase(Engine& engine, const SkeletonBenchSetup& s,
                              const std::vector<std::shared_ptr<const server::SkeletonPrompts>>& prompts,
                              std::vector<SotResult>& results) {
  server::EngineBackend backend(engine);
  const size_t n = prompts.size();
  std::vector<std::unique_ptr<server::SkeletonOfThought>> runs(n);  // after backend: gone first
  std::vector<size_t> active;
  size_t next = 0, finished = 0;
  PhaseStats st;
  st.e2e_ms.assign(n, 0);
  results.assign(n, SotResult{});
  const int64_t t0 = now_ns();
  int64_t t_end = t0;
  while (finished < n) {
    while (next < n && int64_t(active.size()) < s.concurrency) {
      runs[next] = std::make_unique<server::SkeletonOfThought>(backend, prompts[next], options_for(s, next));
      try {
        runs[next]->start();
      } catch (const server::ApiError& e) {
        fail("--organize skeleton: question ", next + 1, ": ", e.what());
      }
      active.push_back(next++);
    }
    const bool expanding = std::any_of(active.begin(), active.end(),
                                       [&](size_t i) { return runs[i]->stage() == SotStage::Points; });
    const bool stepped = timed_step(engine, expanding, st);
    bool changed = false;
    for (auto it = active.begin(); it != active.end();) {
      server::SkeletonOfThought& run = *runs[*it];
      if (!run.poll().empty()) changed = true;
      if (!run.done()) {
        ++it;
        continue;
      }
      t_end = now_ns();
      results[*it] = run.result();
      runs[*it].reset();
      ++finished;
      it = active.erase(it);
    }
    // Outputs reach the driver during step(): an idle engine with nothing new for a run that
    // is not done would loop forever.
    if (!stepped && !changed)
      fail("--organize skeleton: the engine went idle with ", active.size(), " run(s) unfinished");
  }
  st.duration_s = double(t_end - t0) / 1e9;
  for (size_t i = 0; i < n; ++i) {
    const SotResult& r = results[i];
    st.prompt_tokens += r.prompt_tokens();
    st.cached_tokens += r.cached_tokens();
    st.skeleton_tokens += int64_t(r.skeleton_ids.size());
    if (!r.error.empty()) {
      ++st.failed;
      continue;
    }
    st.e2e_ms[i] = r.e2e_ms;
    st.answer_tokens += int64_t(r.plain_ids.size());
    if (r.fallback) {
      ++st.fallbacks;
      continue;
    }
    ++st.runs_with_points;
    st.points += int64_t(r.points.size());
    st.first_point_ms.push_back(r.first_point_ms);
    for (const auto& p : r.points) st.answer_tokens += int64_t(p.ids.size());
  }
  return st;
}

// One request of the sequential phase: what a run's point (or plain answer) was given, alone.
struct SequentialJob {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 0;
  uint64_t seed = 0;
  bool point = false;  // a point's expansion (else the plain answer of a run that fell back)
  std::vector<int32_t> ids;
  RequestMetrics metrics;
  FinishReason finish = FinishReason::None;
  bool finished = false;
};

struct SequentialChain {  // one question's jobs, one after another
  std::vector<SequentialJob> jobs;
  size_t current = 0;
  int64_t t_start = 0;
  double first_point_ms = 0;
};

// The same requests a run made, as SkeletonOfThought::submit makes them.
std::vector<SequentialChain> sequential_chains(const SkeletonBenchSetup& s,
                                               const std::vector<std::shared_ptr<const server::SkeletonPrompts>>& prompts,
                                               const std::vector<SotResult>& results, int64_t n_ctx) {
  std::vector<SequentialChain> chains(results.size());
  for (size_t q = 0; q < results.size(); ++q) {
    const SotResult& r = results[q];
    if (!r.error.empty()) continue;  // failed: nothing to compare
    const server::SkeletonOptions o = options_for(s, q);
    const auto add = [&](std::vector<int32_t> ids, int64_t max_tokens, uint64_t seed, bool point) {
      SequentialJob j;
      j.max_tokens = std::min(max_tokens, n_ctx - int64_t(ids.size()));
      j.prompt = std::move(ids);
      j.seed = seed;
      j.point = point;
      chains[q].jobs.push_back(std::move(j));
    };
    if (r.fallback) {
      add(prompts[q]->plain_ids(), o.plain_max_tokens, o.base.sampling.seed, false);
      continue;
    }
    std::vector<std::string> headings;
    for (const auto& p : r.points) headings.push_back(p.heading);
    for (size_t i = 0; i < headings.size(); ++i)
      add(prompts[q]->point_ids(headings, i), o.point_max_tokens, o.base.sampling.seed + i + 1, true);
  }
  return chains;
}

PhaseStats run_sequential_phase(Engine& engine, const SkeletonBenchSetup& s, std::vector<SequentialChain>& chains) {
  const size_t n = chains.size();
  PhaseStats st;
  st.e2e_ms.assign(n, 0);
  const auto submit = [&](size_t q) {
    SequentialJob& job = chains[q].jobs[chains[q].current];
    const server::SkeletonOptions o = options_for(s, q);
    RequestParams p = o.base;
    p.prompt_ids = job.prompt;
    p.max_tokens = job.max_tokens;
    p.n = 1;
    p.sampling.seed = job.seed;
    SequentialJob* out = &job;  // chains outlive the engine's use of it: every job finishes here
    if (engine.add_request(std::move(p), [out](const RequestOutput& o) {
          for (const auto& g : o.tokens) out->ids.push_back(g.id);
          if (!o.finished) return;
          out->finished = true;
          out->metrics = o.metrics;
          out->finish = o.finish_reason;
        }) == 0)
      fail("--organize skeleton: the engine's queue refused a sequential request");
  };
  std::vector<size_t> active;
  size_t next = 0, finished = 0;
  const int64_t t0 = now_ns();
  int64_t t_end = t0;
  while (finished < n) {
    while (next < n && int64_t(active.size()) < s.concurrency) {
      const size_t q = next++;
      if (chains[q].jobs.empty()) {  // its run failed
        ++finished;
        continue;
      }
      chains[q].t_start = now_ns();
      submit(q);
      active.push_back(q);
    }
    if (active.empty()) continue;
    const bool expanding = std::any_of(active.begin(), active.end(), [&](size_t q) {
      return chains[q].jobs[chains[q].current].point;
    });
    const bool stepped = timed_step(engine, expanding, st);
    bool changed = false;
    for (auto it = active.begin(); it != active.end();) {
      SequentialChain& c = chains[*it];
      SequentialJob& job = c.jobs[c.current];
      if (!job.finished) {
        ++it;
        continue;
      }
      changed = true;
      const int64_t t = now_ns();
      if (job.point && c.first_point_ms == 0) c.first_point_ms = double(t - c.t_start) / 1e6;
      const bool failed = job.finish == FinishReason::Error || job.finish == FinishReason::Abort;
      if (!failed && ++c.current < c.jobs.size()) {
        submit(*it);
        ++it;
        continue;
      }
      t_end = t;
      if (failed) ++st.failed;
      else st.e2e_ms[*it] = double(t - c.t_start) / 1e6;
      ++finished;
      it = active.erase(it);
    }
    if (!stepped && !changed)
      fail("--organize skeleton: the engine went idle with ", active.size(), " sequential run(s) unfinished");
  }
  st.duration_s = double(t_end - t0) / 1e9;
  for (const SequentialChain& c : chains) {
    if (c.jobs.empty()) continue;
    if (c.jobs.front().point) {
      ++st.runs_with_points;
      st.points += int64_t(c.jobs.size());
      st.first_point_ms.push_back(c.first_point_ms);
    } else {
      ++st.fallbacks;
    }
    for (const SequentialJob& j : c.jobs) {
      st.answer_tokens += int64_t(j.ids.size());
      st.prompt_tokens += int64_t(j.prompt.size());
      st.cached_tokens += j.metrics.n_cached_prompt;
    }
  }
  return st;
}

std::string svg_num(double v, const char* fmt) {
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

double ratio_or_zero(double b, double a) { return a > 0 ? b / a : 0; }

// 0 as JSON null: a figure the run had nothing to measure with.
nlohmann::json or_null(double v) { return v > 0 ? nlohmann::json(v) : nlohmann::json(nullptr); }

std::vector<double> completed_e2e(const std::vector<double>& e2e) {
  std::vector<double> out;
  for (double v : e2e)
    if (v > 0) out.push_back(v);
  return out;
}

}  // namespace

DecodeBatch decode_batch(const std::vector<int64_t>& tokens_per_step, const std::vector<double>& step_ms) {
  std::map<int64_t, int64_t> count;
  for (int64_t t : tokens_per_step)
    if (t > 0) ++count[t];
  DecodeBatch d;
  for (const auto& [batch, steps] : count)
    if (steps >= d.steps) d = {batch, 0, steps};  // ascending: a tie goes to the larger batch
  std::vector<double> ms;
  for (size_t i = 0; i < tokens_per_step.size() && i < step_ms.size(); ++i)
    if (d.batch > 0 && tokens_per_step[i] == d.batch) ms.push_back(step_ms[i]);
  d.step_ms = percentile(ms, 50);
  return d;
}

std::string skeleton_chart_svg(const std::vector<double>& skeleton_e2e_ms, const std::vector<double>& sequential_e2e_ms,
                               const std::string& title) {
  const size_t n = std::max(skeleton_e2e_ms.size(), sequential_e2e_ms.size());
  const double L = 70, R = 170, T = 40, B = 50, H = 360, group = 56;
  const double W = std::max(600.0, L + R + group * double(n));
  double hi = 0;
  for (const auto* v : {&skeleton_e2e_ms, &sequential_e2e_ms})
    for (double x : *v) hi = std::max(hi, x);
  const std::vector<double> ticks = nice_ticks(0, hi > 0 ? hi * 1.05 : 1);
  const double y1 = ticks.back() > 0 ? ticks.back() : 1;
  const auto Y = [&](double v) { return T + (H - T - B) * (1 - v / y1); };
  const double plot_w = W - L - R, gw = plot_w / double(std::max<size_t>(1, n)), bw = std::min(22.0, gw * 0.38);
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + svg_num(W, "%.0f") + "\" height=\"" + svg_num(H, "%.0f") +
                  "\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + svg_num(W / 2, "%.0f") + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" +
       svg_escape(title) + "</text>\n";
  for (double t : ticks)
    s += "<line x1=\"" + svg_num(L, "%.0f") + "\" x2=\"" + svg_num(W - R, "%.0f") + "\" y1=\"" + svg_num(Y(t), "%.1f") + "\" y2=\"" +
         svg_num(Y(t), "%.1f") + "\" stroke=\"#ddd\"/><text x=\"" + svg_num(L - 6, "%.0f") + "\" y=\"" + svg_num(Y(t) + 4, "%.1f") +
         "\" text-anchor=\"end\" font-size=\"12\">" + svg_num(t, "%g") + "</text>\n";
  s += "<text x=\"16\" y=\"" + svg_num((H - B + T) / 2, "%.0f") + "\" transform=\"rotate(-90 16 " + svg_num((H - B + T) / 2, "%.0f") +
       ")\" text-anchor=\"middle\" font-size=\"13\">end-to-end latency (ms, lower is better)</text>\n";
  s += "<text x=\"" + svg_num((W - R + L) / 2, "%.0f") + "\" y=\"" + svg_num(H - 10, "%.0f") +
       "\" text-anchor=\"middle\" font-size=\"13\">question</text>\n";
  const char* names[] = {"skeleton-of-thought", "sequential"};
  const char* colors[] = {"#1f77b4", "#d62728"};
  const std::vector<double>* series[] = {&skeleton_e2e_ms, &sequential_e2e_ms};
  for (size_t q = 0; q < n; ++q) {
    const double cx = L + gw * (double(q) + 0.5);
    for (int k = 0; k < 2; ++k) {
      if (q >= series[k]->size()) continue;
      const double v = (*series[k])[q];
      const double x = cx + (k == 0 ? -bw - 1 : 1);
      s += "<rect x=\"" + svg_num(x, "%.1f") + "\" y=\"" + svg_num(Y(v), "%.1f") + "\" width=\"" + svg_num(bw, "%.1f") +
           "\" height=\"" + svg_num(Y(0) - Y(v), "%.1f") + "\" fill=\"" + colors[k] + "\"><title>" +
           svg_escape(str_cat("question ", q + 1, ", ", names[k], ": ", svg_num(v, "%.0f"), " ms")) + "</title></rect>\n";
    }
    s += "<text x=\"" + svg_num(cx, "%.1f") + "\" y=\"" + svg_num(H - B + 18, "%.0f") + "\" text-anchor=\"middle\" font-size=\"12\">" +
         svg_num(double(q + 1), "%.0f") + "</text>\n";
  }
  for (int k = 0; k < 2; ++k) {
    const double y = T + 10 + 20 * k;
    s += "<rect x=\"" + svg_num(W - R + 12, "%.0f") + "\" y=\"" + svg_num(y - 6, "%.0f") + "\" width=\"12\" height=\"12\" fill=\"" +
         colors[k] + "\"/><text x=\"" + svg_num(W - R + 30, "%.0f") + "\" y=\"" + svg_num(y + 4, "%.0f") + "\" font-size=\"12\">" +
         names[k] + "</text>\n";
  }
  return s + "</svg>\n";
}

int run_skeleton_bench(std::unique_ptr<Engine> engine, const std::function<std::unique_ptr<Engine>()>& make_engine,
                       const Tokenizer& tok, const SkeletonBenchSetup& setup) {
  if (setup.questions.empty()) fail("--organize skeleton: no question to ask");
  if (!setup.chat_template.declared)
    fail("--organize skeleton renders every prompt with a chat template, and ", setup.model_path,
         " declares none (tokenizer.chat_template): give one with --chat-template NAME|FILE (e.g. chatml, llama2)");
  std::vector<std::shared_ptr<const server::SkeletonPrompts>> prompts;
  for (size_t q = 0; q < setup.questions.size(); ++q) {
    try {
      prompts.push_back(std::make_shared<server::SkeletonPrompts>(
          setup.chat_template, tok, std::vector<server::ChatMessage>{{"user", setup.questions[q]}}));
    } catch (const server::ApiError& e) {
      fail("--organize skeleton: question ", q + 1, ": ", e.what());
    }
  }

  // Skeleton-of-Thought, then the same requests one after another on a fresh engine.
  std::vector<SotResult> results;
  warm_up(*engine, tok, setup.warmup, setup.seed);
  const PhaseStats sot = run_skeleton_phase(*engine, setup, prompts, results);
  const int64_t n_ctx = engine->n_ctx();
  engine.reset();  // one engine's memory at a time
  std::vector<SequentialChain> chains = sequential_chains(setup, prompts, results, n_ctx);
  PhaseStats seq;
  {
    std::unique_ptr<Engine> fresh = make_engine();
    warm_up(*fresh, tok, setup.warmup, setup.seed);
    seq = run_sequential_phase(*fresh, setup, chains);
  }

  // Greedy: every point is what its prompt gives alone.
  int64_t compared = 0, mismatched = 0;
  for (size_t q = 0; q < results.size(); ++q) {
    const SotResult& r = results[q];
    const SequentialChain& c = chains[q];
    if (c.jobs.empty()) continue;
    for (size_t i = 0; i < c.jobs.size(); ++i) {
      const std::vector<int32_t>& got = r.fallback ? r.plain_ids : r.points[i].ids;
      ++compared;
      if (got != c.jobs[i].ids) ++mismatched;
    }
  }

  std::vector<double> speedups;
  for (size_t q = 0; q < results.size(); ++q)
    if (sot.e2e_ms[q] > 0 && seq.e2e_ms[q] > 0) speedups.push_back(seq.e2e_ms[q] / sot.e2e_ms[q]);
  const double speedup = percentile(speedups, 50);
  const DecodeBatch db_sot = decode_batch(sot.step_tokens, sot.step_ms);
  const DecodeBatch db_seq = decode_batch(seq.step_tokens, seq.step_ms);
  // B sequences per step cost tB; one after another the same B tokens cost B steps of t1 (at the
  // sequential phase's own batch, b1 questions in flight).
  const double batch_ratio = ratio_or_zero(db_sot.step_ms, db_seq.step_ms);
  const double bound = db_seq.batch > 0 && batch_ratio > 0 ? double(db_sot.batch) / double(db_seq.batch) / batch_ratio : 0;
  const double points_mean = sot.runs_with_points > 0 ? double(sot.points) / double(sot.runs_with_points) : 0;
  const int64_t failed = sot.failed + seq.failed;
  const bool mismatch_is_error = setup.temperature == 0 && mismatched > 0;
  const int n_threads = setup.n_threads > 0 ? setup.n_threads : default_thread_count();
  const int64_t n = int64_t(setup.questions.size());

  if (!setup.chart_path.empty())
    write_output_file(setup.chart_path,
                      skeleton_chart_svg(sot.e2e_ms, seq.e2e_ms,
                                         str_cat("Skeleton-of-Thought vs sequential: ", svg_num(points_mean, "%.3g"),
                                                 " points of ", setup.sot.point_max_tokens, " tokens, ",
                                                 svg_num(speedup, "%.2f"), "x")));

  const auto phase_json = [&](const PhaseStats& st, bool with_skeleton) {
    const std::vector<double> e2e = completed_e2e(st.e2e_ms);
    const DecodeBatch db = decode_batch(st.step_tokens, st.step_ms);
    nlohmann::json j;
    j["duration_s"] = st.duration_s;
    j["e2e_ms_mean"] = mean(e2e);
    j["e2e_ms_p50"] = percentile(e2e, 50);
    j["e2e_ms_p90"] = percentile(e2e, 90);
    j["e2e_ms"] = st.e2e_ms;
    j["first_point_ms_p50"] = or_null(percentile(st.first_point_ms, 50));
    j["first_point_ms_p90"] = or_null(percentile(st.first_point_ms, 90));
    j["output_tokens"] = st.answer_tokens;
    j["output_tok_s"] = st.duration_s > 0 ? double(st.answer_tokens) / st.duration_s : 0;
    if (with_skeleton) j["skeleton_tokens"] = st.skeleton_tokens;
    j["occupancy_mean"] = mean(st.occupancy);
    j["occupancy_max"] = st.max_running;
    j["points_mean"] = st.runs_with_points > 0 ? double(st.points) / double(st.runs_with_points) : 0;
    j["fallbacks"] = st.fallbacks;
    j["failed"] = st.failed;
    j["prefix_hit_rate"] = st.prompt_tokens > 0 ? double(st.cached_tokens) / double(st.prompt_tokens) : 0;
    j["steps"] = st.steps;
    j["decode_batch"] = db.batch;
    j["decode_step_ms"] = db.step_ms;
    return j;
  };

  if (setup.json) {
    nlohmann::json j;
    j["organize"] = "skeleton";
    j["model"] = setup.model_path;
    j["prompts"] = setup.prompts_desc;
    j["questions"] = n;
    j["concurrency"] = setup.concurrency;
    j["points_given"] = !setup.sot.points.empty();
    j["points_mean"] = points_mean;
    j["point_tokens"] = setup.sot.point_max_tokens;
    j["temperature"] = setup.temperature;
    j["ignore_eos"] = setup.ignore_eos;
    j["threads"] = n_threads;
    j["isa"] = active_isa();
    j["skeleton"] = phase_json(sot, true);
    j["sequential"] = phase_json(seq, false);
    j["speedup_e2e"] = speedup;
    j["batch_decode_ratio"] = or_null(batch_ratio);
    j["speedup_bound"] = or_null(bound);
    j["compared_points"] = compared;
    j["mismatched_points"] = mismatched;
    j["failed"] = failed;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("--- tern bench-serve --organize skeleton: %lld questions (%s), concurrency %lld, %.3g points per run%s, "
                "%lld tokens per point, %d threads, isa %s\n",
                static_cast<long long>(n), setup.prompts_desc.c_str(), static_cast<long long>(setup.concurrency),
                points_mean, setup.sot.points.empty() ? "" : " (given)",
                static_cast<long long>(setup.sot.point_max_tokens), n_threads, active_isa());
    std::printf("%-11s %11s %11s %13s %12s %14s %10s %9s %11s %17s\n", "run", "E2E p50 ms", "E2E p90 ms",
                "1st point p50", "output tok/s", "occupancy mean", "points/run", "fallbacks", "prefix hits",
                "decode step ms");
    const auto row = [&](const char* name, const PhaseStats& st) {
      const std::vector<double> e2e = completed_e2e(st.e2e_ms);
      const DecodeBatch db = decode_batch(st.step_tokens, st.step_ms);
      std::printf("%-11s %11.1f %11.1f %13.1f %12.2f %8.2f (max %lld) %10.2f %9lld %10.1f%% %9.2f (batch %lld)\n", name,
                  percentile(e2e, 50), percentile(e2e, 90), percentile(st.first_point_ms, 50),
                  st.duration_s > 0 ? double(st.answer_tokens) / st.duration_s : 0, mean(st.occupancy),
                  static_cast<long long>(st.max_running),
                  st.runs_with_points > 0 ? double(st.points) / double(st.runs_with_points) : 0,
                  static_cast<long long>(st.fallbacks),
                  st.prompt_tokens > 0 ? 100.0 * double(st.cached_tokens) / double(st.prompt_tokens) : 0,
                  db.step_ms, static_cast<long long>(db.batch));
    };
    row("skeleton", sot);
    row("sequential", seq);
    std::printf("speedup (sequential E2E / skeleton E2E, median of %zu questions)  %.2fx\n", speedups.size(), speedup);
    if (bound > 0)
      std::printf("batch decode: a step of %lld sequences takes %.2fx one of %lld (%.2f vs %.2f ms): speedup bound %.2fx\n",
                  static_cast<long long>(db_sot.batch), batch_ratio, static_cast<long long>(db_seq.batch),
                  db_sot.step_ms, db_seq.step_ms, bound);
    else
      std::printf("batch decode: no point was expanded (every run fell back): no bound\n");
    std::printf("points equal to their sequential decode: %lld of %lld%s\n",
                static_cast<long long>(compared - mismatched), static_cast<long long>(compared),
                setup.temperature == 0 ? "" : " (sampled: may differ)");
    if (failed > 0) std::printf("failed runs: %lld\n", static_cast<long long>(failed));
  }
  if (mismatch_is_error)
    std::fprintf(stderr,
                 "tern bench-serve: error: %lld of %lld points (greedy) differ from the same prompt decoded alone\n",
                 static_cast<long long>(mismatched), static_cast<long long>(compared));
  if (failed > 0)
    for (const SotResult& r : results)
      if (!r.error.empty()) std::fprintf(stderr, "tern bench-serve: a Skeleton-of-Thought run failed: %s\n", r.error.c_str());
  return failed == 0 && !mismatch_is_error ? 0 : 1;
}

}  // namespace tern
