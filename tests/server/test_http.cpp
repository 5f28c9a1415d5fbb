// The HTTP server against a scripted backend (fake_backend.h): every endpoint, the OpenAI
// response shapes, streaming, and the robustness cases of the server issue's item 5
// (malformed requests, a full queue, disconnects, limits, timeouts, auth, graceful shutdown).
#include <gtest/gtest.h>
#include <httplib.h>

#include <future>
#include <thread>

#include "fake_backend.h"
#include "http_test_util.h"
#include "server/server.h"

using namespace tern;
using namespace tern::server;
using namespace tern::testing;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

const std::string kScript = FakeBackend::Options{}.script;

struct Fixture {
  explicit Fixture(FakeBackend::Options bo = {}, ServerConfig cfg = {}) : backend(bo), server(backend, prep(cfg)) {
    server.start();
    client = std::make_unique<httplib::Client>("127.0.0.1", server.port());
    client->set_read_timeout(20, 0);
  }
  static ServerConfig prep(ServerConfig c) {
    c.port = 0;
    c.model_id = "fake-model";
    c.model_names = {"fake-model.gguf"};
    c.http_threads = std::max(c.http_threads, 16);
    if (c.max_in_flight == 0) c.max_in_flight = 64;
    return c;
  }
  httplib::Result post(const std::string& path, const json& body, const httplib::Headers& h = {}) {
    return client->Post(path, h, body.dump(), "application/json");
  }
  json post_json(const std::string& path, const json& body, int want_status = 200) {
    auto r = post(path, body);
    EXPECT_TRUE(r) << "no response for " << path;
    if (!r) return json();
    EXPECT_EQ(r->status, want_status) << r->body;
    return json::parse(r->body);
  }
  // A streamed request over a raw socket; returns the whole response.
  std::string stream(const std::string& path, const json& body) {
    RawConn c(server.port());
    c.send_all(http_post(path, body.dump()));
    return c.read_until("data: [DONE]", 20s);
  }

  FakeBackend backend;
  Server server;
  std::unique_ptr<httplib::Client> client;
};

json error_of(const httplib::Result& r) {
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  json j = json::parse(r->body);
  EXPECT_TRUE(j.contains("error")) << r->body;
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"]["type"].is_string());
  EXPECT_TRUE(j["error"].contains("param"));
  EXPECT_TRUE(j["error"].contains("code"));
  return j["error"];
}

}  // namespace

TEST(Http, CompletionMatchesOpenAISchema) {
  Fixture f;
  const json j = f.post_json("/v1/completions", {{"model", "fake-model"}, {"prompt", "Hello"}, {"max_tokens", 10}});
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_TRUE(j["id"].get<std::string>().rfind("cmpl-", 0) == 0);
  EXPECT_TRUE(j["created"].is_number_integer());
  EXPECT_EQ(j["model"], "fake-model");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["text"], kScript.substr(0, 10));
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 6);  // BOS + 5 bytes
  EXPECT_EQ(j["usage"]["completion_tokens"], 10);
  EXPECT_EQ(j["usage"]["total_tokens"], 16);
  // OpenAI's default max_tokens for completions is 16.
  EXPECT_EQ(f.post_json("/v1/completions", {{"prompt", "Hello"}})["usage"]["completion_tokens"], 16);
  // The file name is accepted as the model too.
  EXPECT_EQ(f.post_json("/v1/completions", {{"model", "fake-model.gguf"}, {"prompt", "x"}, {"max_tokens", 1}})["model"],
            "fake-model");
}

TEST(Http, SamplingFieldsReachTheEngine) {
  Fixture f;
  f.post_json("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 3}, {"temperature", 0.3}, {"top_p", 0.7},
                                  {"top_k", 5}, {"min_p", 0.2}, {"seed", 7}, {"presence_penalty", 0.4},
                                  {"frequency_penalty", 0.6}, {"stop", {"zz"}}, {"user", "me"}});
  const RequestParams p = f.backend.last_params();
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.3f);
  EXPECT_FLOAT_EQ(p.sampling.top_p, 0.7f);
  EXPECT_EQ(p.sampling.top_k, 5);
  EXPECT_FLOAT_EQ(p.sampling.min_p, 0.2f);
  EXPECT_EQ(p.sampling.seed, 7u);
  EXPECT_FLOAT_EQ(p.sampling.presence_penalty, 0.4f);
  EXPECT_FLOAT_EQ(p.sampling.frequency_penalty, 0.6f);
  EXPECT_EQ(p.stop, std::vector<std::string>{"zz"});
  EXPECT_EQ(p.max_tokens, 3);
  EXPECT_EQ(p.n_logprobs, -1);
}

