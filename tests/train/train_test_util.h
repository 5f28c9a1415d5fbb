#pragma once
// What the training tests share: a tiny model shape, random token windows, and a model whose
// weights are large enough that every gradient is far from zero.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gguf/gguf.h"
#include "models/synth.h"
#include "train/model.h"
#include "test_util.h"
#include "train/forward_backward.h"
#include "train/trainer.h"

namespace tern::testing {

inline train::ModelShape model_shape(int64_t n_vocab, int64_t n_embd, int64_t n_layer, int64_t n_head,
                                     int64_t n_head_kv, int64_t n_ff, int64_t n_ctx_train) {
  train::ModelShape s;
  s.n_vocab = n_vocab;
  s.n_embd = n_embd;
  s.n_layer = n_layer;
  s.n_head = n_head;
  s.n_head_kv = n_head_kv;
  s.n_ff = n_ff;
  s.n_ctx_train = n_ctx_train;
  return s;
}

inline train::ModelShape tiny_shape(int64_t n_vocab = 11) { return model_shape(n_vocab, 12, 2, 3, 1, 20, 8); }

// The 32-wide model of the QAT and LoRA tests (2 layers, 4 heads, 2 kv heads, n_ff 64): its
// rows fit 32-weight blocks.
inline train::ModelShape shape32(int64_t n_vocab, int64_t n_ctx_train = 64) {
  return model_shape(n_vocab, 32, 2, 4, 2, 64, n_ctx_train);
}

// Every matrix in `type`, the norms f32.
inline std::vector<DType> all_matrices(const train::TrainModel& m, DType type) {
  std::vector<DType> t;
  for (const train::ParamInfo& p : m.params) t.push_back(p.ne.size() == 2 ? type : DType::F32);
  return t;
}

// The resume tests' run: 8 steps of 2 sequences of 16 tokens, 2 micro-batches a step, seed 3.
inline train::TrainConfig resume_test_config(float lr) {
  train::TrainConfig cfg;
  cfg.n_seq = 2;
  cfg.n_ctx = 16;
  cfg.grad_accum = 2;
  cfg.steps = 8;
  cfg.seed = 3;
  cfg.opt.lr = lr;
  return cfg;
}

// The JSON objects among a command's output lines (`--json`).
inline std::vector<nlohmann::json> json_lines(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') v.push_back(nlohmann::json::parse(line));
  return v;
}

inline std::vector<int32_t> random_windows(int64_t n_seq, int64_t n_ctx, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> w(size_t(n_seq * (n_ctx + 1)));
  for (auto& t : w) t = int32_t(rng() % uint32_t(n_vocab));
  return w;
}

// Weights large enough that every tensor's gradient is far from zero.
inline train::TrainModel test_model(const train::ModelShape& s, uint64_t seed) {
  train::TrainModel m = train::init_model(s, seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (const auto& p : m.params)
    for (int64_t i = 0; i < p.size; ++i)
      m.data[size_t(p.offset + i)] = p.ne.size() == 1 ? 1.0f + 0.3f * d(rng) : 0.4f * d(rng);
  return m;
}

// A random direction of unit length in n dimensions (normal entries, normalised): the
// directional finite-difference tests check g . dir against (L(w + h dir) - L(w - h dir)) / 2h.
inline std::vector<double> unit_direction(std::mt19937& rng, std::normal_distribution<double>& nd, int64_t n) {
  std::vector<double> dir(static_cast<size_t>(n));
  double norm = 0.0;
  for (auto& v : dir) {
    v = nd(rng);
    norm += v * v;
  }
  norm = std::sqrt(norm);
  for (auto& v : dir) v /= norm;
  return dir;
}

// g . dir, in order.
inline double along(const std::vector<double>& dir, const float* g) {
  double gd = 0.0;
  for (size_t i = 0; i < dir.size(); ++i) gd += dir[i] * double(g[i]);
  return gd;
}

// A directory removed with the object.
struct TrainTempDir {
  std::filesystem::path path;
  TrainTempDir() {
    path = std::filesystem::temp_directory_path() /
           ("tern_train_test_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path);
  }
  ~TrainTempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// A vocabulary-only GGUF (tern synth's generated SentencePiece vocabulary of 300 tokens).
inline std::string write_train_vocab(const TrainTempDir& dir) {
  GgufWriter w(3);
  add_generated_vocab(w, 300);
  const std::string p = dir.file("vocab.gguf");
  w.write(p);
  return p;
}

// n_docs documents of 30 words from a 12-word list, separated by blank lines.
inline std::string write_train_text(const TrainTempDir& dir, const std::string& name, int n_docs, uint32_t seed) {
  std::ofstream out(dir.file(name));
  std::mt19937 rng(seed);
  const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "home", "big", "red"};
  for (int d = 0; d < n_docs; ++d) {
    for (int i = 0; i < 30; ++i) out << words[rng() % 12] << (i % 10 == 9 ? ".\n" : " ");
    out << "\n\n";
  }
  return dir.file(name);
}

// The losses of a --json run's steps after `after_step`.
inline std::vector<double> step_losses(const std::vector<nlohmann::json>& lines, int after_step = -1) {
  std::vector<double> v;
  for (const auto& j : lines)
    if (j.contains("step") && j["step"].get<int>() > after_step) v.push_back(j["loss"].get<double>());
  return v;
}

// The resume tests of a training command: run(args, &out, &err) must exit 0 with `common` (which
// holds --json) and -o DIR/whole.gguf, then with --stop-after 3 and -o DIR/part.gguf, then with
// --resume of part.gguf. *whole: the whole run's losses of steps 4 on; *resumed: the resumed run's.
template <class Run>
void run_whole_and_resumed(Run&& run, const std::string& common, const TrainTempDir& dir, std::vector<double>* whole,
                           std::vector<double>* resumed) {
  std::string out, err;
  ASSERT_EQ(run(common + "-o " + dir.file("whole.gguf"), &out, &err), 0) << err;
  *whole = step_losses(json_lines(out), 3);
  ASSERT_EQ(run(common + "--stop-after 3 -o " + dir.file("part.gguf"), &out, &err), 0) << err;
  ASSERT_EQ(run(common + "--resume -o " + dir.file("part.gguf"), &out, &err), 0) << err;
  *resumed = step_losses(json_lines(out));
}

#ifdef TERN_BINARY
// The trained model's forward is the inference engine's: `tern logits` on the written file
// `path` gives, for the first n tokens of `window`, the logits fb's last forward gave (within
// 1e-3 of the largest).
inline void expect_tern_logits_match(const std::string& path, const std::vector<int32_t>& window, size_t n,
                                     const train::ForwardBackward& fb, int64_t n_vocab, const std::string& out_file) {
  std::string ids;
  for (size_t i = 0; i < n; ++i) ids += (i ? " " : "") + std::to_string(window[i]);
  std::string out, err;
  ASSERT_EQ(run_command(std::string(TERN_BINARY) + " logits -m " + path + " --ids \"" + ids + "\" -o " + out_file + " -t 1",
                        &out, &err),
            0)
      << err;
  std::ifstream in(out_file, std::ios::binary);
  std::vector<float> want(n * size_t(n_vocab));
  in.read(reinterpret_cast<char*>(want.data()), std::streamsize(want.size() * sizeof(float)));
  ASSERT_TRUE(in.good());
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(double(want[i]) - double(fb.logits()[i])));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  EXPECT_LT(worst, 1e-3 * std::max(1.0, scale)) << "largest |logit| " << scale;
  EXPECT_GT(scale, 0.1);
}
#endif

}  // namespace tern::testing
