// Request lifecycle: validation, the queue limit, finish reasons, aborts at random points over
// thousands of requests (no leaked blocks, no memory growth), submission from other threads,
// a failing request that does not disturb the others, and the metrics.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/stats.h"
#include "engine_test_util.h"

namespace tern {
namespace {

using tern::testing::Collected;
using tern::testing::drive;
using tern::testing::greedy;
using tern::testing::shared_path;
using tern::testing::Sink;

class EngineLifecycle : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = open_model_file(tern::testing::real_model_path());
    tok_ = Tokenizer::from_gguf(*file_);
  }
  EngineConfig config() const {
    EngineConfig c;
    c.n_threads = 2;
    return c;
  }
  RequestParams params(const std::string& text, int64_t max_tokens = 8) const {
    RequestParams p;
    p.prompt_ids = tok_->encode(text, true);
    p.max_tokens = max_tokens;
    p.sampling = greedy();
    return p;
  }
  std::shared_ptr<const GgufFile> file_;
  std::shared_ptr<const Tokenizer> tok_;
};

TEST_F(EngineLifecycle, BadRequestsThrowAndAFullQueueSaysNotNow) {
  EngineConfig c = config();
  c.n_ctx = 64;
  c.max_waiting = 3;
  Engine engine(file_, tok_, c);
  EXPECT_EQ(engine.n_ctx(), 64);
  RequestParams p = params("Hello");
  p.prompt_ids.clear();
  EXPECT_THROW(engine.add_request(p, {}), Error);
  p.prompt_ids.assign(64, 5);  // prompt + 1 > n_ctx
  EXPECT_THROW(engine.add_request(p, {}), Error);
  p.prompt_ids.assign(63, 5);  // just fits
  EXPECT_GT(engine.add_request(p, {}), 0u);
  p.prompt_ids = {1, 2, 100000};
  EXPECT_THROW(engine.add_request(p, {}), Error);
  p.prompt_ids = {1, -3};
  EXPECT_THROW(engine.add_request(p, {}), Error);
  p = params("Hello");
  p.sampling.top_p = 2;
  EXPECT_THROW(engine.add_request(p, {}), Error);
  p = params("Hello");
  p.n = 0;
  EXPECT_THROW(engine.add_request(p, {}), Error);
  p = params("Hello");
  p.n_logprobs = 21;
  EXPECT_THROW(engine.add_request(p, {}), Error);
  // Queue limit: 1 queued already, two more fit, the fourth is refused with 0.
  EXPECT_GT(engine.add_request(params("a"), {}), 0u);
  EXPECT_GT(engine.add_request(params("b"), {}), 0u);
  EXPECT_EQ(engine.add_request(params("c"), {}), 0u);
  drive(engine);
  EXPECT_GT(engine.add_request(params("c"), {}), 0u);
  drive(engine);
  EXPECT_EQ(engine.metrics().kv_blocks_used, 0);
}

TEST_F(EngineLifecycle, BadEngineConfigThrows) {
  EngineConfig c = config();
  c.kv_block_size = -1;
  EXPECT_THROW(Engine(file_, tok_, c), Error);
  c = config();
  c.kv_memory_bytes = 100;  // less than one block
  EXPECT_THROW(Engine(file_, tok_, c), Error);
  c = config();
  c.max_batch_tokens = 0;
  EXPECT_THROW(Engine(file_, tok_, c), Error);
}

TEST_F(EngineLifecycle, SmallArenaClipsTheContextSoOneRequestAlwaysFits) {
  EngineConfig c = config();
  c.kv_block_size = 16;
  c.kv_memory_bytes = 10 * 16 * kv_bytes_per_token(*file_, KvType::F32);
  Engine engine(file_, tok_, c);
  EXPECT_EQ(engine.n_ctx(), 160);
  EXPECT_EQ(engine.metrics().kv_blocks_total, 10);
  RequestParams p = params("Once upon a time", 1000);
  p.ignore_eos = true;
  Sink sink;
  const uint64_t id = engine.add_request(p, sink.callback());
  drive(engine);
  const Collected got = sink.get(id);
  EXPECT_EQ(got.reason, FinishReason::Length);
  EXPECT_EQ(int64_t(got.ids.size()), 160 - int64_t(p.prompt_ids.size()));
}