TEST(Http, NGivesDistinctIndexedChoices) {
  Fixture f;
  const json j = f.post_json("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 4}, {"n", 3}});
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], kScript.substr(size_t(i), 4));
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);  // once per prompt, not per choice
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  // A batch of prompts: choice index = prompt * n + i.
  const json b = f.post_json("/v1/completions", {{"prompt", {"a", "bb"}}, {"max_tokens", 2}, {"n", 2}});
  ASSERT_EQ(b["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(b["choices"][i]["index"], i);
  EXPECT_EQ(b["usage"]["prompt_tokens"], 2 + 3);
}

TEST(Http, StopSequenceIsTrimmed) {
  Fixture f;
  const json j = f.post_json("/v1/completions", {{"prompt", "x"}, {"max_tokens", 60}, {"stop", "fox"}});
  EXPECT_EQ(j["choices"][0]["text"], "Once upon a time there was a little ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  // Streamed, the held-back prefix never leaks either.
  bool done = false;
  const auto chunks = sse_json(f.stream("/v1/completions", {{"prompt", "x"}, {"max_tokens", 60}, {"stop", "fox"}, {"stream", true}}), &done);
  std::string text;
  for (const auto& c : chunks) text += c["choices"][0]["text"].get<std::string>();
  EXPECT_TRUE(done);
  EXPECT_EQ(text, "Once upon a time there was a little ");
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "stop");
}

TEST(Http, EosFinishesWithStopAndIgnoreEosOverrides) {
  FakeBackend::Options o;
  o.eos_after = 5;
  Fixture f(o);
  json j = f.post_json("/v1/completions", {{"prompt", "x"}, {"max_tokens", 20}});
  EXPECT_EQ(j["choices"][0]["text"], kScript.substr(0, 5));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  j = f.post_json("/v1/completions", {{"prompt", "x"}, {"max_tokens", 20}, {"ignore_eos", true}});
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
}

TEST(Http, CompletionLogprobsShape) {
  Fixture f;
  const json j = f.post_json("/v1/completions", {{"prompt", "x"}, {"max_tokens", 3}, {"logprobs", 2}});
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 3u);
  EXPECT_EQ(lp["tokens"][0], "O");
  EXPECT_FLOAT_EQ(lp["token_logprobs"][0].get<float>(), -0.25f);
  ASSERT_EQ(lp["top_logprobs"][0].size(), 2u);
  EXPECT_FLOAT_EQ(lp["top_logprobs"][0]["a"].get<float>(), -1.0f);
  EXPECT_EQ(lp["text_offset"], json({0, 1, 2}));
}

TEST(Http, ChatCompletionAppliesTheTemplate) {
  Fixture f;
  const json j = f.post_json("/v1/chat/completions",
                             {{"model", "fake-model"},
                              {"messages", {{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "U"}}}},
                              {"max_completion_tokens", 5}});
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_TRUE(j["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
  const json& c = j["choices"][0];
  EXPECT_EQ(c["message"]["role"], "assistant");
  EXPECT_EQ(c["message"]["content"], kScript.substr(0, 5));
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_TRUE(c["logprobs"].is_null());
  // ChatML (the default, as the fake has no template), BOS added by the tokenizer.
  const RequestParams p = f.backend.last_params();
  const std::string want = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n";
  ASSERT_EQ(p.prompt_ids.size(), want.size() + 1);
  EXPECT_EQ(p.prompt_ids[0], 1);
  EXPECT_EQ(f.backend.tokenizer().decode(p.prompt_ids), want);
  EXPECT_EQ(j["usage"]["prompt_tokens"], int64_t(want.size() + 1));
  // Without max_tokens a chat answer may fill the context.
  EXPECT_EQ(f.post_json("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "U"}}}}})["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(f.backend.last_params().max_tokens, 256 - int64_t(f.backend.last_params().prompt_ids.size()));
}

TEST(Http, ChatLogprobsShape) {
  Fixture f;
  const json j = f.post_json("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "U"}}}},
                                                      {"max_tokens", 2}, {"logprobs", true}, {"top_logprobs", 1}});
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "O");
  EXPECT_EQ(content[0]["bytes"], json({int('O')}));
  EXPECT_FLOAT_EQ(content[0]["logprob"].get<float>(), -0.25f);
  ASSERT_EQ(content[0]["top_logprobs"].size(), 1u);
  EXPECT_EQ(content[0]["top_logprobs"][0]["token"], "a");
}

TEST(Http, CompletionStream) {
  Fixture f;
  const std::string raw = f.stream("/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 12}, {"stream", true}});
  EXPECT_EQ(status_of(raw), 200);
  EXPECT_NE(raw.find("Content-Type: text/event-stream"), std::string::npos);
  bool done = false;
  const auto chunks = sse_json(raw, &done);
  ASSERT_TRUE(done) << raw;
  ASSERT_GE(chunks.size(), 2u);
  std::string text;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i]["object"], "text_completion");
    EXPECT_TRUE(chunks[i]["choices"][0]["finish_reason"].is_null());
    EXPECT_FALSE(chunks[i].contains("usage"));
    text += chunks[i]["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, kScript.substr(0, 12));
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "length");
  // Every chunk of one response shares its id.
  for (const auto& c : chunks) EXPECT_EQ(c["id"], chunks[0]["id"]);
}

