// Prompt compression behind the server (docs/data-level.md): a request's "prompt_compression"
// object shortens a completion's prompt or a chat's user messages before the model sees them
// (usage counts what it ran on; the response carries the compression's report, a stream its
// final chunk), `--compress-prompt R` does it for every request that does not ask, without
// --scorer the served model scores through its own engine, and what a request gets wrong is a
// 400 naming the field, after which the server serves the next request.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>

#include "server/http_test_util.h"
#include "server/serve_process.h"
#include "test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace test_server_prompt_compression {

using namespace tern;
using namespace tern::testing;
using nlohmann::json;

namespace {

const std::string kModel = std::string(TERN_SOURCE_DIR) + "/models/tern-stories.gguf";
const std::string kStory =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her red ball. "
    "One day, she saw a big dog in the park. The dog wanted to play too.";

TEST(ServerPromptCompression, RequestsAskForItAndGetTheirReport) {
  ServeProcess srv({"-m", kModel, "--scorer", kModel});
  ASSERT_GT(srv.port(), 0) << srv.log();
  EXPECT_NE(srv.log().find("prompt compression scorer"), std::string::npos) << srv.log();
  httplib::Client c("127.0.0.1", srv.port());
  const json plain = post_json(c, "/v1/completions", {{"prompt", kStory}, {"max_tokens", 4}, {"temperature", 0}}, 200);
  EXPECT_FALSE(plain.contains("prompt_compression"));
  const int64_t full = plain["usage"]["prompt_tokens"];
  for (const char* method : {"llmlingua", "selective-context", "random", "tail"}) {
    const json r = post_json(c, "/v1/completions",
                             {{"prompt", kStory},
                              {"max_tokens", 4},
                              {"temperature", 0},
                              {"prompt_compression", {{"ratio", 2}, {"method", method}}}},
                             200);
    const json& pc = r["prompt_compression"];
    EXPECT_EQ(pc["method"], method);
    EXPECT_EQ(pc["tokens"].get<int64_t>(), full - 1);  // BOS is not compressed
    EXPECT_EQ(pc["kept_tokens"].get<int64_t>(), full / 2);
    EXPECT_EQ(r["usage"]["prompt_tokens"].get<int64_t>(), pc["kept_tokens"].get<int64_t>() + 1) << method;
  }
  // A chat compresses its messages, not the template around them.
  const json chat_plain = post_json(
      c, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", kStory}}}}, {"max_tokens", 2}}, 200);
  const json chat = post_json(c, "/v1/chat/completions",
                              {{"messages", {{{"role", "user"}, {"content", kStory}}}},
                               {"max_tokens", 2},
                               {"prompt_compression", {{"ratio", 4}}}},
                              200);
  const int64_t saved = chat["prompt_compression"]["tokens_saved"];
  EXPECT_GT(saved, 0);
  // The kept text is rendered and tokenized again: a token may merge across a gap.
  EXPECT_NEAR(double(chat["usage"]["prompt_tokens"].get<int64_t>()),
              double(chat_plain["usage"]["prompt_tokens"].get<int64_t>() - saved), 2.0);
  // A stream's final chunk carries the report.
  auto s = c.Post("/v1/completions",
                  json{{"prompt", kStory}, {"max_tokens", 3}, {"stream", true}, {"prompt_compression", {{"ratio", 3}}}}.dump(),
                  "application/json");
  ASSERT_TRUE(s);
  bool reported = false;
  for (const json& chunk : sse_json(s->body)) reported |= chunk.contains("prompt_compression");
  EXPECT_TRUE(reported) << s->body;
}

TEST(ServerPromptCompression, BadRequestsAreA400AndTheServerGoesOn) {
  ServeProcess srv({"-m", kModel, "--scorer", kModel});
  ASSERT_GT(srv.port(), 0) << srv.log();
  httplib::Client c("127.0.0.1", srv.port());
  const struct {
    json pc;
    std::string prompt, needle;
  } cases[] = {
      {{{"ratio", 0.5}}, kStory, "prompt_compression.ratio"},
      {{{"ratio", "two"}}, kStory, "prompt_compression.ratio"},
      {{{"ratio", 2}, {"method", "zip"}}, kStory, "must be one of"},
      {{{"ratio", 2}, {"unit", "letter"}}, kStory, "token, word or sentence"},
      {{{"ratio", 2}, {"level", 3}}, kStory, "unknown field 'level'"},
      {json(2), kStory, "prompt_compression"},
      {{{"ratio", 8}}, "<keep>" + kStory + "</keep>", "more than the budget"},
      {{{"ratio", 2}}, "a <keep>b", "never closed"},
      {{{"ratio", 2}, {"method", "longllmlingua"}}, kStory, "--question"},
  };
  for (const auto& k : cases) {
    const json r = post_json(c, "/v1/completions", {{"prompt", k.prompt}, {"max_tokens", 2}, {"prompt_compression", k.pc}}, 400);
    EXPECT_NE(r.dump().find(k.needle), std::string::npos) << k.pc.dump() << " -> " << r.dump();
    // The next request is served.
    post_json(c, "/v1/completions", {{"prompt", kStory}, {"max_tokens", 2}}, 200);
  }
}

TEST(ServerPromptCompression, ServerDefaultAndNoScorer) {
  {
    // --compress-prompt: every request is compressed (the scorer is the model itself).
    ServeProcess srv({"-m", kModel, "--compress-prompt", "2", "--compress-method", "tail"});
    ASSERT_GT(srv.port(), 0) << srv.log();
    httplib::Client c("127.0.0.1", srv.port());
    const json r = post_json(c, "/v1/completions", {{"prompt", kStory}, {"max_tokens", 2}}, 200);
    EXPECT_EQ(r["prompt_compression"]["method"], "tail");
    EXPECT_EQ(r["prompt_compression"]["ratio"], 2.0);
    // A request's own object wins.
    const json own = post_json(c, "/v1/completions",
                               {{"prompt", kStory}, {"max_tokens", 2}, {"prompt_compression", {{"ratio", 4}}}}, 200);
    EXPECT_EQ(own["prompt_compression"]["method"], "llmlingua");
  }
  // Without --scorer the request's own model scores through its engine, even one that evicts
  // from the KV cache as it decodes (--kv-policy): the scoring requests keep every token.
  const std::vector<std::vector<std::string>> servers = {
      {"-m", kModel}, {"-m", kModel, "--kv-policy", "streaming", "--window", "64"}};
  for (const auto& args : servers) {
    ServeProcess srv(args);
    ASSERT_GT(srv.port(), 0) << srv.log();
    EXPECT_EQ(srv.log().find("prompt compression scorer"), std::string::npos) << "the model was loaded twice";
    httplib::Client c("127.0.0.1", srv.port());
    const json r = post_json(
        c, "/v1/completions", {{"prompt", kStory}, {"max_tokens", 2}, {"prompt_compression", {{"ratio", 2}}}}, 200);
    EXPECT_GT(r["prompt_compression"]["tokens_saved"].get<int64_t>(), 0) << r.dump();
    EXPECT_GT(r["prompt_compression"]["scorer_tokens"].get<int64_t>(), 0) << r.dump();
  }
}

}  // namespace

}  // namespace test_server_prompt_compression
