// LoRA fine-tuning in the training engine: the adapter's gradients against finite differences
// (every target kind, through the input-gradient path of later layers, with dropout and with
// unscored targets), a zero-B adapter leaving the base's forward untouched bit for bit, the
// frozen base, resume, the JSONL data packing, and `tern finetune` from the command line.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "models/lora.h"
#include "models/synth.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "train/data.h"
#include "train/forward_backward.h"
#include "train/lora.h"
#include "train/lora_data.h"
#include "train/model.h"
#include "train/trainer.h"
#include "train_test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::train::test_lora_train {
namespace {

namespace fs = std::filesystem;

const std::vector<LoraKind> kAllKinds = {LoraKind::Q,    LoraKind::K,  LoraKind::V,    LoraKind::O,
                                         LoraKind::Gate, LoraKind::Up, LoraKind::Down, LoraKind::Output};

using tern::testing::json_lines;
using tern::testing::random_windows;
using tern::testing::test_model;
using tern::testing::tiny_shape;

// An adapter with B != 0 too (so that dA is not zero).
LoraWeights test_lora(const ModelShape& s, const std::vector<LoraKind>& kinds, int64_t rank, float alpha,
                      float dropout, uint32_t seed) {
  LoraWeights l = make_lora(s, kinds, rank, alpha, dropout);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.5f);
  for (float& v : l.data) v = d(rng);
  return l;
}

// Per adapter tensor, the gradient against central differences of the f32 loss along a random
// direction inside that tensor (as the base model's test in test_trainer.cpp). With dropout the
// loss is forward_backward's (same dropout seed: the same masks).
void check_lora_gradients(const ModelShape& s, LoraWeights& lora, const std::vector<int32_t>& windows, int64_t n_seq,
                          int64_t n_ctx, const std::string& label) {
  const TrainModel m = test_model(s, 7);
  const std::vector<float> base_before = m.data;
  ForwardBackward fb(s, n_seq, n_ctx, nullptr);
  fb.prepare(m);
  fb.set_lora(&lora);
  fb.set_dropout_seed(99);
  fb.prepare_lora();
  std::vector<float> g(size_t(lora.n_params()), 0.0f), scratch(g.size());
  const double loss = fb.forward_backward(m, windows.data(), g.data(), 1.0f);
  auto loss_now = [&]() {
    fb.prepare_lora();
    if (lora.dropout > 0.0f) return fb.forward_backward(m, windows.data(), scratch.data(), 1.0f);
    return fb.forward_loss(m, windows.data());
  };
  EXPECT_NEAR(loss_now(), loss, 1e-6) << label;
  std::mt19937 rng(11);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (const auto& p : lora.params) {
    const std::vector<double> dir = testing::unit_direction(rng, nd, p.size);
    const double gd = testing::along(dir, g.data() + p.offset);
    const std::vector<float> keep(lora.data.begin() + p.offset, lora.data.begin() + p.offset + p.size);
    auto loss_at = [&](double h) {
      for (int64_t i = 0; i < p.size; ++i) lora.data[size_t(p.offset + i)] = float(keep[size_t(i)] + h * dir[size_t(i)]);
      return loss_now();
    };
    // Central differences at h and h/2, Richardson-extrapolated: the O(h^2) curvature term
    // cancels (attention's softmax is curved enough to show it at h = 1e-2).
    const double h = 1e-2;
    const double d1 = (loss_at(h) - loss_at(-h)) / (2 * h), d2 = (loss_at(h / 2) - loss_at(-h / 2)) / h;
    const double fd = (4 * d2 - d1) / 3;
    std::copy(keep.begin(), keep.end(), lora.data.begin() + p.offset);
    EXPECT_NEAR(gd, fd, 2e-3 + 1e-2 * std::abs(fd)) << label << ": " << p.name;
    EXPECT_GT(std::abs(gd), 1e-4) << label << ": " << p.name << ": gradient vanishes; the test would not see a wrong one";
  }
  EXPECT_TRUE(m.data == base_before) << "the base changed";
}

