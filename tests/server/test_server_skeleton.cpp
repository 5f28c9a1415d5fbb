// Skeleton-of-Thought behind /v1/chat/completions ("organize", server/skeleton_api.h): the
// answer, usage and "skeleton" object of a run on the scripted backend (fake_backend.h, whose
// every request writes the same script), its stream's chunks, the fallback, the 400s of what it
// cannot serve, and a client that leaves mid-run; then once over the real engine (stories260K).
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <thread>

#include "fake_backend.h"
#include "http_test_util.h"
#include "server/serve_process.h"
#include "server/server.h"
#include "server/skeleton_of_thought.h"
#include "test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace test_server_skeleton {

using namespace tern;
using namespace tern::server;
using namespace tern::testing;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// Every request writes this and ends (EOS): the skeleton "1." + kList parses to 3 points.
const std::string kList = " Pick a spot\n2. Dig\n3. Plant\n\nend";
const std::vector<std::string> kHeadings = {"Pick a spot", "Dig", "Plant"};
const std::string kQuestion = "How do I plant a tree?";

ChatTemplate declared_template() { return select_chat_template("chatml", "", "<s>", "</s>"); }

struct Fixture {
  explicit Fixture(const std::string& script = kList, ChatTemplate tmpl = declared_template(),
                   std::chrono::milliseconds step = 1ms, int64_t eos_after = -2, int64_t max_waiting = 64,
                   double request_timeout_s = 600)
      : backend(backend_options(script, step, eos_after, max_waiting)),
        server(backend, config(std::move(tmpl), request_timeout_s)) {
    server.start();
    client = std::make_unique<httplib::Client>("127.0.0.1", server.port());
    client->set_read_timeout(20, 0);
  }
  static FakeBackend::Options backend_options(const std::string& script, std::chrono::milliseconds step,
                                              int64_t eos_after, int64_t max_waiting) {
    FakeBackend::Options o;
    o.max_waiting = max_waiting;
    o.script = script;
    o.n_ctx = 4096;  // one token per byte: the planner's instructions are long
    o.step = step;
    o.eos_after = eos_after == -2 ? int64_t(script.size()) : eos_after;
    return o;
  }
  static ServerConfig config(ChatTemplate tmpl, double request_timeout_s) {
    ServerConfig c;
    c.request_timeout_s = request_timeout_s;
    c.port = 0;
    c.model_id = "fake-model";
    c.http_threads = 16;
    c.max_in_flight = 64;
    c.chat_template = std::move(tmpl);
    return c;
  }
  httplib::Result post(const json& body, const std::string& path = "/v1/chat/completions") {
    return client->Post(path, body.dump(), "application/json");
  }
  json post_json(const json& body, int want_status = 200) {
    auto r = post(body);
    EXPECT_TRUE(r);
    if (!r) return json();
    EXPECT_EQ(r->status, want_status) << r->body;
    return json::parse(r->body);
  }
  std::string stream(const json& body) {
    RawConn c(server.port());
    c.send_all(http_post("/v1/chat/completions", body.dump()));
    return c.read_until("data: [DONE]", 20s);
  }
  int64_t metric(const std::string& name) {
    const std::string text = client->Get("/metrics")->body;
    const size_t at = text.find("\n" + name + " ");
    return at == std::string::npos ? -1 : std::stoll(text.substr(at + name.size() + 2));
  }

  FakeBackend backend;
  Server server;
  std::unique_ptr<httplib::Client> client;
};

json messages() { return json::array({{{"role", "user"}, {"content", kQuestion}}}); }

json skeleton_request(json organize = "skeleton") {
  return {{"messages", messages()}, {"organize", std::move(organize)}, {"temperature", 0}};
}

// What the answer must be: the points in order, each "i. heading" + what its request wrote.
std::string assembled(const std::vector<std::string>& headings, const std::string& expansion) {
  std::string s;
  for (size_t i = 0; i < headings.size(); ++i)
    s += str_cat(i > 0 ? "\n" : "", i + 1, ". ", headings[i], expansion);
  return s;
}

// Prompt tokens of a run, from the prompts the driver renders (the fake's tokenizer: bytes).
int64_t prompt_tokens_of(const std::vector<std::string>& points, bool with_skeleton) {
  static const ByteTokenizer tok;
  static const ChatTemplate tmpl = declared_template();
  const SkeletonPrompts prompts(tmpl, tok, {{"user", kQuestion}});
  int64_t n = with_skeleton ? int64_t(prompts.skeleton_ids().size()) : 0;
  for (size_t i = 0; i < points.size(); ++i) n += int64_t(prompts.point_ids(points, i).size());
  return n;
}

