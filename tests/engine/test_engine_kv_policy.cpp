// KV eviction policies in the paged engine (docs/kv.md): a request under streaming or H2O keeps
// at most its policy's capacity in private blocks, runs past the context, and produces exactly
// the tokens one Session with the same policy produces alone (greedy), batched beside plain
// requests and requests under other policies. What a policy cannot do is refused.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <unistd.h>

#include "core/error.h"
#include "engine_test_util.h"
#include "models/synth.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_engine_kv_policy {
namespace {

using tern::testing::Collected;
using tern::testing::drive;
using tern::testing::greedy;
using tern::testing::shared_path;
using tern::testing::Sink;

std::vector<std::vector<int32_t>> story_prompts(const Tokenizer& tok, size_t n) {
  std::ifstream in(shared_path("data/tinystories/tinystories_val.txt"));
  std::vector<std::vector<int32_t>> out;
  std::string line;
  size_t k = 0;
  while (out.size() < n && std::getline(in, line)) {
    if (line.size() < 60) continue;
    // From shorter than a policy's capacity to several times it.
    const size_t len = std::min(line.size(), size_t(30 + (k * 97) % 400));
    out.push_back(tok.encode(line.substr(0, len), true));
    ++k;
  }
  return out;
}

// The reference: one Session under `policy` (prompt chunks of what the policy takes beside its
// sinks, as the engine plans them), greedy, ignoring EOS.
std::vector<int32_t> run_alone(std::shared_ptr<const GgufFile> file, const Tokenizer& tok, const std::vector<int32_t>& prompt,
                               int64_t n, int64_t n_ctx, const KvPolicy& policy) {
  SessionConfig cfg;
  cfg.n_threads = 2;
  cfg.n_ctx = n_ctx;
  cfg.kv_policy = policy;
  Session s(file, cfg);
  GenerateOptions opts;
  opts.n_predict = n;
  opts.sampling = greedy();
  opts.ignore_eos = true;
  return generate(s, tok, prompt, opts).ids;
}

TEST(EngineKvPolicy, RequestsUnderPoliciesEqualASessionAloneAndRunPastTheContext) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  TERN_REQUIRE_SHARED("data/tinystories/tinystories_val.txt");
  auto file = open_model_file(shared_path("models/stories260K.gguf"));
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  const int64_t n_ctx = 96, max_tokens = 160;  // generation runs past the context
  const KvPolicy streaming = make_kv_policy("streaming", 4, 28, "");
  KvPolicy original = make_kv_policy("streaming", 2, 30, "");
  original.sinks_follow = false;
  const KvPolicy h2o = make_kv_policy("h2o", 4, 0, "40%");

  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.n_ctx = n_ctx;
  cfg.kv_block_size = 8;
  cfg.max_batch_tokens = 4096;  // prefill chunks are what each policy takes, as the Session's
  cfg.kv_policy = streaming;    // the default; some requests choose their own
  Engine engine(file, tok, cfg);
  const auto prompts = story_prompts(*tok, 9);
  ASSERT_EQ(prompts.size(), 9u);
  // Prompts up to 90 tokens (several times a policy's capacity); a plain request's leaves room
  // for its 40 tokens in the context.
  const auto cut = [](size_t i) { return ptrdiff_t(i % 3 == 2 ? 50 : 90); };
  Sink sink;
  std::vector<uint64_t> ids;
  std::vector<KvPolicy> used;
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestParams p;
    p.prompt_ids = std::vector<int32_t>(prompts[i].begin(), prompts[i].begin() + std::min<ptrdiff_t>(ptrdiff_t(prompts[i].size()), cut(i)));
    p.max_tokens = i % 3 == 2 ? 40 : max_tokens;  // plain requests stay within the context
    p.sampling = greedy();
    p.ignore_eos = true;
    if (i % 3 == 1) p.kv_policy = i % 2 ? h2o : original;
    if (i % 3 == 2) p.kv_policy = KvPolicy{};  // none
    used.push_back(p.kv_policy ? *p.kv_policy : streaming);
    ids.push_back(engine.add_request(p, sink.callback()));
    if (i == 4) engine.step();  // the rest arrive while the first run
  }
  drive(engine);
  for (size_t i = 0; i < ids.size(); ++i) {
    const Collected got = sink.get(ids[i]);
    ASSERT_EQ(got.reason, FinishReason::Length) << "request " << i << ": " << got.error;
    const int64_t n = i % 3 == 2 ? 40 : max_tokens;
    ASSERT_EQ(int64_t(got.ids.size()), n) << "request " << i;
    std::vector<int32_t> prompt(prompts[i].begin(), prompts[i].begin() + std::min<ptrdiff_t>(ptrdiff_t(prompts[i].size()), cut(i)));
    const std::vector<int32_t> want = used[i].evicts() ? run_alone(file, *tok, prompt, n, n_ctx, used[i])
                                                       : tern::testing::run_alone(file, *tok, prompt, n, greedy(), {}, true).ids;
    EXPECT_EQ(got.ids, want) << "request " << i << " under " << used[i].describe() << ", prompt " << prompt.size();
  }
  const EngineMetrics m = engine.metrics();
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.requests_finished, int64_t(ids.size()));
}

