// The model split of the parallel layouts (models/partition.h), in one process without MPI:
// pipeline stages chained through forward_stage, and tensor-parallel ranks on threads whose
// collectives are an in-process rendezvous. Both are compared with the whole model on the real
// model over a prompt step and greedy decode steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "dist/step_plan.h"
#include "models/lora.h"
#include "models/model.h"
#include "models/partition.h"
#include "models/synth.h"
#include "test_util.h"

using namespace tern;

namespace {

constexpr int64_t kSlots = 256;      // the K/V arena of every model in these tests
constexpr int64_t kSeqSlots = 96;    // sequence s's slots start at s * kSeqSlots
constexpr int64_t kMaxTokens = 64;   // reserve() of every model
constexpr int kDecodeSteps = 6;

// One step of the script: each sequence's new tokens, and whether it wants every row.
struct Step {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<bool> all_logits;
  std::vector<const LoraSet*> lora;  // per sequence (empty: none runs an adapter)
};

// A step as the forward pass reads it; its views point into the Step and into `slots`.
struct StepBatch {
  std::vector<std::vector<int32_t>> slots;
  std::vector<SeqBatch> seqs;
  int64_t n_tokens = 0;
};

StepBatch make_batch(const Step& st, const std::vector<int64_t>& n_past) {
  StepBatch b;
  b.slots.resize(st.tokens.size());
  for (size_t s = 0; s < st.tokens.size(); ++s) {
    const int64_t n = int64_t(st.tokens[s].size());
    for (int64_t j = 0; j < n_past[s] + n; ++j) b.slots[s].push_back(int32_t(int64_t(s) * kSeqSlots + j));
  }
  for (size_t s = 0; s < st.tokens.size(); ++s) {
    SeqBatch q;
    q.n_past = n_past[s];
    q.tokens = st.tokens[s];
    q.slots = b.slots[s];
    q.all_logits = st.all_logits[s];
    q.lora = st.lora.empty() ? nullptr : st.lora[s];
    b.seqs.push_back(q);
    b.n_tokens += int64_t(st.tokens[s].size());
  }
  return b;
}

int64_t argmax(const float* row, int64_t n) { return int64_t(std::max_element(row, row + n) - row); }

// The whole model's run: a prompt step of two sequences (the second wanting every row), then
// greedy decode steps of one token each. The steps are replayed on the parts.
struct Reference {
  std::vector<Step> steps;
  std::vector<std::vector<float>> logits;  // per step, [n_logit_rows, n_vocab]
};

// loras: each sequence's adapters (empty: none), kept over the steps.
Reference whole_model_run(Model& model, bool one_sequence = false, std::vector<const LoraSet*> loras = {}) {
  const int64_t V = model.hparams().n_vocab;
  const auto prompt = [&](int64_t n, int64_t salt) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) t[size_t(i)] = int32_t(1 + (i * 37 + salt * 101) % (V - 1));
    return t;
  };
  KvStore kv = make_kv_store(model.hparams(), kSlots);
  ThreadPool pool(1);
  model.reserve(kMaxTokens);
  Reference ref;
  // (One sequence: its decode steps are single tokens, a mixture-of-experts layer's own path.)
  Step cur = one_sequence ? Step{{prompt(12, 1)}, {false}, {}} : Step{{prompt(12, 1), prompt(17, 2)}, {false, true}, {}};
  cur.lora = loras;
  std::vector<int64_t> n_past(cur.tokens.size(), 0);
  for (int i = 0; i <= kDecodeSteps; ++i) {
    const StepBatch b = make_batch(cur, n_past);
    std::vector<float> logits(size_t(n_logit_rows(b.seqs) * V));
    model.forward(b.seqs, kv, logits.data(), pool);
    Step next;
    int64_t row = 0;
    for (size_t s = 0; s < cur.tokens.size(); ++s) {
      const int64_t n = int64_t(cur.tokens[s].size());
      row += cur.all_logits[s] ? n : 1;
      next.tokens.push_back({int32_t(argmax(logits.data() + (row - 1) * V, V))});
      next.all_logits.push_back(false);
      n_past[s] += n;
    }
    next.lora = loras;
    ref.steps.push_back(cur);
    ref.logits.push_back(std::move(logits));
    cur = std::move(next);
  }
  return ref;
}