std::string stream_content(const std::vector<json>& chunks) {
  std::string text;
  for (const auto& c : chunks)
    if (c.contains("choices") && !c["choices"].empty() && c["choices"][0]["delta"].contains("content"))
      text += c["choices"][0]["delta"]["content"].get<std::string>();
  return text;
}

void expect_400(Fixture& f, const json& body, const std::string& param, const std::string& words,
                const std::string& path = "/v1/chat/completions") {
  auto r = f.post(body, path);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << body.dump() << " -> " << r->body;
  const json e = json::parse(r->body)["error"];
  EXPECT_EQ(e["param"], param) << r->body;
  EXPECT_NE(e["message"].get<std::string>().find(words), std::string::npos) << r->body;
}

}  // namespace

TEST(ServerSkeleton, AnswersWithTheExpandedSkeleton) {
  Fixture f;
  const json j = f.post_json(skeleton_request());
  EXPECT_EQ(j["object"], "chat.completion");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["message"]["content"], assembled(kHeadings, kList));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const json& s = j["skeleton"];
  EXPECT_EQ(s["points"], json(kHeadings));
  EXPECT_EQ(s["fallback"], false);
  EXPECT_TRUE(s["fallback_reason"].is_null());
  EXPECT_EQ(s["points_given"], false);
  // Every request writes the script and its EOS.
  const int64_t per_request = int64_t(kList.size()) + 1;
  EXPECT_EQ(s["skeleton_tokens"], per_request);
  EXPECT_EQ(s["point_tokens"], json({per_request, per_request, per_request}));
  EXPECT_GE(s["e2e_ms"].get<double>(), s["first_point_ms"].get<double>());
  EXPECT_EQ(j["usage"]["completion_tokens"], 4 * per_request);
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_tokens_of(kHeadings, true));
  EXPECT_EQ(j["usage"]["total_tokens"], 4 * per_request + prompt_tokens_of(kHeadings, true));
  EXPECT_EQ(f.backend.added(), 4);
  // Counted once, as its usage says.
  EXPECT_EQ(f.server.metrics().requests("/v1/chat/completions", 200), 1u);
  EXPECT_EQ(f.metric("tern_prompt_tokens_total"), j["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(f.metric("tern_generation_tokens_total"), j["usage"]["completion_tokens"].get<int64_t>());
  EXPECT_EQ(f.server.in_flight(), 0);
}

TEST(ServerSkeleton, GivenPointsSkipTheSkeletonStage) {
  Fixture f;
  const std::vector<std::string> points = {"Alpha", "Beta"};
  const json j = f.post_json(skeleton_request({{"type", "skeleton"}, {"points", points}, {"seed", 1}}), 400);
  EXPECT_EQ(j["error"]["param"], "organize");  // "seed" is the request's, not organize's
  const json ok = f.post_json(skeleton_request({{"type", "skeleton"}, {"points", points}}));
  EXPECT_EQ(ok["choices"][0]["message"]["content"], assembled(points, kList));
  EXPECT_EQ(ok["skeleton"]["points_given"], true);
  EXPECT_EQ(ok["skeleton"]["skeleton_tokens"], 0);
  EXPECT_EQ(ok["skeleton"]["points"], json(points));
  EXPECT_EQ(ok["usage"]["prompt_tokens"], prompt_tokens_of(points, false));
  EXPECT_EQ(f.backend.added(), 2);  // one request per point, no skeleton request
}

TEST(ServerSkeleton, MaxTokensCapsEveryPoint) {
  Fixture f;
  json body = skeleton_request({{"type", "skeleton"}, {"points", {"Alpha", "Beta"}}, {"point_max_tokens", 50}});
  body["max_completion_tokens"] = 5;
  const json j = f.post_json(body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], assembled({"Alpha", "Beta"}, kList.substr(0, 5)));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 10);
  EXPECT_EQ(f.backend.last_params().max_tokens, 5);
}

