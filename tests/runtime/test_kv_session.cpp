// A Session under a KV policy (issue #20): what each token attends to is exactly the policy's
// resident set. Streaming is checked against an independent construction: a full cache with one
// slot per position, where each step lists the sinks and the window's positions by hand (and,
// when the sinks follow the window, re-rotates the sinks' keys itself); a policy with room for
// everything changes no bit; H2O's key masses are probabilities; quantized K/V stays close to f32;
// and what a policy cannot do is refused with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "kv/kv_policy.h"
#include "models/model.h"
#include "models/synth.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace tern {
namespace {

using tern::testing::shared_path;

std::shared_ptr<const GgufFile> stories() {
  return std::make_shared<const GgufFile>(GgufFile::open(shared_path("models/stories260K.gguf")));
}

// A fixed token sequence (ids inside stories260K's 512-token vocabulary).
std::vector<int32_t> tokens(int64_t n) {
  std::vector<int32_t> t = {1};
  for (int64_t i = 1; i < n; ++i) t.push_back(int32_t(3 + (i * 37 + i * i * 11) % 500));
  return t;
}

SessionConfig config(KvPolicy policy, int64_t n_ctx, int64_t n_batch, KvType kv_type = KvType::F32) {
  SessionConfig cfg;
  cfg.n_ctx = n_ctx;
  cfg.n_threads = 2;
  cfg.n_batch = n_batch;
  cfg.kv_type = kv_type;
  cfg.kv_policy = policy;
  return cfg;
}

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, size_t(n) * sizeof(float)) == 0; }

TEST(KvSession, APolicyWithRoomForEverythingChangesNoBit) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  const auto file = stories();
  const std::vector<int32_t> t = tokens(40);
  Session plain(file, config({}, 64, 7));
  const int64_t V = plain.hparams().n_vocab;
  const float* p = plain.eval(t, true);
  const std::vector<float> ref(p, p + 40 * V);
  for (const KvPolicy& policy : {make_kv_policy("streaming", 4, 60, ""), make_kv_policy("h2o", 4, 0, "100%")}) {
    Session s(file, config(policy, 64, 7));
    const float* q = s.eval(t, true);
    EXPECT_TRUE(same_bits(q, ref.data(), 40 * V)) << policy.describe();
    EXPECT_EQ(s.n_evicted(), 0);
    EXPECT_EQ(s.n_resident(), 40);
  }
}

// The reference: a full cache (slot = position); before step t the resident set is the sinks
// and the most recent window - 1 positions, the new token makes window.
void check_streaming(int64_t sinks, int64_t window, bool follow, KvType kv_type) {
  const auto file = stories();
  KvPolicy policy = make_kv_policy("streaming", sinks, window, "");
  policy.sinks_follow = follow;
  const int64_t n = 3 * (sinks + window) + 5;
  const std::vector<int32_t> t = tokens(n);
  Session s(file, config(policy, 64, 1, kv_type));
  auto model = load_model(file);
  model->reserve(1);
  const HParams& hp = model->hparams();
  const int64_t V = hp.n_vocab;
  ThreadPool pool(2);
  KvStore full = make_kv_store(hp, n, kv_type);
  std::vector<std::vector<std::vector<float>>> sink_k;  // [sink][layer] keys as first stored
  std::vector<float> ref(static_cast<size_t>(V));
  for (int64_t pos = 0; pos < n; ++pos) {
    std::vector<int32_t> slots;
    for (int64_t p = 0; p < std::min(sinks, pos); ++p) slots.push_back(int32_t(p));
    const int64_t first_recent = std::max(sinks, pos - (window - 1));
    for (int64_t p = first_recent; p < pos; ++p) slots.push_back(int32_t(p));
    if (follow && pos > sinks && first_recent > sinks) {
      const int64_t shift = first_recent - sinks;  // positions evicted between sinks and window
      for (int64_t i = 0; i < sinks; ++i)
        for (int64_t il = 0; il < hp.n_layer; ++il) {
          std::vector<float> k = sink_k[size_t(i)][size_t(il)];
          ASSERT_TRUE(model->rotate_keys(il, k.data(), 1, shift));
          full.store_k(il, i, k.data());
        }
    }
    const int64_t n_keys = int64_t(slots.size());
    slots.push_back(int32_t(pos));
    SeqBatch sb;
    sb.n_past = n_keys;
    sb.pos = pos;
    sb.tokens = std::span<const int32_t>(t.data() + pos, 1);
    sb.slots = slots;
    model->forward(std::span<const SeqBatch>(&sb, 1), full, ref.data(), pool);
    if (pos < sinks) {
      sink_k.emplace_back();
      for (int64_t il = 0; il < hp.n_layer; ++il) {
        sink_k.back().emplace_back(size_t(hp.n_embd_kv(il)));
        full.load_k(il, pos, sink_k.back().back().data());
      }
    }
    const float* got = s.eval(std::span<const int32_t>(t.data() + pos, 1));
    ASSERT_TRUE(same_bits(got, ref.data(), V))
        << "sinks " << sinks << " window " << window << " follow " << follow << " kv " << kv_type_name(kv_type)
        << ": position " << pos << " logit 0 " << got[0] << " vs " << ref[0];
    ASSERT_EQ(s.n_resident(), std::min(pos + 1, sinks + window));
  }
  EXPECT_EQ(s.n_past(), n);
  EXPECT_EQ(s.n_evicted(), n - (sinks + window));
  EXPECT_EQ(s.kv_capacity(), sinks + window);
}