// Replays the reference's steps through `run(seqs, logits)`, returning each step's logits.
std::vector<std::vector<float>> replay(const Reference& ref, int64_t n_vocab,
                                       const std::function<void(std::span<const SeqBatch>, float*)>& run) {
  std::vector<std::vector<float>> out;
  std::vector<int64_t> n_past(ref.steps.front().tokens.size(), 0);
  for (const Step& st : ref.steps) {
    const StepBatch b = make_batch(st, n_past);
    std::vector<float> logits(size_t(n_logit_rows(b.seqs) * n_vocab), std::nanf(""));
    run(b.seqs, logits.data());
    out.push_back(std::move(logits));
    for (size_t s = 0; s < st.tokens.size(); ++s) n_past[s] += int64_t(st.tokens[s].size());
  }
  return out;
}

// A part of the model with its own K/V arena and pool (what one rank holds).
struct Part {
  std::unique_ptr<Model> model;
  KvStore kv;
  ThreadPool pool{1};
  explicit Part(std::unique_ptr<Model> m) : model(std::move(m)), kv(make_kv_store(model->hparams(), kSlots)) {
    model->reserve(kMaxTokens);
  }
};

struct Fixture {
  std::shared_ptr<const GgufFile> file = open_model_file(tern::testing::real_model_path());
  std::unique_ptr<Model> whole = load_model(file);
  const HParams& hp() const { return whole->hparams(); }
};

// ---------------------------------------------------------------------------------------------
// Tensor parallelism's collectives between threads of one process. Each rank deposits a copy of
// its buffer, all wait, each computes the result from the deposits into its own buffer (a sum in
// rank order 0..N-1, as dist/comm.h's all_reduce_sum adds, so every rank gets the same bits),
// and all wait again before the deposits are overwritten by the next collective.
class LocalGroup {
 public:
  explicit LocalGroup(int n) : n_(n), deposits_(size_t(n)), reduces_(size_t(n), 0), sync_(n) {}

  void all_reduce(int rank, float* x, int64_t n) {
    deposits_[size_t(rank)].assign(x, x + n);
    sync_.arrive_and_wait();
    for (int64_t i = 0; i < n; ++i) {
      float acc = deposits_[0][size_t(i)];
      for (int r = 1; r < n_; ++r) acc += deposits_[size_t(r)][size_t(i)];
      x[i] = acc;
    }
    ++reduces_[size_t(rank)];
    sync_.arrive_and_wait();
  }

  void all_gather(int rank, const float* mine, int64_t n, float* all) {
    deposits_[size_t(rank)].assign(mine, mine + n);
    sync_.arrive_and_wait();
    for (int r = 0; r < n_; ++r) std::copy_n(deposits_[size_t(r)].data(), n, all + r * n);
    sync_.arrive_and_wait();
  }

  ModelPartition partition(int rank) {
    ModelPartition p;
    p.tp_rank = rank;
    p.tp_size = n_;
    p.all_reduce = [this, rank](float* x, int64_t n) { all_reduce(rank, x, n); };
    p.all_gather = [this, rank](const float* mine, int64_t n, float* all) { all_gather(rank, mine, n, all); };
    return p;
  }
  int64_t reduces(int rank) const { return reduces_[size_t(rank)]; }

 private:
  int n_;
  std::vector<std::vector<float>> deposits_;
  std::vector<int64_t> reduces_;  // each rank's count, written by that rank only
  std::barrier<> sync_;
};

