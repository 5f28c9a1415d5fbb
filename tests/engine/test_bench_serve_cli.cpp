// `tern bench-serve`: runs end to end on a small model and reports the documented JSON fields.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace tern {
namespace {

using tern::testing::run_command;
using tern::testing::shared_path;

nlohmann::json bench(const std::string& args) {
  std::string out, err;
  const int rc = run_command(std::string(TERN_BINARY) + " bench-serve " + args, &out, &err);
  EXPECT_EQ(rc, 0) << err;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not JSON: " << out << "\n" << err;
  }
  return j;
}

TEST(BenchServeCli, SyntheticPromptsAtAFixedConcurrency) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  const auto j = bench("-m " + shared_path("models/stories260K.gguf") +
                       " -t 2 --num-prompts 12 --concurrency 4 --max-tokens 8 --input-len 20 --json");
  for (const char* key : {"request_throughput", "output_tok_s", "total_tok_s", "ttft_ms_p50", "ttft_ms_p99",
                          "tbt_ms_p50", "tbt_ms_p99", "e2e_ms_p50", "kv_waste_pct", "prefix_hit_rate",
                          "peak_rss_bytes", "kv_bytes", "kv_used_bytes_peak", "preemptions"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j.value("completed", 0), 12);
  EXPECT_EQ(j.value("failed", -1), 0);
  EXPECT_EQ(j.value("output_tokens", 0), 12 * 8);
  EXPECT_EQ(j.value("max_running", 0), 4);
  EXPECT_GT(j.value("output_tok_s", 0.0), 0.0);
  EXPECT_GE(j.value("kv_waste_pct", -1.0), 0.0);
  EXPECT_LT(j.value("kv_waste_pct", 100.0), 100.0);
  EXPECT_GT(j.value("peak_rss_bytes", 0), 0);
  // Without a drafter the report is what it was: no speculative fields.
  EXPECT_FALSE(j.contains("spec_drafted"));
  EXPECT_FALSE(j.contains("spec_acceptance_rate"));
}

// A state-space model is served with one recurrent state per running request: --parallel of
// them, so at most that many run at once, and every request completes.
TEST(BenchServeCli, AStateSpaceModelRunsWithItsStateSlots) {
  const std::string path = ::testing::TempDir() + "tern_bench_serve_mamba_" + std::to_string(::getpid()) + ".gguf";
  std::string out, err;
  ASSERT_EQ(run_command(std::string(TERN_BINARY) + " synth --shape mamba-tiny -o " + path, &out, &err), 0) << err;
  const auto j = bench("-m " + path + " -t 2 --num-prompts 10 --concurrency 8 --parallel 3 --max-tokens 6 --input-len 20 --json");
  std::remove(path.c_str());
  EXPECT_EQ(j.value("completed", 0), 10);
  EXPECT_EQ(j.value("failed", -1), 0);
  EXPECT_EQ(j.value("output_tokens", 0), 10 * 6);
  EXPECT_EQ(j.value("state_slots", 0), 3);
  EXPECT_EQ(j.value("max_running", 0), 3);
  // No K/V at all; per layer the conv window (d_conv - 1 = 3 inputs of the 128 inner channels)
  // and the 128 x 16 SSM state, f32, over the 3 layers.
  EXPECT_EQ(j.value("kv_bytes_per_token", -1), 0);
  EXPECT_EQ(j.value("state_bytes_per_sequence", 0), 3 * (3 * 128 + 128 * 16) * 4);
}

