// Multi-LoRA batching: requests running different adapters (or none) share the engine's steps
// and each gives, greedy, exactly the tokens it gives alone (Session with the same adapter);
// prompts with one long common beginning under different adapters never share prefix-cache
// blocks (they would give the other adapter's K/V), while requests of one adapter do.
#include <gtest/gtest.h>


#include "core/error.h"
#include "engine_test_util.h"
#include "models/lora.h"

namespace tern {
namespace {

using tern::testing::Collected;
using tern::testing::drive;
using tern::testing::greedy;
using tern::testing::Sink;

// A random adapter over q, k, v, o, gate, up, down of every layer, big enough to change the
// greedy continuation, written to `path` and read back.
std::shared_ptr<const LoraAdapter> random_adapter(const GgufFile& base, int64_t rank, uint32_t seed,
                                                  const std::string& path) {
  write_lora_adapter(path, base.get_string("general.architecture"), float(2 * rank),
                     LoraAdapter::random_pairs(base, rank, seed, /*b_std=*/0.8f));
  return LoraAdapter::load(path);
}

std::vector<int32_t> alone(std::shared_ptr<const GgufFile> file, const Tokenizer& tok, const std::vector<int32_t>& prompt,
                           int64_t max_tokens, const LoraSet& lora) {
  SessionConfig cfg;
  cfg.n_threads = 2;
  Session s(file, cfg);
  if (!lora.empty()) s.set_lora(lora);
  GenerateOptions opts;
  opts.n_predict = max_tokens;
  opts.sampling = greedy();
  opts.ignore_eos = true;
  return generate(s, tok, prompt, opts).ids;
}

TEST(EngineLora, MixedAdaptersInOneStepEqualEachRunAlone) {
  std::shared_ptr<const GgufFile> file = open_model_file(tern::testing::synthetic_model_path(DType::F32));
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  std::vector<LoraSet> sets(5);  // 0..3: an adapter each (ranks 2, 4, 8, 16); 4: the base
  std::vector<std::string> paths;
  for (int a = 0; a < 4; ++a) {
    paths.push_back(::testing::TempDir() + "tern_engine_lora_" + std::to_string(a) + "_" + std::to_string(::getpid()) + ".gguf");
    sets[size_t(a)] = {LoraUse{random_adapter(*file, int64_t(2) << a, 100u + uint32_t(a), paths.back()), 1.0f}};
  }
  // Adapter 3 stacked on adapter 0 at half scale, as a fifth kind.
  sets.push_back({sets[0][0], LoraUse{sets[3][0].adapter, 0.5f}});
  // 16 prompts: a long common beginning (the prefix cache would share it), then each its own.
  std::vector<std::vector<int32_t>> prompts;
  const std::string common = "Once upon a time there was a little dog who loved to run in the park with his friends. ";
  const char* tails[] = {"One day", "The sun", "He saw", "A bird", "Mom said", "They went", "It was", "Then"};
  for (int i = 0; i < 16; ++i) prompts.push_back(tok->encode(common + tails[i % 8] + (i >= 8 ? " again" : ""), true));
  const int64_t max_tokens = 24;

  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.kv_block_size = 8;
  cfg.max_batch_tokens = 64;  // chunked prefill beside decode steps
  Engine engine(file, tok, cfg);
  Sink sink;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 16; ++i) {
    RequestParams p;
    p.prompt_ids = prompts[size_t(i)];
    p.max_tokens = max_tokens;
    p.sampling = greedy();
    p.ignore_eos = true;
    p.lora = sets[size_t(i) % sets.size()];
    ids.push_back(engine.add_request(p, sink.callback()));
    if (i % 4 == 3) engine.step();  // arrivals while others run
  }
  drive(engine);
  const EngineMetrics m = engine.metrics();
  EXPECT_EQ(m.requests_finished, 16);
  EXPECT_EQ(m.kv_blocks_used, 0);
  // Requests of one adapter share the common beginning: some prefix hits.
  EXPECT_GT(m.prefix_hit_rate, 0.1);
  int differ_from_base = 0;
  for (int i = 0; i < 16; ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    const LoraSet& set = sets[size_t(i) % sets.size()];
    const Collected c = sink.get(ids[size_t(i)]);
    ASSERT_EQ(c.reason, FinishReason::Length) << c.error;
    const std::vector<int32_t> want = alone(file, *tok, prompts[size_t(i)], max_tokens, set);
    EXPECT_EQ(c.ids, want);
    if (!set.empty() && want != alone(file, *tok, prompts[size_t(i)], max_tokens, {})) ++differ_from_base;
  }
  EXPECT_GE(differ_from_base, 8) << "the adapters should change most continuations";
  for (const auto& p : paths) std::remove(p.c_str());
}

TEST(EngineLora, AnAdapterForAnotherModelIsRefused) {
  std::shared_ptr<const GgufFile> file = open_model_file(tern::testing::synthetic_model_path(DType::F32));
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  EngineConfig cfg;
  cfg.n_threads = 1;
  Engine engine(file, tok, cfg);
  LoraPair p;
  p.target = "blk.0.attn_q.weight";
  p.rank = 2;
  p.n_in = 7;  // not the model's width
  p.n_out = file->find_tensor(p.target)->ne[1];
  p.a.assign(size_t(p.rank * p.n_in), 0.1f);
  p.b.assign(size_t(p.rank * p.n_out), 0.1f);
  const std::string path = ::testing::TempDir() + "tern_engine_lora_bad_" + std::to_string(::getpid()) + ".gguf";
  write_lora_adapter(path, "llama", 2.0f, {p});
  RequestParams r;
  r.prompt_ids = {1, 5, 6};
  r.lora = {LoraUse{LoraAdapter::load(path), 1.0f}};
  try {
    engine.add_request(r, [](const RequestOutput&) {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.0.attn_q.weight is 7 x"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tern