TEST(LoraTrain, GradientsOfEveryTargetMatchFiniteDifferences) {
  const ModelShape s = tiny_shape();
  const int64_t n_seq = 2, n_ctx = 5;
  const auto windows = random_windows(n_seq, n_ctx, s.n_vocab, 3);
  LoraWeights all = test_lora(s, kAllKinds, 3, 6.0f, 0.0f, 5);
  ASSERT_EQ(all.slots.size(), 2u * 7u + 1u);
  check_lora_gradients(s, all, windows, n_seq, n_ctx, "all targets");
  // Each kind alone (only its adapters move the loss: layer 0's gradient reaches the loss through
  // layer 1's base weights and the input gradients alone).
  for (LoraKind k : kAllKinds) {
    LoraWeights one = test_lora(s, {k}, 2, 2.0f, 0.0f, 6 + uint32_t(k));
    check_lora_gradients(s, one, windows, n_seq, n_ctx, std::string("only ") + lora_kind_name(k));
  }
}

TEST(LoraTrain, GradientsWithDropoutAndUnscoredTargetsMatchFiniteDifferences) {
  const ModelShape s = tiny_shape();
  const int64_t n_seq = 2, n_ctx = 6;
  auto windows = random_windows(n_seq, n_ctx, s.n_vocab, 4);
  // Prompt-like entries: inputs that are no targets.
  for (size_t i : {0u, 1u, 2u, 8u, 9u}) windows[i] = unscored_token(windows[i]);
  LoraWeights l = test_lora(s, kAllKinds, 2, 4.0f, 0.3f, 8);
  check_lora_gradients(s, l, windows, n_seq, n_ctx, "dropout 0.3, unscored targets");
}

TEST(LoraTrain, UnscoredTargetsAreLeftOutOfTheMean) {
  const ModelShape s = tiny_shape();
  const TrainModel m = test_model(s, 1);
  const int64_t n_ctx = 6;
  auto w = random_windows(1, n_ctx, s.n_vocab, 2);
  ForwardBackward fb(s, 1, n_ctx, nullptr);
  fb.prepare(m);
  fb.forward_loss(m, w.data());
  std::vector<double> row(static_cast<size_t>(n_ctx), 0.0);
  {
    // Per-position losses from the logits.
    const float* lg = fb.logits();
    for (int64_t t = 0; t < n_ctx; ++t) {
      double mx = -1e30, sum = 0.0;
      for (int64_t v = 0; v < s.n_vocab; ++v) mx = std::max(mx, double(lg[t * s.n_vocab + v]));
      for (int64_t v = 0; v < s.n_vocab; ++v) sum += std::exp(double(lg[t * s.n_vocab + v]) - mx);
      row[size_t(t)] = std::log(sum) + mx - double(lg[t * s.n_vocab + w[size_t(t + 1)]]);
    }
  }
  w[3] = unscored_token(w[3]);  // position 2's target
  w[6] = unscored_token(w[6]);  // position 5's target (the window's last)
  const double want = (row[0] + row[1] + row[3] + row[4]) / 4.0;
  EXPECT_NEAR(fb.forward_loss(m, w.data()), want, 1e-5);
  EXPECT_EQ(fb.n_scored(), 4);
  // The inputs are the same tokens: the logits did not change.
  std::vector<float> g(size_t(m.n_params()), 0.0f);
  EXPECT_NEAR(fb.forward_backward(m, w.data(), g.data(), 1.0f), want, 1e-5);
}