TEST(BenchServeCli, ShareGptPromptsWithPoissonArrivalsAndATightArena) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  TERN_REQUIRE_SHARED("data/prompts/ShareGPT_V3_filtered_500.json");
  // 150 KiB of f16 KV (bench-serve's default type) holds 15 blocks of 16 tokens (640 bytes a
  // token): about two of these requests at a time, so they queue and preempt, and still none
  // fails. The same arena in f32 (1280 bytes a token) holds 7 blocks.
  const std::string args = "-m " + shared_path("models/stories260K.gguf") + " --prompts " +
                           shared_path("data/prompts/ShareGPT_V3_filtered_500.json") +
                           " -t 2 --num-prompts 10 --request-rate 200 --max-tokens 6 --max-prompt-tokens 100"
                           " --kv-memory 150K --json";
  const auto j = bench(args);
  EXPECT_EQ(j.value("completed", 0), 10);
  EXPECT_EQ(j.value("failed", -1), 0);
  EXPECT_EQ(j.value("output_tokens", 0), 60);
  EXPECT_EQ(j.value("kv_type", ""), "f16");
  EXPECT_EQ(j.value("kv_bytes", 0), 150 * 1024 / (16 * 640) * 16 * 640);
  EXPECT_EQ(j.value("kv_blocks_total", 0), 15);
  EXPECT_EQ(j.value("kv_bytes_per_token", 0), 640);
  EXPECT_EQ(j.value("state_bytes_per_sequence", -1), 0);
  const auto f32 = bench(args + " --kv-type f32");
  EXPECT_EQ(f32.value("completed", 0), 10);
  EXPECT_EQ(f32.value("kv_type", ""), "f32");
  EXPECT_EQ(f32.value("kv_bytes", 0), 150 * 1024 / (16 * 1280) * 16 * 1280);
  EXPECT_EQ(f32.value("kv_blocks_total", 0), 7);
}

TEST(BenchServeCli, BadArgumentsAreUsageErrors) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  std::string out, err;
  const std::string m = " -m " + shared_path("models/stories260K.gguf");
  EXPECT_EQ(run_command(std::string(TERN_BINARY) + " bench-serve" + m + " --concurrency 2 --request-rate 3", &out, &err), 2);
  EXPECT_EQ(run_command(std::string(TERN_BINARY) + " bench-serve" + m + " --kv-type bf16", &out, &err), 2);
  EXPECT_NE(err.find("--kv-type"), std::string::npos) << err;
  EXPECT_EQ(run_command(std::string(TERN_BINARY) + " bench-serve" + m + " --kv-memory 12Q", &out, &err), 1);
  EXPECT_NE(err.find("unknown size unit"), std::string::npos) << err;
  EXPECT_EQ(run_command(std::string(TERN_BINARY) + " bench-serve" + m + " --prompts /nonexistent.json", &out, &err), 1);
  EXPECT_NE(err.find("cannot open prompts file"), std::string::npos) << err;
}

TEST(BenchServeCli, LatencyTargetsAndGoodput) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string m = "-m " + shared_path("models/stories260K.gguf") +
                        " -t 2 --num-prompts 8 --max-tokens 6 --input-len 24 --json";
  // The default: an automatic TBT target, calibrated at start, and the goodput judged by it.
  const auto a = bench(m + " --concurrency 4");
  for (const char* key : {"tbt_target_ms", "decode_step_ms", "goodput_req_s", "goodput_tok_s", "good_requests",
                          "slo_attainment_pct", "tbt_within_target_pct", "step_ms_p50", "step_ms_p99", "step_ms_max",
                          "steps", "steps_over_target", "steps_prefill_cut", "step_cost_error_p50"})
    EXPECT_TRUE(a.contains(key)) << key;
  EXPECT_GT(a.value("tbt_target_ms", 0.0), 0.0);
  EXPECT_GE(a.value("tbt_target_ms", 0.0), 3 * a.value("decode_step_ms", 1e9) - 1e-9);
  EXPECT_GE(a.value("tbt_target_ms", 0.0), 50.0);  // the floor: stories260K decodes in ~0.1 ms
  EXPECT_EQ(a["goodput_slo"].value("tpot_ms", 0.0), a.value("tbt_target_ms", -1.0));
  EXPECT_GT(a.value("steps", 0), 0);
  // Off: no target; an objective no request can meet gives a goodput of 0.
  const auto off = bench(m + " --concurrency 4 --tbt-target-ms off --goodput ttft:0.000001");
  EXPECT_EQ(off.value("tbt_target_ms", -1.0), 0.0);
  EXPECT_EQ(off.value("good_requests", -1), 0);
  EXPECT_EQ(off.value("goodput_req_s", -1.0), 0.0);
  EXPECT_EQ(off.value("completed", 0), 8);
  // One every request meets.
  const auto all = bench(m + " --concurrency 4 --goodput ttft:1000000 tpot:1000000 e2el:1000000 tbt:1000000");
  EXPECT_EQ(all.value("good_requests", -1), 8);
  // No stream may pause longer than 1 ns: none is good (the tbt objective is every gap's).
  const auto gap = bench(m + " --concurrency 4 --goodput tbt:0.000001");
  EXPECT_EQ(gap.value("good_requests", -1), 0);
  EXPECT_DOUBLE_EQ(all.value("slo_attainment_pct", 0.0), 100.0);
}

