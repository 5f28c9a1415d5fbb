// Embedding requests (engine/engine.h, EmbeddingParams) and the hidden states they pool
// (SeqBatch::hidden): on a random-weight stories260K-shape model (no ../shared needed),
//   - the hidden states are the same bits on every forward path (pooled, phased, serial), the
//     logits are unchanged by asking for them, and logits = hidden x output^T;
//   - an embedding request batched with generating requests (same steps) gives the vector a
//     direct single-sequence forward gives, and leaves the generations' tokens as they are;
//   - a chunked prefill (a small step budget) pools its chunks to the same vector (1e-6);
//   - mean, last, cls and none pool as defined, normalised or not;
//   - cached prefixes are never reused (a repeated input gives the same vector, 0 cached);
//   - preemption under a small KV arena recomputes without counting a position twice;
//   - bad embedding requests are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>

#include "core/error.h"
#include "engine_test_util.h"

namespace tern {
namespace {

using tern::testing::Collected;
using tern::testing::drive;
using tern::testing::greedy;
using tern::testing::Sink;

std::shared_ptr<const GgufFile> model_file() {
  return open_model_file(tern::testing::synthetic_model_path(DType::F32));
}

std::vector<int32_t> random_prompt(size_t n, uint32_t seed, int32_t n_vocab) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p = {1};
  while (p.size() < n) p.push_back(3 + int32_t(rng() % uint32_t(n_vocab - 3)));
  return p;
}

// Every token's hidden state of `prompt` alone, in one step: [n, n_embd].
std::vector<float> direct_hidden(const std::shared_ptr<const GgufFile>& file, const std::vector<int32_t>& prompt,
                                 int n_threads = 1, std::vector<float>* logits_out = nullptr) {
  auto model = load_model(file);
  const int64_t n = int64_t(prompt.size()), E = model->hparams().n_embd, V = model->hparams().n_vocab;
  model->reserve(n);
  KvStore kv = make_kv_store(model->hparams(), n);
  std::vector<int32_t> slots(static_cast<size_t>(n));
  std::iota(slots.begin(), slots.end(), 0);
  std::vector<float> hidden(size_t(n * E)), logits(size_t(n * V));
  SeqBatch sb;
  sb.tokens = prompt;
  sb.slots = slots;
  sb.all_logits = true;
  sb.hidden = hidden.data();
  ThreadPool pool(n_threads);
  model->forward(std::span<const SeqBatch>(&sb, 1), kv, logits.data(), pool);
  if (logits_out) *logits_out = logits;
  return hidden;
}

// The oracle's pooling: in double, then L2-normalised.
std::vector<double> pool_rows(const std::vector<float>& rows, int64_t E, Pooling p, bool normalize) {
  const int64_t n = int64_t(rows.size()) / E;
  std::vector<double> v(size_t(E), 0.0);
  for (int64_t k = 0; k < E; ++k) {
    if (p == Pooling::Mean) {
      for (int64_t t = 0; t < n; ++t) v[size_t(k)] += rows[size_t(t * E + k)];
      v[size_t(k)] /= double(n);
    } else {
      v[size_t(k)] = rows[size_t((p == Pooling::Cls ? 0 : n - 1) * E + k)];
    }
  }
  if (normalize) {
    double ss = 0;
    for (double x : v) ss += x * x;
    for (double& x : v) x /= std::sqrt(ss);
  }
  return v;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

RequestParams gen_request(std::vector<int32_t> prompt, int64_t max_tokens) {
  RequestParams p;
  p.prompt_ids = std::move(prompt);
  p.max_tokens = max_tokens;
  p.sampling = greedy();
  return p;
}

// The final output of an embedding request.
struct Embedded {
  std::vector<float> v;
  FinishReason reason = FinishReason::None;
  std::string error;
  RequestMetrics metrics;
  int n_outputs = 0;
  int64_t step = -1;  // the step() call it finished in
};

RequestParams embedding_request(std::vector<int32_t> prompt, Pooling pooling, bool normalize = true) {
  RequestParams p;
  p.prompt_ids = std::move(prompt);
  p.embedding.enabled = true;
  p.embedding.pooling = pooling;
  p.embedding.normalize = normalize;
  return p;
}

EngineConfig config(int64_t batch_tokens, int n_threads = 2) {
  EngineConfig cfg;
  cfg.n_threads = n_threads;
  cfg.max_batch_tokens = batch_tokens;
  cfg.n_ctx = 256;
  cfg.n_parallel = 8;
  return cfg;
}

// Runs these embedding requests through a fresh engine and returns their outputs.
std::vector<Embedded> embed_all(const EngineConfig& cfg, const std::vector<RequestParams>& reqs) {
  auto file = model_file();
  Engine engine(file, Tokenizer::from_gguf(*file), cfg);
  std::vector<Embedded> got(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_GT(engine.add_request(reqs[i], [&got, i](const RequestOutput& o) {
      ++got[i].n_outputs;
      got[i].v = o.embedding;
      got[i].reason = o.finish_reason;
      got[i].error = o.error;
      got[i].metrics = o.metrics;
      EXPECT_TRUE(o.finished);
      EXPECT_TRUE(o.tokens.empty());
    }), 0u);
  drive(engine);
  for (const Embedded& e : got) {
    EXPECT_EQ(e.n_outputs, 1);
    EXPECT_EQ(e.reason, FinishReason::Stop) << e.error;
  }
  const EngineMetrics m = engine.metrics();
  EXPECT_EQ(m.kv_blocks_used, 0) << "blocks of finished embedding requests must be freed";
  return got;
}

TEST(EmbeddingHidden, SameBitsOnEveryPathAndLogitsUnchanged) {
  auto file = model_file();
  const int32_t V = int32_t(read_hparams(*file).n_vocab);
  const int64_t E = read_hparams(*file).n_embd;
  // Two sequences in steps of 9, 2 and 1 + 1 tokens: prefill (pooled or alone), then steps small
  // enough for the phased path.
  const std::vector<int32_t> a = random_prompt(12, 1, V), b = random_prompt(10, 2, V);
  auto run = [&](int n_threads, bool with_hidden, std::vector<float>& logits_all) {
    auto model = load_model(file);
    model->reserve(16);
    KvStore kv = make_kv_store(model->hparams(), 64);
    std::vector<int32_t> sa(12), sb(10);
    std::iota(sa.begin(), sa.end(), 0);
    std::iota(sb.begin(), sb.end(), 30);
    ThreadPool pool(n_threads);
    std::vector<float> hidden_all;
    const int64_t steps[][4] = {{0, 5, 0, 4}, {5, 1, 4, 1}, {6, 6, 5, 0}, {12, 0, 5, 5}};
    for (const auto& st : steps) {
      std::vector<SeqBatch> seqs;
      std::vector<float> h(size_t(16 * E), -7.0f);
      int64_t off = 0;
      for (int w = 0; w < 2; ++w) {
        const int64_t past = st[w * 2], n = st[w * 2 + 1];
        if (n == 0) continue;
        const std::vector<int32_t>& p = w == 0 ? a : b;
        SeqBatch s;
        s.n_past = past;
        s.tokens = std::span<const int32_t>(p.data() + past, size_t(n));
        s.slots = std::span<const int32_t>((w == 0 ? sa : sb).data(), size_t(past + n));
        s.all_logits = w == 1;
        // Only sequence a asks for hidden states: b's rows must stay untouched.
        if (with_hidden && w == 0) s.hidden = h.data() + off;
        off += n;
        seqs.push_back(s);
      }
      std::vector<float> logits(size_t(n_logit_rows(seqs) * V));
      model->forward(seqs, kv, logits.data(), pool);
      logits_all.insert(logits_all.end(), logits.begin(), logits.end());
      hidden_all.insert(hidden_all.end(), h.begin(), h.end());
    }
    return hidden_all;
  };
  std::vector<float> ref_logits, plain_logits;
  const std::vector<float> ref = run(1, true, ref_logits);
  run(1, false, plain_logits);
  EXPECT_EQ(ref_logits, plain_logits) << "asking for hidden states changed the logits";
  size_t written = 0, untouched = 0;
  for (float x : ref) (x == -7.0f ? untouched : written)++;
  EXPECT_EQ(written, size_t(12 * E)) << "every token of a, and nothing else, gets a hidden row";
  for (const char* path : {"phased", "serial", "auto"})
    for (int n_threads : {2, 3}) {
      ::setenv("TERN_SMALL_MODEL_PATH", path, 1);
      std::vector<float> logits;
      const std::vector<float> got = run(n_threads, true, logits);
      ::unsetenv("TERN_SMALL_MODEL_PATH");
      EXPECT_EQ(got, ref) << "hidden states differ on path " << path << " with " << n_threads << " threads";
      EXPECT_EQ(logits, ref_logits) << path << " " << n_threads;
    }
}

TEST(EmbeddingHidden, LogitsAreHiddenTimesOutput) {
  auto file = model_file();
  const std::vector<int32_t> p = random_prompt(9, 3, int32_t(read_hparams(*file).n_vocab));
  std::vector<float> logits;
  const std::vector<float> h = direct_hidden(file, p, 1, &logits);
  // The synthetic model has an output matrix or ties it to token_embd; either way it is f32.
  const GgufTensorInfo* out = file->find_tensor("output.weight");
  if (!out) out = file->find_tensor("token_embd.weight");
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(out->type, DType::F32);
  const float* w = reinterpret_cast<const float*>(out->data);
  const int64_t E = read_hparams(*file).n_embd, V = read_hparams(*file).n_vocab;
  double worst = 0, scale = 0;
  for (size_t t = 0; t < p.size(); ++t)
    for (int64_t v = 0; v < V; ++v) {
      double dot = 0;
      for (int64_t k = 0; k < E; ++k) dot += double(h[t * size_t(E) + size_t(k)]) * double(w[v * E + k]);
      worst = std::max(worst, std::fabs(dot - double(logits[t * size_t(V) + size_t(v)])));
      scale = std::max(scale, std::fabs(dot));
    }
  EXPECT_LT(worst, 1e-4 * std::max(1.0, scale));
}

TEST(EngineEmbedding, BatchedWithGenerationEqualsDirectForward) {
  auto file = model_file();
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  const int32_t V = int32_t(read_hparams(*file).n_vocab);
  const int64_t E = read_hparams(*file).n_embd;
  const std::vector<int32_t> pe = random_prompt(23, 10, V), pl = random_prompt(17, 11, V);
  const std::vector<int32_t> g1 = random_prompt(15, 12, V), g2 = random_prompt(9, 13, V);

  // The generations alone, for their tokens.
  std::map<int, Collected> alone;
  {
    Engine engine(file, tok, config(128));
    Sink sink;
    const uint64_t a = engine.add_request(gen_request(g1, 12), sink.callback());
    const uint64_t b = engine.add_request(gen_request(g2, 12), sink.callback());
    drive(engine);
    alone[0] = sink.get(a);
    alone[1] = sink.get(b);
  }

  Engine engine(file, tok, config(128));
  Sink sink;
  int64_t step = 0;
  std::vector<int64_t> gen_first_step(2, -1);
  Embedded mean, last;
  auto embed_cb = [&step](Embedded& into) {
    return [&into, &step](const RequestOutput& o) {
      ++into.n_outputs;
      into.v = o.embedding;
      into.reason = o.finish_reason;
      into.error = o.error;
      into.metrics = o.metrics;
      into.step = step;
    };
  };
  auto gen_cb = [&](int k) {
    OutputCallback inner = sink.callback();
    return [&, k, inner](const RequestOutput& o) {
      if (gen_first_step[size_t(k)] < 0 && !o.tokens.empty()) gen_first_step[size_t(k)] = step;
      inner(o);
    };
  };
  const uint64_t a = engine.add_request(gen_request(g1, 12), gen_cb(0));
  engine.add_request(embedding_request(pe, Pooling::Mean), embed_cb(mean));
  const uint64_t b = engine.add_request(gen_request(g2, 12), gen_cb(1));
  engine.add_request(embedding_request(pl, Pooling::Last), embed_cb(last));
  while (engine.has_work() && step < 10000) {
    engine.step();
    ++step;
  }
  ASSERT_EQ(mean.reason, FinishReason::Stop) << mean.error;
  ASSERT_EQ(last.reason, FinishReason::Stop) << last.error;
  EXPECT_EQ(mean.n_outputs, 1);
  EXPECT_EQ(last.n_outputs, 1);
  // All four prompts fit one step's budget: the embeddings were computed in the step that also
  // produced the generations' first tokens.
  EXPECT_EQ(mean.step, gen_first_step[0]);
  EXPECT_EQ(last.step, gen_first_step[1]);
  EXPECT_EQ(mean.metrics.n_prompt, int64_t(pe.size()));
  EXPECT_EQ(mean.metrics.n_generated, 0);
  // The generations are untouched by the embedding requests beside them.
  EXPECT_EQ(sink.get(a).ids, alone[0].ids);
  EXPECT_EQ(sink.get(b).ids, alone[1].ids);
  EXPECT_EQ(engine.metrics().kv_blocks_used, 0);

  const std::vector<double> want_mean = pool_rows(direct_hidden(file, pe), E, Pooling::Mean, true);
  const std::vector<double> want_last = pool_rows(direct_hidden(file, pl), E, Pooling::Last, true);
  EXPECT_LT(max_abs_diff(mean.v, want_mean), 1e-6);
  EXPECT_LT(max_abs_diff(last.v, want_last), 1e-6);
  double norm = 0;
  for (float x : mean.v) norm += double(x) * x;
  EXPECT_NEAR(norm, 1.0, 1e-6);
}

TEST(EngineEmbedding, ChunkedPrefillPoolsTheChunks) {
  auto file = model_file();
  const int32_t V = int32_t(read_hparams(*file).n_vocab);
  const std::vector<int32_t> p = random_prompt(61, 20, V), q = random_prompt(40, 21, V);
  for (Pooling pool : {Pooling::Mean, Pooling::Last, Pooling::Cls}) {
    const std::vector<RequestParams> reqs = {embedding_request(p, pool), embedding_request(q, pool, false)};
    const std::vector<Embedded> whole = embed_all(config(512), reqs);
    for (int64_t budget : {7, 16, 33}) {
      const std::vector<Embedded> chunked = embed_all(config(budget), reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        ASSERT_EQ(chunked[i].v.size(), whole[i].v.size());
        double worst = 0;
        for (size_t k = 0; k < whole[i].v.size(); ++k)
          worst = std::max(worst, std::fabs(double(chunked[i].v[k]) - double(whole[i].v[k])));
        EXPECT_LT(worst, 1e-6) << pooling_name(pool) << " budget " << budget << " input " << i;
      }
    }
  }
}

TEST(EngineEmbedding, PoolingsAsDefined) {
  auto file = model_file();
  const int32_t V = int32_t(read_hparams(*file).n_vocab);
  const int64_t E = read_hparams(*file).n_embd;
  const std::vector<int32_t> p = random_prompt(30, 30, V);
  const std::vector<float> h = direct_hidden(file, p);
  const std::vector<Embedded> got =
      embed_all(config(512), {embedding_request(p, Pooling::Mean), embedding_request(p, Pooling::Last),
                              embedding_request(p, Pooling::Cls), embedding_request(p, Pooling::Mean, false),
                              embedding_request(p, Pooling::None, false), embedding_request(p, Pooling::Model)});
  EXPECT_LT(max_abs_diff(got[0].v, pool_rows(h, E, Pooling::Mean, true)), 1e-6);
  EXPECT_LT(max_abs_diff(got[1].v, pool_rows(h, E, Pooling::Last, true)), 1e-6);
  EXPECT_LT(max_abs_diff(got[2].v, pool_rows(h, E, Pooling::Cls, true)), 1e-6);
  EXPECT_LT(max_abs_diff(got[3].v, pool_rows(h, E, Pooling::Mean, false)), 1e-6);
  // Mean and last are different vectors (a test that could not tell them apart would pass
  // with either).
  EXPECT_GT(max_abs_diff(got[0].v, pool_rows(h, E, Pooling::Last, true)), 1e-3);
  // None: every token's row, as the direct forward gives it.
  ASSERT_EQ(got[4].v.size(), h.size());
  double worst = 0;
  for (size_t i = 0; i < h.size(); ++i) worst = std::max(worst, std::fabs(double(got[4].v[i]) - double(h[i])));
  EXPECT_LT(worst, 1e-6);
  // The synthetic file declares no pooling_type: Model means Mean.
  EXPECT_EQ(got[5].v, got[0].v);
}

TEST(EngineEmbedding, ModelPoolingFollowsTheFilesKey) {
  HParams hp;
  EXPECT_EQ(model_pooling(hp), Pooling::Mean);  // absent
  hp.pooling_type = 0;
  EXPECT_EQ(model_pooling(hp), Pooling::Mean);  // none: no sentence embedding declared
  hp.pooling_type = 1;
  EXPECT_EQ(model_pooling(hp), Pooling::Mean);
  hp.pooling_type = 2;
  EXPECT_EQ(model_pooling(hp), Pooling::Cls);
  hp.pooling_type = 3;
  EXPECT_EQ(model_pooling(hp), Pooling::Last);
  hp.pooling_type = 4;
  EXPECT_EQ(model_pooling(hp), Pooling::Mean);  // rank needs a classifier head tern does not have
  EXPECT_EQ(pooling_from_name("last"), Pooling::Last);
  EXPECT_THROW(pooling_from_name("max"), Error);
}

TEST(EngineEmbedding, NoPrefixReuseAndTheSameVectorAgain) {
  auto file = model_file();
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  const int32_t V = int32_t(read_hparams(*file).n_vocab);
  const std::vector<int32_t> p = random_prompt(70, 40, V);
  EngineConfig cfg = config(512);
  cfg.prefix_caching = true;
  cfg.kv_block_size = 16;
  Engine engine(file, tok, cfg);
  Sink sink;
  // A generation of the same prompt first: its blocks are published to the prefix cache.
  const uint64_t g = engine.add_request(gen_request(p, 2), sink.callback());
  drive(engine);
  ASSERT_EQ(sink.get(g).reason, FinishReason::Length);
  std::vector<Embedded> got(3);
  for (size_t i = 0; i < got.size(); ++i) {
    engine.add_request(embedding_request(p, Pooling::Mean), [&got, i](const RequestOutput& o) {
      got[i].v = o.embedding;
      got[i].reason = o.finish_reason;
      got[i].metrics = o.metrics;
    });
    drive(engine);
    EXPECT_EQ(got[i].reason, FinishReason::Stop);
    EXPECT_EQ(got[i].metrics.n_cached_prompt, 0) << "an embedding request reused cached blocks";
  }
  EXPECT_EQ(got[1].v, got[0].v);
  EXPECT_EQ(got[2].v, got[0].v);
  // And a generation of it still finds the generation's cached blocks.
  const uint64_t g2 = engine.add_request(gen_request(p, 2), sink.callback());
  drive(engine);
  EXPECT_GT(sink.get(g2).metrics.n_cached_prompt, 0);
  const int64_t E = read_hparams(*file).n_embd;
  EXPECT_LT(max_abs_diff(got[0].v, pool_rows(direct_hidden(file, p), E, Pooling::Mean, true)), 1e-6);
}

TEST(EngineEmbedding, PreemptedEmbeddingsCountEachPositionOnce) {
  auto file = model_file();
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  const int32_t V = int32_t(read_hparams(*file).n_vocab);
  const int64_t E = read_hparams(*file).n_embd;
  // An arena of 12 blocks of 8 tokens, steps of 24 tokens: generations growing into the
  // arena preempt the newest running requests, the embedding ones among them.
  EngineConfig cfg = config(24);
  cfg.kv_block_size = 8;
  cfg.kv_memory_bytes = 12 * 8 * kv_bytes_per_token(read_hparams(*file), KvType::F32);
  cfg.n_ctx = 96;
  Engine engine(file, tok, cfg);
  Sink sink;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<Embedded> got(4);
  for (int i = 0; i < 3; ++i) engine.add_request(gen_request(random_prompt(10, 50 + i, V), 40), sink.callback());
  for (size_t i = 0; i < got.size(); ++i) {
    prompts.push_back(random_prompt(30 + 5 * i, 60 + uint32_t(i), V));
    engine.add_request(embedding_request(prompts.back(), i % 2 ? Pooling::Last : Pooling::Mean),
                       [&got, i](const RequestOutput& o) {
                         ++got[i].n_outputs;
                         got[i].v = o.embedding;
                         got[i].reason = o.finish_reason;
                         got[i].error = o.error;
                         got[i].metrics = o.metrics;
                       });
  }
  drive(engine);
  EXPECT_GT(engine.metrics().n_preempted_total, 0) << "the test did not preempt anything";
  int64_t embeddings_preempted = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].reason, FinishReason::Stop) << got[i].error;
    EXPECT_EQ(got[i].n_outputs, 1);
    embeddings_preempted += got[i].metrics.n_preempted;
    const std::vector<double> want = pool_rows(direct_hidden(file, prompts[i]), E, i % 2 ? Pooling::Last : Pooling::Mean, true);
    EXPECT_LT(max_abs_diff(got[i].v, want), 1e-6) << "input " << i;
  }
  std::printf("preemptions: %lld in all, %lld of embedding requests\n",
              static_cast<long long>(engine.metrics().n_preempted_total), static_cast<long long>(embeddings_preempted));
  EXPECT_EQ(engine.metrics().kv_blocks_used, 0);
}

