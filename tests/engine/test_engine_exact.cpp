// Batched generation is exact: 16 different prompts run concurrently through the engine
// (continuous batching, chunked prefill, paged KV, preemption, prefix-cache hits, forks) give,
// with greedy sampling, token-identical outputs to each prompt run alone through Session, with
// f32 K/V and with f16 K/V (both sides storing the same type). And f16 K/V against f32 K/V on
// stories260K: the same greedy text for as long as observed to hold.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "core/error.h"
#include "engine_test_util.h"

#include <utility>

namespace tern {
namespace {

using tern::testing::Collected;
using tern::testing::drive;
using tern::testing::greedy;
using tern::testing::run_alone;
using tern::testing::shared_path;
using tern::testing::Sink;

// 16 prompts of varied lengths from the TinyStories validation text.
std::vector<std::string> story_prompts(size_t n) {
  std::ifstream in(shared_path("data/tinystories/tinystories_val.txt"));
  std::vector<std::string> out;
  std::string line;
  size_t k = 0;
  while (out.size() < n && std::getline(in, line)) {
    if (line.size() < 40) continue;
    // Lengths from a few words to a few sentences.
    const size_t len = std::min(line.size(), size_t(12 + (k * 37) % 220));
    out.push_back(line.substr(0, len));
    ++k;
  }
  return out;
}

struct ExactCase {
  const char* name;
  bool synthetic;          // random-weight model of type synth_type instead of stories260K
  DType synth_type;
  int64_t block_size;
  int64_t kv_tokens;       // arena size in tokens (0: default)
  int64_t batch_tokens;
  bool shared_prefix;      // prompts share a long common beginning
  bool expect_preemption;
  bool expect_prefix_hits;
  KvType kv_type = KvType::F32;  // of the engine and of the single-run oracle
  double tbt_target_ms = 0;      // a step-time target (EngineConfig::tbt_target_ms)
};

class EngineExact : public ::testing::TestWithParam<ExactCase> {};

TEST_P(EngineExact, SixteenConcurrentPromptsEqualEachRunAlone) {
  const ExactCase& tc = GetParam();
  TERN_REQUIRE_SHARED("data/tinystories/tinystories_val.txt");
  std::shared_ptr<const GgufFile> file;
  if (tc.synthetic) {
    file = open_model_file(tern::testing::synthetic_model_path(tc.synth_type));
  } else {
    TERN_REQUIRE_SHARED("models/stories260K.gguf");
    file = open_model_file(shared_path("models/stories260K.gguf"));
  }
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);

