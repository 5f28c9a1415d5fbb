// The server in front of the real engine and a real model (stories260K from ../shared):
// what the fake-backend tests assume about the engine holds — outputs stream, n > 1 shares
// one prompt, logprobs arrive, a seed reproduces, a disconnect frees the KV blocks at once.
#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

#include "engine/engine.h"
#include "http_test_util.h"
#include "models/model.h"
#include "server/backend.h"
#include "server/server.h"
#include "test_util.h"

using namespace tern;
using namespace tern::server;
using namespace tern::testing;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

constexpr const char* kModel = "models/stories260K.gguf";

struct RealFixture {
  explicit RealFixture(int64_t n_ctx = 256, double max_queue_ms = 0, bool start_engine = true) {
    file = open_model_file(shared_path(kModel), "");
    tok = Tokenizer::from_gguf(*file);
    EngineConfig ec;
    ec.n_threads = 1;
    ec.n_ctx = n_ctx;
    ec.n_parallel = 4;
    ec.max_queue_ms = max_queue_ms;
    engine = std::make_unique<Engine>(file, tok, ec);
    backend = std::make_unique<EngineBackend>(*engine);
    ServerConfig sc;
    sc.port = 0;
    sc.model_id = "stories260K";
    sc.http_threads = 16;
    server = std::make_unique<Server>(*backend, sc);
    server->start();
    if (start_engine) engine->start();
    client = std::make_unique<httplib::Client>("127.0.0.1", server->port());
    client->set_read_timeout(60, 0);
  }
  ~RealFixture() {
    server->shutdown(0ms);
    engine->stop();
  }
  json post(const std::string& path, const json& body, int want = 200) {
    auto r = client->Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return json();
    EXPECT_EQ(r->status, want) << r->body;
    return json::parse(r->body);
  }
  bool wait_kv_free(std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      const EngineMetrics m = engine->metrics();
      if (m.kv_blocks_used == 0 && m.n_running == 0 && m.n_waiting == 0) return true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }

  std::shared_ptr<const GgufFile> file;
  std::shared_ptr<const Tokenizer> tok;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<EngineBackend> backend;
  std::unique_ptr<Server> server;
  std::unique_ptr<httplib::Client> client;
};

}  // namespace

TEST(EngineServer, GreedyCompletionMatchesTheReference) {
  TERN_REQUIRE_SHARED(kModel);
  TERN_REQUIRE_SHARED("reference/stories260K/greedy_prompt_once_upon_a_time_n64.txt");
  RealFixture f;
  // 64 positions in total = BOS + 4 prompt tokens + 59 generated.
  const json j = f.post("/v1/completions",
                        {{"prompt", "Once upon a time"}, {"max_tokens", 59}, {"temperature", 0}, {"ignore_eos", true}});
  const std::string ref = read_file_bytes(shared_path("reference/stories260K/greedy_prompt_once_upon_a_time_n64.txt"));
  const std::string text = "Once upon a time" + j["choices"][0]["text"].get<std::string>();
  // The reference file is the prompt and its continuation as run.c printed it.
  EXPECT_EQ(ref.rfind(text.substr(0, std::min(text.size(), ref.size())), 0), 0u) << "got: " << text << "\nref: " << ref;
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 59);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
}

TEST(EngineServer, StreamingNAndLogprobs) {
  TERN_REQUIRE_SHARED(kModel);
  RealFixture f;
  // Streamed text equals the non-streamed text for the same seed.
  const json body = {{"prompt", "Lily saw a"}, {"max_tokens", 20}, {"seed", 11}, {"temperature", 0.8}};
  const json whole = f.post("/v1/completions", body);
  json sbody = body;
  sbody["stream"] = true;
  RawConn c(f.server->port());
  c.send_all(http_post("/v1/completions", sbody.dump()));
  bool done = false;
  const auto chunks = sse_json(c.read_until("data: [DONE]", 30s), &done);
  ASSERT_TRUE(done);
  std::string text;
  for (const auto& ch : chunks) text += ch["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, whole["choices"][0]["text"].get<std::string>());

  const json n3 = f.post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Tell a story"}}}},
                                                  {"max_tokens", 8}, {"n", 3}, {"logprobs", true}, {"top_logprobs", 2},
                                                  {"seed", 5}});
  ASSERT_EQ(n3["choices"].size(), 3u);
  int64_t total = 0;
  for (int i = 0; i < 3; ++i) {
    const json& ch = n3["choices"][i];
    EXPECT_EQ(ch["index"], i);
    const json& lp = ch["logprobs"]["content"];
    EXPECT_GE(lp.size(), 1u);
    for (const auto& t : lp) {
      EXPECT_LE(t["logprob"].get<double>(), 0.0);
      EXPECT_EQ(t["top_logprobs"].size(), 2u);
    }
    total += int64_t(lp.size());
  }
  EXPECT_EQ(n3["usage"]["completion_tokens"], total);
  EXPECT_TRUE(f.wait_kv_free(5s));
}