TEST(ServerSkeleton, NoListFallsBackToPlainDecoding) {
  const std::string plain = "Water it well and wait.";
  Fixture f(plain);
  const json j = f.post_json(skeleton_request());
  EXPECT_EQ(j["choices"][0]["message"]["content"], plain);
  EXPECT_EQ(j["skeleton"]["fallback"], true);
  ASSERT_TRUE(j["skeleton"]["fallback_reason"].is_string());
  EXPECT_FALSE(j["skeleton"]["fallback_reason"].get<std::string>().empty());
  EXPECT_EQ(j["skeleton"]["points"], json::array());
  EXPECT_EQ(f.backend.added(), 2);  // the skeleton, then the plain answer
  EXPECT_EQ(j["usage"]["completion_tokens"], 2 * (int64_t(plain.size()) + 1));
}

TEST(ServerSkeleton, StreamMatchesTheWholeAnswer) {
  Fixture f;
  const std::string whole = f.post_json(skeleton_request())["choices"][0]["message"]["content"];
  json body = skeleton_request();
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  bool done = false;
  const std::vector<json> chunks = sse_json(f.stream(body), &done);
  EXPECT_TRUE(done);
  ASSERT_GE(chunks.size(), 4u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(stream_content(chunks), whole);
  std::vector<int> point_indexes;
  int skeleton_chunks = 0;
  std::string finish;
  for (const auto& c : chunks) {
    if (c.contains("skeleton")) {
      ++skeleton_chunks;
      EXPECT_EQ(c["skeleton"]["points"], json(kHeadings));
    }
    if (!c.contains("choices") || c["choices"].empty()) continue;
    const json& choice = c["choices"][0];
    if (choice.contains("point")) {
      const int i = choice["point"]["index"];
      point_indexes.push_back(i);
      EXPECT_EQ(choice["point"]["content"], str_cat(i + 1, ". ", kHeadings.at(size_t(i)), kList));
    }
    if (choice["finish_reason"].is_string()) finish = choice["finish_reason"];
  }
  EXPECT_EQ(skeleton_chunks, 1);
  std::sort(point_indexes.begin(), point_indexes.end());
  EXPECT_EQ(point_indexes, std::vector<int>({0, 1, 2}));
  EXPECT_EQ(finish, "stop");
  ASSERT_TRUE(chunks.back().contains("usage"));
  EXPECT_EQ(chunks.back()["usage"]["completion_tokens"], 4 * (int64_t(kList.size()) + 1));
}

TEST(ServerSkeleton, StreamedFallbackSaysSoAndStreamsThePlainAnswer) {
  const std::string plain = "Water it well and wait.";
  Fixture f(plain);
  json body = skeleton_request();
  body["stream"] = true;
  bool done = false;
  const std::vector<json> chunks = sse_json(f.stream(body), &done);
  EXPECT_TRUE(done);
  size_t fallback_at = chunks.size(), first_content_at = chunks.size();
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].contains("skeleton") && chunks[i]["skeleton"].value("fallback", false)) fallback_at = i;
    if (first_content_at == chunks.size() && !chunks[i]["choices"].empty() &&
        !chunks[i]["choices"][0]["delta"].value("content", std::string()).empty())
      first_content_at = i;
  }
  ASSERT_LT(fallback_at, chunks.size());
  EXPECT_TRUE(chunks[fallback_at]["skeleton"]["reason"].is_string());
  EXPECT_LT(fallback_at, first_content_at);
  EXPECT_EQ(stream_content(chunks), plain);
}