  auto texts = story_prompts(16);
  ASSERT_EQ(texts.size(), 16u);
  if (tc.shared_prefix) {
    // A common system-prompt-like beginning, then each its own text.
    const std::string common =
        "Once upon a time, in a small town, there was a little girl named Lily who loved to play "
        "outside with her dog. ";
    for (auto& t : texts) t = common + t.substr(0, 40);
  }
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& t : texts) prompts.push_back(tok->encode(t, true));
  const int64_t max_tokens = 48;

  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.kv_block_size = tc.block_size;
  cfg.max_batch_tokens = tc.batch_tokens;
  cfg.kv_type = tc.kv_type;
  cfg.tbt_target_ms = tc.tbt_target_ms;
  cfg.tbt_auto_floor_ms = 0;  // stories260K's steps are far under the floor: let the target cut them
  if (tc.kv_tokens > 0) cfg.kv_memory_bytes = tc.kv_tokens * kv_bytes_per_token(*file, tc.kv_type);
  Engine engine(file, tok, cfg);
  Sink sink;
  std::vector<uint64_t> ids;
  // Half arrive at once, the rest while the first half runs (continuous batching).
  for (size_t i = 0; i < 8; ++i) {
    RequestParams p;
    p.prompt_ids = prompts[i];
    p.max_tokens = max_tokens;
    p.sampling = greedy();
    p.n_logprobs = 2;
    ids.push_back(engine.add_request(p, sink.callback()));
  }
  for (int s = 0; s < 3; ++s) engine.step();
  for (size_t i = 8; i < 16; ++i) {
    RequestParams p;
    p.prompt_ids = prompts[i];
    p.max_tokens = max_tokens;
    p.sampling = greedy();
    p.n_logprobs = 2;
    ids.push_back(engine.add_request(p, sink.callback()));
    engine.step();
  }
  drive(engine);
  const EngineMetrics m = engine.metrics();
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.requests_finished, 16);
  EXPECT_EQ(m.n_running + m.n_waiting, 0);
  EXPECT_EQ(m.kv_bytes, m.kv_blocks_total * tc.block_size * kv_bytes_per_token(*file, tc.kv_type));
  if (tc.expect_preemption) {
    EXPECT_GT(m.n_preempted_total, 0) << "the arena should force preemption";
  }
  if (tc.expect_prefix_hits) {
    EXPECT_GT(m.prefix_hit_rate, 0.2);
  }

  // Bit-exact batching needs a kernel whose GEMM rows equal its GEMV; where the kernel in use
  // rounds differently by batch size (see matmul_is_batch_invariant), the outputs may part at
  // a near tie only: up to there identical, and there the two candidates within 1e-2 logits.
  const DType wtype = tc.synthetic ? tc.synth_type : DType::F32;
  const bool invariant = tern::testing::matmul_is_batch_invariant(wtype);
  int n_parted = 0;
  for (size_t i = 0; i < 16; ++i) {
    const GenerateResult alone = run_alone(file, *tok, prompts[i], max_tokens, greedy(), {}, false, tc.kv_type);
    const Collected c = sink.get(ids[i]);
    EXPECT_EQ(c.n_final, 1);
    if (!invariant && c.ids != alone.ids) {
      size_t d = 0;
      while (d < c.ids.size() && d < alone.ids.size() && c.ids[d] == alone.ids[d]) ++d;
      ASSERT_LT(d, c.ids.size());
      ASSERT_LT(d, alone.ids.size());
      const auto& top = c.tokens[d].top_logprobs;
      ASSERT_EQ(top.size(), 2u);
      EXPECT_EQ(top[1].id, alone.ids[d]) << "prompt " << i << " parts at " << d << " for a non-runner-up";
      EXPECT_LT(top[0].logprob - top[1].logprob, 1e-2f) << "prompt " << i << " parts at " << d << ", no near tie";
      ++n_parted;
      continue;
    }
    EXPECT_EQ(c.ids, alone.ids) << "prompt " << i << " (" << prompts[i].size() << " tokens)";
    EXPECT_EQ(c.text, alone.text) << "prompt " << i;
    EXPECT_STREQ(finish_reason_name(c.reason), alone.finish_reason.c_str()) << "prompt " << i;
    EXPECT_EQ(c.metrics.n_generated, int64_t(alone.ids.size()));
  }
  if (n_parted > 0)
    std::printf("note: kernel '%s' is not batch-invariant for %s; %d of 16 outputs parted at a near tie\n",
                active_isa(), dtype_name(wtype), n_parted);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, EngineExact,
    ::testing::Values(
        ExactCase{"stories_default", false, DType::F32, 16, 0, 512, false, false, false},
        ExactCase{"stories_chunked_small_blocks", false, DType::F32, 4, 0, 24, false, false, false},
        ExactCase{"stories_preemption", false, DType::F32, 8, 320, 128, false, true, false},
        ExactCase{"stories_prefix_cache", false, DType::F32, 4, 0, 512, true, false, true},
        ExactCase{"stories_prefix_cache_and_preemption", false, DType::F32, 4, 300, 64, true, true, true},
        ExactCase{"synthetic_f16_default", true, DType::F16, 16, 0, 512, false, false, false},
        ExactCase{"synthetic_f16_preemption_prefix", true, DType::F16, 4, 300, 64, true, true, true},
        ExactCase{"synthetic_q4_0_default", true, DType::Q4_0, 16, 0, 512, false, false, false},
        ExactCase{"synthetic_q4_0_preemption_prefix", true, DType::Q4_0, 4, 300, 64, true, true, true},
        ExactCase{"stories_default_kv_f16", false, DType::F32, 16, 0, 512, false, false, false, KvType::F16},
        ExactCase{"stories_chunked_small_blocks_kv_f16", false, DType::F32, 4, 0, 24, false, false, false,
                  KvType::F16},
        ExactCase{"stories_prefix_cache_and_preemption_kv_f16", false, DType::F32, 4, 300, 64, true, true, true,
                  KvType::F16},
        ExactCase{"synthetic_f16_preemption_prefix_kv_f16", true, DType::F16, 4, 300, 64, true, true, true,
                  KvType::F16},
        // Under a step-time target the prefill chunks follow the measured step times (different
        // every run): the tokens must not change.
        ExactCase{"stories_tbt_target_auto", false, DType::F32, 4, 0, 512, false, false, false, KvType::F32,
                  EngineConfig::kTbtAuto},
        // A small arena too, but whether it preempts depends on the measured step times (about 1
        // run in 5 on a busy 2-core VM admits too few at once): preemption itself is required of
        // the fixed-batch cases above.
        ExactCase{"stories_tbt_target_auto_preemption_prefix", false, DType::F32, 4, 300, 64, true, false, true,
                  KvType::F32, EngineConfig::kTbtAuto}),
    [](const auto& info) { return std::string(info.param.name); });

