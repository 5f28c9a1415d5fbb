#pragma once
// What `tern eval` reports (docs/eval.md): the three-way table of each scenario (recorded
// production figures | online base + its adapter | candidate base + the adapter retrained on it,
// with the thresholds and the gate's verdict per metric), the same as JSON, and an SVG chart of
// small multiples (one panel per metric, bars per scenario).
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/eval_suite.h"

namespace tern {

struct EvalSample {
  std::string prompt, reference, online, candidate;  // generated texts
};

struct ScenarioResult {
  const EvalScenario* scenario = nullptr;
  std::string online_adapter, candidate_adapter;  // paths
  bool online_trained = false, candidate_trained = false;  // in this run (else reused)
  double online_train_s = 0, candidate_train_s = 0;
  MetricValues online, candidate;                 // base + adapter
  MetricValues online_base, candidate_base;       // the bases alone (--show-bases; else empty)
  GateVerdict verdict;
  std::vector<EvalSample> samples;                // the first few prompts
};

// The plain-text table of one scenario (show_bases: two more columns, the bases alone).
void print_scenario_table(FILE* out, const ScenarioResult& r, bool show_bases);
nlohmann::json scenario_json(const ScenarioResult& r);
std::string eval_svg_chart(const std::vector<ScenarioResult>& results, const std::string& title);

}  // namespace tern
