// Prompt scores behind the server and the engine scorer of prompt compression:
//   - BackendScorer (server/backend_scorer.h) gives SessionScorer's logprobs within 1e-4 on every
//     call of a multi-segment LLMLingua compression, and the same compressed prompt; concurrent
//     compressions through one engine agree with one alone; the prefix cache saves scorer work;
//   - /v1/completions with echo and logprobs (lm-evaluation-harness's loglikelihood) begins the
//     choice's logprobs with the prompt's tokens (the first with null scores), max_tokens 0 only
//     scores, and the scores are the model's (a Session prefill of the prompt);
//   - vLLM's prompt_logprobs on completions (per choice) and chat (beside the choices), streamed in
//     the first chunk; what a request gets wrong is a 400 naming the field.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "../engine/engine_test_util.h"
#include "prompt/compress.h"
#include "prompt/prompt_tokens.h"
#include "prompt/session_scorer.h"
#include "server/backend.h"
#include "server/backend_scorer.h"
#include "server/http_test_util.h"
#include "server/serve_process.h"

namespace tern {
namespace {

using nlohmann::json;
using tern::testing::real_model_path;
using tern::testing::sequence_logprobs;
using tern::testing::ServeProcess;
using tern::testing::post_json;
using tern::testing::sse_json;

const std::string kStory =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her red ball. "
    "One day, she saw a big dog in the park. The dog wanted to play too. Lily was scared at first, but the dog was "
    "kind. They played with the ball all day and became best friends.";

// Calls both scorers with every context and tokens compress() asks for; answers with the
// engine's, after checking the two agree.
class ComparingScorer final : public prompt::TokenScorer {
 public:
  ComparingScorer(prompt::TokenScorer& engine, prompt::TokenScorer& session) : engine_(engine), session_(session) {}
  std::vector<double> logprobs(std::span<const int32_t> context, std::span<const int32_t> tokens) override {
    const std::vector<double> a = engine_.logprobs(context, tokens), b = session_.logprobs(context, tokens);
    EXPECT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size() && k < b.size(); ++k)
      EXPECT_NEAR(a[k], b[k], 1e-4) << "call " << calls << ", context " << context.size() << ", token " << k;
    ++calls;
    return a;
  }
  int64_t tokens_evaluated() const override { return engine_.tokens_evaluated(); }
  int calls = 0;

 private:
  prompt::TokenScorer& engine_;
  prompt::TokenScorer& session_;
};

class BackendScorerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = open_model_file(real_model_path());
    tok_ = Tokenizer::from_gguf(*file_);
    EngineConfig cfg;
    cfg.n_threads = 2;
    cfg.max_batch_tokens = 64;  // prompts prefill in chunks, beside each other
    engine_ = std::make_unique<Engine>(file_, tok_, cfg);
    backend_ = std::make_unique<server::EngineBackend>(*engine_);
    engine_->start();
  }
  void TearDown() override { engine_->stop(); }

  prompt::PromptTokens story() const { return prompt::tokenize_prompt(*tok_, {"", kStory, ""}, {}); }
  static prompt::CompressOptions lingua() {
    prompt::CompressOptions o;
    o.ratio = 2.5;
    o.method = prompt::Method::LlmLingua;
    o.segment = 8;  // many segments, each scored after the compressed text before it
    return o;
  }

  std::shared_ptr<const GgufFile> file_;
  std::shared_ptr<const Tokenizer> tok_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<server::EngineBackend> backend_;
};

TEST_F(BackendScorerTest, SameLogprobsAndCompressionAsSessionScorer) {
  const prompt::PromptTokens p = story();
  ASSERT_GT(p.size(), 40);
  SessionConfig sc;
  sc.n_threads = 2;
  Session session(file_, sc);
  prompt::SessionScorer by_session(session);
  server::BackendScorer by_engine(*backend_, {});
  ComparingScorer both(by_engine, by_session);
  const prompt::CompressResult compared = prompt::compress(p, both, lingua());
  EXPECT_GT(both.calls, 3) << "LLMLingua's token level should score several segments";
  EXPECT_GT(compared.scorer_tokens, 0);

  // Each scorer alone: the same tokens kept.
  session.reset();
  prompt::SessionScorer session_alone(session);
  server::BackendScorer engine_alone(*backend_, {});
  const prompt::CompressResult a = prompt::compress(p, session_alone, lingua());
  const prompt::CompressResult b = prompt::compress(p, engine_alone, lingua());
  EXPECT_EQ(a.keep, b.keep);
  EXPECT_EQ(a.n_kept, b.n_kept);
  EXPECT_LT(b.n_kept, a.n_tokens);
  // Selective Context scores the whole prompt after BOS in one call.
  prompt::CompressOptions sel;
  sel.method = prompt::Method::SelectiveContext;
  session.reset();
  EXPECT_EQ(prompt::compress(p, session_alone, sel).keep, prompt::compress(p, engine_alone, sel).keep);
}