TEST(Http, ChatStreamWithUsage) {
  Fixture f;
  const std::string raw = f.stream("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "U"}}}},
                                                            {"max_tokens", 6}, {"stream", true}, {"n", 2},
                                                            {"stream_options", {{"include_usage", true}}}});
  bool done = false;
  const auto chunks = sse_json(raw, &done);
  ASSERT_TRUE(done);
  std::map<int, std::string> text;
  std::map<int, int> roles, finishes;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    const json& c = chunks[i];
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_TRUE(c.contains("usage") && c["usage"].is_null());
    ASSERT_EQ(c["choices"].size(), 1u);
    const int idx = c["choices"][0]["index"];
    const json& d = c["choices"][0]["delta"];
    if (d.contains("role")) {
      EXPECT_EQ(d["role"], "assistant");
      ++roles[idx];
    }
    if (d.contains("content")) text[idx] += d["content"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) ++finishes[idx];
  }
  EXPECT_EQ(roles[0], 1);
  EXPECT_EQ(roles[1], 1);
  EXPECT_EQ(finishes[0], 1);
  EXPECT_EQ(finishes[1], 1);
  EXPECT_EQ(text[0], kScript.substr(0, 6));
  EXPECT_EQ(text[1], kScript.substr(1, 6));
  const json& last = chunks.back();
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["completion_tokens"], 12);
}

TEST(Http, StreamedLogprobs) {
  Fixture f;
  const auto chunks = sse_json(f.stream("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "U"}}}},
                                                                  {"max_tokens", 4}, {"stream", true}, {"logprobs", true}}));
  int n = 0;
  for (const auto& c : chunks)
    if (!c["choices"].empty() && c["choices"][0]["logprobs"].is_object())
      n += int(c["choices"][0]["logprobs"]["content"].size());
  EXPECT_EQ(n, 4);
}

TEST(Http, EchoPrependsThePrompt) {
  Fixture f;
  const json j = f.post_json("/v1/completions", {{"prompt", "Say: "}, {"max_tokens", 4}, {"echo", true}});
  EXPECT_EQ(j["choices"][0]["text"], "Say: " + kScript.substr(0, 4));
}

TEST(Http, TokenPrompts) {
  Fixture f;
  const json j = f.post_json("/v1/completions", {{"prompt", {1, 3 + 'h', 3 + 'i'}}, {"max_tokens", 2}, {"echo", true}});
  EXPECT_EQ(j["choices"][0]["text"], "hi" + kScript.substr(0, 2));
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  auto r = f.post("/v1/completions", {{"prompt", {1, 100000}}});
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(error_of(r)["param"], "prompt");
}

TEST(Http, ModelsHealthTokenize) {
  Fixture f;
  auto r = f.client->Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "fake-model");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["owned_by"], "tern");
  r = f.client->Get("/v1/models/fake-model");
  EXPECT_EQ(r->status, 200);
  r = f.client->Get("/v1/models/other");
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(error_of(r)["code"], "model_not_found");
  r = f.client->Get("/health");
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["status"], "ok");

  j = f.post_json("/tokenize", {{"prompt", "ab"}, {"with_pieces", true}});
  EXPECT_EQ(j["tokens"], json({1, 3 + 'a', 3 + 'b'}));
  EXPECT_EQ(j["count"], 3);
  EXPECT_EQ(j["max_model_len"], 256);
  EXPECT_EQ(j["pieces"][1], "a");
  EXPECT_EQ(f.post_json("/tokenize", {{"prompt", "ab"}, {"add_special_tokens", false}})["count"], 2);
  EXPECT_EQ(f.post_json("/tokenize", {{"messages", {{{"role", "user"}, {"content", "U"}}}}})["count"],
            1 + std::string("<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n").size());
  EXPECT_EQ(f.post_json("/detokenize", {{"tokens", {1, 3 + 'o', 3 + 'k'}}})["prompt"], "ok");
  EXPECT_EQ(f.post("/detokenize", {{"tokens", {999}}})->status, 400);
}

TEST(Http, StaticChatPage) {
  Fixture f;
  auto r = f.client->Get("/");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(r->body.find("<script src=\"/app.js\">"), std::string::npos);
  // No external resources: everything the page loads is served by tern.
  EXPECT_EQ(r->body.find("http://"), std::string::npos);
  EXPECT_EQ(r->body.find("https://"), std::string::npos);
  r = f.client->Get("/app.js");
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/javascript; charset=utf-8");
  EXPECT_NE(r->body.find("/v1/chat/completions"), std::string::npos);
  EXPECT_EQ(f.client->Get("/style.css")->status, 200);
  r = f.client->Get("/nope.js");
  EXPECT_EQ(r->status, 404);
  error_of(r);
}