// Two adapters for the multi-LoRA tests: random pairs on every attention and FFN matrix, and on
// the output projection and the token embeddings (the vocabulary-row split and the embedding
// lookup); the second held as IEEE half (the F16C shrink on x86).
std::vector<std::shared_ptr<const LoraAdapter>> test_adapters(const GgufFile& file, const HParams& hp) {
  std::vector<std::shared_ptr<const LoraAdapter>> out;
  for (uint64_t seed : {7u, 8u}) {
    std::vector<LoraPair> pairs = LoraAdapter::random_pairs(file, 4, seed, 0.5f);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n01(0.0f, 0.3f);
    const auto random_pair = [&](const std::string& target, int64_t n_in, int64_t n_out, size_t a_size, size_t b_size) {
      LoraPair p;
      p.target = target;
      p.rank = 4;
      p.n_in = n_in;
      p.n_out = n_out;
      p.a.resize(a_size);
      p.b.resize(b_size);
      for (float& x : p.a) x = n01(rng);
      for (float& x : p.b) x = n01(rng);
      pairs.push_back(std::move(p));
    };
    if (file.find_tensor("output.weight"))
      random_pair("output.weight", hp.n_embd, hp.n_vocab, size_t(4 * hp.n_embd), size_t(4 * hp.n_vocab));
    random_pair("token_embd.weight", hp.n_embd, hp.n_vocab, size_t(hp.n_vocab * 4), size_t(hp.n_embd * 4));
    out.push_back(LoraAdapter::from_pairs("test-adapter-" + std::to_string(seed), hp.arch, 8.0f, std::move(pairs),
                                          /*half=*/seed == 8));
  }
  return out;
}