// B = 0 (PEFT's initialisation): the adapted model is the base, bit for bit.
TEST(LoraTrain, ZeroBForwardIsTheBaseForwardBitForBit) {
  ModelShape s = tiny_shape(37);
  s.n_embd = 48;
  s.n_head = 6;
  s.n_head_kv = 2;
  s.n_ff = 100;
  const TrainModel m = test_model(s, 2);
  const int64_t n_seq = 2, n_ctx = 9;
  const auto windows = random_windows(n_seq, n_ctx, s.n_vocab, 9);
  ThreadPool pool(2);
  ForwardBackward base(s, n_seq, n_ctx, &pool), adapted(s, n_seq, n_ctx, &pool);
  base.prepare(m);
  const double loss_base = base.forward_loss(m, windows.data());
  const std::vector<float> logits_base(base.logits(), base.logits() + n_seq * n_ctx * s.n_vocab);
  LoraWeights l = make_lora(s, kAllKinds, 4, 8.0f);
  init_lora(l, 3);
  for (const LoraSlot& sl : l.slots) {
    for (int64_t i = 0; i < l.rank * sl.n_in; ++i) ASSERT_LE(std::abs(l.data[size_t(sl.a + i)]), 1.0 / std::sqrt(double(sl.n_in)));
    for (int64_t i = 0; i < l.rank * sl.n_out; ++i) ASSERT_EQ(l.data[size_t(sl.b + i)], 0.0f);
  }
  adapted.prepare(m);
  adapted.set_lora(&l);
  adapted.prepare_lora();
  EXPECT_EQ(adapted.forward_loss(m, windows.data()), loss_base);
  const std::vector<float> logits_lora(adapted.logits(), adapted.logits() + n_seq * n_ctx * s.n_vocab);
  EXPECT_TRUE(logits_lora == logits_base);
  // With B = 0, only B has a gradient; A's is exactly zero.
  std::vector<float> g(size_t(l.n_params()), 0.0f);
  adapted.forward_backward(m, windows.data(), g.data(), 1.0f);
  for (const LoraSlot& sl : l.slots) {
    double na = 0.0, nb = 0.0;
    for (int64_t i = 0; i < l.rank * sl.n_in; ++i) na += std::abs(g[size_t(sl.a + i)]);
    for (int64_t i = 0; i < l.rank * sl.n_out; ++i) nb += std::abs(g[size_t(sl.b + i)]);
    EXPECT_EQ(na, 0.0) << sl.target;
    EXPECT_GT(nb, 0.0) << sl.target;
  }
}

TEST(LoraTrain, GradientsAreTheSameBitsForAnyThreadCount) {
  ModelShape s = tiny_shape(37);
  s.n_embd = 48;
  s.n_head = 6;
  s.n_head_kv = 2;
  s.n_ff = 100;
  const TrainModel m = test_model(s, 2);
  const int64_t n_seq = 3, n_ctx = 17;
  const auto windows = random_windows(n_seq, n_ctx, s.n_vocab, 9);
  LoraWeights l = test_lora(s, kAllKinds, 4, 8.0f, 0.1f, 2);
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    ForwardBackward fb(s, n_seq, n_ctx, &pool);
    fb.prepare(m);
    fb.set_lora(&l);
    fb.prepare_lora();
    fb.set_dropout_seed(5);
    std::vector<float> g(size_t(l.n_params()), 0.0f);
    losses.push_back(fb.forward_backward(m, windows.data(), g.data(), 1.0f));
    grads.push_back(std::move(g));
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(losses[0], losses[2]);
  EXPECT_TRUE(grads[0] == grads[1]);
  EXPECT_TRUE(grads[0] == grads[2]);
}