TEST(KvSession, StreamingAttendsToTheSinksAndTheWindowOnly) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  check_streaming(4, 12, /*follow=*/false, KvType::F32);
  check_streaming(0, 9, false, KvType::F32);
  check_streaming(2, 5, /*follow=*/true, KvType::F32);
  check_streaming(4, 12, true, KvType::F16);
  check_streaming(4, 12, true, KvType::Q8_0);
}

// A sequence longer than the context, in chunks: memory stays the policy's; truncation and reset
// give back slots that the next tokens reuse.
TEST(KvSession, StreamingRunsPastTheContextInChunksAndTruncates) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  Session s(stories(), config(make_kv_policy("streaming", 4, 28, ""), 64, 16));
  const int64_t bytes = s.kv_bytes();
  const std::vector<int32_t> t = tokens(200);
  s.eval(t);
  EXPECT_EQ(s.n_past(), 200);
  EXPECT_EQ(s.n_resident(), 32);
  EXPECT_EQ(s.kv_bytes(), bytes);
  EXPECT_EQ(s.kv().n_pinned(), 4);  // the sinks' keys as first stored, kept to re-rotate
  s.truncate(190);
  EXPECT_EQ(s.n_past(), 190);
  EXPECT_EQ(s.n_resident(), 22);
  s.eval(std::span<const int32_t>(t.data() + 190, 10));
  EXPECT_EQ(s.n_resident(), 32);
  s.truncate(2);  // two sinks cut: their copies go with them
  EXPECT_EQ(s.kv().n_pinned(), 2);
  s.eval(std::span<const int32_t>(t.data() + 2, 60));
  EXPECT_EQ(s.kv().n_pinned(), 4);
  s.reset();
  EXPECT_EQ(s.n_past(), 0);
  EXPECT_EQ(s.n_evicted(), 0);
  EXPECT_EQ(s.kv().n_pinned(), 0);
  // After a reset the session computes what a fresh one does.
  Session fresh(stories(), config(make_kv_policy("streaming", 4, 28, ""), 64, 16));
  const int64_t V = s.hparams().n_vocab;
  s.eval(std::span<const int32_t>(t.data(), 50));
  s.reset();
  const float* x = s.eval(std::span<const int32_t>(t.data(), 50));
  const std::vector<float> xs(x, x + V);
  const float* y = fresh.eval(std::span<const int32_t>(t.data(), 50));
  EXPECT_TRUE(same_bits(xs.data(), y, V));
}

// H2O's masses as the model reports them: each new token's probabilities sum to one per query
// head and layer, so a step's masses sum to n_tokens x n_head x n_layer.
TEST(KvSession, KeyMassesAreAttentionProbabilities) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  auto model = load_model(stories());
  model->reserve(8);
  const HParams& hp = model->hparams();
  ThreadPool pool(2);
  for (KvType kv_type : {KvType::F32, KvType::Q8_0}) {
    KvStore kv = make_kv_store(hp, 32, kv_type);
    const std::vector<int32_t> t = tokens(12);
    std::vector<int32_t> slots(12);
    for (int i = 0; i < 12; ++i) slots[size_t(i)] = 31 - i;
    std::vector<float> logits(size_t(hp.n_vocab));
    for (auto [past, n] : {std::pair<int64_t, int64_t>{0, 7}, {7, 1}, {8, 4}}) {
      std::vector<float> mass(size_t(past + n), 0.0f);
      SeqBatch sb;
      sb.n_past = past;
      sb.tokens = std::span<const int32_t>(t.data() + past, size_t(n));
      sb.slots = std::span<const int32_t>(slots.data(), size_t(past + n));
      sb.key_mass = mass.data();
      model->forward(std::span<const SeqBatch>(&sb, 1), kv, logits.data(), pool);
      double total = 0;
      for (float m : mass) {
        EXPECT_GE(m, 0.0f);
        total += m;
      }
      EXPECT_NEAR(total, double(n * hp.n_head * hp.n_layer), 1e-3) << kv_type_name(kv_type) << " past " << past;
      // The newest key is seen by the newest token only.
      EXPECT_LE(mass.back(), float(hp.n_head * hp.n_layer) + 1e-3f);
    }
  }
}