TEST(Http, MetricsArePrometheusText) {
  Fixture f;
  f.post_json("/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 5}});
  f.post_json("/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 5}});
  f.post("/v1/completions", {{"prompt", 5}});
  f.stream("/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 5}, {"stream", true}});
  // The fake retires a finished request just after its last callback: let it, so the gauges
  // below read an idle engine.
  ASSERT_TRUE(f.backend.wait_idle(2s));
  // The gauges are read live from the backend; on a loaded machine the fake's worker can still
  // be between a request's last callback and its retirement, so allow it a moment more.
  auto r = f.client->Get("/metrics");
  for (int i = 0; i < 200 && r && r->body.find("tern_num_requests_running 0\n") == std::string::npos; ++i) {
    std::this_thread::sleep_for(10ms);
    r = f.client->Get("/metrics");
  }
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  const std::string& m = r->body;
  EXPECT_NE(m.find("tern_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 3\n"), std::string::npos) << m;
  EXPECT_NE(m.find("tern_requests_total{endpoint=\"/v1/completions\",status=\"400\"} 1\n"), std::string::npos);
  EXPECT_NE(m.find("tern_prompt_tokens_total 18\n"), std::string::npos);
  EXPECT_NE(m.find("tern_generation_tokens_total 15\n"), std::string::npos);
  EXPECT_NE(m.find("tern_time_to_first_token_seconds_count 3\n"), std::string::npos);
  EXPECT_NE(m.find("tern_time_per_output_token_seconds_count 12\n"), std::string::npos);
  EXPECT_NE(m.find("tern_e2e_request_latency_seconds_bucket{le=\"+Inf\"} 3\n"), std::string::npos);
  for (const char* name : {"tern_num_requests_running 0", "tern_num_requests_waiting 0", "tern_kv_blocks_used 0",
                           "tern_kv_blocks_free 1024", "tern_prefix_cache_hit_rate 0", "# TYPE tern_requests_total counter",
                           "# TYPE tern_time_to_first_token_seconds histogram"})
    EXPECT_NE(m.find(name), std::string::npos) << name;
}

// ---- item 5: malformed requests ---------------------------------------------------------

TEST(HttpErrors, MalformedBodiesGet400WithAnOpenAIErrorObject) {
  Fixture f;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/v1/completions", "not json"},
      {"/v1/completions", "{\"prompt\": "},
      {"/v1/completions", "[]"},
      {"/v1/completions", "{\"prompt\": 12}"},
      {"/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": \"many\"}"},
      {"/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 0}"},
      {"/v1/completions", "{\"prompt\": \"x\", \"temperature\": 9}"},
      {"/v1/chat/completions", "{\"messages\": \"hi\"}"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\"}]}"},
      {"/tokenize", "{}"},
      {"/detokenize", "{\"tokens\": [\"a\"]}"},
  };
  for (const auto& [path, body] : cases) {
    auto r = f.client->Post(path, body, "application/json");
    ASSERT_TRUE(r) << body;
    EXPECT_EQ(r->status, 400) << path << " " << body << " -> " << r->body;
    EXPECT_EQ(error_of(r)["type"], "invalid_request_error");
  }
  EXPECT_EQ(f.backend.added(), 0);
}

TEST(HttpErrors, UnknownModel) {
  // With an alias (strict names) another model's name is 404, as OpenAI answers.
  ServerConfig cfg;
  cfg.strict_model_names = true;
  Fixture f({}, cfg);
  auto r = f.post("/v1/completions", {{"model", "gpt-9"}, {"prompt", "x"}});
  EXPECT_EQ(r->status, 404);
  const json e = error_of(r);
  EXPECT_EQ(e["code"], "model_not_found");
  EXPECT_EQ(e["param"], "model");
  EXPECT_EQ(f.post("/v1/completions", {{"model", "fake-model.gguf"}, {"prompt", "x"}, {"max_tokens", 1}})->status, 200);
}

TEST(Http, OneModelWithoutAliasServesAnyModelName) {
  // Clients send "gpt-3.5-turbo" by default; llama.cpp's server ignores the name.
  Fixture f;
  const json j = f.post_json("/v1/chat/completions", {{"model", "gpt-3.5-turbo"},
                                                      {"messages", {{{"role", "user"}, {"content", "U"}}}},
                                                      {"max_tokens", 2}});
  EXPECT_EQ(j["model"], "fake-model");
  EXPECT_EQ(f.client->Get("/v1/models/gpt-3.5-turbo")->status, 404);  // the list names what is served
}

TEST(HttpProtocol, CorsForAllowedOriginsOnly) {
  ServerConfig cfg;
  cfg.api_key = "sekrit";
  cfg.cors_origins = {"http://app.example"};
  Fixture f({}, cfg);
  // Preflight: answered without the key, naming what the page asked for.
  RawConn c(f.server.port());
  c.send_all("OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nOrigin: http://app.example\r\n"
             "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type\r\n\r\n");
  const std::string pre = c.read_all(2s);
  EXPECT_EQ(status_of(pre), 204) << pre;
  EXPECT_NE(pre.find("Access-Control-Allow-Origin: http://app.example\r\n"), std::string::npos) << pre;
  EXPECT_NE(pre.find("Access-Control-Allow-Headers: authorization, content-type\r\n"), std::string::npos) << pre;
  EXPECT_NE(pre.find("Access-Control-Allow-Methods: "), std::string::npos) << pre;
  // The request itself carries the origin back; another origin gets no CORS header at all.
  auto r = f.client->Get("/v1/models", {{"Authorization", "Bearer sekrit"}, {"Origin", "http://app.example"}});
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  EXPECT_EQ(r->get_header_value("Vary"), "Origin");
  r = f.client->Get("/v1/models", {{"Authorization", "Bearer sekrit"}, {"Origin", "http://evil.example"}});
  EXPECT_EQ(r->status, 200);
  EXPECT_FALSE(r->has_header("Access-Control-Allow-Origin"));
  RawConn e(f.server.port());
  e.send_all("OPTIONS /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nOrigin: http://evil.example\r\n"
             "Access-Control-Request-Method: GET\r\n\r\n");
  EXPECT_EQ(e.read_all(2s).find("Access-Control-Allow"), std::string::npos);
  // A 401 for a page of an allowed origin is readable by it (the header is on errors too).
  r = f.client->Get("/v1/models", {{"Origin", "http://app.example"}});
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
}

TEST(HttpProtocol, CorsWildcard) {
  ServerConfig cfg;
  cfg.cors_origins = {"*"};
  Fixture f({}, cfg);
  auto r = f.client->Get("/health", {{"Origin", "http://anything.example"}});
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "*");
  EXPECT_FALSE(r->has_header("Vary"));
}

TEST(HttpErrors, ContextAndMaxTokensLimits) {
  Fixture f;  // n_ctx 256
  auto r = f.post("/v1/completions", {{"prompt", std::string(300, 'a')}});
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(error_of(r)["code"], "context_length_exceeded");
  r = f.post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", std::string(300, 'a')}}}}});
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(error_of(r)["param"], "messages");
  r = f.post("/v1/completions", {{"prompt", "abc"}, {"max_tokens", 253}});  // 4 + 253 > 256
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(error_of(r)["param"], "max_tokens");
  EXPECT_EQ(f.post("/v1/completions", {{"prompt", "abc"}, {"max_tokens", 252}})->status, 200);
  r = f.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", -1}});
  EXPECT_EQ(r->status, 400);
  // A template that cannot express the conversation.
  ServerConfig cfg;
  cfg.chat_template.family = ChatFamily::Gemma;
  Fixture g({}, cfg);
  r = g.post("/v1/chat/completions", {{"messages", {{{"role", "assistant"}, {"content", "A"}}}}});
  EXPECT_EQ(r->status, 400);
}

TEST(HttpErrors, UnknownEndpointsAndMethods) {
  Fixture f;
  auto r = f.client->Post("/v1/audio/speech", "{}", "application/json");
  EXPECT_EQ(r->status, 404);
  EXPECT_NE(error_of(r)["message"].get<std::string>().find("/v1/audio/speech"), std::string::npos);
  r = f.client->Get("/v1/completions");
  EXPECT_EQ(r->status, 405);
  error_of(r);
}

TEST(HttpErrors, BodyAndHeaderLimits) {
  ServerConfig cfg;
  cfg.max_body_bytes = 1024;
  cfg.max_header_bytes = 2048;
  Fixture f({}, cfg);
  auto r = f.post("/v1/completions", {{"prompt", std::string(2000, 'a')}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  error_of(r);
  r = f.client->Get("/v1/models", {{"X-Big", std::string(4000, 'b')}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 431);
  error_of(r);
  EXPECT_EQ(f.client->Get("/v1/models", {{"X-Small", "c"}})->status, 200);
  // A request line longer than httplib's limit (8 KiB) is refused, not served.
  RawConn c(f.server.port());
  c.send_all("GET /" + std::string(10000, 'x') + " HTTP/1.1\r\nHost: x\r\n\r\n");
  const int st = status_of(c.read_all(1s));
  EXPECT_TRUE(st == 414 || st == 400 || st == -1) << st;
  // Garbage instead of HTTP: the connection is answered 400 or dropped, never served.
  RawConn g(f.server.port());
  g.send_all("\x16\x03\x01 not http at all\r\n\r\n");
  const int gs = status_of(g.read_all(1s));
  EXPECT_TRUE(gs == 400 || gs == -1) << gs;
  EXPECT_EQ(f.client->Get("/health")->status, 200);  // still serving
}

TEST(HttpErrors, SlowClientsAreDropped) {
  ServerConfig cfg;
  cfg.read_timeout_s = 1;
  Fixture f({}, cfg);
  // Headers that never end (slowloris): refused (408) once the read timeout passes.
  RawConn c(f.server.port());
  c.send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
  const auto t0 = std::chrono::steady_clock::now();
  const int st = status_of(c.read_until("\r\n\r\n", 5s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s);
  EXPECT_TRUE(st == 408 || st == -1) << st;
  // A body shorter than its Content-Length: the same.
  RawConn b(f.server.port());
  b.send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro");
  const auto t1 = std::chrono::steady_clock::now();
  const int bs = status_of(b.read_until("\r\n\r\n", 5s));
  EXPECT_LT(std::chrono::steady_clock::now() - t1, 4s);
  EXPECT_TRUE(bs == 408 || bs == -1) << bs;
  EXPECT_EQ(f.backend.added(), 0);
  EXPECT_EQ(f.client->Get("/health")->status, 200);
}

TEST(HttpErrors, ApiKey) {
  ServerConfig cfg;
  cfg.api_key = "sekrit";
  Fixture f({}, cfg);
  auto r = f.client->Get("/v1/models");
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(error_of(r)["code"], "invalid_api_key");
  EXPECT_EQ(f.client->Get("/v1/models", {{"Authorization", "Bearer wrong"}})->status, 401);
  EXPECT_EQ(f.client->Get("/v1/models", {{"Authorization", "sekrit"}})->status, 401);
  EXPECT_EQ(f.client->Get("/v1/models", {{"Authorization", "Bearer sekrit"}})->status, 200);
  EXPECT_EQ(f.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}})->status, 401);
  EXPECT_EQ(f.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}}, {{"Authorization", "Bearer sekrit"}})->status, 200);
  EXPECT_EQ(f.client->Get("/metrics")->status, 401);
  EXPECT_EQ(f.client->Post("/tokenize", "{\"prompt\":\"a\"}", "application/json")->status, 401);
  // Open: the health probe and the chat page's static files (the page asks for the key).
  EXPECT_EQ(f.client->Get("/health")->status, 200);
  EXPECT_EQ(f.client->Get("/")->status, 200);
  EXPECT_EQ(f.client->Get("/app.js")->status, 200);
}