TEST(LoraTrain, TableAndErrors) {
  ModelShape s = tiny_shape();
  const LoraWeights l = make_lora(s, parse_lora_targets("q, v,output,q"), 4, 8.0f);
  EXPECT_EQ(lora_targets_string(l.kinds), "q,v,output");
  ASSERT_EQ(l.slots.size(), 5u);
  EXPECT_EQ(l.slots[0].target, "blk.0.attn_q.weight");
  EXPECT_EQ(l.slots[4].target, "output.weight");
  EXPECT_EQ(l.params[0].name, "blk.0.attn_q.weight.lora_a");
  EXPECT_EQ(l.params[1].name, "blk.0.attn_q.weight.lora_b");
  EXPECT_EQ(l.find(1, LoraKind::V)->target, "blk.1.attn_v.weight");
  EXPECT_EQ(l.find(1, LoraKind::K), nullptr);
  EXPECT_EQ(l.find(-1, LoraKind::Output)->n_out, s.n_vocab);
  EXPECT_FLOAT_EQ(l.scale(), 2.0f);
  auto err = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(err([] { parse_lora_targets("q,wq"); }).find("unknown target \"wq\""), std::string::npos);
  EXPECT_NE(err([] { parse_lora_targets("q,,v"); }).find("empty entry"), std::string::npos);
  EXPECT_NE(err([&] { make_lora(s, {LoraKind::Q}, 0, 1.0f); }).find("rank"), std::string::npos);
  EXPECT_NE(err([&] { make_lora(s, {LoraKind::Q}, 2, NAN); }).find("alpha"), std::string::npos);
  EXPECT_NE(err([&] { make_lora(s, {LoraKind::Q}, 2, 1.0f, 1.0f); }).find("dropout"), std::string::npos);
  s.tied_output = true;
  EXPECT_NE(err([&] { make_lora(s, {LoraKind::Output}, 2, 1.0f); }).find("tied"), std::string::npos);
}

using TempDir = testing::TrainTempDir;
using testing::write_train_text;
using testing::write_train_vocab;

const char* kWords[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "home", "big", "red"};

// Prompt "X Y Z" -> completion: the same words reversed (a rule the adapter can learn).
std::string write_jsonl(const TempDir& dir, const std::string& name, int n, uint32_t seed) {
  std::ofstream out(dir.file(name));
  std::mt19937 rng(seed);
  for (int e = 0; e < n; ++e) {
    std::string w[3];
    for (auto& x : w) x = kWords[rng() % 12];
    out << "{\"prompt\": \"" << w[0] << " " << w[1] << " " << w[2] << " =\", \"completion\": \" " << w[2] << " " << w[1]
        << " " << w[0] << ".\"}\n";
    if (e % 7 == 3) out << "\n";
  }
  return dir.file(name);
}

TEST(LoraData, FormatIsDetectedByTheFirstNonEmptyLine) {
  EXPECT_EQ(detect_data_format("\n  \n {\"prompt\": \"a\"}\n"), DataFormat::Jsonl);
  EXPECT_EQ(detect_data_format("Once upon a time\n{\"x\": 1}\n"), DataFormat::Text);
  EXPECT_EQ(detect_data_format(""), DataFormat::Text);
}

TEST(LoraData, ExamplesArePackedWholeWithOnlyTheCompletionScored) {
  std::vector<Example> ex = {{{1, 10, 11, 20, 21}, 3}, {{1, 12, 22, 23}, 2}, {{1, 13, 14, 15, 24, 25, 26, 27, 28, 29}, 4}};
  ExampleStats st;
  const TokenStream s = pack_examples(ex, 8, 2, &st);
  const int32_t u = -2;  // unscored_token(0) - ...: spelled out below
  (void)u;
  auto U = [](int32_t id) { return unscored_token(id); };
  // Block 0: example 0 (5) fits, example 1 (4) does not: padded. Block 1: example 1 + pad.
  // Example 2 (10 > 8): truncated to 8, its own block. Then one unscored entry.
  const std::vector<int32_t> want = {U(1), U(10), U(11), 20, 21, U(2), U(2), U(2),   // block 0
                                     U(1), U(12), 22,    23, U(2), U(2), U(2), U(2),  // block 1
                                     U(1), U(13), U(14), U(15), 24, 25, 26, 27,       // block 2
                                     U(2)};
  EXPECT_EQ(s.tokens, want);
  EXPECT_EQ(st.n_examples, 3);
  EXPECT_EQ(st.n_truncated, 1);
  EXPECT_EQ(st.n_dropped, 0);
  EXPECT_EQ(st.n_blocks, 3);
  EXPECT_EQ(st.n_scored, 2 + 2 + 4);
  // The window sampler cuts exactly these blocks.
  WindowSampler w(&s.tokens, 8, false, 0, "t");
  EXPECT_EQ(w.n_windows(), 3);
  EXPECT_EQ(w.window(1)[0], U(1));
  // A prompt that fills the context is dropped.
  const TokenStream d = pack_examples({{{1, 10, 11, 12}, 3}, {{1, 5, 6}, 1}}, 3, 0, &st);
  EXPECT_EQ(st.n_dropped, 1);
  EXPECT_EQ(st.n_scored, 2);
}

