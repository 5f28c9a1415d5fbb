#include "tools/latency_args.h"

#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace tern {

double parse_tbt_target(const std::string& text) {
  if (text == "auto") return EngineConfig::kTbtAuto;
  if (text == "off") return 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v <= 0)
    fail("--tbt-target-ms must be a positive number of milliseconds, auto or off, got '", text, "'");
  return v;
}

void add_latency_options(CLI::App& app, LatencyArgs& args, bool with_queue_limit) {
  app.add_option("--tbt-target-ms", args.tbt_target,
                 "time-between-tokens target: a step with decoding requests takes only the prefill that keeps it "
                 "under MS (step times predicted by a cost model learnt online); auto: 3x a one-sequence decode "
                 "step measured at start, or 2x a decode step of --parallel sequences, and at least 50 ms; off: the "
                 "--batch-tokens budget alone")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            try {
              parse_tbt_target(v);
              return "";
            } catch (const Error& e) {
              return e.what();
            }
          },
          "MS|auto|off"));
  app.add_option("--ttft-target-ms", args.ttft_target_ms,
                 "time-to-first-token objective, reported per request and in the goodput (0: none)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  if (with_queue_limit)
    app.add_option("--max-queue-ms", args.max_queue_ms,
                   "refuse (503 + Retry-After) a request predicted to wait longer than MS before its prompt "
                   "starts (0: never)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
}

void apply_latency_args(const LatencyArgs& args, EngineConfig& cfg) {
  cfg.tbt_target_ms = parse_tbt_target(args.tbt_target);
  if (!std::isfinite(args.ttft_target_ms) || args.ttft_target_ms < 0)
    fail("--ttft-target-ms must be a positive number of milliseconds (0: none), got ", args.ttft_target_ms);
  if (!std::isfinite(args.max_queue_ms) || args.max_queue_ms < 0)
    fail("--max-queue-ms must be a positive number of milliseconds (0: no limit), got ", args.max_queue_ms);
  cfg.ttft_target_ms = args.ttft_target_ms;
  cfg.max_queue_ms = args.max_queue_ms;
}

}  // namespace tern