TEST_F(EngineLifecycle, FinishReasonsAndMetrics) {
  Engine engine(file_, tok_, config());
  Sink sink;
  RequestParams len = params("Once upon a time", 12);
  len.ignore_eos = true;
  len.n_logprobs = 3;
  const uint64_t a = engine.add_request(len, sink.callback());
  RequestParams stop = params("Once upon a time", 200);
  stop.stop = {"."};
  const uint64_t b = engine.add_request(stop, sink.callback());
  const uint64_t c = engine.add_request(params("The cat", 200), sink.callback());
  engine.step();
  engine.step();
  engine.abort(c);
  engine.abort(987654);  // unknown: ignored
  drive(engine);

  const Collected ga = sink.get(a);
  EXPECT_EQ(ga.reason, FinishReason::Length);
  EXPECT_EQ(ga.ids.size(), 12u);
  EXPECT_EQ(ga.metrics.n_generated, 12);
  EXPECT_EQ(ga.metrics.n_prompt, int64_t(len.prompt_ids.size()));
  EXPECT_EQ(ga.metrics.tbt_ms.size(), 11u);
  EXPECT_GT(ga.metrics.ttft_ms, 0.0);
  EXPECT_GE(ga.metrics.e2e_ms, ga.metrics.ttft_ms);
  EXPECT_GE(ga.metrics.ttft_ms, ga.metrics.queue_ms);
  for (const auto& t : ga.tokens) {
    EXPECT_LE(t.logprob, 0.0f);
    ASSERT_EQ(t.top_logprobs.size(), 3u);
    EXPECT_EQ(t.top_logprobs[0].id, t.id);  // greedy takes the most likely token
  }
  const Collected gb = sink.get(b);
  EXPECT_EQ(gb.reason, FinishReason::Stop);
  EXPECT_EQ(gb.text.find('.'), std::string::npos) << "the stop string is trimmed";
  const Collected gc = sink.get(c);
  EXPECT_EQ(gc.reason, FinishReason::Abort);
  EXPECT_EQ(gc.n_final, 1);

  const EngineMetrics m = engine.metrics();
  EXPECT_EQ(m.requests_finished, 2);
  EXPECT_EQ(m.requests_aborted, 1);
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.kv_blocks_free, m.kv_blocks_total);
  EXPECT_GT(m.kv_bytes, 0);
  EXPECT_GE(m.generated_tokens_total, 12 + int64_t(gb.ids.size()));
  EXPECT_GT(m.steps, 0);
}

TEST_F(EngineLifecycle, ARequestWhoseCallbackThrowsFailsAloneWithError) {
  Engine engine(file_, tok_, config());
  Sink sink;
  auto inner = sink.callback();
  std::atomic<int> calls{0};
  RequestParams p = params("Once upon a time", 20);
  p.ignore_eos = true;
  const uint64_t bad = engine.add_request(p, [&](const RequestOutput& o) {
    inner(o);
    if (!o.finished && ++calls == 3) throw std::runtime_error("client went away");
  });
  const uint64_t good = engine.add_request(p, sink.callback());
  drive(engine);
  const Collected gbad = sink.get(bad), ggood = sink.get(good);
  EXPECT_EQ(gbad.reason, FinishReason::Error);
  EXPECT_EQ(gbad.error, "client went away");
  EXPECT_EQ(gbad.n_final, 1);
  EXPECT_EQ(ggood.reason, FinishReason::Length);
  EXPECT_EQ(ggood.ids.size(), 20u);
  EXPECT_EQ(engine.metrics().requests_failed, 1);
  EXPECT_EQ(engine.metrics().kv_blocks_used, 0);
}