TEST(LoraData, PromptIsTheCommonPrefixOfTheTokenizations) {
  TempDir dir;
  const GgufFile vocab = GgufFile::open(write_train_vocab(dir));
  const auto tok = Tokenizer::from_gguf(vocab);
  const Example ex = make_example(*tok, "the cat =", " mat sat", true);
  const std::vector<int32_t> p = tok->encode("the cat =", true, false);
  const std::vector<int32_t> full = tok->encode("the cat = mat sat", true, false);
  ASSERT_EQ(ex.ids.size(), full.size() + 1);
  EXPECT_EQ(ex.ids.back(), tok->eos_id());
  EXPECT_EQ(ex.ids[0], tok->bos_id());
  EXPECT_LE(ex.n_prompt, int64_t(p.size()));
  for (int64_t i = 0; i < ex.n_prompt; ++i) EXPECT_EQ(ex.ids[size_t(i)], p[size_t(i)]);
  EXPECT_GT(int64_t(ex.ids.size()), ex.n_prompt + 1);
}

TEST(LoraData, BadJsonlNamesTheFileAndLine) {
  TempDir dir;
  const GgufFile vocab = GgufFile::open(write_train_vocab(dir));
  const auto tok = Tokenizer::from_gguf(vocab);
  struct Case {
    std::string text, expect;
  } cases[] = {
      {"{\"prompt\": \"a\", \"completion\": \"b\"}\n\n{\"prompt\": \"a\", \"completion\": \"b\"\n", ":3: not a JSON object"},
      {"{\"prompt\": \"a\", \"completion\": \"b\"}\n[1, 2]\n", ":2: a JSONL example is an object"},
      {"{\"prompt\": \"a\"}\n", ":1: missing \"completion\""},
      {"{\"prompt\": 3, \"completion\": \"b\"}\n", ":1: \"prompt\" must be a string"},
      {"{\"prompt\": \"a\", \"completion\": \"\"}\n", ":1: empty \"completion\""},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n", ":1: \"messages\" examples are not supported"},
  };
  for (const auto& c : cases) {
    const std::string path = dir.file("bad.jsonl");
    { std::ofstream(path) << c.text; }
    try {
      read_finetune_data(path, *tok, 16, false, "--data", nullptr, nullptr, nullptr);
      ADD_FAILURE() << "no error for " << c.text;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path + c.expect), std::string::npos) << msg;
    }
  }
  // Every prompt longer than the context: nothing to learn.
  const std::string path = dir.file("long.jsonl");
  { std::ofstream(path) << "{\"prompt\": \"the cat sat on the mat and the dog ran home\", \"completion\": \" red\"}\n"; }
  try {
    read_finetune_data(path, *tok, 4, false, "--data", nullptr, nullptr, nullptr);
    ADD_FAILURE() << "no error for a prompt that fills the context";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no completion token within --ctx 4"), std::string::npos) << e.what();
  }
}

