#include "tools/bench_spec.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/stats.h"
#include "kernels/matmul.h"
#include "runtime/generate.h"
#include "spec/draft_model.h"
#include "tools/progress.h"
#include "tools/spec_args.h"

namespace tern {

namespace {

std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("--spec-prompts ", path, ": cannot open");
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::string p;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '\\' && i + 1 < line.size()) {
        const char c = line[++i];
        p += c == 'n' ? '\n' : c;
      } else {
        p += line[i];
      }
    }
    out.push_back(std::move(p));
  }
  if (out.empty()) fail("--spec-prompts ", path, ": no prompts (one per line)");
  return out;
}

struct ModeTotals {
  int64_t tokens = 0;     // decode tokens (every generated token after the first)
  double decode_ms = 0;   // their time
  int64_t drafted = 0, accepted = 0, steps = 0;
  double tok_s() const { return decode_ms > 0 ? double(tokens) / (decode_ms / 1e3) : 0; }
};

}  // namespace

int run_spec_bench(ModelArgs& margs, const SpecConfig& spec, const SpecBenchArgs& args) {
  if (spec.source == DraftSource::None) fail("--spec-prompts needs --lookup N or --draft FILE");
  const std::vector<std::string> texts = read_prompts(args.prompts_path);
  std::shared_ptr<const GgufFile> draft_file;
  if (spec.source == DraftSource::DraftModel && spec.self_draft.empty()) draft_file = open_draft_file(spec.draft_path);
  LoadedSession ls = open_session(margs);
  Session& s = *ls.session;
  SpecConfig resolved = spec;
  if (!spec.self_draft.empty()) {
    resolve_self_draft(resolved, ls.file, s.n_threads());
    draft_file = resolved.draft_file;
  }
  std::unique_ptr<DraftModel> draft;
  if (draft_file) {
    check_draft_vocab(*ls.file, *draft_file);
    draft = std::make_unique<DraftModel>(draft_file, s.n_ctx(), 1, s.kv_type());
  }
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& t : texts) {
    std::vector<int32_t> ids = ls.tokenizer->encode(t, ls.tokenizer->add_bos_default());
    if (int64_t(ids.size()) + args.n_gen >= s.n_ctx())
      ids.resize(size_t(std::max<int64_t>(1, s.n_ctx() - args.n_gen - 1)));  // the prompt's head fits
    prompts.push_back(std::move(ids));
  }
  GenerateOptions plain;
  plain.n_predict = args.n_gen;
  plain.sampling.temperature = 0;
  GenerateOptions fast = plain;
  fast.spec = spec;
  fast.draft = draft.get();

  // Rounds alternate which mode goes first, prompt by prompt, so a slow minute of a shared
  // machine falls on both alike; each round's speedup is its two totals' ratio.
  std::vector<double> plain_runs, spec_runs, speedups;
  ModeTotals all_spec;
  int64_t identical = 0, compared = 0;
  Progress progress("bench spec", int64_t(args.reps + 1) * int64_t(prompts.size()), !args.json);
  int64_t done = 0;
  for (int r = -1; r < args.reps; ++r) {  // round -1 warms up (pages, the pool, the draft's region)
    ModeTotals tp, ts;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateResult a, b;
      for (int order = 0; order < 2; ++order) {
        const bool spec_now = (order == 0) == ((r + int(i)) % 2 == 0);
        s.reset();
        GenerateResult g = generate(s, *ls.tokenizer, prompts[i], spec_now ? fast : plain);
        ModeTotals& t = spec_now ? ts : tp;
        t.tokens += std::max<int64_t>(0, int64_t(g.ids.size()) - 1);
        for (double ms : g.metrics.tbt_ms) t.decode_ms += ms;
        t.drafted += g.metrics.n_drafted;
        t.accepted += g.metrics.n_accepted;
        t.steps += g.metrics.n_target_steps;
        (spec_now ? b : a) = std::move(g);
      }
      if (r >= 0) {
        ++compared;
        identical += a.ids == b.ids;
      }
      progress.update(++done);
    }
    if (r < 0) continue;
    plain_runs.push_back(tp.tok_s());
    spec_runs.push_back(ts.tok_s());
    speedups.push_back(tp.tok_s() > 0 ? ts.tok_s() / tp.tok_s() : 0);
    all_spec.drafted += ts.drafted;
    all_spec.accepted += ts.accepted;
    all_spec.steps += ts.steps;
    all_spec.tokens += ts.tokens;
  }
  progress.finish();
  const double acceptance = all_spec.drafted > 0 ? double(all_spec.accepted) / double(all_spec.drafted) : 0;
  const double per_step = all_spec.steps > 0 ? double(all_spec.tokens) / double(all_spec.steps) : 0;
  const double p_med = percentile(plain_runs, 50), s_med = percentile(spec_runs, 50), x_med = percentile(speedups, 50);
  if (args.json) {
    nlohmann::json j = {{"model", margs.model},
                        {"threads", s.pool().size()},
                        {"isa", active_isa()},
                        {"drafter", draft_source_name(spec.source)},
                        {"draft", spec.self_draft.empty() ? spec.draft_path : "self:" + spec.self_draft},
                        {"draft_max", spec.n_draft_max},
                        {"prompts", prompts.size()},
                        {"n_gen", args.n_gen},
                        {"reps", args.reps},
                        {"plain_tok_s", p_med},
                        {"spec_tok_s", s_med},
                        {"speedup", x_med},
                        {"plain_runs", plain_runs},
                        {"spec_runs", spec_runs},
                        {"speedup_runs", speedups},
                        {"acceptance_rate", acceptance},
                        {"tokens_per_step", per_step},
                        {"identical_outputs", identical},
                        {"compared_outputs", compared},
                        {"peak_rss_bytes", peak_rss_bytes()}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("| model | drafter | prompts | plain decode tok/s | speculative tok/s | speedup (median of %d) | "
              "acceptance | tokens / target step | same tokens |\n|---|---|---|---|---|---|---|---|---|\n",
              args.reps);
  std::printf("| %s | %s | %zu | %.1f | %.1f | %.2fx [%.2f-%.2f] | %.1f%% | %.2f | %lld / %lld |\n", margs.model.c_str(),
              spec.source == DraftSource::Lookup ? str_cat("lookup ", spec.ngram.ngram_max).c_str()
              : spec.self_draft.empty()          ? str_cat("draft ", spec.draft_path).c_str()
                                                 : str_cat("self, ", spec.self_draft).c_str(),
              prompts.size(), p_med, s_med, x_med, *std::min_element(speedups.begin(), speedups.end()),
              *std::max_element(speedups.begin(), speedups.end()), 100 * acceptance, per_step,
              static_cast<long long>(identical), static_cast<long long>(compared));
  return 0;
}

}  // namespace tern