// q8_0 K/V: the next token agrees with f32 K/V's almost everywhere on stories260K.
TEST(KvSession, Q8KvAgreesWithF32Kv) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  const auto file = stories();
  const std::vector<int32_t> t = tokens(120);
  Session f(file, config({}, 128, 32)), q(file, config({}, 128, 32, KvType::Q8_0));
  const int64_t V = f.hparams().n_vocab;
  const float* a = f.eval(t, true);
  const std::vector<float> fa(a, a + 120 * V);
  const float* b = q.eval(t, true);
  int agree = 0;
  double max_diff = 0, sum_diff = 0;
  for (int64_t i = 0; i < 120; ++i) {
    const float* x = fa.data() + i * V;
    const float* y = b + i * V;
    agree += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
    for (int64_t v = 0; v < V; ++v) {
      max_diff = std::max(max_diff, double(std::fabs(x[v] - y[v])));
      sum_diff += std::fabs(x[v] - y[v]);
    }
  }
  EXPECT_GE(agree, 114) << "of 120";
  EXPECT_GT(max_diff, 0.0);  // it is quantized
  EXPECT_LT(sum_diff / double(120 * V), 0.15) << "max " << max_diff;  // measured 0.065
  EXPECT_LT(q.kv_bytes() * 10, f.kv_bytes() * 3);  // 34 bytes a block of 32 floats: 0.27x
}

// kivi2 K/V (KIVI, 2-bit): until a group of 32 slots seals, the cache holds exactly the halves
// f16 K/V holds, so token-by-token logits equal f16's bit for bit through position 31 (its
// group seals after that step's attention); later ones read 2-bit keys and values and stay
// close; the arena is 3/16 of f16's, the one open group's stage beside it.
TEST(KvSession, Kivi2EqualsF16UntilAGroupSealsThenStaysClose) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  const auto file = stories();
  const std::vector<int32_t> t = tokens(120);
  Session f(file, config({}, 128, 1, KvType::F16)), q(file, config({}, 128, 1, KvType::Kivi2));
  const int64_t V = f.hparams().n_vocab;
  int agree = 0;
  double sum_diff = 0;
  for (int64_t i = 0; i < 120; ++i) {
    const std::vector<int32_t> one{t[size_t(i)]};
    const float* a = f.eval(one, false);
    const std::vector<float> fa(a, a + V);
    const float* b = q.eval(one, false);
    if (i < kKiviGroup) {
      ASSERT_TRUE(same_bits(fa.data(), b, V)) << "position " << i;
      continue;
    }
    agree += std::max_element(fa.begin(), fa.end()) - fa.begin() == std::max_element(b, b + V) - b;
    for (int64_t v = 0; v < V; ++v) sum_diff += std::fabs(fa[size_t(v)] - b[v]);
  }
  EXPECT_GT(sum_diff, 0.0);  // it is quantized
  EXPECT_GE(agree, 50) << "of 88";  // measured 58 (this synthetic text leaves the model unsure)
  EXPECT_LT(sum_diff / double(88 * V), 0.7) << "mean " << sum_diff / double(88 * V);
  std::printf("kivi2 vs f16: %d of 88 next tokens agree, mean logit difference %.3f\n", agree, sum_diff / double(88 * V));
  EXPECT_LT(q.kv_bytes(), f.kv_bytes() / 2);
}

TEST(KvSession, WhatAPolicyCannotDoIsRefusedWithTheReason) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  // Sliding-window layers measure distances in the cache.
  const std::string gemma = ::testing::TempDir() + "tern_kv_gemma2_" + std::to_string(::getpid()) + ".gguf";
  SynthOptions o;
  o.shape = "gemma2-tiny";
  synth_model(o, gemma);
  const auto gfile = std::make_shared<const GgufFile>(GgufFile::open(gemma));
  try {
    Session s(gfile, config(make_kv_policy("streaming", 4, 28, ""), 64, 8));
    ADD_FAILURE() << "a sliding-window model took an evicting policy";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding-window"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(Session(gfile, config({}, 64, 8)));
  std::remove(gemma.c_str());

  // Speculative decoding cannot take back what a rejected draft evicted.
  const auto file = stories();
  auto tok = Tokenizer::from_gguf(*file);
  Session s(file, config(make_kv_policy("streaming", 4, 28, ""), 64, 8));
  GenerateOptions opts;
  opts.n_predict = 4;
  opts.spec.source = DraftSource::Lookup;
  try {
    generate(s, *tok, tokens(8), opts, {});
    ADD_FAILURE() << "speculation ran with an evicting policy";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("speculative"), std::string::npos) << e.what();
  }

  // kivi2 seals groups of 32 slots that an eviction policy would refill one slot at a time.
  try {
    Session k(file, config(make_kv_policy("streaming", 4, 28, ""), 64, 8, KvType::Kivi2));
    ADD_FAILURE() << "kivi2 took an evicting policy";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kivi2"), std::string::npos) << e.what();
  }

  // Quantized K/V needs whole blocks per row and 8-element head pieces.
  try {
    check_kv_type(KvType::Q4_0, std::vector<int64_t>{40}, 20, "model 'x'");
    ADD_FAILURE() << "q4_0 took a head of 20";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim is 20"), std::string::npos) << e.what();
  }
  try {
    check_kv_type(KvType::Q8_0, std::vector<int64_t>{48}, 16, "model 'x'");
    ADD_FAILURE() << "q8_0 took a row of 48";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("48 elements"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_kv_type(KvType::Q8_0, std::vector<int64_t>{32, 64}, 8, "model 'x'"));
  try {
    (void)kv_type_from_name("q5_0");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tern