TEST_F(BackendScorerTest, ConcurrentCompressionsAgreeWithOneAlone) {
  const prompt::PromptTokens p = story();
  server::BackendScorer alone(*backend_, {});
  const std::vector<uint8_t> want = prompt::compress(p, alone, lingua()).keep;
  std::vector<std::vector<uint8_t>> got(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i)
    threads.emplace_back([&, i] {
      server::BackendScorer scorer(*backend_, {});
      got[i] = prompt::compress(p, scorer, lingua()).keep;
    });
  for (auto& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
}

TEST_F(BackendScorerTest, PrefixCacheSavesWorkAndErrorsAreClear) {
  const prompt::PromptTokens p = story();
  const std::vector<int32_t> context(p.ids.begin(), p.ids.begin() + 40), tokens(p.ids.begin() + 40, p.ids.end());
  server::BackendScorer scorer(*backend_, {});
  const std::vector<double> first = scorer.logprobs(context, tokens);
  const int64_t cold = scorer.tokens_evaluated();
  EXPECT_EQ(cold, p.size());
  // The same context again: its full KV blocks come from the prefix cache.
  const std::vector<double> again = scorer.logprobs(context, tokens);
  EXPECT_LT(scorer.tokens_evaluated() - cold, cold);
  ASSERT_EQ(first.size(), again.size());
  for (size_t k = 0; k < first.size(); ++k) EXPECT_NEAR(first[k], again[k], 1e-4) << k;

  EXPECT_THROW(scorer.logprobs({}, tokens), Error);  // nothing scores a first token
  EXPECT_TRUE(scorer.logprobs(context, {}).empty());
  // Longer than the engine's context: the engine's refusal, named.
  const std::vector<int32_t> too_long(size_t(engine_->n_ctx()) + 1, p.ids[1]);
  try {
    scorer.logprobs(std::vector<int32_t>{p.ids[0]}, too_long);
    ADD_FAILURE() << "a prompt longer than the context was scored";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("refused"), std::string::npos) << e.what();
  }
  // A deadline already past: the request is aborted and the call says why.
  server::BackendScorerOptions late;
  late.deadline = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  server::BackendScorer hurried(*backend_, late);
  std::vector<int32_t> long_tokens(tokens);
  for (int i = 0; i < 3; ++i) long_tokens.insert(long_tokens.end(), tokens.begin(), tokens.end());
  try {
    hurried.logprobs(context, long_tokens);  // may finish first on a fast machine: either is right
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("time limit"), std::string::npos) << e.what();
  }
}

// ---- through tern serve ------------------------------------------------------------------

std::vector<int32_t> tokenize(httplib::Client& c, const std::string& text) {
  const json t = post_json(c, "/tokenize", {{"prompt", text}}, 200);
  std::vector<int32_t> ids;
  for (const auto& id : t["tokens"]) ids.push_back(id.get<int32_t>());
  return ids;
}