TEST(HttpErrors, FullQueueIs429WithRetryAfter) {
  FakeBackend::Options o;
  o.max_waiting = 1;
  Fixture f(o);
  f.backend.pause(true);
  RawConn first(f.server.port());
  first.send_all(http_post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}}.dump()));
  while (f.backend.added() < 1) std::this_thread::sleep_for(1ms);
  auto r = f.post("/v1/completions", {{"prompt", "y"}, {"max_tokens", 2}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_EQ(error_of(r)["type"], "rate_limit_error");
  f.backend.pause(false);
  EXPECT_EQ(status_of(first.read_all(5s)), 200);
}

TEST(HttpErrors, TooManyInFlightIs503WithRetryAfter) {
  ServerConfig cfg;
  cfg.max_in_flight = 1;
  Fixture f({}, cfg);
  f.backend.pause(true);
  RawConn first(f.server.port());
  first.send_all(http_post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}}.dump()));
  while (f.backend.added() < 1) std::this_thread::sleep_for(1ms);
  auto r = f.post("/v1/completions", {{"prompt", "y"}, {"max_tokens", 2}});
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  f.backend.pause(false);
  EXPECT_EQ(status_of(first.read_all(5s)), 200);
}

TEST(HttpErrors, RequestTimeout) {
  ServerConfig cfg;
  cfg.request_timeout_s = 0.2;
  Fixture f({}, cfg);
  f.backend.pause(true);
  auto r = f.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}});
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(error_of(r)["code"], "timeout");
  EXPECT_TRUE(f.backend.wait_idle(2s));  // aborted, nothing left holding blocks
  // A stream that times out ends with an error event, then [DONE].
  bool done = false;
  const auto chunks = sse_json(f.stream("/v1/completions", {{"prompt", "x"}, {"stream", true}}), &done);
  EXPECT_TRUE(done);
  ASSERT_FALSE(chunks.empty());
  EXPECT_TRUE(chunks.back().contains("error"));
  f.backend.pause(false);
}