TEST(ServerSkeleton, WhatItCannotServeIsA400) {
  Fixture f;
  const auto with = [](json extra) {
    json b = skeleton_request();
    for (auto& [k, v] : extra.items()) b[k] = v;
    return b;
  };
  expect_400(f, with({{"n", 2}}), "organize", "n > 1");
  json tool = {{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "object"}}}}}};
  expect_400(f, with({{"tools", {tool}}}), "organize", "tools");
  EXPECT_EQ(f.post(with({{"tools", {tool}}, {"tool_choice", "none"}}))->status, 200);
  expect_400(f, with({{"logprobs", true}}), "organize", "logprobs");
  expect_400(f, with({{"response_format", {{"type", "json_object"}}}}), "organize", "response_format");
  expect_400(f, with({{"grammar", "root ::= \"a\""}}), "organize", "grammar");
  // On /v1/completions only "none" is accepted.
  expect_400(f, {{"prompt", "x"}, {"organize", "skeleton"}}, "organize", "chat-completions extension",
             "/v1/completions");
  EXPECT_EQ(f.post({{"prompt", "x"}, {"max_tokens", 2}, {"organize", "none"}}, "/v1/completions")->status, 200);
  // Bad organize values name the field.
  expect_400(f, skeleton_request("bogus"), "organize", "bogus");
  expect_400(f, skeleton_request(5), "organize", "expected");
  expect_400(f, skeleton_request({{"points", {"a"}}}), "organize.type", "type");
  expect_400(f, skeleton_request({{"type", "skeleton"}, {"depth", 2}}), "organize", "unknown field 'depth'");
  expect_400(f, skeleton_request({{"type", "skeleton"}, {"points", json::array()}}), "organize.points", "1 to 32");
  expect_400(f, skeleton_request({{"type", "skeleton"}, {"points", {"a", "  "}}}), "organize.points[1]", "empty");
  expect_400(f, skeleton_request({{"type", "skeleton"}, {"points", {"a", 3}}}), "organize.points[1]", "string");
  expect_400(f, skeleton_request({{"type", "skeleton"}, {"max_points", 40}}), "organize.max_points", "[2, 32]");
  expect_400(f, skeleton_request({{"type", "skeleton"}, {"max_points", 1}}), "organize.max_points", "[2, 32]");
  expect_400(f, skeleton_request({{"type", "skeleton"}, {"max_points", 3}, {"min_points", 4}}), "organize.min_points",
             "at most max_points");
  expect_400(f, skeleton_request({{"type", "skeleton"}, {"point_max_tokens", 0}}), "organize.point_max_tokens", "");
  expect_400(f, skeleton_request({{"type", "skeleton"}, {"points", {"a", "b", "c"}}, {"max_points", 2}}),
             "organize.points", "more than max_points");
  // A conversation that does not end with the user's question.
  json body = skeleton_request();
  body["messages"].push_back({{"role", "assistant"}, {"content", "ok"}});
  expect_400(f, body, "organize", "last message");
  EXPECT_EQ(f.backend.added(), 4 + 1);  // the run with tool_choice none, the completion with organize none
  // "none" is a plain chat.
  const json plain = f.post_json(skeleton_request("none"));
  EXPECT_FALSE(plain.contains("skeleton"));
}

TEST(ServerSkeleton, ModelWithoutChatTemplateIsA400) {
  Fixture f(kList, select_chat_template("", "", "<s>", "</s>"));
  expect_400(f, skeleton_request(), "organize", "chat template");
  json streamed = skeleton_request();
  streamed["stream"] = true;
  expect_400(f, streamed, "organize", "chat template");
  EXPECT_EQ(f.backend.added(), 0);
  // A plain chat still works on it.
  EXPECT_EQ(f.post({{"messages", messages()}, {"max_tokens", 3}})->status, 200);
}

TEST(ServerSkeleton, ClientLeavingMidRunAbortsEveryRequest) {
  // Slow steps and no EOS: the points are still being written when the client leaves.
  Fixture f(kList, declared_template(), 20ms, -1);
  const json organize = {{"type", "skeleton"}, {"points", {"Alpha", "Beta", "Gamma"}}, {"point_max_tokens", 1000}};
  int64_t aborted = 0;
  for (bool stream : {false, true}) {
    json body = skeleton_request(organize);
    body["stream"] = stream;
    RawConn c(f.server.port());
    c.send_all(http_post("/v1/chat/completions", body.dump()));
    for (int i = 0; i < 500 && f.backend.live_requests() < 3; ++i) std::this_thread::sleep_for(2ms);
    ASSERT_EQ(f.backend.live_requests(), 3) << "stream=" << stream;
    const int64_t aborts_before = f.backend.aborts();
    c.close();
    EXPECT_TRUE(f.backend.wait_idle(5s)) << "stream=" << stream;
    EXPECT_GE(f.backend.aborts() - aborts_before, 3) << "stream=" << stream;
    ++aborted;
    for (int i = 0; i < 200 && f.server.metrics().requests("/v1/chat/completions", 499) < uint64_t(aborted); ++i)
      std::this_thread::sleep_for(5ms);
    EXPECT_EQ(f.server.metrics().requests("/v1/chat/completions", 499), uint64_t(aborted));
  }
  EXPECT_EQ(f.server.metrics().requests("/v1/chat/completions", 200), 0u);
  for (int i = 0; i < 200 && f.server.in_flight() > 0; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(f.server.in_flight(), 0);
  // The next request is served.
  json next = skeleton_request({{"type", "skeleton"}, {"points", {"Alpha"}}, {"point_max_tokens", 3}});
  const json j = f.post_json(next);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "1. Alpha" + kList.substr(0, 3));
}

