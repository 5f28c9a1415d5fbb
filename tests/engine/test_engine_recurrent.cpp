// State-space models (Mamba, Mamba-2, RWKV-6, RWKV-7) and hybrids (Granite 4.0-H, Qwen3-Next: K/V blocks
// and a state in one step) in the serving engine: every running request holds a recurrent
// state slot, n completions copy their prompt's state, a prompt that starts with cached blocks
// resumes from a state snapshot, and prefill runs in chunks. 16 concurrent seeded requests give
// the tokens each gives alone through Session, with and without prefix caching, and the
// log-probability of every token equals the one a single Session prefill of the prompt and the
// generated text computes (a random-weight model's text soon repeats one token whatever its
// state, so the tokens alone would hide a wrong state; the log-probabilities do not).
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

using tern::testing::Collected;
using tern::testing::drive;
using tern::testing::expect_completions_equal_alone;
using tern::testing::random_token_prompt;
using tern::testing::run_alone;
using tern::testing::sequence_logprobs;
using tern::testing::SynthShapeFile;
using tern::testing::Sink;

SamplingParams seeded(uint64_t seed) {
  SamplingParams s;
  s.temperature = 1.0f;
  s.seed = seed;
  return s;
}

struct RecurrentCase {
  const char* name;
  const char* shape;
  bool prefix_caching;
  // > 0: a K/V arena of this many tokens (hybrid models: their attention layers' blocks run out
  // and requests are preempted, their states recomputed).
  int64_t kv_tokens = 0;
  // The context, block size and tokens per request. A pure recurrent model's block bookkeeping
  // is n_ctx x its four state slots, which blocks of 80 and a context of 96 (the longest
  // request's 95 tokens) round to 5 blocks, where running requests of more than 80 tokens need 2
  // each: requests are preempted, their states recomputed (`preempts`: it must happen).
  int64_t n_ctx = 256, block_size = 8, max_tokens = 24;
  bool preempts = false;
};

class EngineRecurrent : public ::testing::TestWithParam<RecurrentCase> {};

TEST_P(EngineRecurrent, SixteenRequestsEqualEachRunAlone) {
  const RecurrentCase& tc = GetParam();
  SynthShapeFile synth(tc.shape);
  auto file = open_model_file(synth.path);
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  const int32_t n_vocab = int32_t(tok->n_vocab());

  // Half the prompts share a 40-token beginning (snapshot resumes); lengths 5 to 60.
  std::mt19937 rng(17);
  const std::vector<int32_t> common = random_token_prompt(rng, 40, n_vocab);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 16; ++i) {
    std::vector<int32_t> p = i % 2 ? common : std::vector<int32_t>{1};
    const auto tail = random_token_prompt(rng, size_t(5 + (i * 11) % 20), n_vocab);
    p.insert(p.end(), tail.begin() + 1, tail.end());
    prompts.push_back(p);
  }
  const int64_t max_tokens = tc.max_tokens;

  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.kv_block_size = tc.block_size;
  cfg.max_batch_tokens = 28;  // chunked prefill
  cfg.n_parallel = 4;         // four state slots: the others wait
  cfg.n_ctx = tc.n_ctx;
  cfg.prefix_caching = tc.prefix_caching;
  if (tc.kv_tokens > 0) cfg.kv_memory_bytes = tc.kv_tokens * kv_bytes_per_token(*file, cfg.kv_type);
  Engine engine(file, tok, cfg);
  EXPECT_EQ(engine.metrics().state_slots_total, 4);
  Sink sink;
  std::vector<uint64_t> ids;
  std::vector<int> ns;
  const auto submit = [&](size_t i) {
    RequestParams p;
    p.prompt_ids = prompts[i];
    p.max_tokens = max_tokens;
    p.sampling = seeded(100 + i);
    p.n = i % 5 == 3 ? 2 : 1;  // n = 2: the second completion copies the prompt's state
    p.ignore_eos = true;
    p.n_logprobs = 0;
    ns.push_back(p.n);
    ids.push_back(engine.add_request(p, sink.callback()));
  };
  for (size_t i = 0; i < 8; ++i) submit(i);
  for (int s = 0; s < 3; ++s) engine.step();
  EXPECT_LE(engine.metrics().state_slots_used, 4);
  for (size_t i = 8; i < 16; ++i) {
    submit(i);
    engine.step();
  }
  drive(engine);
  const EngineMetrics m = engine.metrics();
  EXPECT_EQ(m.requests_finished, 16);
  EXPECT_EQ(m.n_running + m.n_waiting, 0);
  EXPECT_EQ(m.state_slots_used, 0);
  EXPECT_EQ(m.kv_blocks_used, 0);
  if (tc.kv_tokens > 0 || tc.preempts) {
    EXPECT_GT(m.n_preempted_total, 0) << "the small arena should preempt";
  }
  if (tc.prefix_caching) {
    EXPECT_GT(m.prefix_hit_rate, 0.1) << "the shared beginning resumes from snapshots";
    EXPECT_GT(m.state_snapshots, 0);
  } else {
    EXPECT_EQ(m.prefix_hit_rate, 0);
    EXPECT_EQ(m.state_snapshots, 0);
  }

  EXPECT_GT(expect_completions_equal_alone(file, *tok, prompts, ids, ns, sink, max_tokens, 100), 15u)
      << "the outputs should differ";
}

