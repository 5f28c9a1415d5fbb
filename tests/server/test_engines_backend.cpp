// EnginesBackend (server/engines_backend.h): several real engines over stories260K behind one
// Backend, as `tern serve --pp P` runs its pipeline engines. Requests spread over the engines,
// the ids a caller gets are the backend's own (and the outputs carry them), aborts reach the
// right engine, and every answer is the one engine's answer.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "engine/engine.h"
#include "server/backend.h"
#include "server/engines_backend.h"
#include "test_util.h"

using namespace tern;
using namespace tern::server;
using namespace tern::testing;

// (Everything in a namespace named after the file: under TERN_UNITY it is compiled with its
// neighbours.)
namespace engines_backend_test {

constexpr const char* kModel = "models/stories260K.gguf";

struct Outputs {
  std::map<uint64_t, std::vector<int32_t>> tokens;  // by the id the output carries
  std::map<uint64_t, FinishReason> finished;
};

OutputCallback collect(Outputs& out) {
  return [&out](const RequestOutput& o) {
    for (const GeneratedToken& t : o.tokens) out.tokens[o.request_id].push_back(t.id);
    if (o.finished) out.finished[o.request_id] = o.finish_reason;
  };
}

struct Fixture {
  explicit Fixture(int n_engines, int64_t max_waiting = 1024) {
    file = open_model_file(shared_path(kModel), "");
    tok = Tokenizer::from_gguf(*file);
    EngineConfig ec;
    ec.n_threads = 1;
    ec.n_ctx = 128;
    ec.n_parallel = 2;
    ec.max_waiting = max_waiting;
    for (int e = 0; e < n_engines; ++e) engines.push_back(std::make_unique<Engine>(file, tok, ec));
    std::vector<Engine*> all;
    for (auto& e : engines) all.push_back(e.get());
    backend = std::make_unique<EnginesBackend>(all);
  }
  // Drives every engine (not started) until none has work.
  void run_all() {
    for (bool busy = true; busy;) {
      busy = false;
      for (auto& e : engines) busy = e->step() || busy;
    }
  }
  RequestParams greedy(const std::string& prompt, int64_t max_tokens = 12) const {
    RequestParams p;
    p.prompt_ids = tok->encode(prompt, /*add_bos=*/true);
    p.max_tokens = max_tokens;
    p.sampling.temperature = 0;
    return p;
  }

  std::shared_ptr<const GgufFile> file;
  std::shared_ptr<const Tokenizer> tok;
  std::vector<std::unique_ptr<Engine>> engines;
  std::unique_ptr<EnginesBackend> backend;
};

const std::vector<std::string> kPrompts = {"Once upon a time", "The little dog", "Lily wanted to", "One day, a cat",
                                           "Tom and Sue"};


TEST(EnginesBackend, SpreadsRequestsAndAnswersAsOneEngine) {
  TERN_REQUIRE_SHARED(kModel);
  Fixture one(1), two(2);
  Outputs want, got;
  std::vector<uint64_t> want_ids, got_ids;
  for (const std::string& p : kPrompts) {
    want_ids.push_back(one.backend->add_request(one.greedy(p), collect(want)));
    got_ids.push_back(two.backend->add_request(two.greedy(p), collect(got)));
  }
  // Five requests over two idle engines: 3 and 2, each added to the less loaded one.
  const std::vector<int64_t> load = two.backend->load();
  ASSERT_EQ(load.size(), 2u);
  EXPECT_EQ(load[0] + load[1], 5);
  EXPECT_LE(std::abs(load[0] - load[1]), 1);
  EXPECT_EQ(std::set<uint64_t>(got_ids.begin(), got_ids.end()).size(), got_ids.size()) << "ids are unique";
  one.run_all();
  two.run_all();
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    SCOPED_TRACE(kPrompts[i]);
    ASSERT_TRUE(got.finished.count(got_ids[i])) << "the outputs carry the backend's id";
    EXPECT_EQ(got.finished[got_ids[i]], FinishReason::Length);
    EXPECT_EQ(got.tokens[got_ids[i]], want.tokens[want_ids[i]]);
    EXPECT_EQ(got.tokens[got_ids[i]].size(), 12u);
  }
  EXPECT_EQ(got.finished.size(), kPrompts.size());
  EXPECT_EQ(two.backend->load(), (std::vector<int64_t>{0, 0}));
  const EngineMetrics m = two.backend->metrics();
  EXPECT_EQ(m.requests_finished, int64_t(kPrompts.size()));
  EXPECT_EQ(m.generated_tokens_total, int64_t(12 * kPrompts.size()));
  EXPECT_EQ(m.kv_bytes, two.engines[0]->metrics().kv_bytes + two.engines[1]->metrics().kv_bytes);
  EXPECT_GT(two.engines[0]->metrics().requests_finished, 0);
  EXPECT_GT(two.engines[1]->metrics().requests_finished, 0);
}

