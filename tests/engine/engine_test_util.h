#pragma once
// Helpers for the engine tests: collect a request's streamed outputs, run a set of prompts
// through an Engine (driving step() from the test thread) and the same prompts alone through
// the single-sequence path (Session + generate), which is the oracle for exactness.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "engine/engine.h"
#include "models/model.h"
#include "models/synth.h"
#include "quant/quant_traits.h"
#include "kernels/matmul.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "test_util.h"

namespace tern::testing {

// Everything one completion streamed.
struct Collected {
  std::vector<int32_t> ids;
  std::vector<GeneratedToken> tokens;
  std::string text;
  FinishReason reason = FinishReason::None;
  std::string error;
  RequestMetrics metrics;
  int n_final = 0;  // final outputs received (must end as 1)
};

// Thread-safe sink: (request id, index) -> Collected.
class Sink {
 public:
  OutputCallback callback() {
    return [this](const RequestOutput& o) {
      std::lock_guard<std::mutex> lock(mu_);
      Collected& c = got_[{o.request_id, o.index}];
      EXPECT_EQ(c.n_final, 0) << "output after the final one, request " << o.request_id;
      for (const auto& t : o.tokens) {
        c.ids.push_back(t.id);
        c.tokens.push_back(t);
      }
      c.text += o.text;
      if (o.finished) {
        ++c.n_final;
        c.reason = o.finish_reason;
        c.error = o.error;
        c.metrics = o.metrics;
      }
    };
  }
  Collected get(uint64_t id, int index = 0) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = got_.find({id, index});
    return it == got_.end() ? Collected{} : it->second;
  }
  size_t n_finished() const {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const auto& [k, c] : got_) n += c.n_final;
    return n;
  }
  std::map<std::pair<uint64_t, int>, Collected> all() const {
    std::lock_guard<std::mutex> lock(mu_);
    return got_;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::pair<uint64_t, int>, Collected> got_;
};

inline void drive(Engine& e, int64_t max_steps = 1000000) {
  for (int64_t i = 0; i < max_steps && e.has_work(); ++i) e.step();
}

inline SamplingParams greedy() {
  SamplingParams s;
  s.temperature = 0;
  return s;
}

// The single-sequence reference: one Session, the prompt alone, K/V of kv_type.
inline GenerateResult run_alone(std::shared_ptr<const GgufFile> file, const Tokenizer& tok,
                                const std::vector<int32_t>& prompt, int64_t max_tokens,
                                const SamplingParams& sp, const std::vector<std::string>& stop = {},
                                bool ignore_eos = false, KvType kv_type = KvType::F32) {
  SessionConfig cfg;
  cfg.n_threads = 2;
  cfg.kv_type = kv_type;
  Session s(file, cfg);
  GenerateOptions opts;
  opts.n_predict = max_tokens;
  opts.sampling = sp;
  opts.stop = stop;
  opts.ignore_eos = ignore_eos;
  return generate(s, tok, prompt, opts);
}

// A random-weight model with the stories260K shape in `type` (Q4_0 where rows allow, the rest
// fall back), written once per test binary to a temporary file.
inline std::string synthetic_model_path(DType type) {
  struct TempModel {
    std::string path;
    explicit TempModel(DType t) {
      path = (std::filesystem::temp_directory_path() /
              ("tern_engine_test_synth_" + std::string(dtype_name(t)) + "_" + std::to_string(::getpid()) + ".gguf"))
                 .string();
      SynthOptions o;
      o.shape = "stories260k";
      o.type = t;
      o.seed = 99;
      o.n_threads = 2;
      synth_model(o, path);
    }
    ~TempModel() { std::filesystem::remove(path); }
  };
  static std::mutex mu;
  static std::map<DType, std::unique_ptr<TempModel>> models;
  std::lock_guard<std::mutex> lock(mu);
  auto& m = models[type];
  if (!m) m = std::make_unique<TempModel>(type);
  return m->path;
}

// Whether the matmul kernel in use gives every token's row the same bits whatever the batch
// size (a GEMM row equal to the GEMV of that token). Greedy outputs of a batched engine can
// only equal single runs bit for bit when it does; F32 kernels do, some quantized GEMM paths
// round differently from their GEMV.
inline bool matmul_is_batch_invariant(DType type) {
  const int64_t n_in = 256, n_out = 32;
  std::vector<float> wf(size_t(n_in * n_out));
  uint64_t s = 12345;
  auto rnd = [&s] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return float(int64_t(s >> 40) % 2001 - 1000) / 1000.0f;
  };
  for (auto& x : wf) x = rnd();
  const QuantTraits* qt = quant_traits(type);
  const int64_t rb = dtype_row_bytes(type, n_in);
  std::vector<uint8_t> wq(size_t(rb * n_out));
  if (type == DType::F32) {
    std::memcpy(wq.data(), wf.data(), wq.size());
  } else {
    for (int64_t o = 0; o < n_out; ++o) qt->from_float(wf.data() + o * n_in, wq.data() + o * rb, n_in);
  }
  const WeightView w{type, n_in, n_out, wq.data()};
  ThreadPool pool(2);
  for (int64_t T : {2, 7, 8, 16, 17, 33, 64}) {
    std::vector<float> x(static_cast<size_t>(T * n_in)), y(static_cast<size_t>(T * n_out)), y1(static_cast<size_t>(n_out));
    for (auto& v : x) v = rnd();
    matmul(w, x.data(), n_in, T, y.data(), n_out, pool);
    for (int64_t t = 0; t < T; ++t) {
      matmul(w, x.data() + t * n_in, n_in, 1, y1.data(), n_out, pool);
      if (std::memcmp(y1.data(), y.data() + t * n_out, size_t(n_out) * sizeof(float)) != 0) return false;
    }
  }
  return true;
}