INSTANTIATE_TEST_SUITE_P(Shapes, EngineRecurrent,
                         ::testing::Values(RecurrentCase{"mamba_prefix_cache", "mamba-tiny", true},
                                           RecurrentCase{"mamba_no_prefix_cache", "mamba-tiny", false},
                                           RecurrentCase{"mamba_no_prefix_cache_preemption", "mamba-tiny", false, 0,
                                                         96, 80, 32, true},
                                           RecurrentCase{"mamba2_prefix_cache", "mamba2-tiny", true},
                                           RecurrentCase{"mamba2_no_prefix_cache_preemption", "mamba2-tiny", false, 0,
                                                         96, 80, 32, true},
                                           RecurrentCase{"rwkv7_prefix_cache", "rwkv7-tiny", true},
                                           RecurrentCase{"rwkv7_no_prefix_cache_preemption", "rwkv7-tiny", false, 0,
                                                         96, 80, 32, true},
                                           RecurrentCase{"rwkv6_prefix_cache", "rwkv6-tiny", true},
                                           RecurrentCase{"rwkv6_no_prefix_cache_preemption", "rwkv6-tiny", false, 0,
                                                         96, 80, 32, true},
                                           RecurrentCase{"granitehybrid_prefix_cache", "granitehybrid-tiny", true},
                                           RecurrentCase{"granitehybrid_preemption", "granitehybrid-tiny", true, 160},
                                           RecurrentCase{"granitehybrid_dense_no_prefix_cache",
                                                         "granitehybrid-dense-tiny", false},
                                           RecurrentCase{"qwen3next_prefix_cache", "qwen3next-tiny", true},
                                           RecurrentCase{"qwen3next_preemption", "qwen3next-tiny", true, 160}),
                         [](const auto& info) { return std::string(info.param.name); });

// A prompt that repeats a finished one's first blocks starts from the snapshot (n_cached_prompt
// is the resumed position) and still generates what it generates alone.
TEST(EngineRecurrentPrefix, ARepeatedBeginningResumesFromItsSnapshot) {
  SynthShapeFile synth("mamba-tiny");
  auto file = open_model_file(synth.path);
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  std::mt19937 rng(5);
  const std::vector<int32_t> a = random_token_prompt(rng, 37, int32_t(tok->n_vocab()));
  std::vector<int32_t> b(a.begin(), a.begin() + 33);
  b.push_back(7);
  b.push_back(9);
  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.kv_block_size = 8;
  cfg.max_batch_tokens = 12;  // chunks end at 8, 16, 24, 32: snapshots there
  cfg.n_ctx = 128;
  Engine engine(file, tok, cfg);
  Sink sink;
  RequestParams p;
  p.prompt_ids = a;
  p.max_tokens = 12;
  p.sampling = seeded(3);
  p.ignore_eos = true;
  p.n_logprobs = 0;
  const uint64_t ia = engine.add_request(p, sink.callback());
  drive(engine);
  p.prompt_ids = b;
  const uint64_t ib = engine.add_request(p, sink.callback());
  drive(engine);
  EXPECT_EQ(sink.get(ia).ids, run_alone(file, *tok, a, 12, seeded(3), {}, true).ids);
  const Collected cb = sink.get(ib);
  EXPECT_EQ(cb.metrics.n_cached_prompt, 32) << "resumes after the block ending at 32";
  EXPECT_EQ(cb.ids, run_alone(file, *tok, b, 12, seeded(3), {}, true).ids);
  const std::vector<float> ref = sequence_logprobs(file, b, cb.ids);
  for (size_t t = 0; t < ref.size(); ++t) EXPECT_NEAR(cb.tokens[t].logprob, ref[t], 1e-4) << "token " << t;
}

TEST(EngineRecurrentErrors, WhatARecurrentModelCannotDoIsRefused) {
  SynthShapeFile synth("mamba-tiny");
  auto file = open_model_file(synth.path);
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  const auto expect_error = [&](const EngineConfig& cfg, const std::string& needle) {
    try {
      Engine e(file, tok, cfg);
      ADD_FAILURE() << "accepted; expected an error with: " << needle;
    } catch (const Error& ex) {
      EXPECT_NE(std::string(ex.what()).find(needle), std::string::npos) << ex.what();
    }
  };
  EngineConfig spec;
  spec.spec.source = DraftSource::Lookup;
  expect_error(spec, "cannot be rolled back");
  EngineConfig tiny;
  tiny.kv_memory_bytes = 1000;
  expect_error(tiny, "holds no recurrent state");
  EngineConfig policy;
  policy.kv_policy.kind = KvPolicyKind::Streaming;
  policy.kv_policy.sinks = 4;
  policy.kv_policy.window = 64;
  expect_error(policy, "state-space model");

  // --kv-memory buys states: two per sequence with prefix caching (its slot and a snapshot).
  EngineConfig mem;
  const int64_t state_bytes = make_kv_store(load_model(file)->hparams(), 0, KvType::F32, 1).state_bytes_per_slot();
  mem.kv_memory_bytes = 6 * state_bytes + 5;
  Engine e(file, tok, mem);
  EXPECT_EQ(e.metrics().state_slots_total, 3);
  EXPECT_EQ(e.metrics().kv_bytes, 6 * state_bytes);

  // A request's own eviction policy is refused naming what the model keeps instead.
  RequestParams rp;
  rp.prompt_ids = {1, 5, 6};
  rp.kv_policy = policy.kv_policy;
  try {
    e.add_request(rp, [](const RequestOutput&) {});
    ADD_FAILURE() << "a request's KV policy was accepted for a state-space model";
  } catch (const Error& ex) {
    EXPECT_NE(std::string(ex.what()).find("state-space model"), std::string::npos) << ex.what();
  }
}

}  // namespace
}  // namespace tern
