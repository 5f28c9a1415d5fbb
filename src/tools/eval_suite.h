#pragma once
// The suite file of `tern eval` (base-model replacement, docs/eval.md) and its gate.
//
// A suite is a JSON object:
//   {"name": "stories",                           (optional: the file's stem)
//    "defaults": {"recipe": {...}, "max_regression": 0.05, "thresholds": {...}},   (optional)
//    "scenarios": [{
//       "name": "animals",                        (letters, digits, '-', '_', '.')
//       "train": "animals.train.jsonl",           the fine-tuning data (tern finetune --data)
//       "val": "animals.val.jsonl",               (optional: --val)
//       "recipe": {"rank": 8, "steps": 200, ...}, tern finetune's options (below), over the defaults'
//       "online_adapter": "animals.online.gguf",  the adapter production runs on the online base
//                                                 (reused; trained with the recipe when missing)
//       "eval": "animals.eval.jsonl",             held-out {"prompt", "reference"} lines
//       "checks": [{"name": "mentions-cat", "contains": "cat"}, ...],   (optional)
//       "thresholds": {"ppl": {"max": 6}, "rouge_l": {"min": 0.2}},     (optional)
//       "max_regression": 0.05 | {"ppl": 0.02, ...},   (optional, default 0.05)
//       "production": {"ppl": 4.1, "rouge_l": 0.31}     (optional: the recorded figures)
//    }]}
// Relative paths are relative to the suite file's folder. Metrics: "ppl" (of the references,
// lower is better), "exact_match", "token_f1", "rouge_l" and "check:<name>" (pass rates, higher
// is better). A missing or mistyped field, an unknown key and an unknown metric are errors
// that name the suite file and the scenario.
//
// Recipe keys (tern finetune's options): rank, alpha, dropout, targets (string or array),
// steps (required), lr, min_lr, warmup, batch, grad_accum, ctx, seed, weight_decay, clip,
// eos (bool), no_shuffle (bool).
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tools/text_metrics.h"

namespace tern {

struct EvalItem {
  std::string prompt, reference;
};

struct MetricBound {
  std::optional<double> min, max;
};

using MetricValues = std::map<std::string, double>;  // metric name -> value

struct EvalScenario {
  std::string name;
  std::string train, val;      // paths (val may be empty)
  nlohmann::json recipe;       // the defaults' recipe with the scenario's keys over it
  std::string online_adapter;  // path
  std::string eval;            // path
  std::vector<EvalItem> items; // eval's lines
  std::vector<TextCheck> checks;
  std::map<std::string, MetricBound> thresholds;
  std::map<std::string, double> max_regression;  // metric -> relative tolerance ("*": default)
  MetricValues production;

  // The tolerance for `metric` (its own, else the scenario's default).
  double tolerance(const std::string& metric) const;
  // Every metric this scenario reports, in table order.
  std::vector<std::string> metric_names() const;
};

struct EvalSuite {
  std::string path, name;
  std::vector<EvalScenario> scenarios;
};

// Reads and validates the suite (and each scenario's eval file). Throws tern::Error naming the
// suite file, the scenario and the field.
EvalSuite load_eval_suite(const std::string& path);

// tern finetune's arguments for a recipe (without --lora, -m, --data, -o); throws tern::Error
// naming `what` for an unknown key or a value of the wrong type.
std::vector<std::string> recipe_arguments(const nlohmann::json& recipe, const std::string& what);

bool lower_is_better(const std::string& metric);

// The gate on one scenario: the candidate's metrics against the thresholds, against the online
// base's (no worse than its value by more than the tolerance, relative) and against the
// recorded production figures (the same rule). A metric missing on a side is not compared.
struct GateCheck {
  std::string metric, against;  // against: "threshold", "online", "production"
  double limit = 0.0;           // the value the candidate had to reach
  bool pass = true;
};
struct GateVerdict {
  bool pass = true;
  std::vector<GateCheck> checks;
  std::vector<std::string> failures;  // readable: "rouge_l 0.21 < 0.25 (online 0.26 - 5%)"
  // The verdict of one metric's row: "pass", "FAIL" or "-" (nothing to compare).
  std::string row_verdict(const std::string& metric) const;
};
GateVerdict gate_scenario(const EvalScenario& sc, const MetricValues& online, const MetricValues& candidate);

}  // namespace tern