// Thousands of requests, aborted at random points (queued, prefilling, decoding, forked, or
// already finished), through a small arena that preempts: zero blocks in use at the end, one
// final output per completion, and no memory growth after the warm-up.
TEST_F(EngineLifecycle, RandomAbortsOverThousandsOfRequestsLeakNothing) {
  EngineConfig c = config();
  c.kv_block_size = 8;
  c.kv_memory_bytes = 600 * kv_bytes_per_token(*file_, KvType::F32);
  c.max_batch_tokens = 96;
  Engine engine(file_, tok_, c);
  const int64_t n_requests = 3000;
  // Final outputs per request id, counted in a buffer sized up front so that the test itself
  // does not grow while the engine's memory is watched.
  std::vector<int> finals(size_t(n_requests + 1), 0), expected(size_t(n_requests + 1), 0);
  int64_t n_bad_order = 0;
  auto on_output = [&](const RequestOutput& o) {
    if (o.request_id >= finals.size()) return;
    if (finals[o.request_id] >= expected[o.request_id]) ++n_bad_order;  // output after the last final
    if (o.finished) ++finals[o.request_id];
  };
  std::mt19937_64 rng(5);
  std::vector<uint64_t> live;
  live.reserve(size_t(n_requests));
  int64_t n_added = 0;
  int64_t rss_after_warmup = 0;
  RequestParams p;
  p.prompt_ids.reserve(64);
  while (n_added < n_requests || engine.has_work()) {
    // Arrivals keep a bounded backlog, so a steady state exists and any growth is a leak.
    for (int k = 0; k < 3 && n_added < n_requests && engine.metrics().n_waiting < 24; ++k) {
      const int64_t n_prompt = 1 + int64_t(rng() % 48);
      p.prompt_ids.assign(1, 1);
      const int stem = int(rng() % 4);  // shared beginnings for prefix hits
      for (int64_t i = 1; i < n_prompt; ++i)
        p.prompt_ids.push_back(int32_t(i < 20 ? 10 + stem * 50 + i : 3 + rng() % 500));
      p.max_tokens = 1 + int64_t(rng() % 16);
      p.sampling.temperature = rng() % 2 ? 0.0f : 0.8f;
      p.sampling.seed = rng();
      p.ignore_eos = rng() % 2;
      p.n = rng() % 8 == 0 ? 3 : 1;
      const uint64_t id = engine.add_request(p, on_output);
      ASSERT_GT(id, 0u);
      ASSERT_LE(id, uint64_t(n_requests));
      expected[id] = p.n;
      live.push_back(id);
      ++n_added;
    }
    // One abort per step, of a request not finished yet (queued, prefilling, decoding, forked).
    while (!live.empty()) {
      const size_t i = size_t(rng() % live.size());
      const uint64_t id = live[i];
      live[i] = live.back();
      live.pop_back();
      if (finals[id] == expected[id]) continue;
      engine.abort(id);
      break;
    }
    engine.step();
    if (n_added >= 500 && rss_after_warmup == 0) rss_after_warmup = current_rss_bytes();
  }
  const EngineMetrics m = engine.metrics();
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.kv_blocks_free, m.kv_blocks_total);
  EXPECT_EQ(m.n_running + m.n_waiting, 0);
  EXPECT_EQ(m.requests_finished + m.requests_aborted + m.requests_failed, n_requests);
  EXPECT_GT(m.requests_aborted, 100);
  EXPECT_GT(m.n_preempted_total, 0);
  EXPECT_EQ(m.requests_failed, 0);
  EXPECT_EQ(n_bad_order, 0);
  for (int64_t id = 1; id <= n_requests; ++id)
    ASSERT_EQ(finals[size_t(id)], expected[size_t(id)]) << "request " << id << " final outputs";
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "RSS is not meaningful under AddressSanitizer (freed memory is quarantined)";
#else
  const int64_t growth = current_rss_bytes() - rss_after_warmup;
  std::printf("RSS after 500 requests %lld KiB, growth over the next 2500: %lld KiB\n",
              static_cast<long long>(rss_after_warmup >> 10), static_cast<long long>(growth >> 10));
  EXPECT_LT(growth, int64_t(4) << 20) << "RSS grew by " << growth << " bytes over 2500 requests";
