#pragma once
// What the training tests share: a tiny model shape, random token windows, and a model whose
// weights are large enough that every gradient is far from zero.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "models/synth.h"
#include "train/model.h"

namespace tern::testing {

inline train::ModelShape tiny_shape(int64_t n_vocab = 11) {
  train::ModelShape s;
  s.n_vocab = n_vocab;
  s.n_embd = 12;
  s.n_layer = 2;
  s.n_head = 3;
  s.n_head_kv = 1;
  s.n_ff = 20;
  s.n_ctx_train = 8;
  return s;
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

}  // namespace tern::testing