// 8 steps whole; 4, checkpoint, resume for 4: the same losses and the same adapter bits (with
// dropout and gradient accumulation, so the masks and data order must follow the step).
TEST(LoraTrain, ResumeContinuesTheRunBitForBit) {
  TempDir dir;
  const GgufFile vocab = GgufFile::open(write_train_vocab(dir));
  const auto tok = Tokenizer::from_gguf(vocab);
  const TokenStream data = tokenize_text(testing::read_file_bytes(write_train_text(dir, "data.txt", 12, 12)), *tok, false);
  ModelShape s = tiny_shape(tok->n_vocab());
  s.n_embd = 16;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 24;
  s.n_ctx_train = 16;
  TrainModel base = init_model(s, 1);
  const std::vector<float> base_before = base.data;
  TrainConfig cfg = testing::resume_test_config(1e-2f);
  cfg.opt.min_lr = 1e-3f;
  cfg.opt.warmup = 2;
  cfg.opt.weight_decay = 0.01f;
  ThreadPool pool(2);
  const std::vector<LoraKind> kinds = {LoraKind::Q, LoraKind::V, LoraKind::Down, LoraKind::Output};
  auto fresh = [&] {
    LoraWeights l = make_lora(s, kinds, 4, 8.0f, 0.2f);
    init_lora(l, cfg.seed);
    return l;
  };
  auto run = [&](LoraWeights& l, const TrainConfig& c, int64_t resume_step, std::vector<double>& losses) {
    Trainer t(base, l, vocab, c, &pool, {{"tern.lora.targets", GgufValue::string("q,v,down,output")}});
    if (resume_step > 0) {
      t.resume(GgufFile::open(optimizer_state_path(c.out_path)), resume_step);
      EXPECT_EQ(t.step(), resume_step);
    }
    WindowSampler d(&data.tokens, c.n_ctx, true, c.seed, "data");
    t.run(d, nullptr, [&](const StepLog& log) { losses.push_back(log.loss); }, nullptr);
  };
  std::vector<double> whole, first, second;
  LoraWeights l1 = fresh();
  cfg.out_path = dir.file("whole.gguf");
  run(l1, cfg, 0, whole);
  ASSERT_EQ(whole.size(), 8u);
  EXPECT_LT(whole.back(), whole.front());
  EXPECT_TRUE(base.data == base_before) << "the frozen base changed";

  LoraWeights l2 = fresh();
  TrainConfig c2 = cfg;
  c2.out_path = dir.file("part.gguf");
  c2.stop_after = 4;
  run(l2, c2, 0, first);
  ASSERT_EQ(first.size(), 4u);
  const GgufFile ck = GgufFile::open(c2.out_path);
  EXPECT_EQ(ck.get_uint("tern.train.step"), 4u);
  EXPECT_EQ(ck.get_string("general.type"), "adapter");
  EXPECT_EQ(ck.get_string("tern.lora.targets"), "q,v,down,output");
  const auto ad = LoraAdapter::load(c2.out_path);
  EXPECT_EQ(ad->alpha(), 8.0f);
  EXPECT_EQ(ad->pairs().size(), l2.slots.size());
  LoraWeights l3 = fresh();
  load_lora_weights(l3, *ad);
  EXPECT_TRUE(l3.data == l2.data);
  TrainConfig c3 = c2;
  c3.stop_after = 0;
  run(l3, c3, 4, second);
  ASSERT_EQ(second.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(first[i], whole[i]) << "step " << i + 1;
    EXPECT_EQ(second[i], whole[4 + i]) << "step " << i + 5;
  }
  EXPECT_TRUE(l3.data == l1.data) << "final adapter differs after resume";
  // An adapter of another rank does not load into this table.
  LoraWeights other = make_lora(s, kinds, 2, 8.0f, 0.2f);
  EXPECT_THROW(load_lora_weights(other, *ad), Error);
}

// `tern finetune --lora` from the command line.
class FinetuneCli : public ::testing::Test {
 protected:
  TempDir dir;
  std::string base, data, val, jsonl, jsonl_val;
  void SetUp() override {
    const GgufFile vocab = GgufFile::open(write_train_vocab(dir));
    base = dir.file("base.gguf");
    save_model(init_model(testing::shape32(300), 2), vocab, base);
    data = write_train_text(dir, "data.txt", 20, 1);
    val = write_train_text(dir, "val.txt", 6, 2);
    jsonl = write_jsonl(dir, "train.jsonl", 200, 3);
    jsonl_val = write_jsonl(dir, "val.jsonl", 40, 4);
  }
  int finetune(const std::string& args, std::string* out, std::string* err) {
    return testing::run_command(std::string(TERN_BINARY) + " finetune " + args, out, err);
  }
};

