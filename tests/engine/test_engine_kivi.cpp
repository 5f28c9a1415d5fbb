// KIVI 2-bit K/V in the paged engine (docs/kv.md): blocks default to 32 slots, one key group
// each, so a sequence's groups seal as they do in a Session alone, and batched greedy requests
// give exactly the tokens one Session with kivi2 K/V gives. What kivi2 cannot do is refused.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/error.h"
#include "engine_test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_engine_kivi {
namespace {

using tern::testing::Collected;
using tern::testing::drive;
using tern::testing::greedy;
using tern::testing::shared_path;
using tern::testing::Sink;

// stories260K with a kivi2 cache on 2 threads.
EngineConfig kivi_config(int64_t n_ctx) {
  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.n_ctx = n_ctx;
  cfg.kv_type = KvType::Kivi2;
  return cfg;
}

TEST(EngineKivi, BatchedRequestsEqualASessionAloneWithKivi2) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  TERN_REQUIRE_SHARED("data/tinystories/tinystories_val.txt");
  auto file = open_model_file(shared_path("models/stories260K.gguf"));
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  EngineConfig cfg = kivi_config(256);
  cfg.max_batch_tokens = 4096;  // a prompt in one step, as the Session prefills it
  cfg.prefix_caching = false;   // a hit would read sealed groups where the Session reads halves
  Engine engine(file, tok, cfg);
  EXPECT_EQ(engine.config().kv_block_size, kKiviGroup);
  std::ifstream in(shared_path("data/tinystories/tinystories_val.txt"));
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  while (prompts.size() < 5 && std::getline(in, line))
    if (line.size() > 200) prompts.push_back(tok->encode(line.substr(0, 40 + 60 * prompts.size() % 200), true));
  ASSERT_EQ(prompts.size(), 5u);
  Sink sink;
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestParams p;
    p.prompt_ids = prompts[i];
    p.max_tokens = 70;  // across two or three group boundaries
    p.sampling = greedy();
    p.ignore_eos = true;
    ids.push_back(engine.add_request(p, sink.callback()));
    if (i == 2) engine.step();  // the rest arrive while the first run
  }
  drive(engine);
  for (size_t i = 0; i < ids.size(); ++i) {
    const Collected got = sink.get(ids[i]);
    ASSERT_EQ(got.reason, FinishReason::Length) << "request " << i << ": " << got.error;
    const auto alone = tern::testing::run_alone(file, *tok, prompts[i], 70, greedy(), {}, true, KvType::Kivi2);
    EXPECT_EQ(got.ids, alone.ids) << "request " << i << ", prompt " << prompts[i].size();
  }
  EXPECT_EQ(engine.metrics().kv_blocks_used, 0);
}

// fn() must throw a tern::Error whose message names `want` (`what`: what it would have let through).
template <class Fn>
void expect_refused(Fn&& fn, const std::string& want, const std::string& what) {
  const std::string err = tern::testing::error_of(fn);
  EXPECT_NE(err.find(want), std::string::npos) << what << ": " << (err.empty() ? "not refused" : err);
}

TEST(EngineKivi, WhatKivi2CannotDoIsRefusedWithTheReason) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  auto file = open_model_file(shared_path("models/stories260K.gguf"));
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  EngineConfig cfg = kivi_config(128);
  cfg.kv_block_size = 16;  // half a key group
  expect_refused([&] { Engine e(file, tok, cfg); }, "whole key groups of 32", "kivi2 took blocks of 16");
  cfg.kv_block_size = 0;
  cfg.kv_memory_bytes = 64 << 10;  // less than one step's fp16 stages
  expect_refused([&] { Engine e(file, tok, cfg); }, "raise --kv-memory", "kivi2 took a budget smaller than its stages");
  cfg.kv_memory_bytes = 0;
  cfg.kv_block_size = 64;
  cfg.kv_policy = make_kv_policy("streaming", 4, 60, "");
  expect_refused([&] { Engine e(file, tok, cfg); }, "kivi2", "kivi2 took an evicting default policy");
  cfg.kv_policy = KvPolicy{};
  Engine engine(file, tok, cfg);
  RequestParams p;
  p.prompt_ids = {1, 20, 30};
  p.max_tokens = 4;
  p.kv_policy = make_kv_policy("h2o", 4, 0, "50%");
  expect_refused([&] { engine.add_request(p, [](const RequestOutput&) {}); }, "kivi2",
                 "a request under h2o ran over kivi2");
}

}  // namespace
}  // namespace tern::test_engine_kivi