// A random-weight model of a synth shape (models/synth.h), written to a temporary file for the
// test's lifetime.
struct SynthShapeFile {
  std::string path;
  explicit SynthShapeFile(const std::string& shape) {
    path = ::testing::TempDir() + "tern_engine_shape_" + shape + "_" + std::to_string(::getpid()) + ".gguf";
    SynthOptions o;
    o.shape = shape;
    synth_model(o, path);
  }
  ~SynthShapeFile() { std::remove(path.c_str()); }
  SynthShapeFile(const SynthShapeFile&) = delete;
  SynthShapeFile& operator=(const SynthShapeFile&) = delete;
};

// BOS then n - 1 random ordinary tokens (ids 3 and up).
inline std::vector<int32_t> random_token_prompt(std::mt19937& rng, size_t n, int32_t n_vocab) {
  std::vector<int32_t> p{1};
  for (size_t i = 1; i < n; ++i) p.push_back(int32_t(3 + rng() % uint32_t(n_vocab - 3)));
  return p;
}

// The log-probability of each generated token, from one Session prefill of prompt + ids (f32
// K/V): what the engine's streamed logprobs must equal.
inline std::vector<float> sequence_logprobs(std::shared_ptr<const GgufFile> file, const std::vector<int32_t>& prompt,
                                            const std::vector<int32_t>& ids) {
  SessionConfig sc;
  sc.n_threads = 2;
  Session session(file, sc);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), ids.begin(), ids.end() - 1);
  const float* rows = session.eval(all, /*all_logits=*/true);
  const int64_t n_vocab = session.model().hparams().n_vocab;
  std::vector<float> out;
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* row = rows + (prompt.size() - 1 + t) * size_t(n_vocab);
    double mx = row[0], sum = 0;
    for (int64_t v = 1; v < n_vocab; ++v) mx = std::max<double>(mx, row[v]);
    for (int64_t v = 0; v < n_vocab; ++v) sum += std::exp(double(row[v]) - mx);
    out.push_back(float(double(row[ids[t]]) - mx - std::log(sum)));
  }
  return out;
}

// The engine's outputs of 16-request tests against the oracle: completion k of request i (ids[i],
// ns[i] completions, drawn at temperature 1 with seed seed_base + i + k, the engine's rule for n
// completions) must give the tokens the prompt gives alone through Session, and each token's
// log-probability must equal one Session prefill's within 1e-4. Returns how many distinct
// outputs there were (a test asserts they differ).
inline size_t expect_completions_equal_alone(std::shared_ptr<const GgufFile> file, const Tokenizer& tok,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             const std::vector<uint64_t>& ids, const std::vector<int>& ns,
                                             Sink& sink, int64_t max_tokens, uint64_t seed_base) {
  std::set<std::vector<int32_t>> distinct;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int k = 0; k < ns[i]; ++k) {
      SamplingParams sp;
      sp.temperature = 1.0f;
      sp.seed = seed_base + i + uint64_t(k);
      const GenerateResult alone = run_alone(file, tok, prompts[i], max_tokens, sp, {}, true);
      const Collected c = sink.get(ids[i], k);
      distinct.insert(c.ids);
      EXPECT_EQ(c.n_final, 1);
      EXPECT_EQ(c.ids, alone.ids) << "prompt " << i << " completion " << k << " (" << prompts[i].size() << " tokens)";
      const std::vector<float> ref = sequence_logprobs(file, prompts[i], c.ids);
      EXPECT_EQ(c.tokens.size(), ref.size());
      for (size_t t = 0; t < std::min(ref.size(), c.tokens.size()); ++t)
        if (std::abs(c.tokens[t].logprob - ref[t]) > 1e-4f) {
          ADD_FAILURE() << "prompt " << i << " completion " << k << " token " << t << ": logprob "
                        << c.tokens[t].logprob << ", alone " << ref[t];
          break;
        }
    }
  }
  return distinct.size();
}

}  // namespace tern::testing