TEST_F(FinetuneCli, TextFineTuningLowersTheHeldOutLossAndWritesAnAdapter) {
  std::string out, err;
  const std::string o = dir.file("a.gguf");
  ASSERT_EQ(finetune("--lora -m " + base + " --data " + data + " --val " + val +
                         " --rank 4 --alpha 8 --targets q,k,v,o,gate,up,down,output --steps 30 --lr 3e-3 --ctx 32 "
                         "--batch 4 -t 2 --json -q -o " + o, &out, &err), 0) << err;
  const auto lines = json_lines(out);
  ASSERT_GE(lines.size(), 3u) << out;
  ASSERT_TRUE(lines.front().contains("start")) << out;
  const double before = lines.front()["val_loss"].get<double>();
  const auto& fin = lines.back();
  ASSERT_TRUE(fin.value("final", false)) << out;
  const double after = fin["val_loss"].get<double>();
  EXPECT_LT(after, before - 0.2) << "held-out loss " << before << " -> " << after;
  const auto ad = LoraAdapter::load(o);
  EXPECT_EQ(ad->architecture(), "llama");
  EXPECT_EQ(ad->alpha(), 8.0f);
  EXPECT_EQ(ad->pairs().size(), 2u * 7u + 1u);
  ad->check_base(GgufFile::open(base));
  const GgufFile f = GgufFile::open(o);
  EXPECT_EQ(f.get_uint("tern.train.step"), 30u);
  EXPECT_EQ(f.get_string("tern.lora.base"), "base.gguf");
  EXPECT_TRUE(fs::exists(optimizer_state_path(o)));
}

TEST_F(FinetuneCli, PromptCompletionFineTuningLearnsTheCompletions) {
  std::string out, err;
  const std::string o = dir.file("pc.gguf");
  ASSERT_EQ(finetune("--lora -m " + base + " --data " + jsonl + " --val " + jsonl_val +
                         " --rank 8 --alpha 16 --targets q,k,v,o,gate,up,down,output --steps 40 --lr 1e-2 --ctx 32 "
                         "--batch 4 --eos -t 2 --json -q -o " + o, &out, &err), 0) << err;
  EXPECT_NE(err.find("JSONL prompt/completion, 200 examples"), std::string::npos) << err;
  const auto lines = json_lines(out);
  ASSERT_GE(lines.size(), 3u);
  const double before = lines.front()["val_loss"].get<double>(), after = lines.back()["val_loss"].get<double>();
  EXPECT_LT(after, before - 1.0) << "held-out completion loss " << before << " -> " << after;
}

TEST_F(FinetuneCli, ResumeContinuesTheRunBitForBit) {
  std::string out, err;
  const std::string common = "--lora -m " + base + " --data " + jsonl + " --rank 4 --alpha 4 --dropout 0.1 --steps 6 "
                             "--lr 1e-2 --ctx 32 --batch 2 --grad-accum 2 -t 2 --json -q ";
  std::vector<double> a, b;
  ASSERT_NO_FATAL_FAILURE(testing::run_whole_and_resumed(
      [&](const std::string& args, std::string* o, std::string* e) { return finetune(args, o, e); }, common, dir, &a,
      &b));
  EXPECT_EQ(a, b);
  const auto x = LoraAdapter::load(dir.file("whole.gguf")), y = LoraAdapter::load(dir.file("part.gguf"));
  ASSERT_EQ(x->pairs().size(), y->pairs().size());
  for (size_t i = 0; i < x->pairs().size(); ++i) {
    EXPECT_TRUE(x->pairs()[i].a == y->pairs()[i].a) << x->pairs()[i].target;
    EXPECT_TRUE(x->pairs()[i].b == y->pairs()[i].b) << x->pairs()[i].target;
  }
  // Another rank or target set is refused, and the checkpoint is left alone.
  const std::string before = testing::read_file_bytes(dir.file("part.gguf"));
  EXPECT_EQ(finetune("--lora -m " + base + " --data " + jsonl + " --rank 4 --alpha 4 --dropout 0.1 --targets q,v "
                     "--steps 8 --ctx 32 --batch 2 --grad-accum 2 -t 2 -q --resume -o " + dir.file("part.gguf"), &out, &err), 1);
  EXPECT_NE(err.find("--targets"), std::string::npos) << err;
  EXPECT_EQ(testing::read_file_bytes(dir.file("part.gguf")), before);
}