float max_abs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// The sequences' adapters of the adapter variants: the first one adapter, the second two stacked.
struct TestLoras {
  std::vector<std::shared_ptr<const LoraAdapter>> ads;
  LoraSet one, both;
  std::vector<const LoraSet*> per_seq;
  TestLoras(const GgufFile& file, const Model& model) : ads(test_adapters(file, model.hparams())) {
    for (const auto& a : ads) model.check_lora(*a);
    one = {LoraUse{ads[0], 1.0f}};
    both = {LoraUse{ads[0], 0.5f}, LoraUse{ads[1], 1.0f}};
    per_seq = {&one, &both};
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Pipeline stages

// Stages chained through x run the same kernels on the same rows as the whole model: the same
// bits, step after step (each stage's K/V arena holds its own layers).
static void check_stages(bool adapters) {
  Fixture f;
  const int64_t L = f.hp().n_layer, V = f.hp().n_vocab, E = f.hp().n_embd;
  std::unique_ptr<TestLoras> loras = adapters ? std::make_unique<TestLoras>(*f.file, *f.whole) : nullptr;
  const Reference ref = whole_model_run(*f.whole, false, loras ? loras->per_seq : std::vector<const LoraSet*>{});
  std::vector<int> stage_counts = {2};
  if (L >= 3) stage_counts.push_back(3);
  if (L > 3) stage_counts.push_back(int(L));  // one layer each
  for (int n_stages : stage_counts) {
    SCOPED_TRACE(std::to_string(n_stages) + " stages");
    std::vector<std::unique_ptr<Part>> stages;
    for (int s = 0; s < n_stages; ++s) {
      const SplitRange layers = stage_layers(L, s, n_stages);
      ModelPartition p;
      p.layer_begin = layers.begin;
      p.layer_end = layers.end;
      stages.push_back(std::make_unique<Part>(load_model(f.file, p)));
      const Model& m = *stages.back()->model;
      EXPECT_LT(m.weight_bytes(), f.whole->weight_bytes());
      // Its K/V arena holds its layers only.
      const std::vector<int64_t> rows = kv_rows(m.hparams()), whole_rows = kv_rows(f.hp());
      for (int64_t il = 0; il < L; ++il)
        EXPECT_EQ(rows[size_t(il)], il >= layers.begin && il < layers.end ? whole_rows[size_t(il)] : 0) << "layer " << il;
    }
    std::vector<float> x;
    const auto got = replay(ref, V, [&](std::span<const SeqBatch> seqs, float* logits) {
      int64_t T = 0;
      for (const SeqBatch& s : seqs) T += int64_t(s.tokens.size());
      x.assign(size_t(T * E), std::nanf(""));
      for (int s = 0; s < n_stages; ++s) {
        Part& st = *stages[size_t(s)];
        st.model->forward_stage(seqs, st.kv, x.data(), s == n_stages - 1 ? logits : nullptr, st.pool);
      }
    });
    for (size_t i = 0; i < ref.logits.size(); ++i)
      EXPECT_EQ(std::memcmp(got[i].data(), ref.logits[i].data(), ref.logits[i].size() * sizeof(float)), 0) << "step " << i;
  }
}

TEST(PartitionPipeline, StagesMatchWholeModelBitForBit) { check_stages(false); }
// Each stage applies its own layers' pairs (the first the embeddings', the last the output's).
TEST(PartitionPipeline, AdaptersThroughStagesMatchWholeModelBitForBit) { check_stages(true); }

// What dist/parallel_model.cpp does with --pp: the step cut into micro-batches, each through
// every stage in turn. The cut changes the prefill's batch shapes, so the logits agree to
// rounding, not bits.
static void check_micro_batches(bool adapters) {
  Fixture f;
  const int64_t L = f.hp().n_layer, V = f.hp().n_vocab, E = f.hp().n_embd;
  std::unique_ptr<TestLoras> loras = adapters ? std::make_unique<TestLoras>(*f.file, *f.whole) : nullptr;
  const Reference ref = whole_model_run(*f.whole, false, loras ? loras->per_seq : std::vector<const LoraSet*>{});
  const int n_stages = 2;
  std::vector<std::unique_ptr<Part>> stages;
  for (int s = 0; s < n_stages; ++s) {
    const SplitRange layers = stage_layers(L, s, n_stages);
    ModelPartition p;
    p.layer_begin = layers.begin;
    p.layer_end = layers.end;
    stages.push_back(std::make_unique<Part>(load_model(f.file, p)));
  }
  const auto got = replay(ref, V, [&](std::span<const SeqBatch> seqs, float* logits) {
    for (const dist::MicroBatch& mb : dist::split_micro_batches(seqs, 3)) {
      std::vector<float> x(size_t(mb.n_tokens * E));
      std::vector<float> rows(mb.logit_rows.size() * size_t(V));
      for (int s = 0; s < n_stages; ++s) {
        Part& st = *stages[size_t(s)];
        st.model->forward_stage(mb.seqs, st.kv, x.data(), s == n_stages - 1 ? rows.data() : nullptr, st.pool);
      }
      for (size_t j = 0; j < mb.logit_rows.size(); ++j)
        if (mb.logit_rows[j] >= 0) std::copy_n(rows.data() + j * size_t(V), V, logits + mb.logit_rows[j] * V);
    }
  });
  for (size_t i = 0; i < ref.logits.size(); ++i) {
    const std::vector<float>& want = ref.logits[i];
    float diff = 0.0f;
    for (size_t k = 0; k < want.size(); ++k) {
      ASSERT_FALSE(std::isnan(got[i][k])) << "step " << i << " row " << int64_t(k) / V << " never written";
      diff = std::max(diff, std::fabs(got[i][k] - want[k]));
    }
    EXPECT_LE(diff, 1e-3f * max_abs(want)) << "step " << i;
    for (int64_t r = 0; r < int64_t(want.size()) / V; ++r)
      EXPECT_EQ(argmax(got[i].data() + r * V, V), argmax(want.data() + r * V, V)) << "step " << i << " row " << r;
  }
}

TEST(PartitionPipeline, MicroBatchesThroughStagesMatchWholeStep) { check_micro_batches(false); }
// Pieces of a prompt keep their sequence's adapters (split_micro_batches copies SeqBatch::lora).
TEST(PartitionPipeline, AdaptersInMicroBatchesMatchWholeStep) { check_micro_batches(true); }

// ---------------------------------------------------------------------------------------------
// Tensor parallelism

namespace {

// A synthesized model of `shape` in `type`, written to a temporary file that is removed once
// mapped (the mapping keeps its bytes).
std::shared_ptr<const GgufFile> synth_file(const std::string& shape, DType type) {
  const std::string path = ::testing::TempDir() + "tern_partition_" + shape + "_" + std::to_string(::getpid()) + ".gguf";
  SynthOptions o;
  o.shape = shape;
  o.type = type;
  synth_model(o, path);
  auto file = open_model_file(path);
  std::remove(path.c_str());
  return file;
}

struct ModelFile {
  std::shared_ptr<const GgufFile> file;
  std::unique_ptr<Model> whole = load_model(file);
  const HParams& hp() const { return whole->hparams(); }
};

// adapters: the sequences run LoRA adapters (test_adapters: the first sequence one, the second
// both stacked at other scales), on the whole model and on every rank.
void check_tensor_parallel(int n_ranks, std::shared_ptr<const GgufFile> file = nullptr, bool one_sequence = false,
                           bool adapters = false) {
  ModelFile f{file ? file : open_model_file(tern::testing::real_model_path())};
  const HParams& hp = f.hp();
  std::unique_ptr<TestLoras> test_loras = adapters ? std::make_unique<TestLoras>(*f.file, *f.whole) : nullptr;
  std::vector<const LoraSet*> loras;
  if (test_loras) loras = one_sequence ? std::vector<const LoraSet*>{&test_loras->both} : test_loras->per_seq;
  const int64_t V = hp.n_vocab;
  for (int64_t il = 0; il < hp.n_layer; ++il)
    if (hp.head_count(il) % n_ranks != 0 || hp.head_count_kv(il) % n_ranks != 0)
      GTEST_SKIP() << "this model's layer " << il << " heads (" << hp.head_count(il) << ", " << hp.head_count_kv(il)
                   << " KV) are not divisible by " << n_ranks;
  const Reference ref = whole_model_run(*f.whole, one_sequence, loras);

  LocalGroup group(n_ranks);
  std::vector<std::unique_ptr<Part>> ranks;
  for (int r = 0; r < n_ranks; ++r) ranks.push_back(std::make_unique<Part>(load_model(f.file, group.partition(r))));
  if (test_loras)
    for (const auto& rank : ranks)
      for (const auto& a : test_loras->ads) rank->model->check_lora(*a);  // every target is on every rank (a share of it)

  // Each rank holds its share of every layer: its heads' K/V, and well under the whole model's
  // bytes (what it holds beyond 1/N: the norms, and the embedding rows it looks up whole).
  const std::vector<int64_t> whole_rows = kv_rows(hp);
  for (int r = 0; r < n_ranks; ++r) {
    const Model& m = *ranks[size_t(r)]->model;
    const std::vector<int64_t> rows = kv_rows(m.hparams());
    ASSERT_EQ(rows.size(), whole_rows.size());
    for (size_t il = 0; il < rows.size(); ++il) EXPECT_EQ(rows[il] * n_ranks, whole_rows[il]) << "layer " << il;
    const double ratio = double(m.weight_bytes()) / double(f.whole->weight_bytes());
    std::printf("tp %d rank %d: %lld of the whole model's %lld weight bytes (%.3f)\n", n_ranks, r,
                (long long)m.weight_bytes(), (long long)f.whole->weight_bytes(), ratio);
    EXPECT_GT(m.weight_bytes(), 0);
    EXPECT_LE(ratio, n_ranks == 2 ? 0.75 : 0.5);
  }

  // Rank r's logits of each step; ranks run on their own threads, meeting in the collectives.
  std::vector<std::vector<std::vector<float>>> rank_logits(static_cast<size_t>(n_ranks));
  const auto got = replay(ref, V, [&](std::span<const SeqBatch> seqs, float* logits) {
    const int64_t rows = n_logit_rows(seqs);
    std::vector<std::vector<float>> out(size_t(n_ranks), std::vector<float>(size_t(rows * V), std::nanf("")));
    std::vector<std::thread> threads;
    for (int r = 0; r < n_ranks; ++r)
      threads.emplace_back([&, r] {
        Part& p = *ranks[size_t(r)];
        p.model->forward(seqs, p.kv, out[size_t(r)].data(), p.pool);
      });
    for (std::thread& t : threads) t.join();
    std::copy(out[0].begin(), out[0].end(), logits);
    for (int r = 0; r < n_ranks; ++r) rank_logits[size_t(r)].push_back(std::move(out[size_t(r)]));
  });

  // Two all-reduces per layer and step: attn_output's and ffn_down's (or the experts') partial sums.
  for (int r = 0; r < n_ranks; ++r) EXPECT_EQ(group.reduces(r), 2 * hp.n_layer * int64_t(ref.steps.size())) << "rank " << r;

  // Against the whole model: the all-reduce adds attn_output's and ffn_down's products as N
  // partial sums over heads / channels, a different summation order than one dot product over
  // all of them, so the logits differ by float rounding that the remaining layers carry along.
  // With float weights (stories260K) that stays a few ulps of the residual stream: 1e-4 of the
  // logits' scale bounds it with a wide margin. Quantized weights (the fallback model is q8_0)
  // quantize every matmul's input to 8 bits per block, and an ulp's change can move an element
  // across a rounding boundary, changing its product by a whole quantization step (1/254 of the
  // block's largest element) in the layers after: a looser bound there, the one the MPI test
  // states (5%). Measured: most quantized models here stay within 1e-5 (no element crossed), but
  // qwen2moe-tiny in q8_0 moves 0.8% (the same file run by the scalar kernels instead of the SIMD
  // ones moves 1.3%: this random model amplifies one activation step that much).
  bool float_weights = true;  // every matrix (gpt-oss's experts are MXFP4 whatever the rest is)
  for (const GgufTensorInfo& t : f.file->tensors())
    if (t.ne.size() >= 2 && !dtype_is_float(t.type)) float_weights = false;
  const float rel = float_weights ? 1e-4f : 5e-2f;
  float worst = 0.0f, worst_scale = 0.0f;
  for (size_t i = 0; i < ref.logits.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    // Every rank ends with the same bits (the same sums, the same gathered rows).
    for (int r = 1; r < n_ranks; ++r)
      EXPECT_EQ(std::memcmp(rank_logits[size_t(r)][i].data(), rank_logits[0][i].data(), got[i].size() * sizeof(float)), 0)
          << "rank " << r << " differs from rank 0";
    const std::vector<float>& want = ref.logits[i];
    const float scale = max_abs(want);
    const float bound = rel * scale + 1e-5f;
    float diff = 0.0f;
    for (size_t k = 0; k < want.size(); ++k) {
      ASSERT_FALSE(std::isnan(got[i][k])) << "logit " << k << " never written";
      diff = std::max(diff, std::fabs(got[i][k] - want[k]));
    }
    EXPECT_LE(diff, bound) << "max |logit| " << scale << (float_weights ? " (float weights)" : " (quantized weights)");
    if (diff > worst) worst = diff, worst_scale = scale;
    // The greedy choice of every row is the whole model's (unless its top two are closer than
    // rounding can tell apart, which these prompts do not hit; skipped rather than flaky then).
    for (int64_t r = 0; r < int64_t(want.size()) / V; ++r) {
      const float* w = want.data() + r * V;
      const int64_t best = argmax(w, V);
      float second = -INFINITY;
      for (int64_t k = 0; k < V; ++k)
        if (k != best) second = std::max(second, w[k]);
      if (w[best] - second <= 2 * bound) continue;
      EXPECT_EQ(argmax(got[i].data() + r * V, V), best) << "row " << r;
    }
  }
  std::printf("tp %d: max |logit - whole model's| %.3g (max |logit| %.3g, %s weights)\n", n_ranks, double(worst),
              double(worst_scale), float_weights ? "float" : "quantized");
}

}  // namespace

TEST(PartitionTensorParallel, TwoRanksMatchWholeModel) { check_tensor_parallel(2); }
TEST(PartitionTensorParallel, FourRanksMatchWholeModel) { check_tensor_parallel(4); }

// Mixture-of-experts layers: every expert's channels split over the ranks (its down by whole
// blocks), the router whole on each rank, one all-reduce of the experts' weighted sum. Mixtral's
// experts in q8_0 (96 channels: 64 + 32, so unequal shares); Qwen2-MoE's shared expert with its
// sigmoid gate, in f32 and q8_0; Qwen3-MoE in f16; gpt-oss's MXFP4 experts with their biases (the
// down's added once) and attention sinks.
TEST(PartitionTensorParallel, MixtralExpertsTwoRanksMatchWholeModel) {
  check_tensor_parallel(2, synth_file("mixtral-tiny", DType::Q8_0));
  check_tensor_parallel(2, synth_file("mixtral-tiny", DType::Q8_0), /*one_sequence=*/true);  // one-token decode
}
TEST(PartitionTensorParallel, Qwen2MoeSharedExpertTwoRanksMatchWholeModel) {
  check_tensor_parallel(2, synth_file("qwen2moe-tiny", DType::F32));
  check_tensor_parallel(2, synth_file("qwen2moe-tiny", DType::Q8_0));
  check_tensor_parallel(2, synth_file("qwen2moe-tiny", DType::F32), /*one_sequence=*/true);
}
TEST(PartitionTensorParallel, Qwen3MoeTwoRanksMatchWholeModel) {
  check_tensor_parallel(2, synth_file("qwen3moe-tiny", DType::F16));
}
// LoRA adapters under tensor parallelism (S-LoRA's split): a column-split matrix's (q/k/v/gate/
// up, the output's vocabulary rows) update expands into the rank's rows of B; a row-split one's
// (attn_output, ffn_down) shrinks the rank's columns of A, and its expanded update is a partial
// sum like the matmul's, added by the same all-reduce. Two sequences with different adapters
// (one of them two stacked), and one sequence's one-token decode.
TEST(PartitionTensorParallel, AdaptersTwoRanksMatchWholeModel) {
  check_tensor_parallel(2, nullptr, false, /*adapters=*/true);
  check_tensor_parallel(2, nullptr, true, /*adapters=*/true);
}
TEST(PartitionTensorParallel, AdaptersFourRanksMatchWholeModel) { check_tensor_parallel(4, nullptr, false, true); }
TEST(PartitionTensorParallel, AdaptersOnAQwen2MoeMatchWholeModel) {  // the shared expert's and router's pairs
  check_tensor_parallel(2, synth_file("qwen2moe-tiny", DType::F32), false, true);
}

TEST(PartitionTensorParallel, GptOssExpertsTwoRanksMatchWholeModel) {
  check_tensor_parallel(2, synth_file("gpt-oss-tiny", DType::F32));
  check_tensor_parallel(2, synth_file("gpt-oss-tiny", DType::F32), /*one_sequence=*/true);
}

// ---------------------------------------------------------------------------------------------
// Errors

namespace {

// The message of load_model's error for `part`, or "" when it loads.
std::string load_error(const std::shared_ptr<const GgufFile>& file, const ModelPartition& part) {
  try {
    (void)load_model(file, part);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

}  // namespace

TEST(PartitionErrors, BadPartsThrow) {
  Fixture f;
  const int64_t L = f.hp().n_layer;
  const auto reduce = [](float*, int64_t) {};
  const auto gather = [](const float*, int64_t, float*) {};

  // --tp 3: the 8 query and 4 KV heads do not split into 3 whole shares.
  ModelPartition tp3;
  tp3.tp_size = 3;
  tp3.all_reduce = reduce;
  tp3.all_gather = gather;
  const std::string e3 = load_error(f.file, tp3);
  EXPECT_NE(e3.find("--tp"), std::string::npos) << e3;

  // Experts whose channels are fewer blocks than ranks: qwen3moe-tiny's 32 expert channels are one
  // q8_0 block, which rank 1 of 2 would get none of.
  {
    ModelPartition tp2;
    tp2.tp_size = 2;
    tp2.tp_rank = 1;
    tp2.all_reduce = reduce;
    tp2.all_gather = gather;
    const std::string e = load_error(synth_file("qwen3moe-tiny", DType::Q8_0), tp2);
    EXPECT_NE(e.find("ffn_down_exps"), std::string::npos) << e;
    EXPECT_NE(e.find("--tp"), std::string::npos) << e;
  }

  // Tensor parallelism without its collectives.
  ModelPartition no_reduce;
  no_reduce.tp_size = 2;
  no_reduce.all_gather = gather;
  EXPECT_NE(load_error(f.file, no_reduce), "");
  ModelPartition no_gather;
  no_gather.tp_size = 2;
  no_gather.all_reduce = reduce;
  EXPECT_NE(load_error(f.file, no_gather), "");

  // A rank outside its group.
  ModelPartition bad_rank;
  bad_rank.tp_size = 2;
  bad_rank.tp_rank = 2;
  bad_rank.all_reduce = reduce;
  bad_rank.all_gather = gather;
  EXPECT_NE(load_error(f.file, bad_rank), "");

  // Layer ranges beyond the model, or empty.
  ModelPartition beyond;
  beyond.layer_begin = 1;
  beyond.layer_end = L + 1;
  const std::string eb = load_error(f.file, beyond);
  EXPECT_NE(eb.find(std::to_string(L) + " layers"), std::string::npos) << eb;
  ModelPartition empty;
  empty.layer_begin = 2;
  empty.layer_end = 2;
  EXPECT_NE(load_error(f.file, empty), "");
  ModelPartition past_end;
  past_end.layer_begin = L;
  EXPECT_NE(load_error(f.file, past_end), "");
  ModelPartition negative;
  negative.layer_begin = -1;
  negative.layer_end = 2;
  EXPECT_NE(load_error(f.file, negative), "");
}