// n completions of one prompt share its blocks copy-on-write; with a seed, completion i
// samples exactly what a single run with seed + i samples (f32 and f16 K/V).
class EngineFork : public ::testing::TestWithParam<KvType> {};

TEST_P(EngineFork, NCompletionsEqualSingleRunsWithTheirSeeds) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  auto file = open_model_file(shared_path("models/stories260K.gguf"));
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  // 21 tokens: with block size 8 the last block is shared partly filled -> copies.
  const auto prompt = tok->encode("Once upon a time, there was a big red ball. It liked to", true);
  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.kv_block_size = 8;
  cfg.kv_type = GetParam();
  Engine engine(file, tok, cfg);
  Sink sink;
  RequestParams p;
  p.prompt_ids = prompt;
  p.max_tokens = 40;
  p.sampling.temperature = 0.9f;
  p.sampling.seed = 1000;
  p.n = 4;
  const uint64_t id = engine.add_request(p, sink.callback());
  drive(engine);
  EXPECT_EQ(engine.metrics().kv_blocks_used, 0);
  std::set<std::vector<int32_t>> distinct;
  for (int i = 0; i < 4; ++i) {
    SamplingParams sp = p.sampling;
    sp.seed += uint64_t(i);
    const GenerateResult alone = run_alone(file, *tok, prompt, 40, sp, {}, false, GetParam());
    const Collected c = sink.get(id, i);
    EXPECT_EQ(c.n_final, 1) << "completion " << i;
    EXPECT_EQ(c.ids, alone.ids) << "completion " << i;
    EXPECT_EQ(c.text, alone.text) << "completion " << i;
    distinct.insert(c.ids);
  }
  EXPECT_GT(distinct.size(), 1u) << "different seeds should give different completions";
}

INSTANTIATE_TEST_SUITE_P(KvTypes, EngineFork, ::testing::Values(KvType::F32, KvType::F16),
                         [](const auto& info) { return std::string(kv_type_name(info.param)); });

// Greedy decoding of stories260K with f16 K/V against f32 K/V (Session, prompt alone, EOS
// ignored): each step's argmax and the gap between the best two logits.
struct GreedyTrace {
  std::vector<int32_t> ids;
  std::vector<float> gap;  // top-1 minus top-2 logit before each token was chosen
};
GreedyTrace greedy_trace(const std::shared_ptr<const GgufFile>& file, const std::vector<int32_t>& prompt, int64_t n,
                         KvType kv_type) {
  SessionConfig cfg;
  cfg.n_threads = 2;
  cfg.n_ctx = int64_t(prompt.size()) + n;
  cfg.kv_type = kv_type;
  Session s(file, cfg);
  const int64_t V = s.hparams().n_vocab;
  GreedyTrace t;
  const float* logits = s.eval(prompt);
  for (int64_t i = 0; i < n; ++i) {
    int32_t best = 0, second = 1;
    if (logits[1] > logits[0]) std::swap(best, second);
    for (int32_t v = 2; v < V; ++v) {
      if (logits[v] > logits[best]) {
        second = best;
        best = v;
      } else if (logits[v] > logits[second]) {
        second = v;
      }
    }
    t.ids.push_back(best);
    t.gap.push_back(logits[best] - logits[second]);
    if (i + 1 < n) logits = s.eval(std::span<const int32_t>(&best, 1));
  }
  return t;
}

// f16 K/V changes stories260K's greedy text only where the f32 run itself was at a near tie.
// Observed on these 33 prompts (BOS alone and the 32 TinyStories beginnings of story_prompts,
// 256 tokens each; the same on AVX-512, AVX2 and the scalar reference): 30 identical for all
// 256 tokens, BOS alone among them (which is also the llama.cpp reference text); the other three
// part at tokens 59, 161 and 235, where the two best f32 logits were within 0.002 of each other.
// (The same prompts with surrounding blanks trimmed, through `tern run`: 31 of 33 identical,
// partings at 21 and 161.) Checked with margin: BOS alone identical for 256 tokens, every prompt
// identical for its first 16, at least 28 of 33 identical throughout, and wherever one parts,
// the best two logits of both runs within 0.05 there.
TEST(EngineKvF16, Stories260KGreedyOutputMatchesF32) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  TERN_REQUIRE_SHARED("data/tinystories/tinystories_val.txt");
  auto file = open_model_file(shared_path("models/stories260K.gguf"));
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  std::vector<std::vector<int32_t>> prompts = {{tok->bos_id()}};
  for (const auto& t : story_prompts(32)) prompts.push_back(tok->encode(t, true));
  const int64_t n = 256;
  int n_identical = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const GreedyTrace a = greedy_trace(file, prompts[i], n, KvType::F32);
    const GreedyTrace b = greedy_trace(file, prompts[i], n, KvType::F16);
    size_t d = 0;
    while (d < a.ids.size() && a.ids[d] == b.ids[d]) ++d;
    if (d == a.ids.size()) {
      ++n_identical;
      continue;
    }
    std::printf("note: prompt %zu (%zu tokens): f16 K/V parts from f32 at token %zu, f32 top-2 gap %.4f\n", i,
                prompts[i].size(), d, double(a.gap[d]));
    EXPECT_NE(i, 0u) << "BOS alone parts at token " << d;
    EXPECT_GE(d, 16u) << "prompt " << i;
    EXPECT_LT(a.gap[d], 0.05f) << "prompt " << i << " parts at " << d << " without a near tie";
    EXPECT_LT(b.gap[d], 0.05f) << "prompt " << i << " parts at " << d << " without a near tie (f16 run)";
  }
  EXPECT_GE(n_identical, 28) << "of " << prompts.size();
}

