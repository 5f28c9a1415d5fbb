// tern bench: llama-bench-style prompt processing (pp) and generation (tg) throughput,
// medians over repetitions after a warm-up, with the memory-bandwidth roofline for decode and,
// with --roofline, the compute roofline for prefill (tools/compute_probe.h).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "core/file_read_rate.h"
#include "core/stats.h"
#include "kernels/matmul.h"
#include "models/ffn_bundle_format.h"
#include "models/ffn_predictor_format.h"
#include "models/model.h"
#include "tools/bandwidth_probe.h"
#include "tools/bench_spec.h"
#include "tools/compute_probe.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/model_args.h"
#include "tools/parallel_report.h"
#include "tools/progress.h"
#include "tools/spec_args.h"

namespace tern {

namespace {

// Bytes a decode step streams: every weight once, except the embedding table, of which only
// one row is read (unless it doubles as the output projection).
// Bytes one decode step reads: every tensor but an untied embedding (one row of it), and of a
// mixture of experts' 3-D ffn_*_exps tensors only the routed experts' share (a token takes
// expert_used_count of expert_count equal-sized experts per layer).
int64_t bytes_read_per_token(const GgufFile& f) {
  int64_t bytes = 0;
  const bool tied = f.find_tensor("output.weight") == nullptr;
  const std::string a = f.get_string("general.architecture", "llama") + ".";
  const uint64_t n_expert = f.get_uint(a + "expert_count", 0), n_used = f.get_uint(a + "expert_used_count", 0);
  for (const auto& t : f.tensors()) {
    if (t.name == "token_embd.weight" && !tied) continue;
    // A sparsity predictor and neuron bundles are not part of the dense decode (docs/sparsity.md).
    if (is_ffn_predictor_tensor(t.name) || is_ffn_bundle_tensor(t.name)) continue;
    const bool routed = n_expert > 0 && t.ne.size() == 3 && t.name.find("_exps.") != std::string::npos;
    bytes += routed ? int64_t(t.n_bytes / n_expert * n_used) : int64_t(t.n_bytes);
  }
  return bytes;
}

// Multiply-adds x 2 of one prompt token: every weight of the layers once (of a mixture of
// experts' routed tensors the used share), the attention's QK^T and PV over the average
// context of an n_prompt-token prompt; the output projection runs for the last token only.
double flops_per_prompt_token(const GgufFile& f, const HParams& hp, int64_t n_prompt) {
  const std::string a = f.get_string("general.architecture", "llama") + ".";
  const uint64_t n_expert = f.get_uint(a + "expert_count", 0), n_used = f.get_uint(a + "expert_used_count", 0);
  double weights = 0;
  for (const auto& t : f.tensors()) {
    if (t.name.rfind("blk.", 0) != 0 || t.ne.size() < 2) continue;
    if (is_ffn_predictor_tensor(t.name) || is_ffn_bundle_tensor(t.name)) continue;
    double n = 1;
    for (int64_t d : t.ne) n *= double(d);
    const bool routed = n_expert > 0 && t.ne.size() == 3 && t.name.find("_exps.") != std::string::npos;
    weights += routed ? n / double(n_expert) * double(n_used) : n;
  }
  const double avg_ctx = double(n_prompt + 1) / 2;
  return 2 * weights + 4.0 * avg_ctx * double(hp.n_layer * hp.n_head * hp.head_dim);
}

// Which compute peak bounds a type's prefill: the float types' GEMMs are FP32 FMAs (BF16's
// the BF16 dot where the kernels use it: kernels/matmul.h isa_bf16_dot), the quantized types'
// integer dot products of 8-bit activations.
const char* compute_peak_for(const std::string& type, int64_t n_embd) {
  if (type == "bf16" && isa_bf16_dot(selected_isa(), DType::BF16, n_embd)) return "bf16_dot";
  return type == "f32" || type == "f16" || type == "bf16" ? "fp32_fma" : "int8_dot";
}

std::string model_type_name(const GgufFile& f) {
  // The type most of the bytes are stored in (what llama-bench prints as the model type).
  std::vector<std::pair<int64_t, DType>> by_type;
  for (const auto& t : f.tensors()) {
    auto it = std::find_if(by_type.begin(), by_type.end(), [&](const auto& p) { return p.second == t.type; });
    if (it == by_type.end()) by_type.push_back({int64_t(t.n_bytes), t.type});
    else it->first += int64_t(t.n_bytes);
  }
  if (by_type.empty()) return "?";
  return dtype_name(std::max_element(by_type.begin(), by_type.end())->second);
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  CLI::App app{"Prompt-processing and generation throughput (llama-bench style) with the decode roofline."};
  ModelArgs margs;
  margs.add_to(app, /*with_ctx=*/false);
  margs.add_parallel_to(app);
  margs.add_sparse_ffn_to(app);
  int64_t n_prompt = 512, n_gen = 128;
  int reps = 5;
  bool json = false, no_bandwidth = false, roofline = false, cold_file = false;
  app.add_option("-p,--n-prompt", n_prompt, "prompt tokens of the pp test (0: skip)")->capture_default_str()
      ->check(CLI::Range(int64_t(0), int64_t(1) << 16));
  app.add_option("-n,--n-gen", n_gen, "generated tokens of the tg test (0: skip)")->capture_default_str()
      ->check(CLI::Range(int64_t(0), int64_t(1) << 16));
  app.add_option("-r,--reps", reps, "repetitions (the median is reported)")->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_flag("--no-bandwidth", no_bandwidth, "skip the memory-bandwidth probe");
  app.add_flag("--cold-file", cold_file,
               "--ram-budget: also time tg with the model file dropped from the page cache before every token "
               "(the neuron store's reads then come from the disk)");
  app.add_flag("--roofline", roofline,
               "also measure the compute peaks (FP32 FMA, BF16 dot, int8 dot) on the same threads and report pp "
               "as a share of the one its type runs on");
  int verify_max = 0;
  int64_t verify_ctx = 128;
  app.add_option("--verify-curve", verify_max,
                 "also time one forward step of k tokens at a context of --verify-ctx, k = 1..K, against a "
                 "one-token step: the cost of verifying k-1 speculative drafts (docs/speculative.md)")
      ->check(CLI::Range(0, 64));
  app.add_option("--verify-ctx", verify_ctx, "tokens in the cache before the --verify-curve steps")
      ->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 16));
  SpecArgs spec_args;
  add_spec_options(app, spec_args);
  std::string spec_prompts;
  app.add_option("--spec-prompts", spec_prompts,
                 "with --lookup or --draft: generate -n tokens greedily from each prompt in FILE (one per line, \\n "
                 "for a newline), plainly and speculatively in turn, and report both decode speeds, the speedup and "
                 "the acceptance (instead of pp/tg)");
  std::vector<int64_t> depths;
  app.add_option("--depth", depths,
                 "also time tg (-n tokens) after a context of D tokens, for each D (comma-separated, as "
                 "llama-bench -d): decode cost and cache bytes against the context")
      ->delimiter(',')->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  app.add_flag("--json", json, "print one JSON object");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  const SpecConfig spec = spec_config_from_args(spec_args);
  if (spec.source != DraftSource::None || !spec_prompts.empty()) {
    if (spec_prompts.empty()) fail("--lookup / --draft in tern bench compare decoding over --spec-prompts FILE: give one");
    SpecBenchArgs sa;
    sa.prompts_path = spec_prompts;
    sa.n_gen = n_gen > 0 ? n_gen : 128;
    sa.reps = reps;
    sa.json = json;
    margs.ctx = margs.ctx_given() ? margs.ctx : 0;
    return run_spec_bench(margs, spec, sa);
  }
  if (n_prompt == 0 && n_gen == 0 && verify_max == 0) fail("nothing to measure: -p and -n are both 0");
  margs.ctx = std::max<int64_t>(n_prompt, n_gen) + 1;
  if (verify_max > 0) margs.ctx = std::max<int64_t>(margs.ctx, verify_ctx + verify_max);
  if (!depths.empty()) {
    if (n_gen == 0) fail("--depth times -n generated tokens after each context: -n must be > 0");
    // Each depth's context, then a warm-up and `reps` timed runs that continue from it.
    margs.ctx = std::max<int64_t>(margs.ctx, *std::max_element(depths.begin(), depths.end()) + n_gen * (reps + 1) + 1);
  }
  margs.batch = std::max<int64_t>({int64_t(1), std::min<int64_t>(n_prompt, 512), int64_t(verify_max)});
  LoadedSession ls = open_session(margs);
  Session& s = *ls.session;
  const int64_t V = s.hparams().n_vocab;
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> pick(0, int32_t(V - 1));
  std::vector<int32_t> prompt(size_t(std::max<int64_t>(n_prompt, 1)));
  for (auto& t : prompt) t = pick(rng);

