#include "tools/parallel_report.h"

#include <cstdio>

#include "dist/parallel_model.h"
#include "dist/pipeline_report.h"
#include "runtime/context_fit.h"
#include "tools/cli_util.h"

namespace tern {

ParallelBenchReport parallel_bench_report(const std::function<void()>& run_prompt_step) {
  ParallelBenchReport r;
  const dist::ParallelLayout* layout = dist::active_layout();
  if (!layout) return r;
  r.json["layout"] = {{"tp", layout->tp}, {"pp", layout->pp}, {"micro_batches", layout->micro_batch_count()}};
  r.text += "\nlayout " + layout->describe() + "\n| rank | stage | tp rank | layers | weights | K/V per token (f32) |\n"
            "|---|---|---|---|---|---|\n";
  nlohmann::json ranks = nlohmann::json::array();
  for (const dist::RankInfo& i : dist::rank_infos()) {
    ranks.push_back({{"rank", i.rank},
                     {"stage", i.stage},
                     {"tp_rank", i.tp_rank},
                     {"layer_begin", i.layer_begin},
                     {"layer_end", i.layer_end},
                     {"weight_bytes", i.weight_bytes},
                     {"kv_bytes_per_token", i.kv_bytes_per_token}});
    char line[256];
    std::snprintf(line, sizeof line, "| %d | %d | %d | %lld-%lld | %s | %s |\n", i.rank, i.stage, i.tp_rank,
                  static_cast<long long>(i.layer_begin), static_cast<long long>(i.layer_end - 1),
                  format_bytes(i.weight_bytes).c_str(), format_bytes(i.kv_bytes_per_token).c_str());
    r.text += line;
  }
  r.json["ranks"] = ranks;
  if (layout->pp == 1 || !run_prompt_step) return r;
  dist::collect_timeline();  // drops the measurement steps' intervals
  run_prompt_step();
  const std::vector<dist::BusyInterval> iv = dist::collect_timeline();
  if (iv.empty()) return r;
  const int64_t step = iv.front().step;
  const dist::PipelineStats st = dist::pipeline_stats(iv, step, layout->pp);
  nlohmann::json timeline = nlohmann::json::array();
  const double t0 = [&] {
    double m = iv.front().t0;
    for (const auto& b : iv) m = std::min(m, b.t0);
    return m;
  }();
  for (const auto& b : iv)
    if (b.step == step)
      timeline.push_back({{"rank", b.rank},
                          {"stage", b.stage},
                          {"tp_rank", b.tp_rank},
                          {"micro_batch", b.micro_batch},
                          {"n_tokens", b.n_tokens},
                          {"start_ms", (b.t0 - t0) * 1e3},
                          {"end_ms", (b.t1 - t0) * 1e3}});
  r.json["pipeline"] = {{"stages", st.stages},
                        {"micro_batches", st.micro_batches},
                        {"makespan_ms", st.makespan_s * 1e3},
                        {"stage_busy_ms", [&] {
                           nlohmann::json a = nlohmann::json::array();
                           for (double v : st.stage_busy_s) a.push_back(v * 1e3);
                           return a;
                         }()},
                        {"bubble", st.bubble},
                        {"ideal_bubble", st.ideal_bubble},
                        {"timeline", timeline}};
  char line[256];
  std::snprintf(line, sizeof line,
                "\npipeline: one prompt step, %d stages x %d micro-batches: %.2f ms; bubble %.1f%% (measured) vs "
                "%.1f%% = (p-1)/(m+p-1)\n",
                st.stages, st.micro_batches, st.makespan_s * 1e3, 100 * st.bubble, 100 * st.ideal_bubble);
  r.text += line;
  r.text += dist::timeline_chart(iv, step, 60);
  return r;
}

}  // namespace tern