TEST(EnginesBackend, AbortReachesTheEngineThatRunsTheRequest) {
  TERN_REQUIRE_SHARED(kModel);
  Fixture f(3);
  Outputs out;
  std::vector<uint64_t> ids;
  for (const std::string& p : kPrompts) ids.push_back(f.backend->add_request(f.greedy(p, 40), collect(out)));
  // The requests of every engine but one: each id names its engine (and that engine's own id).
  for (size_t i = 0; i < ids.size(); i += 2) f.backend->abort(ids[i]);
  f.backend->abort(0);            // no request: ignored
  f.backend->abort(ids[1] + 300);  // unknown: ignored
  f.run_all();
  for (size_t i = 0; i < ids.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(out.finished.count(ids[i]));
    EXPECT_EQ(out.finished[ids[i]], i % 2 == 0 ? FinishReason::Abort : FinishReason::Length);
  }
  EXPECT_EQ(f.backend->load(), (std::vector<int64_t>{0, 0, 0}));
}

TEST(EnginesBackend, AFullEngineOrABadRequestIsNotCounted) {
  TERN_REQUIRE_SHARED(kModel);
  Fixture f(2, /*max_waiting=*/1);
  Outputs out;
  EXPECT_GT(f.backend->add_request(f.greedy("Once upon a time"), collect(out)), 0u);
  EXPECT_GT(f.backend->add_request(f.greedy("The little dog"), collect(out)), 0u);
  // Both engines' queues are full (neither started): "not now", and nothing counted.
  EXPECT_EQ(f.backend->add_request(f.greedy("Lily wanted to"), collect(out)), 0u);
  EXPECT_EQ(f.backend->load(), (std::vector<int64_t>{1, 1}));
  RequestParams empty;
  EXPECT_THROW(f.backend->add_request(empty, collect(out)), Error);
  EXPECT_EQ(f.backend->load(), (std::vector<int64_t>{1, 1}));
  f.run_all();
  EXPECT_EQ(out.finished.size(), 2u);
  EXPECT_EQ(f.backend->load(), (std::vector<int64_t>{0, 0}));
}

TEST(EnginesBackend, AFullQueueSendsTheRequestToTheNextEngine) {
  TERN_REQUIRE_SHARED(kModel);
  Fixture f(2, /*max_waiting=*/1);
  Outputs out;
  const auto add = [&](const char* prompt) { return f.backend->add_request(f.greedy(prompt, 40), collect(out)); };
  ASSERT_GT(add("Once upon a time"), 0u);
  const size_t a = f.backend->load()[0] == 1 ? 0 : 1;  // the engine that took it
  ASSERT_GT(add("The little dog"), 0u);               // the other one
  f.engines[a]->step();                               // a's request runs: a's queue is free again
  ASSERT_GT(add("Lily wanted to"), 0u);
  EXPECT_EQ(f.backend->load()[a], 2);
  f.engines[a]->step();
  // The other engine is the least loaded, but its queue is full: the request goes to `a`.
  EXPECT_GT(add("One day, a cat"), 0u);
  EXPECT_EQ(f.backend->load()[a], 3);
  EXPECT_EQ(f.backend->load()[1 - a], 1);
  f.run_all();
  EXPECT_EQ(out.finished.size(), 4u);
}