TEST(EngineEmbedding, BadRequestsAreRefused) {
  auto file = model_file();
  Engine engine(file, Tokenizer::from_gguf(*file), config(64));
  const int32_t V = int32_t(read_hparams(*file).n_vocab);
  RequestParams two = embedding_request(random_prompt(5, 1, V), Pooling::Mean);
  two.n = 2;
  EXPECT_THROW(engine.add_request(two, nullptr), Error);
  EXPECT_THROW(engine.add_request(embedding_request(random_prompt(257, 1, V), Pooling::Mean), nullptr), Error);
  RequestParams bad_id = embedding_request({1, V}, Pooling::Mean);
  EXPECT_THROW(engine.add_request(bad_id, nullptr), Error);
  EXPECT_THROW(engine.add_request(embedding_request({}, Pooling::Mean), nullptr), Error);
  // A prompt of the whole context is fine: nothing is generated after it.
  Embedded full;
  EXPECT_GT(engine.add_request(embedding_request(random_prompt(256, 2, V), Pooling::Last),
                               [&full](const RequestOutput& o) {
                                 full.v = o.embedding;
                                 full.reason = o.finish_reason;
                                 full.error = o.error;
                               }),
            0u);
  drive(engine);
  EXPECT_EQ(full.reason, FinishReason::Stop) << full.error;
  EXPECT_EQ(int64_t(full.v.size()), engine.n_embd());
}

}  // namespace
}  // namespace tern
