#include "dist/pipeline_report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace tern::dist {
namespace {

// [first start, last end] of the step's intervals; {0, 0} when there are none.
std::pair<double, double> step_span(std::span<const BusyInterval> intervals, int64_t step) {
  double t0 = std::numeric_limits<double>::infinity(), t1 = -t0;
  for (const BusyInterval& b : intervals)
    if (b.step == step) {
      t0 = std::min(t0, b.t0);
      t1 = std::max(t1, b.t1);
    }
  return t0 <= t1 ? std::make_pair(t0, t1) : std::make_pair(0.0, 0.0);
}

}  // namespace

PipelineStats pipeline_stats(std::span<const BusyInterval> intervals, int64_t step, int stages) {
  PipelineStats s;
  s.stages = stages;
  s.stage_busy_s.assign(size_t(stages), 0.0);
  const auto [t0, t1] = step_span(intervals, step);
  s.makespan_s = t1 - t0;
  for (const BusyInterval& b : intervals) {
    if (b.step != step || b.tp_rank != 0 || b.stage < 0 || b.stage >= stages) continue;
    s.stage_busy_s[size_t(b.stage)] += b.t1 - b.t0;
    if (b.stage == 0) s.micro_batches = std::max(s.micro_batches, b.micro_batch + 1);
  }
  double busy = 0;
  for (double v : s.stage_busy_s) busy += v;
  s.bubble = s.makespan_s > 0 ? std::clamp(1.0 - busy / (double(stages) * s.makespan_s), 0.0, 1.0) : 0.0;
  if (s.micro_batches > 0) s.ideal_bubble = double(stages - 1) / double(s.micro_batches + stages - 1);
  return s;
}

std::string timeline_chart(std::span<const BusyInterval> intervals, int64_t step, int width) {
  const auto [t0, t1] = step_span(intervals, step);
  std::map<int, std::string> lines;  // rank -> its row
  for (const BusyInterval& b : intervals)
    if (b.step == step) lines.emplace(b.rank, std::string(size_t(width), '.'));
  if (lines.empty() || t1 <= t0) return "";
  const double scale = double(width) / (t1 - t0);
  std::map<int, std::pair<int, int>> who;  // rank -> (stage, tp rank)
  for (const BusyInterval& b : intervals) {
    if (b.step != step) continue;
    who[b.rank] = {b.stage, b.tp_rank};
    const int c0 = std::clamp(int(std::floor((b.t0 - t0) * scale)), 0, width - 1);
    const int c1 = std::clamp(int(std::ceil((b.t1 - t0) * scale)), c0 + 1, width);
    for (int c = c0; c < c1; ++c) lines[b.rank][size_t(c)] = char('0' + b.micro_batch % 10);
  }
  std::string out;
  for (const auto& [rank, line] : lines)
    out += "rank " + std::to_string(rank) + " (stage " + std::to_string(who[rank].first) + ", tp " +
           std::to_string(who[rank].second) + ") |" + line + "|\n";
  return out;
}

}  // namespace tern::dist