TEST(BenchServeCli, SavedPromptsCarryTheArrivalsOfAnOpenLoop) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string path = ::testing::TempDir() + "tern_bench_prompts.json";
  const auto j = bench("-m " + shared_path("models/stories260K.gguf") +
                       " -t 2 --num-prompts 6 --max-tokens 4 --input-len 16 --request-rate 50 --json --save-prompts " + path);
  EXPECT_EQ(j.value("completed", 0), 6);
  std::ifstream in(path);
  const auto saved = nlohmann::json::parse(in);
  ASSERT_EQ(saved["prompts"].size(), 6u);
  ASSERT_EQ(saved["arrival_s"].size(), 6u);
  EXPECT_EQ(saved.value("request_rate", 0.0), 50.0);
  for (size_t i = 1; i < 6; ++i) EXPECT_GE(saved["arrival_s"][i].get<double>(), saved["arrival_s"][i - 1].get<double>());
  std::remove(path.c_str());
}

TEST(BenchServeCli, BadLatencyTargetsAreUsageErrors) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  std::string out, err;
  const std::string cmd = std::string(TERN_BINARY) + " bench-serve -m " + shared_path("models/stories260K.gguf");
  for (const char* bad : {"0", "-3", "fast", "nan", "inf"}) {
    EXPECT_EQ(run_command(cmd + " --tbt-target-ms " + bad, &out, &err), 2) << bad;
    EXPECT_NE(err.find("--tbt-target-ms"), std::string::npos) << err;
  }
  EXPECT_EQ(run_command(cmd + " --ttft-target-ms -1", &out, &err), 2);
  EXPECT_EQ(run_command(cmd + " --goodput latency:5", &out, &err), 1);
  EXPECT_NE(err.find("--goodput takes KEY:MS"), std::string::npos) << err;
  // --save-prompts over an input or into a directory: refused before anything runs.
  const std::string prompts = shared_path("data/prompts/ShareGPT_V3_filtered_500.json");
  if (std::ifstream(prompts)) {
    EXPECT_EQ(run_command(cmd + " --prompts " + prompts + " --save-prompts " + prompts, &out, &err), 1);
    EXPECT_NE(err.find(prompts), std::string::npos) << err;
  }
  EXPECT_EQ(run_command(cmd + " --save-prompts " + shared_path("models/stories260K.gguf"), &out, &err), 1);
  EXPECT_EQ(run_command(cmd + " --save-prompts " + ::testing::TempDir(), &out, &err), 1);
  // A positive target below one decode step: refused naming the minimum.
  EXPECT_EQ(run_command(cmd + " --tbt-target-ms 0.000001 --num-prompts 2", &out, &err), 1);
  EXPECT_NE(err.find("the smallest target is"), std::string::npos) << err;
}