TEST(ServerPromptLogprobs, EchoWithLogprobsScoresThePrompt) {
  const std::string model = real_model_path();
  ServeProcess srv({"-m", model, "--kv-type", "f32"});
  ASSERT_GT(srv.port(), 0) << srv.log();
  httplib::Client c("127.0.0.1", srv.port());
  const std::vector<int32_t> ids = tokenize(c, kStory);
  ASSERT_GT(ids.size(), 20u);

  // lm-evaluation-harness's loglikelihood: token ids, echo, logprobs, max_tokens 0.
  const json r = post_json(c, "/v1/completions",
                           {{"prompt", ids}, {"echo", true}, {"logprobs", 2}, {"max_tokens", 0}, {"temperature", 0}}, 200);
  const json& ch = r["choices"][0];
  const json& lp = ch["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids.size()) << lp.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(ch["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 0);
  EXPECT_EQ(r["usage"]["prompt_tokens"].get<size_t>(), ids.size());
  // The model's own scores: a Session prefill of the prompt.
  const std::vector<float> ref = sequence_logprobs(open_model_file(model), {ids[0]}, {ids.begin() + 1, ids.end()});
  for (size_t t = 1; t < ids.size(); ++t) {
    EXPECT_NEAR(lp["token_logprobs"][t].get<double>(), ref[t - 1], 1e-4) << t;
    EXPECT_EQ(lp["top_logprobs"][t].size(), 2u);
    EXPECT_GE(lp["text_offset"][t].get<int64_t>(), lp["text_offset"][t - 1].get<int64_t>());
  }

  // With a completion: the prompt's tokens, then the generated ones; the text echoes the prompt.
  const json g = post_json(c, "/v1/completions",
                           {{"prompt", kStory}, {"echo", true}, {"logprobs", 1}, {"max_tokens", 3}, {"temperature", 0}},
                           200);
  const json& gl = g["choices"][0]["logprobs"];
  EXPECT_EQ(gl["tokens"].size(), ids.size() + 3);
  EXPECT_EQ(g["choices"][0]["text"].get<std::string>().rfind(kStory, 0), 0u);
  for (size_t t = 1; t < gl["token_logprobs"].size(); ++t) EXPECT_TRUE(gl["token_logprobs"][t].is_number()) << t;
  EXPECT_NEAR(gl["token_logprobs"][5].get<double>(), lp["token_logprobs"][5].get<double>(), 1e-4);

  // Streamed: the echoed prompt and its scores in the first chunk after nothing else.
  auto s = c.Post("/v1/completions",
                  json{{"prompt", kStory}, {"echo", true}, {"logprobs", 0}, {"max_tokens", 0}, {"stream", true}}.dump(),
                  "application/json");
  ASSERT_TRUE(s);
  const std::vector<json> chunks = sse_json(s->body);
  ASSERT_GE(chunks.size(), 2u) << s->body;
  EXPECT_EQ(chunks[0]["choices"][0]["text"], kStory);
  EXPECT_EQ(chunks[0]["choices"][0]["logprobs"]["tokens"].size(), ids.size());
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "length");
}

TEST(ServerPromptLogprobs, VllmPromptLogprobsOnCompletionsAndChat) {
  ServeProcess srv({"-m", real_model_path(), "--kv-type", "f32"});
  ASSERT_GT(srv.port(), 0) << srv.log();
  httplib::Client c("127.0.0.1", srv.port());
  const std::vector<int32_t> ids = tokenize(c, kStory);
  const json echo = post_json(
      c, "/v1/completions", {{"prompt", ids}, {"echo", true}, {"logprobs", 0}, {"max_tokens", 0}}, 200);
  const json r = post_json(c, "/v1/completions",
                           {{"prompt", ids}, {"prompt_logprobs", 3}, {"max_tokens", 2}, {"n", 2}, {"temperature", 0}},
                           200);
  ASSERT_EQ(r["choices"].size(), 2u);
  for (const json& ch : r["choices"]) {
    // Every choice of the prompt carries its scores.
    const json& pl = ch["prompt_logprobs"];
    ASSERT_EQ(pl.size(), ids.size()) << ch.dump();
    EXPECT_TRUE(pl[0].is_null());
    for (size_t t = 1; t < ids.size(); ++t) {
      const json& entry = pl[t];
      const std::string key = std::to_string(ids[t]);
      ASSERT_TRUE(entry.contains(key)) << t << ": " << entry.dump();
      EXPECT_NEAR(entry[key]["logprob"].get<double>(), echo["choices"][0]["logprobs"]["token_logprobs"][t].get<double>(),
                  1e-4);
      EXPECT_TRUE(entry.size() == 3u || entry.size() == 4u) << entry.dump();  // the top 3, and the token if not among them
      bool has_rank1 = false;
      for (const auto& [id, e] : entry.items()) {
        EXPECT_TRUE(e.contains("decoded_token"));
        has_rank1 |= e["rank"] == 1;
      }
      EXPECT_TRUE(has_rank1) << entry.dump();
    }
  }
  // Chat: beside the choices, one entry per prompt token.
  const json chat = post_json(c, "/v1/chat/completions",
                              {{"messages", {{{"role", "user"}, {"content", "Tell me a story."}}}},
                               {"prompt_logprobs", 0},
                               {"max_tokens", 2}},
                              200);
  ASSERT_TRUE(chat.contains("prompt_logprobs")) << chat.dump();
  EXPECT_EQ(chat["prompt_logprobs"].size(), chat["usage"]["prompt_tokens"].get<size_t>());
  // Streamed: the first chunk of the choice carries them.
  auto s = c.Post("/v1/completions",
                  json{{"prompt", kStory}, {"prompt_logprobs", 1}, {"max_tokens", 2}, {"stream", true}}.dump(),
                  "application/json");
  ASSERT_TRUE(s);
  const std::vector<json> chunks = sse_json(s->body);
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks[0]["choices"][0]["prompt_logprobs"].size(), ids.size()) << s->body;
}

