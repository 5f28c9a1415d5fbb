// The training model's whole forward/backward, the optimizer, the data pipeline, checkpoints and
// resume, and `tern train`'s handling of bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "models/synth.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "train/data.h"
#include "train/forward_backward.h"
#include "train/model.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#include "train_test_util.h"

namespace tern::train {
namespace {

namespace fs = std::filesystem;

using tern::testing::random_windows;
using tern::testing::test_model;
using tern::testing::tiny_shape;

// The gradient of every tensor against a central difference of the f32 loss along a random
// direction inside that tensor: (L(w + h d) - L(w - h d)) / 2h = g . d.
TEST(TrainModel, EveryTensorsGradientMatchesADirectionalFiniteDifference) {
  for (bool tied : {false, true}) {
    ModelShape s = tiny_shape();
    s.tied_output = tied;
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
    for (const auto& p : m.params) {
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
      EXPECT_NEAR(gd, fd, 2e-3 + 1e-2 * std::abs(fd)) << p.name << (tied ? " (tied)" : "");
      EXPECT_GT(std::abs(gd), 1e-4) << p.name << ": gradient vanishes; the test would not see a wrong one";
    }
  }
}

TEST(TrainModel, GradientsAreTheSameBitsForAnyThreadCount) {
  ModelShape s = tiny_shape(37);
  s.n_embd = 48;
  s.n_head = 6;
  s.n_head_kv = 2;
  s.n_ff = 100;
  const TrainModel m = test_model(s, 2);
  const int64_t n_seq = 3, n_ctx = 17;
  const auto windows = random_windows(n_seq, n_ctx, s.n_vocab, 9);
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    ForwardBackward fb(s, n_seq, n_ctx, &pool);
    fb.prepare(m);
    std::vector<float> g(size_t(m.n_params()), 0.0f);
    losses.push_back(fb.forward_backward(m, windows.data(), g.data(), 1.0f));
    grads.push_back(std::move(g));
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(losses[0], losses[2]);
  EXPECT_TRUE(grads[0] == grads[1]);
  EXPECT_TRUE(grads[0] == grads[2]);
}

TEST(TrainOptimizer, ScheduleWarmsUpThenDecaysToMinLr) {
  OptimizerConfig c;
  c.lr = 1.0f;
  c.min_lr = 0.1f;
  c.warmup = 4;
  c.total_steps = 14;
  EXPECT_DOUBLE_EQ(learning_rate(c, 0), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(c, 3), 1.0);
  EXPECT_NEAR(learning_rate(c, 4), 1.0, 1e-7);
  EXPECT_NEAR(learning_rate(c, 9), 0.55, 1e-7);  // half way: (1 + 0.1) / 2
  EXPECT_NEAR(learning_rate(c, 14), 0.1, 1e-7);
  EXPECT_NEAR(learning_rate(c, 20), 0.1, 1e-7);
}

// One AdamW update by hand (PyTorch's formulas), with clipping and decay on matrices only.
TEST(TrainOptimizer, AdamWStepFollowsTheDecoupledRule) {
  ModelShape s = tiny_shape();
  TrainModel m = init_model(s, 1);
  const TrainModel before = m;
  std::vector<float> g(size_t(m.n_params()));
  for (size_t i = 0; i < g.size(); ++i) g[i] = float(int(i % 7) - 3) * 0.5f;
  OptimizerConfig c;
  c.lr = 0.01f;
  c.min_lr = 0.01f;
  c.warmup = 0;
  c.total_steps = 10;
  c.weight_decay = 0.5f;
  c.clip = 1.0f;
  AdamW opt(c, m.n_params());
  const double norm = opt.step(m, g.data(), 0, nullptr);
  EXPECT_NEAR(norm, global_norm(g.data(), int64_t(g.size())), 1e-9);
  const double coef = 1.0 / (norm + 1e-6);
  for (const auto& p : m.params) {
    for (int64_t i = 0; i < p.size; i += 13) {
      const size_t k = size_t(p.offset + i);
      const double gi = double(g[k]) * coef;
      double w = double(before.data[k]) * (p.decay ? 1.0 - 0.01 * 0.5 : 1.0);
      const double mh = 0.1 * gi / 0.1, vh = 0.05 * gi * gi / 0.05;
      w -= 0.01 * mh / (std::sqrt(vh) + 1e-8);
      EXPECT_NEAR(m.data[k], w, 1e-6) << p.name << "[" << i << "]";
    }
  }
}

TEST(TrainData, DocumentsAreRunsOfNonEmptyLines) {
  const auto docs = split_documents("a b\nc\n\n \n\nd\r\n\ne\n  \t\nf");
  ASSERT_EQ(docs.size(), 4u);
  EXPECT_EQ(docs[0], "a b\nc");
  EXPECT_EQ(docs[1], "d");
  EXPECT_EQ(docs[2], "e");
  EXPECT_EQ(docs[3], "f");
  EXPECT_TRUE(split_documents("\n\n  \n").empty());
}

TEST(TrainData, ShuffledWindowsAreAPermutationPerEpochAndAFunctionOfTheSeed) {
  std::vector<int32_t> stream(101);
  for (size_t i = 0; i < stream.size(); ++i) stream[i] = int32_t(i);
  WindowSampler a(&stream, 10, true, 5, "t"), b(&stream, 10, true, 5, "t"), c(&stream, 10, true, 6, "t");
  ASSERT_EQ(a.n_windows(), 10);
  std::vector<int64_t> seen, other;
  for (int64_t slot = 0; slot < 20; ++slot) seen.push_back(a.window_at(slot));
  for (int64_t slot = 19; slot >= 0; --slot) EXPECT_EQ(b.window_at(slot), seen[size_t(slot)]);  // any access order
  for (int64_t slot = 0; slot < 20; ++slot) other.push_back(c.window_at(slot));
  EXPECT_NE(seen, other);
  for (int e = 0; e < 2; ++e) {
    std::vector<int64_t> epoch(seen.begin() + e * 10, seen.begin() + e * 10 + 10);
    std::sort(epoch.begin(), epoch.end());
    for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(epoch[size_t(i)], i);
  }
  std::vector<int32_t> batch(2 * 11);
  WindowSampler plain(&stream, 10, false, 0, "t");
  plain.batch(4, 2, batch.data());  // windows 8, 9
  EXPECT_EQ(batch[0], 80);
  EXPECT_EQ(batch[10], 90);
  EXPECT_EQ(batch[11], 90);
  EXPECT_EQ(batch[21], 100);
  std::vector<int32_t> short_stream(10);
  EXPECT_THROW(WindowSampler(&short_stream, 10, false, 0, "--data x"), Error);
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("tern_train_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// A vocabulary-only GGUF (tern synth's generated SentencePiece vocabulary) and some text.
std::string write_vocab(const TempDir& dir) {
  GgufWriter w(3);
  add_generated_vocab(w, 300);
  const std::string p = dir.file("vocab.gguf");
  w.write(p);
  return p;
}

std::string write_text(const TempDir& dir, const std::string& name, int n_docs) {
  std::ofstream out(dir.file(name));
  std::mt19937 rng(static_cast<uint32_t>(n_docs));
  const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "home", "big", "red"};
  for (int d = 0; d < n_docs; ++d) {
    for (int i = 0; i < 30; ++i) out << words[rng() % 12] << (i % 10 == 9 ? ".\n" : " ");
    out << "\n\n";
  }
  return dir.file(name);
}

// Train 8 steps; train 4, stop, resume for 4: the same losses and the same final weights.
TEST(Trainer, ResumeContinuesTheRunBitForBit) {
  TempDir dir;
  const GgufFile vocab = GgufFile::open(write_vocab(dir));
  const auto tok = Tokenizer::from_gguf(vocab);
  const TokenStream data = tokenize_text(testing::read_file_bytes(write_text(dir, "data.txt", 12)), *tok, false);
  ModelShape s = tiny_shape(tok->n_vocab());
  s.n_embd = 16;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 24;
  s.n_ctx_train = 16;
  TrainConfig cfg = testing::resume_test_config(1e-2f);
  cfg.opt.min_lr = 1e-3f;
  cfg.opt.warmup = 2;
  ThreadPool pool(2);

  auto run = [&](TrainModel& m, const GgufFile& v, const TrainConfig& c, Trainer* resume_from, std::vector<double>& losses) {
    (void)resume_from;
    Trainer t(m, v, c, &pool);
    WindowSampler d(&data.tokens, c.n_ctx, true, c.seed, "data");
    t.run(d, nullptr, [&](const StepLog& l) { losses.push_back(l.loss); }, nullptr);
  };
  std::vector<double> whole, first, second;
  TrainModel m1 = init_model(s, cfg.seed);
  cfg.out_path = dir.file("whole.gguf");
  run(m1, vocab, cfg, nullptr, whole);
  ASSERT_EQ(whole.size(), 8u);
  EXPECT_LT(whole.back(), whole.front());

  TrainModel m2 = init_model(s, cfg.seed);
  TrainConfig c2 = cfg;
  c2.out_path = dir.file("part.gguf");
  c2.stop_after = 4;
  run(m2, vocab, c2, nullptr, first);
  ASSERT_EQ(first.size(), 4u);
  ASSERT_TRUE(fs::exists(optimizer_state_path(c2.out_path)));

  const GgufFile ckpt = GgufFile::open(c2.out_path);
  EXPECT_EQ(ckpt.get_uint("tern.train.step"), 4u);
  TrainModel m3 = load_model(ckpt);
  TrainConfig c3 = c2;
  c3.stop_after = 0;
  {
    Trainer t(m3, ckpt, c3, &pool);
    t.resume(GgufFile::open(optimizer_state_path(c2.out_path)), 4);
    EXPECT_EQ(t.step(), 4);
    WindowSampler d(&data.tokens, c3.n_ctx, true, c3.seed, "data");
    t.run(d, nullptr, [&](const StepLog& l) { second.push_back(l.loss); }, nullptr);
  }
  ASSERT_EQ(second.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(first[i], whole[i]) << "step " << i + 1;
    EXPECT_EQ(second[i], whole[4 + i]) << "step " << i + 5;
  }
  EXPECT_TRUE(m3.data == m1.data) << "final weights differ after resume";

  // A changed setting is refused: the losses would not continue the run.
  TrainConfig c4 = c3;
  c4.n_seq = 3;
  TrainModel m4 = load_model(ckpt);
  Trainer t4(m4, ckpt, c4, &pool);
  EXPECT_THROW(t4.resume(GgufFile::open(optimizer_state_path(c2.out_path)), 4), Error);
  // So is an optimizer state from another step (a write interrupted between the two files).
  Trainer t5(m4, ckpt, c3, &pool);
  EXPECT_THROW(t5.resume(GgufFile::open(optimizer_state_path(c2.out_path)), 3), Error);
}

TEST(Trainer, CheckpointRoundTripsThroughGguf) {
  TempDir dir;
  const GgufFile vocab = GgufFile::open(write_vocab(dir));
  ModelShape s = tiny_shape(300);
  const TrainModel m = init_model(s, 5);
  save_model(m, vocab, dir.file("m.gguf"));
  const GgufFile f = GgufFile::open(dir.file("m.gguf"));
  const TrainModel back = load_model(f);
  EXPECT_TRUE(back.shape.same_architecture(m.shape));
  EXPECT_TRUE(back.data == m.data);
  EXPECT_TRUE(f.has("tokenizer.ggml.tokens"));
}

// `tern train` from the command line: errors before any work, and a checkpoint that `tern run` loads.
class TrainCli : public ::testing::Test {
 protected:
  TempDir dir;
  std::string vocab, data;
  void SetUp() override {
    vocab = write_vocab(dir);
    data = write_text(dir, "data.txt", 6);
  }
  int train(const std::string& args, std::string* out, std::string* err) {
    return testing::run_command(std::string(TERN_BINARY) + " train " + args, out, err);
  }
  std::string new_model() const {
    return "--vocab-from " + vocab + " --n-embd 16 --n-layer 1 --n-head 2 --n-ff 32 --ctx 16 --batch 2 -t 1 -q";
  }
};

TEST_F(TrainCli, TrainsAModelThatTernRunLoads) {
  std::string out, err;
  ASSERT_EQ(train(new_model() + " --data " + data + " --val " + data + " --steps 3 --json -o " + dir.file("m.gguf"), &out, &err), 0) << err;
  int n_steps = 0;
  bool final_seen = false;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("\"step\"") != std::string::npos) ++n_steps;
    if (line.find("\"final\":true") != std::string::npos) final_seen = true;
  }
  EXPECT_EQ(n_steps, 3);
  EXPECT_TRUE(final_seen) << out;
  std::string run_out;
  EXPECT_EQ(testing::run_command(std::string(TERN_BINARY) + " run -m " + dir.file("m.gguf") + " -p hello -n 4 --seed 1",
                                 &run_out, &err), 0) << err;
}

TEST_F(TrainCli, BadInputGetsAClearErrorAndWritesNothing) {
  std::string out, err;
  const std::string o = " -o " + dir.file("m.gguf");
  { std::ofstream(dir.file("empty.txt")) << "\n \n"; }
  { std::ofstream(dir.file("short.txt")) << "the cat"; }
  struct Case {
    std::string args, expect;
  } cases[] = {
      {new_model() + " --data " + dir.file("missing.txt") + " --steps 2" + o, "missing.txt"},
      {new_model() + " --data " + dir.file("empty.txt") + " --steps 2" + o, "no text"},
      {new_model() + " --data " + dir.file("short.txt") + " --steps 2" + o, "tokens after tokenizing"},
      {new_model() + " --data " + data + o, "--steps"},
      {new_model() + " --data " + data + " --steps 2 -o " + dir.file("no/such/dir/m.gguf"), "no/such/dir"},
      {new_model() + " --data " + data + " --steps 2 --batch 0" + o, "--batch"},
      {"--vocab-from " + vocab + " --n-embd 15 --n-layer 1 --n-head 2 --n-ff 8 --data " + data + " --steps 2" + o, "multiple of n_head"},
      {"--data " + data + " --steps 2" + o, "--vocab-from"},
      {new_model() + " --data " + data + " --steps 2 --resume" + o, "does not exist"},
      // Quantization-aware training.
      {new_model() + " --data " + data + " --steps 2 --qat q9_9" + o, "--qat: unknown type 'q9_9'"},
      {new_model() + " --data " + data + " --steps 2 --qat-out " + dir.file("q.gguf") + o, "go with --qat TYPE"},
      {new_model() + " --data " + data + " --steps 2 --qat q4_0" + o, "token_embd.weight: rows of 16 do not fit q4_0"},
      {new_model() + " --data " + data + " --steps 2 --qat f16 --qat-lsq" + o, "this plan has none"},
      {new_model() + " --data " + data + " --steps 2 --qat q8_0 --qat-out " + dir.file("m.gguf") + o, "checkpoint's own path"},
      {new_model() + " --data " + data + " --steps 2 --qat q8_0 --qat-out " + dir.path.string() + o, dir.path.string()},
      {new_model() + " --data " + data + " --steps 2 --qat q8_0 --qat-out " + data + o, "input"},
      {new_model() + " --data self --steps 2" + o, "--data self samples the model given with -m"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(train(c.args, &out, &err), 1) << c.args << "\n" << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.args << "\nstderr: " << err;
    EXPECT_FALSE(fs::exists(dir.file("m.gguf"))) << c.args;
  }
}

TEST_F(TrainCli, ResumeWithAnotherShapeIsRefused) {
  std::string out, err;
  const std::string o = " -o " + dir.file("m.gguf");
  ASSERT_EQ(train(new_model() + " --data " + data + " --steps 4 --stop-after 2" + o, &out, &err), 0) << err;
  const std::string before = testing::read_file_bytes(dir.file("m.gguf"));
  EXPECT_EQ(train("--vocab-from " + vocab + " --n-embd 32 --n-layer 1 --n-head 2 --n-ff 32 --ctx 16 --batch 2 -t 1 -q --data " +
                      data + " --steps 4 --resume" + o, &out, &err), 1);
  EXPECT_NE(err.find("--resume"), std::string::npos) << err;
  EXPECT_NE(err.find("n-embd"), std::string::npos) << err;
  EXPECT_EQ(testing::read_file_bytes(dir.file("m.gguf")), before) << "the checkpoint was touched";
  EXPECT_EQ(train(new_model() + " --data " + data + " --steps 4 --resume" + o, &out, &err), 0) << err;
}

// Ctrl-C: the run stops after the step in progress, writes its checkpoint, exits 130, and
// --resume continues from that step.
TEST_F(TrainCli, CtrlCWritesACheckpointThatResumes) {
  const std::string log = dir.file("log.jsonl"), o = dir.file("m.gguf");
  const std::string cmd = "(" + std::string(TERN_BINARY) + " train " + new_model() + " --data " + data +
                          " --steps 1000000 --json -o " + o + " > " + log + " & pid=$!; " +
                          "for i in $(seq 1 200); do grep -q '\"step\":3,' " + log + " 2>/dev/null && break; sleep 0.05; done; " +
                          "kill -INT $pid; wait $pid; echo rc=$?)";
  std::string out, err;
  testing::run_command(cmd, &out, &err);
  EXPECT_NE(out.find("rc=130"), std::string::npos) << out << err;
  EXPECT_NE(err.find("interrupted after step"), std::string::npos) << err;
  ASSERT_TRUE(fs::exists(o));
  ASSERT_TRUE(fs::exists(optimizer_state_path(o)));
  const uint64_t step = GgufFile::open(o).get_uint("tern.train.step");
  EXPECT_GE(step, 3u);
  EXPECT_EQ(train(new_model() + " --data " + data + " --steps " + std::to_string(step + 2) + " --json --resume -o " + o,
                  &out, &err), 0) << err;
  EXPECT_NE(out.find("\"step\":" + std::to_string(step + 1) + ","), std::string::npos) << out;
  EXPECT_EQ(GgufFile::open(o).get_uint("tern.train.step"), step + 2);
}

TEST_F(TrainCli, DivergenceStopsAndKeepsTheLastGoodCheckpoint) {
  std::string out, err;
  const std::string o = " -o " + dir.file("m.gguf");
  // A learning rate this large overflows the activations within a few steps.
  const int rc = train(new_model() + " --data " + data + " --steps 20 --lr 1e30 --warmup 0 --clip 0 --checkpoint-every 1" + o,
                       &out, &err);
  EXPECT_EQ(rc, 1) << err;
  EXPECT_NE(err.find("training diverged"), std::string::npos) << err;
  EXPECT_NE(err.find("at step"), std::string::npos) << err;
  EXPECT_NE(err.find("is kept in"), std::string::npos) << err;
  EXPECT_TRUE(fs::exists(dir.file("m.gguf")));
}

}  // namespace
}  // namespace tern::train