// --lookup N --spec-compare: the same workload plainly, then with prompt lookup, on two engines;
// greedy, so both runs emit the same tokens, and the speculative one had drafts accepted.
TEST(BenchServeCli, SpecCompareReportsBothRunsAndTheirRatios) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string m = "-m " + shared_path("models/stories260K.gguf") +
                        " -t 2 --num-prompts 8 --concurrency 4 --max-tokens 48 --input-len 24 --lookup 3";
  const auto j = bench(m + " --spec-compare --json");
  ASSERT_TRUE(j.contains("plain")) << j.dump();
  ASSERT_TRUE(j.contains("speculative")) << j.dump();
  const auto& plain = j["plain"];
  const auto& spec = j["speculative"];
  for (const auto* row : {&plain, &spec}) {
    EXPECT_EQ(row->value("completed", 0), 8);
    EXPECT_EQ(row->value("failed", -1), 0);
    EXPECT_EQ(row->value("output_tokens", 0), 8 * 48);
    EXPECT_GT(row->value("output_tok_s", 0.0), 0.0);
    for (const char* key : {"spec_drafted", "spec_accepted", "spec_acceptance_rate", "spec_tokens_per_step",
                            "tbt_ms_mean", "tbt_ms_p50"})
      EXPECT_TRUE(row->contains(key)) << key;
  }
  EXPECT_EQ(plain.value("spec_drafted", -1), 0);
  EXPECT_EQ(plain.value("spec_acceptance_rate", -1.0), 0.0);
  EXPECT_GT(spec.value("spec_drafted", 0), 0);
  EXPECT_GT(spec.value("spec_accepted", 0), 0);
  EXPECT_LE(spec.value("spec_accepted", 0), spec.value("spec_drafted", 0));
  EXPECT_GT(spec.value("spec_acceptance_rate", 0.0), 0.0);
  EXPECT_NEAR(spec.value("spec_acceptance_rate", 0.0),
              double(spec.value("spec_accepted", 0)) / double(spec.value("spec_drafted", 1)), 1e-9);
  EXPECT_GT(spec.value("spec_tokens_per_step", 0.0), 1.0);
  EXPECT_NEAR(j.value("speedup_output_tok_s", 0.0), spec.value("output_tok_s", 0.0) / plain.value("output_tok_s", 1.0),
              1e-9);
  ASSERT_TRUE(j.contains("tbt_ratio"));
  EXPECT_NEAR(j["tbt_ratio"].value("mean", 0.0), spec.value("tbt_ms_mean", 0.0) / plain.value("tbt_ms_mean", 1.0), 1e-9);
  EXPECT_TRUE(j["tbt_ratio"].contains("p50"));
  EXPECT_EQ(j["spec"].value("source", ""), "lookup");

  // One speculative run: its report gains the same fields.
  const auto one = bench(m + " --json");
  EXPECT_GT(one.value("spec_accepted", 0), 0);
  EXPECT_GT(one.value("spec_tokens_per_step", 0.0), 1.0);
  // The table: both rows and the ratio row.
  std::string out, err;
  ASSERT_EQ(run_command(std::string(TERN_BINARY) + " bench-serve " + m + " --spec-compare", &out, &err), 0) << err;
  for (const char* want : {"\nplain ", "\nspeculative ", "\nspeculative/plain ", "acceptance", "tokens/step"})
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
}

TEST(BenchServeCli, BadSpeculativeFlagsAreErrorsNamingThem) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  std::string out, err;
  const std::string cmd = std::string(TERN_BINARY) + " bench-serve -m " + shared_path("models/stories260K.gguf") +
                          " --num-prompts 2 --max-tokens 4";
  EXPECT_NE(run_command(cmd + " --lookup 2 --draft X", &out, &err), 0);
  EXPECT_NE(err.find("--lookup"), std::string::npos) << err;
  EXPECT_NE(err.find("--draft"), std::string::npos) << err;
  EXPECT_NE(run_command(cmd + " --spec-compare", &out, &err), 0);
  EXPECT_NE(err.find("--spec-compare"), std::string::npos) << err;
  EXPECT_NE(run_command(cmd + " --draft-max 4", &out, &err), 0);
  EXPECT_NE(err.find("--draft-max"), std::string::npos) << err;
  EXPECT_NE(run_command(cmd + " --lookup 3 --draft-max 0", &out, &err), 0);
  EXPECT_NE(err.find("--draft-max"), std::string::npos) << err;
  EXPECT_TRUE(out.empty()) << out;
}

}  // namespace
}  // namespace tern
