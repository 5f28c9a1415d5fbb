// Every transformer architecture in the serving engine: 16 concurrent seeded requests through
// continuous batching, chunked prefill, a K/V arena small enough to preempt, prefix-cache hits
// and n = 2 forks give the tokens each gives alone through Session, and the log-probability of
// every token equals the one a single Session prefill of the prompt and the generated text
// computes. The shapes carry what the paged path must get right per architecture: MLA's latent
// (K-only) cache and its roped key (deepseek2, V3 routing), attention sinks and alternating
// sliding-window layers (gpt-oss, gemma2/3), logit soft-capping (gemma2), routed experts
// (qwen3moe), fused QKV (phi3). (The state-space models and hybrids: test_engine_recurrent.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <unistd.h>

#include "core/error.h"
#include "engine_test_util.h"
#include "models/synth.h"

namespace tern {
namespace {

using tern::testing::drive;
using tern::testing::expect_completions_equal_alone;
using tern::testing::random_token_prompt;
using tern::testing::SynthShapeFile;
using tern::testing::Sink;

class EngineArchitectures : public ::testing::TestWithParam<const char*> {};

TEST_P(EngineArchitectures, SixteenRequestsWithPreemptionEqualEachRunAlone) {
  SynthShapeFile synth(GetParam());
  auto file = open_model_file(synth.path);
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  const int32_t n_vocab = int32_t(tok->n_vocab());

  // Half the prompts share a 40-token beginning (prefix-cache hits); lengths 5 to 60.
  std::mt19937 rng(23);
  const std::vector<int32_t> common = random_token_prompt(rng, 40, n_vocab);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 16; ++i) {
    std::vector<int32_t> p = i % 2 ? common : std::vector<int32_t>{1};
    const auto tail = random_token_prompt(rng, size_t(5 + (i * 11) % 20), n_vocab);
    p.insert(p.end(), tail.begin() + 1, tail.end());
    prompts.push_back(p);
  }
  const int64_t max_tokens = 24;

  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.kv_block_size = 8;
  cfg.max_batch_tokens = 28;  // chunked prefill
  cfg.n_ctx = 256;
  cfg.prefix_caching = true;
  // 160 tokens of K/V: a few requests at a time, so the others wait and running ones are
  // preempted (their K/V recomputed) as the arena fills.
  cfg.kv_memory_bytes = 160 * kv_bytes_per_token(*file, cfg.kv_type);
  Engine engine(file, tok, cfg);
  Sink sink;
  std::vector<uint64_t> ids;
  std::vector<int> ns;
  const auto submit = [&](size_t i) {
    RequestParams p;
    p.prompt_ids = prompts[i];
    p.max_tokens = max_tokens;
    p.sampling.temperature = 1.0f;
    p.sampling.seed = 100 + i;
    p.n = i % 5 == 3 ? 2 : 1;  // n = 2: the second completion forks the prompt's blocks
    p.ignore_eos = true;
    p.n_logprobs = 0;
    ns.push_back(p.n);
    ids.push_back(engine.add_request(p, sink.callback()));
  };
  for (size_t i = 0; i < 8; ++i) submit(i);
  for (int s = 0; s < 3; ++s) engine.step();
  for (size_t i = 8; i < 16; ++i) {
    submit(i);
    engine.step();
  }
  drive(engine);
  const EngineMetrics m = engine.metrics();
  EXPECT_EQ(m.requests_finished, 16);
  EXPECT_EQ(m.n_running + m.n_waiting, 0);
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.state_slots_total, 0) << "a transformer holds no recurrent state";
  EXPECT_GT(m.n_preempted_total, 0) << "the small arena should preempt";
  EXPECT_GT(m.prefix_hit_rate, 0.05) << "the shared beginning should hit the prefix cache";

  EXPECT_GT(expect_completions_equal_alone(file, *tok, prompts, ids, ns, sink, max_tokens, 100), 15u)
      << "the outputs should differ";
}

INSTANTIATE_TEST_SUITE_P(Shapes, EngineArchitectures,
                         ::testing::Values("deepseek2-tiny", "deepseek2-lite-tiny", "deepseek3-tiny", "gpt-oss-tiny",
                                           "gemma2-tiny", "gemma3-tiny", "qwen3moe-tiny", "phi3-tiny"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name)
                             if (ch == '-' || ch == '.') ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace tern
