// DeepSeek-V2/V3 multi-head latent attention (models/deepseek2.cpp): the absorbed path (queries
// taken into the latent space, one cached row of latent + roped key per token) gives the logits
// of the non-absorbed reference (K and V decompressed per head and cached as such, TERN_MLA=full)
// through prefill, chunks and token-by-token decode; the cache holds the latent's bytes per token;
// and files whose latent-attention keys and tensors disagree are refused naming them.
// (Logits against llama.cpp and the float64 numpy oracle: tests/py/test_arch_*.py.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <unistd.h>

#include "core/error.h"
#include "dist/layout.h"
#include "kv/kv_policy.h"
#include "models/model.h"
#include "models/synth.h"
#include "runtime/evicting_seq.h"

namespace tern {
namespace {

std::string mla_synth(const std::string& shape) {
  const std::string path = ::testing::TempDir() + "tern_mla_" + shape + "_" + std::to_string(::getpid()) + ".gguf";
  SynthOptions o;
  o.shape = shape;
  synth_model(o, path);
  return path;
}

// Loads the model with TERN_MLA=full (the non-absorbed reference) or without.
std::unique_ptr<Model> mla_load(std::shared_ptr<const GgufFile> file, bool full) {
  if (full) ::setenv("TERN_MLA", "full", 1);
  else ::unsetenv("TERN_MLA");
  std::unique_ptr<Model> m = load_model(std::move(file));
  ::unsetenv("TERN_MLA");
  return m;
}

// Logits of every position of ids, fed `chunk` tokens per step through descending KV slots.
std::vector<float> mla_logits(Model& model, const std::vector<int32_t>& ids, int64_t chunk, int n_threads) {
  const int64_t V = model.hparams().n_vocab, n = int64_t(ids.size());
  model.reserve(chunk);
  ThreadPool pool(n_threads);
  KvStore kv = make_kv_store(model.hparams(), n + 4, KvType::F32);
  std::vector<int32_t> slots;
  for (int64_t i = 0; i < n; ++i) slots.push_back(int32_t(n + 3 - i));
  std::vector<float> out;
  for (int64_t p = 0; p < n; p += chunk) {
    const int64_t m = std::min(chunk, n - p);
    SeqBatch s{p, std::span<const int32_t>(ids.data() + p, size_t(m)), std::span<const int32_t>(slots.data(), size_t(p + m)),
               true};
    std::vector<float> logits(size_t(m * V));
    model.forward(std::span<const SeqBatch>(&s, 1), kv, logits.data(), pool);
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

TEST(Mla, AbsorbedPathGivesTheDecompressedReferenceLogits) {
  std::vector<int32_t> ids = {1};
  for (int i = 0; i < 79; ++i) ids.push_back(int32_t(3 + (i * 37) % 500));  // 80 positions: past YaRN's 64
  for (const char* shape : {"deepseek2-tiny", "deepseek3-tiny", "deepseek2-lite-tiny"}) {
    SCOPED_TRACE(shape);
    const std::string path = mla_synth(shape);
    auto file = std::make_shared<const GgufFile>(GgufFile::open(path));
    auto full = mla_load(file, true);
    ASSERT_FALSE(full->hparams().kv_k_only());
    const std::vector<float> want = mla_logits(*full, ids, int64_t(ids.size()), 1);
    float scale = 0.0f;
    for (float x : want) {
      ASSERT_TRUE(std::isfinite(x));
      scale = std::max(scale, std::fabs(x));
    }
    ASSERT_GT(scale, 1.0f);
    for (int64_t chunk : {int64_t(80), int64_t(9), int64_t(1)}) {
      auto absorbed = mla_load(file, false);
      ASSERT_TRUE(absorbed->hparams().kv_k_only());
      const std::vector<float> got = mla_logits(*absorbed, ids, chunk, 2);
      ASSERT_EQ(got.size(), want.size());
      float err = 0.0f;
      for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(got[i] - want[i]));
      EXPECT_LE(err, 1e-4f * scale) << "chunk " << chunk;
    }
    std::remove(path.c_str());
  }
}

TEST(Mla, KvBytesPerTokenAreTheLatentAndTheRopedKey) {
  // The tiny model as loaded: one row of kv_lora_rank + rope per token and layer, no V row.
  const std::string path = mla_synth("deepseek2-tiny");
  auto file = std::make_shared<const GgufFile>(GgufFile::open(path));
  const SynthShape& sh = find_synth_shape("deepseek2-tiny");
  auto m = mla_load(file, false);
  const HParams& hp = m->hparams();
  const int64_t row = sh.mla_kv_lora + sh.mla_rope;
  EXPECT_EQ(hp.head_dim, row);
  EXPECT_EQ(kv_bytes_per_token(hp, KvType::F32), sh.n_layer * row * 4);
  EXPECT_EQ(kv_bytes_per_token(hp, KvType::F16), sh.n_layer * row * 2);
  KvStore kv = make_kv_store(hp, 64, KvType::F16);
  EXPECT_EQ(kv.bytes(), 64 * kv_bytes_per_token(hp, KvType::F16));
  auto full = mla_load(file, true);  // the reference caches every head's K and (padded) V
  EXPECT_EQ(kv_bytes_per_token(full->hparams(), KvType::F32),
            sh.n_layer * 2 * sh.n_head * (sh.mla_nope + sh.mla_rope) * 4);
  std::remove(path.c_str());

  // DeepSeek-V2-Lite's shape (its hyper-parameters as read_hparams gives them; no 30 GB file):
  // 27 layers of 512 + 64 against full K/V of 16 heads x (192 + 128) per layer.
  const SynthShape& lite = find_synth_shape("deepseek-v2-lite");
  HParams h;
  h.arch = "deepseek2";
  h.n_layer = lite.n_layer;
  h.n_head = lite.n_head;
  h.n_head_kv = 1;
  h.head_dim = lite.mla_kv_lora + lite.mla_rope;
  h.mla.kv_lora_rank = lite.mla_kv_lora;
  const int64_t latent = kv_bytes_per_token(h, KvType::F16);
  const int64_t full_kv = lite.n_layer * lite.n_head * (lite.mla_nope + lite.mla_rope + lite.mla_v) * 2;
  EXPECT_EQ(latent, 27 * 576 * 2);
  std::printf("DeepSeek-V2-Lite f16 KV per token: latent %lld B, full K/V %lld B (%.1fx)\n", (long long)latent,
              (long long)full_kv, double(full_kv) / double(latent));
  EXPECT_GT(full_kv, 8 * latent);
}

// A tiny deepseek2 file rewritten through `edit` (keys and tensors copied unless the edit says
// otherwise); the error of loading it.
std::string mla_load_error(const std::function<void(const GgufFile&, GgufWriter&)>& edit) {
  const std::string path = mla_synth("deepseek2-tiny");
  auto src = std::make_shared<const GgufFile>(GgufFile::open(path));
  GgufWriter w(3);
  edit(*src, w);
  auto bytes = std::make_shared<std::vector<uint8_t>>(w.to_bytes());
  std::remove(path.c_str());
  try {
    load_model(std::make_shared<const GgufFile>(GgufFile::parse(bytes, bytes->data(), bytes->size(), "edited.gguf")));
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Copies everything but `drop` (a key or tensor), with `key` set to `value` when given.
std::function<void(const GgufFile&, GgufWriter&)> mla_edit(const std::string& drop, const std::string& key = "",
                                                           int64_t value = 0) {
  return [=](const GgufFile& s, GgufWriter& w) {
    for (const auto& [k, v] : s.metadata())
      if (k != drop) w.set(k, v);
    if (!key.empty()) w.set(key, GgufValue::u32(uint32_t(value)));
    for (const auto& t : s.tensors())
      if (t.name != drop) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  };
}

TEST(Mla, BadLatentFilesAreRefusedNamingTheKeyOrTensor) {
  // deepseek2-tiny: 4 heads, latent 32, rope 16, keys 16 + 16, values 24, q_lora_rank 32.
  std::string e = mla_load_error(mla_edit("blk.1.attn_k_b.weight"));
  EXPECT_NE(e.find("blk.1.attn_k_b.weight is missing"), std::string::npos) << e;
  e = mla_load_error(mla_edit("blk.2.attn_v_b.weight"));
  EXPECT_NE(e.find("blk.2.attn_v_b.weight is missing"), std::string::npos) << e;
  // An older converter's file: attn_kv_b in place of k_b / v_b, no *_mla keys.
  e = mla_load_error([](const GgufFile& s, GgufWriter& w) {
    for (const auto& [k, v] : s.metadata())
      if (k.find("_mla") == std::string::npos) w.set(k, v);
    for (const auto& t : s.tensors()) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  });
  EXPECT_NE(e.find("key_length_mla / value_length_mla missing"), std::string::npos) << e;
  EXPECT_NE(e.find("attn_k_b / attn_v_b"), std::string::npos) << e;
  static const std::vector<float> kv_b(size_t(32 * 4 * (16 + 24)), 0.01f);
  e = mla_load_error([](const GgufFile& s, GgufWriter& w) {
    for (const auto& [k, v] : s.metadata()) w.set(k, v);
    for (const auto& t : s.tensors()) {
      if (t.name == "blk.0.attn_k_b.weight") {
        w.add_tensor("blk.0.attn_kv_b.weight", DType::F32, {32, 4 * (16 + 24)}, kv_b.data(), kv_b.size() * 4);
      } else if (t.name != "blk.0.attn_v_b.weight") {
        w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
      }
    }
  });
  EXPECT_NE(e.find("blk.0.attn_kv_b.weight is the older layout; tern needs blk.0.attn_k_b.weight"), std::string::npos)
      << e;
  // The rope dimension disagreeing with the cached row (key_length = kv_lora_rank + rope).
  e = mla_load_error(mla_edit("", "deepseek2.rope.dimension_count", 8));
  EXPECT_NE(e.find("attention.key_length 48 is not kv_lora_rank 32 + rope.dimension_count 8"), std::string::npos) << e;
  e = mla_load_error(mla_edit("", "deepseek2.attention.kv_lora_rank", 40));
  EXPECT_NE(e.find("attention.key_length 48 is not kv_lora_rank 40 + rope.dimension_count 16"), std::string::npos) << e;
  e = mla_load_error(mla_edit("", "deepseek2.attention.head_count_kv", 2));
  EXPECT_NE(e.find("a latent-attention file has 1"), std::string::npos) << e;
  // Wrong latent shapes: the loader names the tensor and both shapes.
  e = mla_load_error(mla_edit("", "deepseek2.attention.key_length_mla", 40));  // nope 24: k_b rows disagree
  EXPECT_NE(e.find("blk.0.attn_q_b.weight: expected 32 x 160, file has 32 x 128"), std::string::npos) << e;
  e = mla_load_error(mla_edit("", "deepseek2.attention.value_length_mla", 16));
  EXPECT_NE(e.find("attn_v_b.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("file has 32 x 24 x 4"), std::string::npos) << e;
  e = mla_load_error(mla_edit("", "deepseek2.attention.q_lora_rank", 0));
  EXPECT_NE(e.find("blk.0.attn_q.weight is missing"), std::string::npos) << e;
}

// What latent attention does not support yet is refused naming it: evicting KV policies (the
// cache has no per-head keys), tensor / pipeline parallelism.
TEST(Mla, EvictionAndParallelismAreRefusedNamingTheReason) {
  const std::string path = mla_synth("deepseek2-tiny");
  auto file = std::make_shared<const GgufFile>(GgufFile::open(path));
  auto m = mla_load(file, false);
  for (KvPolicyKind kind : {KvPolicyKind::Streaming, KvPolicyKind::H2O}) {
    KvPolicy policy;
    policy.kind = kind;
    policy.window = 16;
    policy.budget = 64;
    try {
      check_policy_for_model(policy, *m, "f.gguf");
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is not supported for deepseek2: its cache holds one compressed latent"),
                std::string::npos) << e.what();
    }
  }
  for (int tp : {1, 2}) {
    dist::ParallelLayout layout;
    layout.tp = tp;
    layout.pp = 3 - tp;
    try {
      dist::check_layout(layout, m->hparams(), "f.gguf", 2);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("f.gguf: deepseek2 (multi-head latent attention) models do not run split"),
                std::string::npos) << e.what();
    }
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tern