TEST(ServerPromptLogprobs, BadRequestsAreA400NamingTheField) {
  ServeProcess srv({"-m", real_model_path()});
  ASSERT_GT(srv.port(), 0) << srv.log();
  httplib::Client c("127.0.0.1", srv.port());
  const json user = {{{"role", "user"}, {"content", "hi"}}};
  const struct {
    std::string path;
    json body;
    std::string param;
  } cases[] = {
      {"/v1/completions", {{"prompt", "x"}, {"prompt_logprobs", 21}}, "prompt_logprobs"},
      {"/v1/completions", {{"prompt", "x"}, {"prompt_logprobs", -1}}, "prompt_logprobs"},
      {"/v1/completions", {{"prompt", "x"}, {"max_tokens", 0}}, "max_tokens"},
      {"/v1/completions", {{"prompt", "x"}, {"max_tokens", 0}, {"echo", true}}, "max_tokens"},
      {"/v1/completions", {{"prompt", "x"}, {"max_tokens", 0}, {"logprobs", 1}}, "max_tokens"},
      {"/v1/chat/completions", {{"messages", user}, {"max_tokens", 0}, {"logprobs", true}}, "max_tokens"},
      {"/v1/chat/completions", {{"messages", user}, {"echo", true}, {"logprobs", true}}, "echo"},
      {"/v1/chat/completions", {{"messages", user}, {"prompt_logprobs", 99}}, "prompt_logprobs"},
      {"/v1/completions", {{"prompt", "x"}, {"prompt_logprobs", 1}, {"n", 2}, {"stream", true}}, "prompt_logprobs"},
      {"/v1/completions",
       {{"prompt", "x"}, {"echo", true}, {"logprobs", 1}, {"kv_policy", {{"type", "streaming"}, {"window", 64}}}},
       "echo"},
  };
  for (const auto& k : cases) {
    const json r = post_json(c, k.path, k.body, 400);
    EXPECT_EQ(r["error"]["param"], k.param) << k.body.dump() << " -> " << r.dump();
    post_json(c, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}}, 200);  // the next is served
  }
}

// Compression without --scorer scores through the served engine: the same prompt as a scorer
// session of the same file gives (echo with logprobs lists the tokens the model ran on), and
// concurrent compressions all succeed with it.
TEST(ServerPromptLogprobs, CompressionScoresThroughTheServedEngine) {
  const std::string model = real_model_path();
  const json body = {{"prompt", kStory},
                     {"echo", true},
                     {"logprobs", 0},
                     {"max_tokens", 0},
                     {"prompt_compression", {{"ratio", 2}, {"method", "llmlingua"}}}};
  json with_scorer;
  {
    ServeProcess srv({"-m", model, "--kv-type", "f32", "--scorer", model});
    ASSERT_GT(srv.port(), 0) << srv.log();
    httplib::Client c("127.0.0.1", srv.port());
    with_scorer = post_json(c, "/v1/completions", body, 200);
  }
  ServeProcess srv({"-m", model, "--kv-type", "f32"});
  ASSERT_GT(srv.port(), 0) << srv.log();
  EXPECT_EQ(srv.log().find("prompt compression scorer"), std::string::npos) << "no second copy of the model";
  httplib::Client c("127.0.0.1", srv.port());
  const json by_engine = post_json(c, "/v1/completions", body, 200);
  // The model ran on the kept tokens (BOS and them), fewer than the prompt's.
  EXPECT_GT(by_engine["prompt_compression"]["tokens_saved"].get<int64_t>(), 0);
  EXPECT_EQ(by_engine["choices"][0]["logprobs"]["tokens"].size(),
            by_engine["prompt_compression"]["kept_tokens"].get<size_t>() + 1);
  EXPECT_EQ(by_engine["choices"][0]["logprobs"]["tokens"], with_scorer["choices"][0]["logprobs"]["tokens"]);
  for (const char* k : {"tokens", "kept_tokens", "tokens_saved", "method"})
    EXPECT_EQ(by_engine["prompt_compression"][k], with_scorer["prompt_compression"][k]) << k;
  EXPECT_GT(by_engine["prompt_compression"]["scorer_tokens"].get<int64_t>(), 0);
  EXPECT_TRUE(by_engine["prompt_compression"]["scorer_ms"].is_number());

  std::vector<json> got(2);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i)
    threads.emplace_back([&, i] {
      httplib::Client ci("127.0.0.1", srv.port());
      ci.set_read_timeout(120);
      got[i] = post_json(ci, "/v1/completions", body, 200);
    });
  for (auto& t : threads) t.join();
  for (const json& g : got)
    EXPECT_EQ(g["choices"][0]["logprobs"]["tokens"], by_engine["choices"][0]["logprobs"]["tokens"]) << g.dump();
}

}  // namespace
}  // namespace tern