TEST(ServerSkeleton, FullQueueIsA429) {
  Fixture f(kList, declared_template(), 1ms, -2, /*max_waiting=*/1);
  f.backend.pause(true);  // nothing starts: a plain request holds the queue's one place
  RawConn first(f.server.port());
  first.send_all(http_post("/v1/chat/completions", json{{"messages", messages()}, {"max_tokens", 2}}.dump()));
  while (f.backend.added() < 1) std::this_thread::sleep_for(1ms);
  auto r = f.post(skeleton_request({{"type", "skeleton"}, {"points", {"Alpha", "Beta"}}}));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429) << r->body;
  EXPECT_FALSE(r->get_header_value("Retry-After").empty());
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "queue_full");
  f.backend.pause(false);
  EXPECT_EQ(status_of(first.read_all(5s)), 200);
  EXPECT_EQ(f.backend.added(), 1);
  // Nothing of the refused run stays in flight or counted as served.
  for (int i = 0; i < 200 && f.server.in_flight() > 0; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(f.server.in_flight(), 0);
  EXPECT_EQ(f.server.metrics().requests("/v1/chat/completions", 200), 1u);
}

TEST(ServerSkeleton, DeadlineAbortsTheRunWithA503) {
  Fixture f(kList, declared_template(), 1ms, -2, 64, /*request_timeout_s=*/0.3);
  f.backend.pause(true);  // the run never ends by itself
  const json organize = {{"type", "skeleton"}, {"points", {"Alpha", "Beta"}}};
  auto r = f.post(skeleton_request(organize));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "timeout");
  // Streamed: the error event, then [DONE].
  json body = skeleton_request(organize);
  body["stream"] = true;
  bool done = false;
  const std::vector<json> chunks = sse_json(f.stream(body), &done);
  EXPECT_TRUE(done);
  ASSERT_FALSE(chunks.empty());
  ASSERT_TRUE(chunks.back().contains("error"));
  EXPECT_NE(chunks.back()["error"]["message"].get<std::string>().find("time limit"), std::string::npos);
  f.backend.pause(false);
  EXPECT_TRUE(f.backend.wait_idle(2s));
  for (int i = 0; i < 200 && f.server.metrics().requests("/v1/chat/completions", 503) < 2; ++i)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(f.server.metrics().requests("/v1/chat/completions", 503), 2u);
}

// ---- over the real engine ---------------------------------------------------------------

TEST(ServerSkeletonEngine, GivenPointsOnStories260K) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string model = shared_path("models/stories260K.gguf");
  const json body = {{"messages", {{{"role", "user"}, {"content", "Tell a story."}}}},
                     {"temperature", 0},
                     {"organize", {{"type", "skeleton"}, {"points", {"Lily", "Ball", "Home"}}, {"point_max_tokens", 12}}}};
  {
    ServeProcess srv({"-m", model, "--chat-template", "chatml"});
    ASSERT_GT(srv.port(), 0) << srv.log();
    httplib::Client c("127.0.0.1", srv.port());
    c.set_read_timeout(60, 0);
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    const std::string answer = j["choices"][0]["message"]["content"];
    // One line per point, in order, unless a point's expansion wrote newlines of its own.
    for (size_t i = 0; i < 3; ++i) {
      const std::string line_start = str_cat(i + 1, ". ", body["organize"]["points"][i].get<std::string>());
      const size_t at = answer.find(line_start);
      ASSERT_NE(at, std::string::npos) << answer;
      EXPECT_TRUE(at == 0 || answer[at - 1] == '\n') << answer;
    }
    EXPECT_EQ(answer.rfind("1. Lily", 0), 0u) << answer;
    EXPECT_EQ(j["skeleton"]["point_tokens"].size(), 3u);
    // Greedy: the same request gives the same answer.
    auto again = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(again);
    EXPECT_EQ(json::parse(again->body)["choices"][0]["message"]["content"], answer);
  }
  ServeProcess bare({"-m", model});
  ASSERT_GT(bare.port(), 0) << bare.log();
  httplib::Client c("127.0.0.1", bare.port());
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(json::parse(r->body)["error"]["message"].get<std::string>().find("chat template"), std::string::npos)
      << r->body;
}

}  // namespace test_server_skeleton