// ---- item 5: disconnects free the request at once ---------------------------------------

TEST(HttpDisconnect, MidStreamAbortsAndFreesBlocks) {
  FakeBackend::Options o;
  o.step = 20ms;  // slow enough that the request is still running when the client leaves
  Fixture f(o);
  RawConn c(f.server.port());
  c.send_all(http_post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 200}, {"stream", true}}.dump()));
  const std::string got = c.read_until("data: {", 5s);
  ASSERT_NE(got.find("data: {"), std::string::npos);
  EXPECT_GT(f.backend.metrics().kv_blocks_used, 0);
  const auto t0 = std::chrono::steady_clock::now();
  c.close();
  EXPECT_TRUE(f.backend.wait_idle(2s));
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(ms, 1000) << "abort took " << ms << " ms";
  EXPECT_EQ(f.backend.metrics().kv_blocks_used, 0);
  EXPECT_GE(f.backend.aborts(), 1);
  // Counted as 499 (client closed), not as a success.
  for (int i = 0; i < 100 && f.server.metrics().requests("/v1/completions", 499) == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(f.server.metrics().requests("/v1/completions", 499), 1u);
  EXPECT_EQ(f.server.metrics().requests("/v1/completions", 200), 0u);
  EXPECT_EQ(f.server.in_flight(), 0);
}