TEST(EnginesBackend, NCompletionsEndTheRequestOnce) {
  TERN_REQUIRE_SHARED(kModel);
  Fixture f(2);
  std::map<uint64_t, int> finished;
  RequestParams p = f.greedy("Once upon a time", 8);
  p.n = 3;
  p.sampling.temperature = 0.8f;
  const uint64_t id = f.backend->add_request(p, [&](const RequestOutput& o) {
    if (o.finished) ++finished[o.request_id];
  });
  EXPECT_EQ(f.backend->load()[0] + f.backend->load()[1], 1);
  f.run_all();
  EXPECT_EQ(finished[id], 3);
  EXPECT_EQ(f.backend->load(), (std::vector<int64_t>{0, 0}));
}

// Prefix affinity: prompts that begin with the same blocks go to the engine that took the first
// of them while it is within the slack, and its prefix cache serves them; short prompts and
// other adapters' requests are routed by load alone.
TEST(EnginesBackend, ASharedPromptBeginningStaysOnOneEngineWithinTheSlack) {
  TERN_REQUIRE_SHARED(kModel);
  Fixture f(2);
  Outputs out;
  const std::string shared =
      "Once upon a time, there was a little girl named Lily. She liked to play in the park with her friends. "
      "One day, she saw a big red ball under a tree.";
  ASSERT_GE(f.greedy(shared).prompt_ids.size(), 32u);  // two whole blocks of 16 and more
  const auto add = [&](const std::string& p) { return f.backend->add_request(f.greedy(p, 4), collect(out)); };
  ASSERT_GT(add(shared + " One day"), 0u);
  const size_t x = f.backend->load()[0] == 1 ? 0 : 1;
  EXPECT_EQ(f.backend->affinity_hits(), 0);
  // The other engine is idle, but x is within the slack (1 <= 0 + 2, then 2 <= 0 + 2).
  ASSERT_GT(add(shared + " The sun"), 0u);
  ASSERT_GT(add(shared + " Her dog"), 0u);
  EXPECT_EQ(f.backend->load()[x], 3);
  EXPECT_EQ(f.backend->affinity_hits(), 2);
  // Beyond it (3 > 0 + 2) the least loaded engine takes the request, and becomes its prefix's.
  ASSERT_GT(add(shared + " A bird"), 0u);
  EXPECT_EQ(f.backend->load()[1 - x], 1);
  // A prompt shorter than a block has no affinity: load alone.
  ASSERT_GT(add("Tom"), 0u);
  EXPECT_EQ(f.backend->load()[1 - x], 2);
  EXPECT_EQ(f.backend->affinity_hits(), 2);
  f.run_all();
  ASSERT_EQ(out.finished.size(), 5u);
  // Computed once, the prefix is now in both engines' caches; the next one goes back to the
  // engine it was last routed to (1 - x) and is served from its cache.
  Outputs more;
  ASSERT_GT(f.backend->add_request(f.greedy(shared + " At night", 4), collect(more)), 0u);
  EXPECT_EQ(f.backend->load()[1 - x], 1);
  EXPECT_EQ(f.backend->affinity_hits(), 3);
  f.run_all();
  ASSERT_EQ(more.finished.size(), 1u);
  EXPECT_GT(f.engines[1 - x]->metrics().prefix_hit_rate, 0.0);
}

TEST(EnginesBackend, NeedsAnEngine) { EXPECT_THROW(EnginesBackend({}), Error); }

TEST(EnginesBackend, RequestsMayOutliveTheBackend) {
  TERN_REQUIRE_SHARED(kModel);
  // tern serve destroys the backend before the engines, which end the requests still in them:
  // their callbacks run after the backend is gone (ASan would see a use after free).
  Fixture f(2);
  Outputs out;
  const uint64_t id = f.backend->add_request(f.greedy("Once upon a time", 40), collect(out));
  f.engines[0]->step();
  f.engines[1]->step();
  f.backend.reset();
  f.engines.clear();
  ASSERT_TRUE(out.finished.count(id));
  EXPECT_EQ(out.finished[id], FinishReason::Abort);
}

}  // namespace engines_backend_test