TEST_F(FinetuneCli, BadInputGetsAClearErrorAndWritesNothing) {
  std::string out, err;
  const std::string o = " -o " + dir.file("a.gguf");
  const std::string ok = "--lora -m " + base + " --ctx 16 --batch 2 -t 1 -q";
  { std::ofstream(dir.file("bad.jsonl")) << "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"a\",\n"; }
  { std::ofstream(dir.file("empty.jsonl")) << "{\"prompt\": \"the cat\", \"completion\": \"\"}\n"; }
  // A base of another architecture.
  GgufWriter w(3);
  w.set("general.architecture", GgufValue::string("qwen2"));
  add_generated_vocab(w, 300);
  w.write(dir.file("qwen.gguf"));
  struct Case {
    std::string args, expect;
  } cases[] = {
      {ok + " --data " + data + " --steps 2 --rank 0" + o, "--rank must be at least 1"},
      {ok + " --data " + data + " --steps 2 --rank -3" + o, "--rank must be at least 1"},
      {ok + " --data " + data + " --steps 2 --alpha nan" + o, "--alpha must be a finite number"},
      {ok + " --data " + data + " --steps 2 --alpha inf" + o, "--alpha must be a finite number"},
      {ok + " --data " + data + " --steps 2 --targets q,wq" + o, "unknown target \"wq\""},
      {ok + " --data " + data + " --steps 2 --dropout 1" + o, "--dropout"},
      {ok + " --data " + dir.file("bad.jsonl") + " --steps 2" + o, "bad.jsonl:2: not a JSON object"},
      {ok + " --data " + dir.file("empty.jsonl") + " --steps 2" + o, "empty.jsonl:1: empty \"completion\""},
      {ok + " --data " + dir.file("missing.txt") + " --steps 2" + o, "missing.txt"},
      {"--lora -m " + dir.file("qwen.gguf") + " --data " + data + " --steps 2" + o, "llama architecture only"},
      {"-m " + base + " --data " + data + " --steps 2" + o, "--lora"},
      {ok + " --data " + data + " --steps 2 --resume" + o, "does not exist"},
      {ok + " --data " + data + " --steps 2 -o " + dir.file("no/such/dir/a.gguf"), "no/such/dir"},
      {ok + " --data " + data + " --steps 2 -o " + data, "is the input file"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(finetune(c.args, &out, &err), 1) << c.args << "\n" << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.args << "\nstderr: " << err;
    EXPECT_FALSE(fs::exists(dir.file("a.gguf"))) << c.args;
    EXPECT_FALSE(fs::exists(dir.file("a.gguf.optim"))) << c.args;
  }
  // A tied base has no output.weight to adapt.
  const GgufFile vocab = GgufFile::open(dir.file("vocab.gguf"));
  ModelShape s = tiny_shape(300);
  s.tied_output = true;
  s.n_ctx_train = 64;
  save_model(init_model(s, 2), vocab, dir.file("tied.gguf"));
  EXPECT_EQ(finetune("--lora -m " + dir.file("tied.gguf") + " --data " + data + " --ctx 16 --steps 2 --targets q,output -q" + o,
                     &out, &err), 1);
  EXPECT_NE(err.find("tied"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir.file("a.gguf")));
}

}  // namespace
}  // namespace tern::train::test_lora_train