  auto run_pp = [&]() {
    s.reset();
    const int64_t t0 = now_ns();
    s.eval(prompt);
    return double(n_prompt) / (double(now_ns() - t0) / 1e9);
  };
  auto run_tg = [&]() {
    s.reset();
    int32_t tok = ls.tokenizer->bos_id() >= 0 ? ls.tokenizer->bos_id() : 0;
    const int64_t t0 = now_ns();
    for (int64_t i = 0; i < n_gen; ++i) {
      s.eval(std::span<const int32_t>(&tok, 1));
      tok = pick(rng);
    }
    return double(n_gen) / (double(now_ns() - t0) / 1e9);
  };

  // Warm-up: page the weights in and let the pool's threads settle.
  if (n_prompt > 0) run_pp();
  if (n_gen > 0) {
    const int64_t keep = n_gen;
    n_gen = std::min<int64_t>(n_gen, 16);
    run_tg();
    n_gen = keep;
  }
  // The bandwidth is measured next to each tg run (before and after it), and each run's
  // roofline share is taken against the mean of the two: on a shared machine the bandwidth
  // moves by 1.5x from minute to minute, so one probe at the end made the share swing from 58%
  // to over 100% between runs of the same build. The probe reads the decode's own weights where
  // they are (bandwidth_probe.h: another buffer can sit on faster or slower memory), 2 passes,
  // or, for a model that lists none, a 256 MiB buffer of its own (3 passes).
  // Under a parallel layout the probe would read rank 0's part only: the roofline is one
  // process's, so it is left out (docs/distributed.md has the cost model instead).
  if (margs.layout.parallel()) no_bandwidth = true;
  std::unique_ptr<ReadBandwidthProbe> probe;
  const bool probe_weights = !s.model().decode_weight_memory().empty();
  if (!no_bandwidth) {
    probe = probe_weights ? std::make_unique<ReadBandwidthProbe>(s.pool(), s.model().decode_weight_memory())
                          : std::make_unique<ReadBandwidthProbe>(s.pool(), size_t(256) << 20);
  }
  // Each probe reads both ways (bandwidth_probe.h); the roofline takes the faster.
  const auto probe_now = [&] { return probe->measure(probe_weights ? 2 : 3); };
  std::vector<double> pp, tg, bw_runs, pct_runs;
  std::vector<double> bw_one_runs, bw_streams_runs;  // the two ways' figures beside bw_runs'
  const auto add_bandwidth_run = [&](const ReadRates& before, const ReadRates& after) {
    bw_runs.push_back((before.best() + after.best()) / 2);
    bw_one_runs.push_back((before.one_stream + after.one_stream) / 2);
    bw_streams_runs.push_back((before.streams + after.streams) / 2);
  };
  // --sparse-ffn: each tg run is timed again with the dense FFN, in alternating order, so that
  // the ratio compares runs a few seconds apart (the machine is shared); and each run's time in
  // the FFN layers (ms per token): the FFN's own speedup, apart from attention and the output
  // layer, which the sparse FFN does not change.
  SparseFfn* sparse = s.model().sparse_ffn();
  // --ram-budget: no dense FFN in memory to alternate with; the tg runs' reads from the file are
  // counted instead (bytes per decoded token).
  const NeuronStore* store = sparse ? sparse->store() : nullptr;
  const bool alternate_dense = sparse && !store;
  std::vector<double> tg_dense, ffn_ms_dense, ffn_ms_sparse;
  int64_t tg_store_bytes = 0, tg_store_tokens = 0, tg_store_lookups = 0, tg_store_hits = 0;
  const auto run_tg_with = [&](bool on) {
    if (alternate_dense) sparse->set_enabled(on);
    const double f0 = sparse->stats().ffn_seconds;
    const NeuronStoreStats st0 = store ? store->stats() : NeuronStoreStats{};
    const double tok_s = run_tg();
    (on ? ffn_ms_sparse : ffn_ms_dense).push_back((sparse->stats().ffn_seconds - f0) * 1e3 / double(n_gen));
    if (store) {
      tg_store_bytes += store->stats().bytes_read - st0.bytes_read;
      tg_store_lookups += store->stats().lookups - st0.lookups;
      tg_store_hits += store->stats().hits - st0.hits;
      tg_store_tokens += n_gen;
    }
    if (alternate_dense) sparse->set_enabled(true);
    return tok_s;
  };
  const auto run_tg_dense = [&] { tg_dense.push_back(run_tg_with(false)); };
  // --cold-file: the same tokens, the file's page cache dropped before each (not timed).
  std::vector<double> tg_cold;
  int64_t cold_bytes = 0, cold_tokens = 0;
  const auto run_tg_cold = [&] {
    s.reset();
    int32_t tok = ls.tokenizer->bos_id() >= 0 ? ls.tokenizer->bos_id() : 0;
    const int64_t b0 = store->stats().bytes_read;
    int64_t ns = 0;
    for (int64_t i = 0; i < n_gen; ++i) {
      store->drop_page_cache();
      const int64_t t0 = now_ns();
      s.eval(std::span<const int32_t>(&tok, 1));
      ns += now_ns() - t0;
      tok = pick(rng);
    }
    cold_bytes += store->stats().bytes_read - b0;
    cold_tokens += n_gen;
    tg_cold.push_back(double(n_gen) / (double(ns) / 1e9));
  };
  if (cold_file && !store) fail("--cold-file applies to --ram-budget (with --sparse-ffn)");
  if (sparse) sparse->reset_stats();
  const int64_t per_token = bytes_read_per_token(s.file());
  Progress progress("bench", int64_t(reps) * ((n_prompt > 0) + (n_gen > 0)), !json);
  int64_t done = 0;
  ReadRates bw_before = probe && n_gen > 0 ? probe_now() : ReadRates{};
  for (int r = 0; r < reps; ++r) {
    if (n_prompt > 0) {
      pp.push_back(run_pp());
      progress.update(++done);
    }
    if (n_gen > 0) {
      if (probe && n_prompt > 0) bw_before = probe_now();
      if (alternate_dense && r % 2 == 1) run_tg_dense();
      tg.push_back(sparse ? run_tg_with(true) : run_tg());
      if (alternate_dense && r % 2 == 0) run_tg_dense();
      if (cold_file) run_tg_cold();
      if (probe) {
        const ReadRates bw_after = probe_now();
        add_bandwidth_run(bw_before, bw_after);
        bw_before = bw_after;
        const double bw_run = bw_runs.back();
        if (bw_run > 0) pct_runs.push_back(100.0 * tg.back() * double(per_token) / (bw_run * 1e9));
      }
      progress.update(++done);
    }
  }
  progress.finish();
  // --ram-budget: the file's own read rate, cold (off the disk) and warm (the page cache), for
  // the tg runs' bytes per token: the rate the reads alone would allow.
  FileReadRate file_rate;
  if (store && n_gen > 0) file_rate = measure_file_read_rate(store->path(), 0, int64_t(256) << 20);
  const double store_bytes_per_token = tg_store_tokens > 0 ? double(tg_store_bytes) / double(tg_store_tokens) : 0.0;
  const double store_hit_rate = tg_store_lookups > 0 ? double(tg_store_hits) / double(tg_store_lookups) : 0.0;
  const auto read_bound = [&](double rate) { return store_bytes_per_token > 0 ? rate / store_bytes_per_token : 0.0; };
  if (probe && n_gen == 0) {
    const ReadRates r = probe_now();
    add_bandwidth_run(r, r);
  }
  std::vector<ComputePeak> peaks;
  if (roofline) peaks = measure_compute_peaks(s.pool());
  // The verify-cost curve: a step of k tokens (all their logits, as a verify step computes) at a
  // fixed context, k = 1..K, medians of `reps` runs (rounds alternate over k, so a slow minute
  // falls on every k alike). The speedup ceiling of a drafter accepting everything is k tokens
  // per step over the step's cost relative to one token.
  std::vector<double> verify_ms;  // [K] median ms of a k-token step
  if (verify_max > 0) {
    std::vector<int32_t> ctx_tokens(static_cast<size_t>(verify_ctx)), step_tokens(static_cast<size_t>(verify_max));
    for (auto& t : ctx_tokens) t = pick(rng);
    for (auto& t : step_tokens) t = pick(rng);
    s.reset();
    s.eval(ctx_tokens);
    std::vector<std::vector<double>> runs(static_cast<size_t>(verify_max));
    const int rounds = std::max(reps, 3) * 4;
    for (int r = -1; r < rounds; ++r) {  // round -1: warm-up
      for (int k = 1; k <= verify_max; ++k) {
        s.truncate(verify_ctx);
        const int64_t t0 = now_ns();
        s.eval(std::span<const int32_t>(step_tokens.data(), size_t(k)), /*all_logits=*/true);
        if (r >= 0) runs[size_t(k - 1)].push_back(double(now_ns() - t0) / 1e6);
      }
    }
    for (auto& v : runs) verify_ms.push_back(percentile(v, 50));
  }
  // Decode after a context of each depth (llama-bench -d): the context is prefilled once (random
  // tokens, untimed), then `reps` runs of n_gen tokens continue from it (the context grows by
  // n_gen per run, negligible beside the depth). The cache bytes are those the sequence holds at
  // the depth: K/V rows of every position plus a recurrent model's fixed state.
  struct DepthRun {
    int64_t depth = 0;
    double tg_tok_s = 0;
    int64_t cache_bytes = 0;
  };
  std::vector<DepthRun> depth_runs;
  const int64_t kv_per_token = kv_bytes_per_token(s.hparams(), s.kv_type());
  const int64_t state_per_seq = s.hparams().state_floats_per_sequence() * int64_t(sizeof(float));
  if (!depths.empty()) {
    Progress dprog("bench --depth", int64_t(depths.size()), !json);
    std::vector<int32_t> ctx_tokens;
    for (const int64_t d : depths) {
      ctx_tokens.resize(size_t(d));
      for (auto& t : ctx_tokens) t = pick(rng);
      s.reset();
      s.eval(ctx_tokens);
      std::vector<double> runs;
      for (int r = -1; r < reps; ++r) {  // run -1: warm-up
        int32_t tok = pick(rng);
        const int64_t t0 = now_ns();
        for (int64_t i = 0; i < n_gen; ++i) {
          s.eval(std::span<const int32_t>(&tok, 1));
          tok = pick(rng);
        }
        if (r >= 0) runs.push_back(double(n_gen) / (double(now_ns() - t0) / 1e9));
      }
      depth_runs.push_back(DepthRun{d, percentile(runs, 50), d * kv_per_token + state_per_seq});
      dprog.update(int64_t(depth_runs.size()));
    }
    dprog.finish();
  }
  const ParallelBenchReport parallel = parallel_bench_report(n_prompt > 0 ? std::function<void()>([&] { run_pp(); }) : nullptr);
  const double bw = bw_runs.empty() ? 0.0 : percentile(bw_runs, 50);
  const double bw_one = bw_one_runs.empty() ? 0.0 : percentile(bw_one_runs, 50);
  const double bw_streams = bw_streams_runs.empty() ? 0.0 : percentile(bw_streams_runs, 50);
  const double pp_med = percentile(pp, 50), tg_med = percentile(tg, 50);
  const double roofline_tok_s = bw > 0 ? bw * 1e9 / double(per_token) : 0.0;
  const double roofline_pct = pct_runs.empty() ? 0.0 : percentile(pct_runs, 50);
  const int64_t weight_bytes = s.model().weight_bytes();
  const std::string type = model_type_name(s.file());
  // pp against the compute roofline: achieved ops/s over the peak of the instruction the type's
  // GEMM runs on.
  const double pp_flops_per_token = n_prompt > 0 ? flops_per_prompt_token(s.file(), s.hparams(), n_prompt) : 0.0;
  const ComputePeak* pp_peak = nullptr;
  for (const ComputePeak& c : peaks)
    if (c.name == compute_peak_for(type, s.hparams().n_embd) && c.gops > 0) pp_peak = &c;
  const double pp_gflops = pp_med * pp_flops_per_token / 1e9;
  const double pp_compute_pct = pp_peak ? 100.0 * pp_gflops / pp_peak->gops : 0.0;
  if (json) {
    nlohmann::json j = {{"model", margs.model},
                        {"type", type},
                        {"threads", s.pool().size()},
                        {"isa", active_isa()},
                        {"n_prompt", n_prompt},
                        {"n_gen", n_gen},
                        {"reps", reps},
                        {"pp_tok_s", pp_med},
                        {"tg_tok_s", tg_med},
                        {"pp_runs", pp},
                        {"tg_runs", tg},
                        {"weight_bytes", weight_bytes},
                        {"kv_bytes_per_token", kv_per_token},
                        {"state_bytes_per_sequence", state_per_seq},
                        {"bytes_per_token", per_token},
                        {"bandwidth_gb_s", bw},
                        {"bandwidth_runs", bw_runs},
                        {"bandwidth_probe", no_bandwidth ? "none" : probe_weights ? "weights" : "buffer"},
                        {"bandwidth_one_stream_gb_s", bw_one},
                        {"bandwidth_one_stream_runs", bw_one_runs},
                        {"bandwidth_streams_gb_s", bw_streams},
                        {"bandwidth_streams_runs", bw_streams_runs},
                        {"bandwidth_streams_per_thread", ReadBandwidthProbe::kStreams},
                        {"tg_roofline_tok_s", roofline_tok_s},
                        {"tg_roofline_pct", roofline_pct},
                        {"tg_roofline_pct_runs", pct_runs},
                        {"peak_rss_bytes", peak_rss_bytes()}};
    if (verify_max > 0) {
      nlohmann::json vc = nlohmann::json::array();
      for (int k = 1; k <= verify_max; ++k) {
        const double rel = verify_ms[size_t(k - 1)] / verify_ms[0];
        vc.push_back({{"k", k}, {"ms", verify_ms[size_t(k - 1)]}, {"relative", rel}, {"speedup_ceiling", double(k) / rel}});
      }
      j["verify_ctx"] = verify_ctx;
      j["verify_curve"] = vc;
    }
    if (roofline) {
      nlohmann::json pj = nlohmann::json::array();
      for (const ComputePeak& c : peaks) {
        nlohmann::json e = {{"name", c.name}, {"instruction", c.instruction}, {"gops", c.gops}};
        if (!c.missing.empty()) e["missing"] = c.missing;
        pj.push_back(e);
      }
      j["compute_peaks"] = pj;
      j["pp_flops_per_token"] = pp_flops_per_token;
      j["pp_gflops"] = pp_gflops;
      j["pp_compute_peak"] = pp_peak ? pp_peak->name : "";
      j["pp_compute_pct"] = pp_compute_pct;
    }
    if (!depth_runs.empty()) {
      nlohmann::json dj = nlohmann::json::array();
      for (const DepthRun& d : depth_runs)
        dj.push_back({{"depth", d.depth}, {"tg_tok_s", d.tg_tok_s}, {"cache_bytes", d.cache_bytes}});
      j["depth_runs"] = dj;
    }
    if (!parallel.json.is_null()) j["parallel"] = parallel.json;
    if (sparse) {
      nlohmann::json sj = sparse_ffn_json(*sparse);
      sj["tg_dense_tok_s"] = tg_dense.empty() ? 0.0 : percentile(tg_dense, 50);
      sj["tg_dense_runs"] = tg_dense;
      sj["tg_speedup"] = tg_dense.empty() ? 0.0 : tg_med / percentile(tg_dense, 50);
      sj["ffn_ms_per_token_dense"] = ffn_ms_dense.empty() ? 0.0 : percentile(ffn_ms_dense, 50);
      sj["ffn_ms_per_token_sparse"] = ffn_ms_sparse.empty() ? 0.0 : percentile(ffn_ms_sparse, 50);
      sj["ffn_speedup"] = ffn_ms_sparse.empty() || ffn_ms_dense.empty()
                              ? 0.0 : percentile(ffn_ms_dense, 50) / percentile(ffn_ms_sparse, 50);
      if (store) {
        sj["tg_bytes_read_per_token"] = store_bytes_per_token;
        sj["tg_hit_rate"] = store_hit_rate;
        sj["file_read_cold_bytes_per_s"] = file_rate.cold_bytes_per_s;
        sj["file_read_warm_bytes_per_s"] = file_rate.warm_bytes_per_s;
        sj["file_read_direct"] = file_rate.direct;
        sj["read_bound_cold_tok_s"] = read_bound(file_rate.cold_bytes_per_s);
        sj["read_bound_warm_tok_s"] = read_bound(file_rate.warm_bytes_per_s);
        sj["peak_rss_bytes"] = peak_rss_bytes();
        if (!tg_cold.empty()) {
          sj["tg_cold_tok_s"] = percentile(tg_cold, 50);
          sj["tg_cold_runs"] = tg_cold;
          sj["tg_cold_bytes_read_per_token"] = double(cold_bytes) / double(cold_tokens);
        }
      }
      j["sparse_ffn"] = sj;
    }
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  if (n_prompt > 0 || n_gen > 0)
    std::printf("| model | type | size | threads | isa | test | t/s (median of %d) |\n|---|---|---|---|---|---|---|\n", reps);
  const std::string size = format_bytes(weight_bytes);
  if (n_prompt > 0)
    std::printf("| %s | %s | %s | %d | %s | pp%lld | %.2f |\n", margs.model.c_str(), type.c_str(), size.c_str(),
                s.pool().size(), active_isa(), static_cast<long long>(n_prompt), pp_med);
  if (n_gen > 0)
    std::printf("| %s | %s | %s | %d | %s | tg%lld | %.2f |\n", margs.model.c_str(), type.c_str(), size.c_str(),
                s.pool().size(), active_isa(), static_cast<long long>(n_gen), tg_med);
  if (sparse && !tg_dense.empty())
    std::printf("| %s | %s | %s | %d | %s | tg%lld dense FFN | %.2f |\n\n%s\ntg sparse / dense = %.2fx; FFN "
                "layers %.3f ms/token sparse, %.3f dense = %.2fx (medians, runs alternating)\n",
                margs.model.c_str(), type.c_str(), size.c_str(), s.pool().size(), active_isa(),
                static_cast<long long>(n_gen), percentile(tg_dense, 50), sparse_ffn_summary(*sparse).c_str(),
                tg_med / percentile(tg_dense, 50), percentile(ffn_ms_sparse, 50), percentile(ffn_ms_dense, 50),
                percentile(ffn_ms_dense, 50) / percentile(ffn_ms_sparse, 50));
  if (store && n_gen > 0)
    std::printf("\n%s\ntg: %.2f MiB read from the file per token (%.1f%% of lookups hit); the file reads at %.0f MB/s "
                "cold (%s) and %.0f MB/s warm (page cache): the reads alone allow %.1f tok/s cold, %.1f warm; tg %.2f "
                "tok/s; peak RSS %s\n",
                sparse_ffn_summary(*sparse).c_str(), store_bytes_per_token / (1 << 20), 100.0 * store_hit_rate,
                file_rate.cold_bytes_per_s / 1e6, file_rate.direct ? "O_DIRECT" : "after fadvise DONTNEED",
                file_rate.warm_bytes_per_s / 1e6, read_bound(file_rate.cold_bytes_per_s),
                read_bound(file_rate.warm_bytes_per_s), tg_med, format_bytes(peak_rss_bytes()).c_str());
  if (store && !tg_cold.empty())
    std::printf("tg with the file dropped from the page cache before every token: %.2f tok/s (median of %zu), "
                "%.2f MiB read per token%s\n",
                percentile(tg_cold, 50), tg_cold.size(), double(cold_bytes) / double(cold_tokens) / (1 << 20),
                sparse->config().readahead ? " (--ram-readahead)" : "");
  char bw_ways[160];
  std::snprintf(bw_ways, sizeof bw_ways, "one walk a thread %.1f GB/s, %d interleaved walks a thread with prefetch %.1f GB/s",
                bw_one, ReadBandwidthProbe::kStreams, bw_streams);
  if (bw > 0 && n_gen > 0)
    std::printf("\nmemory read bandwidth %.1f GB/s (the faster of %s; medians of the runs' own); decode reads %s per "
                "token -> roofline %.1f tok/s; tg = %.1f%% of it (median of each run against the bandwidth measured "
                "beside it)\n",
                bw, bw_ways, format_bytes(per_token).c_str(), roofline_tok_s, roofline_pct);
  else if (bw > 0)
    std::printf("\nmemory read bandwidth %.1f GB/s (the faster of %s)\n", bw, bw_ways);
  if (verify_max > 0) {
    std::printf("\n| verify step of k tokens (context %lld) | ms (median) | x one token | ceiling tok/step-time |\n"
                "|---|---|---|---|\n",
                static_cast<long long>(verify_ctx));
    for (int k = 1; k <= verify_max; ++k) {
      const double rel = verify_ms[size_t(k - 1)] / verify_ms[0];
      std::printf("| %d | %.3f | %.2f | %.2fx |\n", k, verify_ms[size_t(k - 1)], rel, double(k) / rel);
    }
  }
  if (roofline) {
    std::printf("\n| compute peak (%d threads) | instruction | G op/s |\n|---|---|---|\n", s.pool().size());
    for (const ComputePeak& c : peaks) {
      if (c.missing.empty()) std::printf("| %s | %s | %.1f |\n", c.name.c_str(), c.instruction.c_str(), c.gops);
      else std::printf("| %s | - | not measured: %s |\n", c.name.c_str(), c.missing.c_str());
    }
    if (n_prompt > 0 && pp_peak)
      std::printf("\npp%lld does %.2f GFLOP per token -> %.1f GFLOP/s = %.1f%% of the %s peak\n",
                  static_cast<long long>(n_prompt), pp_flops_per_token / 1e9, pp_gflops, pp_compute_pct,
                  pp_peak->name.c_str());
    else if (n_prompt > 0)
      std::printf("\npp%lld: no %s peak on this CPU to compare with\n", static_cast<long long>(n_prompt),
                  compute_peak_for(type, s.hparams().n_embd));
  }
  if (!depth_runs.empty()) {
    std::printf("\n| depth (context tokens) | tg%lld t/s (median of %d) | x depth %lld | cache bytes (K/V + state) |\n"
                "|---|---|---|---|\n",
                static_cast<long long>(n_gen), reps, static_cast<long long>(depth_runs[0].depth));
    for (const DepthRun& d : depth_runs)
      std::printf("| %lld | %.2f | %.2f | %s |\n", static_cast<long long>(d.depth), d.tg_tok_s,
                  d.tg_tok_s / depth_runs[0].tg_tok_s, format_bytes(d.cache_bytes).c_str());
  }
  if (!parallel.text.empty()) std::printf("%s", parallel.text.c_str());
  return 0;
}

}  // namespace tern