// A bounded sequence never holds more than its policy's blocks, however long it runs.
TEST(EngineKvPolicy, ASequenceHoldsAtMostItsPolicysBlocks) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  auto file = open_model_file(shared_path("models/stories260K.gguf"));
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.n_ctx = 64;
  cfg.kv_block_size = 8;
  cfg.kv_policy = make_kv_policy("streaming", 4, 20, "");  // 24 tokens: 3 blocks
  Engine engine(file, tok, cfg);
  Sink sink;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    RequestParams p;
    p.prompt_ids = {1, int32_t(10 + i), 20, 30};
    p.max_tokens = 300;
    p.sampling = greedy();
    p.ignore_eos = true;
    ids.push_back(engine.add_request(p, sink.callback()));
  }
  int64_t most = 0;
  while (engine.has_work()) {
    engine.step();
    most = std::max(most, engine.metrics().kv_blocks_used);
  }
  EXPECT_LE(most, 3 * 3);
  for (uint64_t id : ids) EXPECT_EQ(sink.get(id).ids.size(), 300u);
}

TEST(EngineKvPolicy, WhatAPolicyCannotDoIsRefused) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  auto file = open_model_file(shared_path("models/stories260K.gguf"));
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  EngineConfig cfg;
  cfg.n_threads = 1;
  cfg.n_ctx = 64;
  Engine engine(file, tok, cfg);
  Sink sink;
  const auto refused = [&](RequestParams p, const char* needle) {
    try {
      engine.add_request(p, sink.callback());
      ADD_FAILURE() << "accepted; expected an error with '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  RequestParams p;
  p.prompt_ids = {1, 2, 3};
  p.kv_policy = make_kv_policy("streaming", 4, 20, "");
  p.n = 2;
  refused(p, "n = 2");
  p.n = 1;
  p.embedding.enabled = true;
  refused(p, "embedding");
  p.embedding.enabled = false;
  p.kv_policy = make_kv_policy("streaming", 4, 100, "");
  refused(p, "104");  // sinks + window over the context of 64

  // A model with sliding-window layers refuses an evicting default when the engine starts.
  const std::string gemma = ::testing::TempDir() + "tern_engine_kv_gemma2_" + std::to_string(::getpid()) + ".gguf";
  SynthOptions o;
  o.shape = "gemma2-tiny";
  synth_model(o, gemma);
  auto gfile = open_model_file(gemma);
  EngineConfig gcfg = cfg;
  gcfg.kv_policy = make_kv_policy("h2o", 4, 0, "50%");
  try {
    Engine g(gfile, Tokenizer::from_gguf(*gfile), gcfg);
    ADD_FAILURE() << "a sliding-window model took an evicting default";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding-window"), std::string::npos) << e.what();
  }
  std::remove(gemma.c_str());
}

}  // namespace
}  // namespace tern::test_engine_kv_policy