TEST(HttpDisconnect, WhileQueuedAborts) {
  Fixture f;
  f.backend.pause(true);  // nothing is generated: the client waits with no bytes flowing
  for (bool stream : {false, true}) {
    RawConn c(f.server.port());
    c.send_all(http_post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 5}, {"stream", stream}}.dump()));
    const int64_t before = f.backend.aborts();
    while (f.backend.live_requests() == 0) std::this_thread::sleep_for(1ms);
    c.close();
    for (int i = 0; i < 200 && f.backend.aborts() == before; ++i) std::this_thread::sleep_for(5ms);
    EXPECT_GT(f.backend.aborts(), before) << "stream=" << stream;
    f.backend.pause(false);
    EXPECT_TRUE(f.backend.wait_idle(2s));
    f.backend.pause(true);
  }
  f.backend.pause(false);
  for (int i = 0; i < 100 && f.server.metrics().requests("/v1/completions", 499) < 2; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(f.server.metrics().requests("/v1/completions", 499), 2u);
  EXPECT_EQ(f.server.metrics().requests("/v1/completions", 200), 0u);
}

// ---- graceful shutdown ------------------------------------------------------------------

TEST(HttpShutdown, InFlightRequestsFinishWithinGrace) {
  FakeBackend::Options o;
  o.step = 5ms;
  Fixture f(o);
  RawConn c(f.server.port());
  c.send_all(http_post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 40}}.dump()));
  while (f.backend.added() < 1) std::this_thread::sleep_for(1ms);
  f.server.shutdown(10s);
  const std::string resp = c.read_all(5s);
  EXPECT_EQ(status_of(resp), 200);
  EXPECT_NE(resp.find(kScript.substr(0, 40)), std::string::npos);
  // Closed for business.
  RawConn late(f.server.port());
  if (late.ok()) {
    late.send_all(http_post("/v1/completions", "{}"));
    const int st = status_of(late.read_all(2s));
    EXPECT_TRUE(st == -1 || st == 503) << st;
  }
}

TEST(HttpShutdown, PastGraceRequestsAreAbortedCleanly) {
  Fixture f;
  f.backend.pause(true);
  RawConn s(f.server.port());
  s.send_all(http_post("/v1/chat/completions",
                       json{{"messages", {{{"role", "user"}, {"content", "U"}}}}, {"stream", true}}.dump()));
  RawConn w(f.server.port());
  w.send_all(http_post("/v1/completions", json{{"prompt", "x"}}.dump()));
  while (f.backend.added() < 2) std::this_thread::sleep_for(1ms);
  // While draining, new requests are refused with 503 (health says so too).
  auto stopper = std::async(std::launch::async, [&] { f.server.shutdown(300ms); });
  std::this_thread::sleep_for(100ms);
  auto h = httplib::Client("127.0.0.1", f.server.port()).Get("/health");
  if (h) {
    EXPECT_EQ(h->status, 503);
  }
  stopper.get();
  bool done = false;
  const auto chunks = sse_json(s.read_all(5s), &done);
  EXPECT_TRUE(done);
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks.back()["error"]["code"], nullptr);
  EXPECT_NE(chunks.back()["error"]["message"].get<std::string>().find("shutting down"), std::string::npos);
  EXPECT_EQ(status_of(w.read_all(5s)), 503);
  EXPECT_TRUE(f.backend.wait_idle(2s));
  EXPECT_EQ(f.server.in_flight(), 0);
}

// ---- the hardening issue's HTTP items (each failed with cpp-httplib 0.11) ----------------

TEST(HttpProtocol, ManyRequestsOnOneKeepAliveConnection) {
  // httplib closed a keep-alive connection after 5 requests (keep-alive max=5).
  Fixture f;
  RawConn c(f.server.port());
  auto answers = [&] {
    size_t n = 0;
    for (size_t at = 0; (at = c.received().find("HTTP/1.1 200", at)) != std::string::npos; ++at) ++n;
    return n;
  };
  for (size_t i = 0; i < 20; ++i) {
    ASSERT_TRUE(c.send_all("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")) << i;
    const auto give_up = std::chrono::steady_clock::now() + 2s;
    while (answers() < i + 1 && std::chrono::steady_clock::now() < give_up) c.read_all(10ms);
  }
  const std::string all = c.received();
  EXPECT_EQ(answers(), 20u);
  EXPECT_EQ(all.find("Connection: close"), std::string::npos);
}

TEST(HttpProtocol, PipelinedRequestsAreAllAnsweredInOrder) {
  Fixture f;
  RawConn c(f.server.port());
  const std::string wire = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                           "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n" +
                           http_post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}}.dump(), "", false) +
                           "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_TRUE(c.send_all(wire));
  const std::string all = c.read_all(5s);
  const size_t a = all.find("\"status\":\"ok\""), b = all.find("\"object\":\"list\""),
               d = all.find("\"text_completion\""), e = all.find("HTTP/1.1 404");
  ASSERT_NE(a, std::string::npos) << all;
  ASSERT_NE(b, std::string::npos) << all;
  ASSERT_NE(d, std::string::npos) << all;
  ASSERT_NE(e, std::string::npos) << all;
  EXPECT_LT(a, b);
  EXPECT_LT(b, d);
  EXPECT_LT(d, e);
}