TEST(EngineServer, DisconnectFreesKvBlocksAtOnce) {
  TERN_REQUIRE_SHARED(kModel);
  RealFixture f(2048);  // a long generation, so the client surely leaves before it ends
  RawConn c(f.server->port());
  c.send_all(http_post("/v1/completions",
                       json{{"prompt", "Once"}, {"max_tokens", 2040}, {"ignore_eos", true}, {"stream", true}}.dump()));
  ASSERT_NE(c.read_until("data: {", 10s).find("data: {"), std::string::npos);
  // The engine's metrics are a snapshot taken at the end of each step, after its outputs went
  // out: wait for one that shows the request holding blocks.
  for (int i = 0; i < 200 && f.engine->metrics().kv_blocks_used == 0; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_GT(f.engine->metrics().kv_blocks_used, 0);
  const auto t0 = std::chrono::steady_clock::now();
  c.close();
  EXPECT_TRUE(f.wait_kv_free(2s));
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(ms, 1000);
  EXPECT_GE(f.engine->metrics().requests_aborted, 1);
}

TEST(EngineServer, EngineRefusalsBecome400) {
  TERN_REQUIRE_SHARED(kModel);
  RealFixture f;
  auto r = f.client->Post("/v1/completions", json{{"prompt", std::string(2000, 'a')}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "context_length_exceeded");
  const json t = f.post("/tokenize", {{"prompt", "Once upon a time"}});
  EXPECT_EQ(t["tokens"], json({1, 403, 407, 261, 378}));
  EXPECT_EQ(f.post("/detokenize", {{"tokens", t["tokens"]}})["prompt"], "Once upon a time");
}

TEST(EngineServer, AQueuePastItsTimeLimitAnswers503WithRetryAfter) {
  TERN_REQUIRE_SHARED(kModel);
  // The engine thread starts late, so the first request is surely still queued when the
  // second comes: 40 prompt tokens ahead of it are over a 1 us limit.
  RealFixture f(256, /*max_queue_ms=*/1e-3, /*start_engine=*/false);
  const json body = {{"prompt", std::string(120, 'a')}, {"max_tokens", 2}, {"temperature", 0}};
  int first_status = 0;
  std::thread first([&] {
    httplib::Client c("127.0.0.1", f.server->port());
    c.set_read_timeout(60, 0);
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    first_status = r ? r->status : -1;
  });
  for (int i = 0; i < 400 && !f.engine->has_work(); ++i) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(f.engine->has_work());  // the first request is queued
  auto r = f.client->Post("/v1/completions", body.dump(), "application/json");
  f.engine->start();  // the first one was not harmed
  first.join();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "queue_time_limit") << r->body;
  ASSERT_TRUE(r->has_header("Retry-After"));
  EXPECT_GE(std::stoi(r->get_header_value("Retry-After")), 1);
  EXPECT_EQ(first_status, 200);
  auto m = f.client->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("tern_requests_refused_queue_total 1\n"), std::string::npos);
}

TEST(EngineServer, ChatContentIsTextNeverControlTokens) {
  // The hardening issue, item 12: "Once</s>" in a message gave [.., 2] (the EOS token), so a
  // user could end the turn, or the generation, from inside a message.
  TERN_REQUIRE_SHARED(kModel);
  RealFixture f;
  const json chat = f.post("/tokenize", {{"messages", {{{"role", "user"}, {"content", "Once</s>"}}}}});
  for (const auto& id : chat["tokens"]) EXPECT_NE(id.get<int>(), 2) << chat.dump();
  // The same through generation: the prompt of the chat request has no EOS inside it.
  const json r = f.post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Once</s>"}}}},
                                                  {"max_tokens", 1}, {"temperature", 0}});
  EXPECT_EQ(r["usage"]["prompt_tokens"].get<int64_t>(), int64_t(chat["tokens"].size()));
  // A raw completion prompt keeps parsing special tokens (llama.cpp's server does: a client
  // can write its own template), as docs/server.md says.
  const json raw = f.post("/tokenize", {{"prompt", "Once</s>"}});
  EXPECT_EQ(raw["tokens"].back().get<int>(), 2) << raw.dump();
}

TEST(EngineServer, LogitBiasSteersTheRealSampler) {
  TERN_REQUIRE_SHARED(kModel);
  RealFixture f;
  // Greedy with +100 on one token: every generated token is that one.
  const json forced = f.post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 6}, {"temperature", 0},
                                                  {"ignore_eos", true}, {"logit_bias", {{"300", 100}}}, {"logprobs", 0}});
  for (const auto& t : forced["choices"][0]["logprobs"]["tokens"]) EXPECT_EQ(t, f.post("/detokenize", {{"tokens", {300}}})["prompt"]);
  // Banning the greedy answer's first token changes the first token.
  const json plain = f.post("/tokenize", {{"prompt", f.post("/v1/completions", {{"prompt", "Once upon a time"},
                                                                                {"max_tokens", 1},
                                                                                {"temperature", 0}})["choices"][0]["text"]},
                                          {"add_special_tokens", false}});
  ASSERT_FALSE(plain["tokens"].empty());
  const std::string first = std::to_string(plain["tokens"][0].get<int>());
  const json banned = f.post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 1}, {"temperature", 0},
                                                  {"logit_bias", {{first, -100}}}, {"logprobs", 0}});
  EXPECT_NE(banned["choices"][0]["logprobs"]["tokens"][0], f.post("/detokenize", {{"tokens", {plain["tokens"][0]}}})["prompt"]);
  // An id outside the vocabulary is a 400 naming the parameter.
  const json bad = f.post("/v1/completions", {{"prompt", "x"}, {"logit_bias", {{"512", 1}}}}, 400);
  EXPECT_EQ(bad["error"]["param"], "logit_bias");
}