#endif
}

TEST_F(EngineLifecycle, SubmissionFromOtherThreadsWithTheBackgroundLoop) {
  Engine engine(file_, tok_, config());
  Sink sink;
  engine.start();
  std::atomic<int64_t> n_completions{0};
  std::vector<std::thread> clients;
  std::mutex ids_mu;
  std::vector<uint64_t> ids;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        RequestParams p = params(i % 2 ? "Once upon a time" : "The little dog", 4 + (i % 5));
        p.n = (i % 7 == 0) ? 2 : 1;
        const uint64_t id = engine.add_request(p, sink.callback());
        ASSERT_GT(id, 0u);
        n_completions += p.n;
        if ((i + t) % 6 == 0) engine.abort(id);  // from the submitting thread, at once
        std::lock_guard<std::mutex> lock(ids_mu);
        ids.push_back(id);
      }
    });
  }
  for (auto& th : clients) th.join();
  for (int i = 0; i < 20000 && (engine.has_work() || int64_t(sink.n_finished()) < n_completions.load()); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  engine.stop();
  EXPECT_EQ(int64_t(sink.n_finished()), n_completions.load());
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()), ids.end()) << "request ids are unique";
  const EngineMetrics m = engine.metrics();
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.requests_finished + m.requests_aborted, 160);
}

TEST_F(EngineLifecycle, DestructorAbortsUnfinishedRequests) {
  Sink sink;
  uint64_t a = 0, b = 0;
  {
    Engine engine(file_, tok_, config());
    a = engine.add_request(params("Once upon a time", 100), sink.callback());
    engine.step();
    b = engine.add_request(params("The cat", 100), sink.callback());
  }
  EXPECT_EQ(sink.get(a).reason, FinishReason::Abort);
  EXPECT_EQ(sink.get(b).reason, FinishReason::Abort);
  EXPECT_EQ(sink.get(a).n_final, 1);
}

TEST_F(EngineLifecycle, PrefixCacheHitRateIsReported) {
  EngineConfig c = config();
  c.kv_block_size = 4;
  Engine engine(file_, tok_, c);
  Sink sink;
  const std::string common = "Once upon a time, there was a little girl named Lily. She loved to play.";
  const uint64_t a = engine.add_request(params(common + " One day", 4), sink.callback());
  drive(engine);
  const uint64_t b = engine.add_request(params(common + " The sun", 4), sink.callback());
  drive(engine);
  EXPECT_EQ(sink.get(a).metrics.n_cached_prompt, 0);
  const int64_t cached = sink.get(b).metrics.n_cached_prompt;
  EXPECT_GT(cached, 8);
  EXPECT_EQ(cached % 4, 0);
  const EngineMetrics m = engine.metrics();
  EXPECT_GT(m.prefix_hit_rate, 0.0);
  EXPECT_NEAR(m.prefix_hit_rate, double(cached) / double(m.prompt_tokens_total), 1e-12);

  EngineConfig off = config();
  off.prefix_caching = false;
  Engine e2(file_, tok_, off);
  Sink sink2;
  e2.add_request(params(common, 2), sink2.callback());
  drive(e2);
  e2.add_request(params(common, 2), sink2.callback());
  drive(e2);
  EXPECT_EQ(e2.metrics().prefix_hit_rate, 0.0);
}

}  // namespace
}  // namespace tern