// Stop strings, EOS and the streamed text match the single-sequence path.
TEST(EngineText, StopStringsAndStreamingMatchGenerate) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  auto file = open_model_file(shared_path("models/stories260K.gguf"));
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  const std::vector<std::string> texts = {"Once upon a time", "Lily wanted to", "The dog", "One day, Tom"};
  const std::vector<std::string> stop = {"her", ". "};
  EngineConfig cfg;
  cfg.n_threads = 2;
  Engine engine(file, tok, cfg);
  Sink sink;
  std::vector<uint64_t> ids;
  for (const auto& t : texts) {
    RequestParams p;
    p.prompt_ids = tok->encode(t, true);
    p.max_tokens = 60;
    p.sampling = greedy();
    p.stop = stop;
    ids.push_back(engine.add_request(p, sink.callback()));
  }
  drive(engine);
  for (size_t i = 0; i < texts.size(); ++i) {
    const GenerateResult alone = run_alone(file, *tok, tok->encode(texts[i], true), 60, greedy(), stop);
    const Collected c = sink.get(ids[i]);
    EXPECT_EQ(c.ids, alone.ids) << texts[i];
    EXPECT_EQ(c.text, alone.text) << texts[i];
    EXPECT_STREQ(finish_reason_name(c.reason), alone.finish_reason.c_str());
  }
}

// Session::truncate keeps a prefix's K/V: cutting back after other tokens and evaluating the
// rest of a prompt gives the logits a fresh prefill of the whole prompt gives, bit for bit
// (float rows do not depend on the batch they are in).
TEST(SessionTruncate, ContinuingFromAKeptPrefixEqualsAFreshPrefill) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  auto file = open_model_file(shared_path("models/stories260K.gguf"));
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  const std::vector<int32_t> prompt = tok->encode("Once upon a time there was a little cat who liked to play.", true);
  ASSERT_GE(prompt.size(), 12u);
  const int64_t V = int64_t(tok->n_vocab());
  SessionConfig cfg;
  cfg.n_threads = 2;
  cfg.n_ctx = 64;
  Session fresh(file, cfg);
  const float* l = fresh.eval(prompt);
  const std::vector<float> want(l, l + V);

  Session s(file, cfg);
  const std::span<const int32_t> all(prompt);
  s.eval(all.first(8));
  const std::vector<int32_t> other = tok->encode(" The dog ran away from the big red ball", false);
  s.eval(other);
  for (int32_t id : other) s.eval(std::span<const int32_t>(&id, 1));  // decode steps too
  EXPECT_EQ(s.n_past(), int64_t(8 + 2 * other.size()));
  s.truncate(8);
  EXPECT_EQ(s.n_past(), 8);
  EXPECT_EQ(s.tokens(), std::vector<int32_t>(prompt.begin(), prompt.begin() + 8));
  EXPECT_EQ(s.n_batched(), 8);
  s.truncate(100);  // beyond n_past: nothing changes
  EXPECT_EQ(s.n_past(), 8);
  l = s.eval(all.subspan(8));
  EXPECT_EQ(s.tokens(), prompt);
  EXPECT_EQ(s.n_batched(), int64_t(prompt.size()));
  for (int64_t v = 0; v < V; ++v) ASSERT_EQ(l[v], want[size_t(v)]) << "logit " << v;
  EXPECT_THROW(s.truncate(-1), Error);
  s.reset();
  EXPECT_EQ(s.n_past(), 0);
  EXPECT_TRUE(s.tokens().empty());
}

}  // namespace
}  // namespace tern
