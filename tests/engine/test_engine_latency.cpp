// Latency objectives in the engine (a random-weight model of the stories260K shape, no shared
// files): the step-cost calibration and the TBT target it enables, the refusal of targets
// below one decode step, the queue-time limit (EngineOverloaded with a Retry-After), and the
// per-request and per-engine SLO accounting. Timing-independent: every check holds on any
// machine speed (tests never assert timings).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "engine_test_util.h"

namespace tern {
namespace {

using tern::testing::Collected;
using tern::testing::drive;
using tern::testing::greedy;
using tern::testing::run_alone;
using tern::testing::Sink;

struct Fixture {
  std::shared_ptr<const GgufFile> file = open_model_file(tern::testing::synthetic_model_path(DType::F32));
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
};

std::vector<int32_t> prompt(int64_t n, int32_t seed, int64_t n_vocab) {
  std::vector<int32_t> v{1};
  for (int64_t i = 1; i < n; ++i) v.push_back(int32_t(3 + (seed * 131 + i * 17) % (n_vocab - 3)));
  return v;
}

EngineConfig base_config() {
  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.n_ctx = 256;
  cfg.n_parallel = 16;
  return cfg;
}

TEST(EngineLatency, AnAutomaticTargetIsCalibratedAndChangesNoToken) {
  Fixture f;
  EngineConfig cfg = base_config();
  cfg.tbt_target_ms = EngineConfig::kTbtAuto;
  cfg.tbt_auto_floor_ms = 0;  // this model's steps take well under a millisecond: let the target bind
  Engine engine(f.file, f.tok, cfg);
  EngineMetrics m0 = engine.metrics();
  ASSERT_GT(m0.decode_step_ms, 0.0);
  // 3x one decode step, or 2x a decode step of the 16 sequences the arena is sized for.
  EXPECT_GE(m0.tbt_target_ms, 3 * m0.decode_step_ms - 1e-9);

  Sink sink;
  std::vector<uint64_t> ids;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i) {
    prompts.push_back(prompt(10 + 15 * i, i, f.tok->n_vocab()));
    RequestParams p;
    p.prompt_ids = prompts.back();
    p.max_tokens = 24;
    p.sampling = greedy();
    p.ignore_eos = true;
    ids.push_back(engine.add_request(p, sink.callback()));
    if (i % 2) engine.step();  // arrivals while others decode: prefill beside decodes
  }
  drive(engine);
  for (size_t i = 0; i < ids.size(); ++i) {
    const Collected c = sink.get(ids[i]);
    const GenerateResult alone = run_alone(f.file, *f.tok, prompts[i], 24, greedy(), {}, true);
    EXPECT_EQ(c.ids, alone.ids) << "request " << i;
    EXPECT_TRUE(c.metrics.ttft_met);  // no TTFT target: met by definition
  }
  const EngineMetrics m = engine.metrics();
  int64_t counted = 0;
  for (int64_t n : m.step_ms_counts) counted += n;
  EXPECT_EQ(counted, m.steps);
  EXPECT_GT(m.step_ms_sum, 0.0);
  EXPECT_LE(m.steps_over_target, m.steps);
  EXPECT_GT(m.steps_prefill_cut, 0);  // 3 decode steps leave no room for a 100-token prompt
  EXPECT_EQ(m.slo_good + m.slo_tbt_missed, 12);  // every completion judged against the target
  EXPECT_EQ(m.slo_ttft_missed, 0);
  EXPECT_GE(m.step_cost_error_p90, m.step_cost_error_p50);
}

TEST(EngineLatency, TheAutomaticTargetHasAFloorNobodySees) {
  // A tiny model decodes in a fraction of a millisecond: cutting its steps that short would
  // only cost throughput, so auto is at least tbt_auto_floor_ms.
  Fixture f;
  EngineConfig cfg = base_config();
  cfg.tbt_target_ms = EngineConfig::kTbtAuto;
  Engine engine(f.file, f.tok, cfg);
  const EngineMetrics m = engine.metrics();
  EXPECT_GE(m.tbt_target_ms, 50.0);
  EXPECT_GE(m.tbt_target_ms, 3 * m.decode_step_ms - 1e-9);
  cfg.tbt_auto_floor_ms = -1;
  EXPECT_THROW(Engine(f.file, f.tok, cfg), Error);
}

TEST(EngineLatency, ATargetBelowOneDecodeStepIsRefusedNamingTheMinimum) {
  Fixture f;
  EngineConfig cfg = base_config();
  cfg.tbt_target_ms = 1e-6;
  try {
    Engine engine(f.file, f.tok, cfg);
    FAIL() << "a 1 ns target was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("below one decode step"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("the smallest target is"), std::string::npos) << e.what();
  }
}

TEST(EngineLatency, BadTargetsAreErrors) {
  Fixture f;
  for (double bad : {-5.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    EngineConfig cfg = base_config();
    cfg.tbt_target_ms = bad;
    EXPECT_THROW(Engine(f.file, f.tok, cfg), Error) << bad;
    cfg = base_config();
    cfg.ttft_target_ms = bad;
    EXPECT_THROW(Engine(f.file, f.tok, cfg), Error) << bad;
    cfg = base_config();
    cfg.max_queue_ms = bad;
    EXPECT_THROW(Engine(f.file, f.tok, cfg), Error) << bad;
  }
  EngineConfig cfg = base_config();
  cfg.tbt_target_ms = EngineConfig::kTbtAuto;
  cfg.tbt_auto_factor = 0.5;
  EXPECT_THROW(Engine(f.file, f.tok, cfg), Error);
}

TEST(EngineLatency, AQueueOverItsTimeLimitRefusesWithARetryAfter) {
  Fixture f;
  EngineConfig cfg = base_config();
  cfg.max_queue_ms = 1e-3;  // any queued prompt token is too much
  cfg.max_waiting = 1000;
  Engine engine(f.file, f.tok, cfg);
  Sink sink;
  RequestParams p;
  p.prompt_ids = prompt(100, 1, f.tok->n_vocab());
  p.max_tokens = 4;
  p.sampling = greedy();
  // The first finds an empty queue; the second queues behind its 100 prompt tokens.
  const uint64_t first = engine.add_request(p, sink.callback());
  EXPECT_GT(first, 0u);
  try {
    engine.add_request(p, sink.callback());
    FAIL() << "a request behind 100 queued tokens was accepted under a 1 us queue limit";
  } catch (const EngineOverloaded& e) {
    EXPECT_GE(e.retry_after_s(), 1.0);
    EXPECT_NE(std::string(e.what()).find("--max-queue-ms"), std::string::npos) << e.what();
  }
  EXPECT_EQ(engine.metrics().requests_refused_queue, 1);
  drive(engine);
  // The queue drained: the same request is admitted again; the first one was not harmed.
  EXPECT_EQ(sink.get(first).reason, FinishReason::Length);
  EXPECT_GT(engine.add_request(p, sink.callback()), 0u);
  drive(engine);
  EXPECT_EQ(engine.metrics().requests_finished, 2);
}

TEST(EngineLatency, TtftObjectivesAreJudgedPerCompletion) {
  Fixture f;
  for (double target : {1e-6, 1e9}) {
    EngineConfig cfg = base_config();
    cfg.ttft_target_ms = target;
    Engine engine(f.file, f.tok, cfg);
    Sink sink;
    std::vector<uint64_t> ids;
    for (int i = 0; i < 4; ++i) {
      RequestParams p;
      p.prompt_ids = prompt(20, i, f.tok->n_vocab());
      p.max_tokens = 3;
      p.sampling = greedy();
      ids.push_back(engine.add_request(p, sink.callback()));
    }
    drive(engine);
    const bool met = target > 1;
    for (uint64_t id : ids) EXPECT_EQ(sink.get(id).metrics.ttft_met, met);
    const EngineMetrics m = engine.metrics();
    EXPECT_EQ(m.slo_good, met ? 4 : 0);
    EXPECT_EQ(m.slo_ttft_missed, met ? 0 : 4);
    EXPECT_EQ(m.slo_tbt_missed, 0);  // no TBT target
    EXPECT_EQ(m.tbt_target_ms, 0.0);
  }
}

}  // namespace
}  // namespace tern
