// Models whose layers differ, as structured pruning (compress/structured.h) leaves them: per-layer
// head counts and FFN widths, head_dim given as key_length (not n_embd / n_head), and FLaP's
// attn_output / ffn_down biases on some layers. The gradients (biases included) against finite
// differences, determinism, the GGUF keys written (arrays only when the layers differ), and the
// trained model's logits against the inference engine's (`tern logits`).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "models/synth.h"
#include "test_util.h"
#include "train/forward_backward.h"
#include "train/lora.h"
#include "train/model.h"
#include "train_test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::train::test_per_layer_shapes {
namespace {

namespace fs = std::filesystem;

using tern::testing::random_windows;
using tern::testing::test_model;

// Layer 0: 2 heads / 1 kv head / n_ff 14 with both biases; layer 1: 4 / 2 / 20 with ffn_down's
// only; head_dim 4 (n_embd / head_count(0) would be 6).
ModelShape pruned_shape(int64_t n_vocab = 11) {
  ModelShape s;
  s.n_vocab = n_vocab;
  s.n_embd = 12;
  s.n_layer = 2;
  s.n_ctx_train = 8;
  s.n_embd_head = 4;
  s.set_per_layer({2, 4}, {1, 2}, {14, 20});
  s.attn_out_bias_l = {1, 0};
  s.ffn_down_bias_l = {1, 1};
  s.validate("test shape");
  return s;
}

TEST(PerLayerShapes, TheTableSizesEachLayerFromItsOwnValues) {
  const ModelShape s = pruned_shape();
  EXPECT_EQ(s.n_head, 4);
  EXPECT_EQ(s.n_head_kv, 2);
  EXPECT_EQ(s.n_ff, 20);
  EXPECT_FALSE(s.uniform_layers());
  const TrainModel m = make_model(s);
  auto ne = [&](const std::string& name) {
    const ParamInfo* p = m.find(name);
    EXPECT_NE(p, nullptr) << name;
    return p ? p->ne : std::vector<int64_t>{};
  };
  EXPECT_EQ(ne("blk.0.attn_q.weight"), (std::vector<int64_t>{12, 8}));
  EXPECT_EQ(ne("blk.0.attn_k.weight"), (std::vector<int64_t>{12, 4}));
  EXPECT_EQ(ne("blk.0.attn_output.weight"), (std::vector<int64_t>{8, 12}));
  EXPECT_EQ(ne("blk.0.ffn_down.weight"), (std::vector<int64_t>{14, 12}));
  EXPECT_EQ(ne("blk.1.attn_q.weight"), (std::vector<int64_t>{12, 16}));
  EXPECT_EQ(ne("blk.1.attn_v.weight"), (std::vector<int64_t>{12, 8}));
  EXPECT_EQ(ne("blk.1.ffn_gate.weight"), (std::vector<int64_t>{12, 20}));
  EXPECT_EQ(ne("blk.0.attn_output.bias"), (std::vector<int64_t>{12}));
  EXPECT_EQ(ne("blk.1.ffn_down.bias"), (std::vector<int64_t>{12}));
  EXPECT_EQ(m.find("blk.1.attn_output.bias"), nullptr);
  EXPECT_FALSE(m.find("blk.0.ffn_down.bias")->decay);  // biases: no weight decay
  // init_model: biases start at 0 (norms at 1).
  const TrainModel init = init_model(s, 3);
  const ParamInfo* b = init.find("blk.0.ffn_down.bias");
  for (int64_t i = 0; i < b->size; ++i) EXPECT_EQ(init.data[size_t(b->offset + i)], 0.0f);
  // A LoRA adapter's linears take their layer's widths.
  const LoraWeights l = make_lora(s, parse_lora_targets("q,o,down"), 2, 4.0f);
  EXPECT_EQ(l.find(0, LoraKind::Q)->n_out, 8);
  EXPECT_EQ(l.find(1, LoraKind::Q)->n_out, 16);
  EXPECT_EQ(l.find(0, LoraKind::O)->n_in, 8);
  EXPECT_EQ(l.find(0, LoraKind::Down)->n_in, 14);
  EXPECT_EQ(l.find(1, LoraKind::Down)->n_in, 20);
}

// As TrainModel.EveryTensorsGradientMatchesADirectionalFiniteDifference, on the pruned shape: a
// wrong per-layer width or a bias left out of the forward or the backward fails here.
TEST(PerLayerShapes, EveryTensorsGradientMatchesADirectionalFiniteDifference) {
  const ModelShape s = pruned_shape();
  TrainModel m = test_model(s, 7);
  const int64_t n_seq = 2, n_ctx = 5;
  const auto windows = random_windows(n_seq, n_ctx, s.n_vocab, 3);
  ForwardBackward fb(s, n_seq, n_ctx, nullptr);
  fb.prepare(m);
  std::vector<float> g(size_t(m.n_params()), 0.0f);
  const double loss = fb.forward_backward(m, windows.data(), g.data(), 1.0f);
  fb.prepare(m);
  EXPECT_NEAR(fb.forward_loss(m, windows.data()), loss, 1e-6);
  std::mt19937 rng(11);
  std::normal_distribution<double> nd(0.0, 1.0);
  int n_bias = 0;
  for (const auto& p : m.params) {
    n_bias += p.name.find(".bias") != std::string::npos;
    const std::vector<double> dir = testing::unit_direction(rng, nd, p.size);
    const double gd = testing::along(dir, g.data() + p.offset);
    const std::vector<float> keep(m.data.begin() + p.offset, m.data.begin() + p.offset + p.size);
    auto loss_at = [&](double h) {
      for (int64_t i = 0; i < p.size; ++i) m.data[size_t(p.offset + i)] = float(keep[size_t(i)] + h * dir[size_t(i)]);
      fb.prepare(m);
      return fb.forward_loss(m, windows.data());
    };
    const double h = 1e-2;
    const double fd = (loss_at(h) - loss_at(-h)) / (2 * h);
    std::copy(keep.begin(), keep.end(), m.data.begin() + p.offset);
    EXPECT_NEAR(gd, fd, 2e-3 + 1e-2 * std::abs(fd)) << p.name;
    EXPECT_GT(std::abs(gd), 1e-4) << p.name << ": gradient vanishes; the test would not see a wrong one";
  }
  EXPECT_EQ(n_bias, 3);
}

TEST(PerLayerShapes, GradientsAreTheSameBitsForAnyThreadCount) {
  const ModelShape s = pruned_shape(37);
  const TrainModel m = test_model(s, 2);
  const int64_t n_seq = 3, n_ctx = 17;
  const auto windows = random_windows(n_seq, n_ctx, s.n_vocab, 9);
  std::vector<std::vector<float>> grads;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    ForwardBackward fb(s, n_seq, n_ctx, &pool);
    fb.prepare(m);
    std::vector<float> g(size_t(m.n_params()), 0.0f);
    fb.forward_backward(m, windows.data(), g.data(), 1.0f);
    grads.push_back(std::move(g));
  }
  EXPECT_TRUE(grads[0] == grads[1]);
  EXPECT_TRUE(grads[0] == grads[2]);
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("tern_per_layer_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::string write_vocab(const TempDir& dir) {
  GgufWriter w(3);
  add_generated_vocab(w, 300);
  const std::string p = dir.file("vocab.gguf");
  w.write(p);
  return p;
}

std::vector<int64_t> ints(const GgufFile& f, const std::string& key) {
  std::vector<int64_t> v;
  for (const GgufValue& x : f.find(key)->as_array(key).items) v.push_back(x.as_int(key));
  return v;
}

// Written: arrays when the layers differ, key_length, the biases; read back the same model. A
// uniform model keeps the scalar keys and no key_length (files as before).
TEST(PerLayerShapes, CheckpointKeepsThePerLayerKeysAndUniformModelsTheScalarOnes) {
  TempDir dir;
  const GgufFile vocab = GgufFile::open(write_vocab(dir));
  const TrainModel m = test_model(pruned_shape(300), 5);
  save_model(m, vocab, dir.file("p.gguf"));
  const GgufFile f = GgufFile::open(dir.file("p.gguf"));
  EXPECT_EQ(f.find("llama.attention.head_count")->type, GgufType::ARRAY);
  EXPECT_EQ(ints(f, "llama.attention.head_count"), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(ints(f, "llama.attention.head_count_kv"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(ints(f, "llama.feed_forward_length"), (std::vector<int64_t>{14, 20}));
  EXPECT_EQ(f.get_uint("llama.attention.key_length"), 4u);
  EXPECT_EQ(f.get_uint("llama.attention.value_length"), 4u);
  EXPECT_EQ(f.get_uint("llama.rope.dimension_count"), 4u);
  const TrainModel back = load_model(f);
  EXPECT_TRUE(back.shape.same_architecture(m.shape)) << back.shape.describe();
  EXPECT_TRUE(back.data == m.data);
  EXPECT_NE(back.shape.describe().find("n_head [2,4]"), std::string::npos) << back.shape.describe();

  ModelShape u = testing::tiny_shape(300);
  save_model(init_model(u, 1), vocab, dir.file("u.gguf"));
  const GgufFile fu = GgufFile::open(dir.file("u.gguf"));
  EXPECT_EQ(fu.find("llama.attention.head_count")->type, GgufType::U32);
  EXPECT_EQ(fu.find("llama.feed_forward_length")->type, GgufType::U32);
  EXPECT_FALSE(fu.has("llama.attention.key_length"));
  const ModelShape ub = load_model(fu).shape;
  EXPECT_TRUE(ub.n_head_l.empty() && ub.n_ff_l.empty() && ub.n_embd_head == 0);

  // Per-layer arrays that agree are read as a uniform model.
  ModelShape same = u;
  same.set_per_layer({3, 3}, {1, 1}, {20, 20});
  EXPECT_TRUE(same.n_head_l.empty());
  EXPECT_TRUE(same.same_architecture(u));
}

// The trained model's forward is the inference engine's: the same logits from `tern logits` on
// the written file (per-layer shapes, key_length and both biases as inference reads them).
TEST(PerLayerShapes, LogitsMatchTheInferenceEngine) {
  TempDir dir;
  const GgufFile vocab = GgufFile::open(write_vocab(dir));
  const ModelShape s = pruned_shape(300);
  const TrainModel m = test_model(s, 9);
  save_model(m, vocab, dir.file("p.gguf"));
  const int64_t n = 7;
  const std::vector<int32_t> window = random_windows(1, n, s.n_vocab, 4);
  ForwardBackward fb(s, 1, n, nullptr);
  fb.prepare(m);
  fb.forward_loss(m, window.data());
  testing::expect_tern_logits_match(dir.file("p.gguf"), window, size_t(n), fb, s.n_vocab, dir.file("l.f32"));
}

}  // namespace
}  // namespace tern::train::test_per_layer_shapes