TEST(HttpProtocol, Http10ClientsGetAStreamWithoutChunkedEncoding) {
  Fixture f;
  RawConn c(f.server.port());
  const std::string body = json{{"prompt", "x"}, {"max_tokens", 3}, {"stream", true}}.dump();
  c.send_all("POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\n\r\n" + body);
  const std::string all = c.read_all(5s);  // ends when the server closes
  EXPECT_EQ(all.rfind("HTTP/1.0 200", 0), 0u) << all;
  EXPECT_EQ(all.find("Transfer-Encoding"), std::string::npos) << all;
  EXPECT_NE(all.find("Connection: close"), std::string::npos);
  bool done = false;
  const auto chunks = sse_json(all.substr(all.find("\r\n\r\n") + 4), &done);
  EXPECT_TRUE(done);
  EXPECT_FALSE(chunks.empty());
  // The body is the events themselves, no chunk-size lines between them.
  EXPECT_EQ(all.substr(all.find("\r\n\r\n") + 4, 6), "data: ");
}

TEST(HttpProtocol, DuplicateContentLengthIsRefused) {
  Fixture f;
  RawConn c(f.server.port());
  const std::string body = json{{"prompt", "x"}, {"max_tokens", 2}}.dump();
  c.send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
             "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(status_of(c.read_all(2s)), 400);
  EXPECT_EQ(f.backend.added(), 0);
}

TEST(HttpProtocol, FormContentTypeBodyIsReadAsJson) {
  // curl -d sends application/x-www-form-urlencoded; httplib answered an 8 KiB one with 413.
  Fixture f;
  std::string body = json{{"prompt", "x"}, {"max_tokens", 2}}.dump();
  body.insert(1, std::string(8192, ' '));
  auto r = f.client->Post("/v1/completions", body, "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  r = f.client->Post("/v1/completions", body, "text/plain");
  EXPECT_EQ(r->status, 200);
}

TEST(HttpProtocol, ExpectContinueGetsA100ThenTheAnswer) {
  Fixture f;
  RawConn c(f.server.port());
  const std::string body = json{{"prompt", "x"}, {"max_tokens", 2}}.dump();
  c.send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nExpect: 100-continue\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\n\r\n");
  EXPECT_EQ(c.read_until("\r\n\r\n", 2s).rfind("HTTP/1.1 100 Continue\r\n\r\n", 0), 0u);
  c.send_all(body);
  const std::string all = c.read_all(5s);
  EXPECT_NE(all.find("HTTP/1.1 200"), std::string::npos) << all;
}

TEST(HttpProtocol, BearerSchemeIsCaseInsensitive) {
  ServerConfig cfg;
  cfg.api_key = "sekrit";
  Fixture f({}, cfg);
  EXPECT_EQ(f.client->Get("/v1/models", {{"Authorization", "bearer sekrit"}})->status, 200);
  EXPECT_EQ(f.client->Get("/v1/models", {{"Authorization", "BEARER  sekrit"}})->status, 200);
  EXPECT_EQ(f.client->Get("/v1/models", {{"Authorization", "Bearer SEKRIT"}})->status, 401);  // the key is not
  EXPECT_EQ(f.client->Get("/v1/models", {{"Authorization", "Basic sekrit"}})->status, 401);
}

TEST(HttpProtocol, HeadAndMethodNotAllowed) {
  Fixture f;
  RawConn c(f.server.port());
  c.send_all("HEAD /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string head = c.read_all(2s);
  EXPECT_EQ(status_of(head), 200);
  EXPECT_EQ(head.substr(head.find("\r\n\r\n") + 4), "");  // no body after the head
  auto r = f.client->Delete("/v1/models");
  EXPECT_EQ(r->status, 405);
  error_of(r);
}

TEST(HttpErrors, LargeAnswersAreBoundedUnlessStreamed) {
  ServerConfig cfg;
  cfg.max_response_entries = 1000;
  Fixture f({}, cfg);
  // 4 choices x 50 tokens x (1 + 1 + 5 alternatives) = 1400 > 1000: refused, with the reason.
  auto r = f.post("/v1/completions", {{"prompt", "x"}, {"n", 4}, {"max_tokens", 50}, {"logprobs", 5}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(error_of(r)["code"], "response_too_large");
  EXPECT_EQ(f.backend.added(), 0);
  // Within it: served.
  EXPECT_EQ(f.post("/v1/completions", {{"prompt", "x"}, {"n", 2}, {"max_tokens", 50}, {"logprobs", 5}})->status, 200);
  // Streamed: not bounded (a stream keeps nothing).
  bool done = false;
  sse_json(f.stream("/v1/completions", {{"prompt", "x"}, {"n", 4}, {"max_tokens", 50}, {"logprobs", 5}, {"stream", true}}),
           &done);
  EXPECT_TRUE(done);
  // A default max_tokens is clipped to the budget instead (chat: the rest of the context).
  r = f.post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "U"}}}}, {"n", 4}, {"logprobs", true},
                                      {"top_logprobs", 5}});
  EXPECT_EQ(r->status, 200) << r->body;
}
