// The OpenAI request parser: every accepted shape, and a 400 naming the parameter for each
// malformed one (item 5 of the server issue: invalid JSON, wrong types, out-of-range values).
#include <gtest/gtest.h>

#include <map>

#include <cctype>

#include "server/api_error.h"
#include "server/openai_request.h"

using namespace tern::server;

namespace {

OpenAiRequest completion(const std::string& body) { return parse_openai_request(body, ApiKind::Completion); }
OpenAiRequest chat(const std::string& body) { return parse_openai_request(body, ApiKind::Chat); }

// The ApiError a body raises (status and param), or a failure when it parses.
ApiError error_of(const std::string& body, ApiKind kind = ApiKind::Completion) {
  try {
    parse_openai_request(body, kind);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "", "", "", "");
}

}  // namespace

TEST(RequestParser, CompletionDefaultsAreOpenAIs) {
  const OpenAiRequest r = completion(R"({"model":"m","prompt":"Hello"})");
  EXPECT_EQ(r.kind, ApiKind::Completion);
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_FALSE(r.prompts[0].is_tokens);
  EXPECT_EQ(r.prompts[0].text, "Hello");
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.n_logprobs, -1);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 1.0f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.0f);
  EXPECT_FALSE(r.seed.has_value());
}

TEST(RequestParser, EveryHonouredField) {
  const OpenAiRequest r = completion(R"({
    "model": "m", "prompt": ["a", "b"], "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
    "top_k": 12, "min_p": 0.1, "n": 3, "stop": ["x", "yy"], "seed": 42, "presence_penalty": 0.5,
    "frequency_penalty": -0.5, "logprobs": 2, "stream": true,
    "stream_options": {"include_usage": true}, "user": "u1", "ignore_eos": true,
    "priority": -1, "repetition_penalty": 1.1})");
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].text, "b");
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 12);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.1f);
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"x", "yy"}));
  EXPECT_EQ(*r.seed, 42u);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.sampling.repeat_penalty, 1.1f);
  EXPECT_EQ(r.n_logprobs, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.user, "u1");
  EXPECT_FALSE(r.echo);
  EXPECT_TRUE(completion(R"({"prompt":"x","echo":true})").echo);
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.priority, -1);
}

TEST(RequestParser, LogitBias) {
  const OpenAiRequest r =
      parse_openai_request(R"({"prompt":"x","logit_bias":{"5":-100,"17":2.5}})", ApiKind::Completion);
  ASSERT_EQ(r.sampling.logit_bias.size(), 2u);
  std::map<int32_t, float> got(r.sampling.logit_bias.begin(), r.sampling.logit_bias.end());
  EXPECT_EQ(got[5], -100.0f);
  EXPECT_EQ(got[17], 2.5f);
}

TEST(RequestParser, PromptShapes) {
  EXPECT_EQ(completion(R"({"prompt":""})").prompts[0].text, "");
  const auto ids = completion(R"({"prompt":[1,2,3]})");
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_TRUE(ids.prompts[0].is_tokens);
  EXPECT_EQ(ids.prompts[0].tokens, (std::vector<int64_t>{1, 2, 3}));
  const auto batch = completion(R"({"prompt":[[1,2],[3]]})");
  ASSERT_EQ(batch.prompts.size(), 2u);
  EXPECT_EQ(batch.prompts[1].tokens, (std::vector<int64_t>{3}));
  EXPECT_EQ(completion(R"({"prompt":"x","stop":"end"})").stop, (std::vector<std::string>{"end"}));
  EXPECT_TRUE(completion(R"({"prompt":"x","stop":""})").stop.empty());
}

TEST(RequestParser, NullMeansAbsent) {
  const auto r = completion(R"({"prompt":"x","max_tokens":null,"temperature":null,"stop":null,"seed":null,
                               "logprobs":null,"stream_options":null,"user":null})");
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_FALSE(r.seed.has_value());
}

TEST(RequestParser, IntegralFloatsAreIntegers) {
  EXPECT_EQ(*completion(R"({"prompt":"x","max_tokens":16.0})").max_tokens, 16);
  EXPECT_EQ(error_of(R"({"prompt":"x","max_tokens":16.5})").param(), "max_tokens");
}

TEST(RequestParser, NegativeSeedIsFolded) {
  EXPECT_EQ(*completion(R"({"prompt":"x","seed":-1})").seed, ~uint64_t(0));
}

TEST(RequestParser, ChatFields) {
  const auto r = chat(R"({"model":"m","messages":[
      {"role":"system","content":"be brief"},
      {"role":"developer","content":"also kind"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
      {"role":"assistant","content":null},
      {"role":"user","content":"hi","name":"bob"}],
    "max_tokens": 5, "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 3})");
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[1].role, "system");
  EXPECT_EQ(r.messages[2].content, "a\nb");
  EXPECT_EQ(r.messages[3].content, "");
  EXPECT_EQ(*r.max_tokens, 9);  // max_completion_tokens wins
  EXPECT_EQ(r.n_logprobs, 3);
  EXPECT_EQ(chat(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})").n_logprobs, 0);
  EXPECT_EQ(chat(R"({"messages":[{"role":"user","content":"x"}],"logprobs":false})").n_logprobs, -1);
}

TEST(RequestParser, TokenizeAndDetokenize) {
  auto t = parse_tokenize_request(R"({"prompt":"hi","add_special_tokens":false,"with_pieces":true})");
  EXPECT_EQ(t.text, "hi");
  EXPECT_FALSE(t.add_special);
  EXPECT_TRUE(t.with_pieces);
  EXPECT_EQ(parse_tokenize_request(R"({"content":"yo"})").text, "yo");
  EXPECT_TRUE(parse_tokenize_request(R"({"messages":[{"role":"user","content":"x"}]})").has_messages);
  EXPECT_EQ(parse_detokenize_request(R"({"tokens":[5,6]})").tokens, (std::vector<int64_t>{5, 6}));
  EXPECT_THROW(parse_tokenize_request(R"({})"), ApiError);
  EXPECT_THROW(parse_detokenize_request(R"({"tokens":"x"})"), ApiError);
  EXPECT_THROW(parse_detokenize_request(R"({"tokens":[-1]})"), ApiError);
}

struct BadCase {
  const char* body;
  const char* param;  // expected ApiError::param()
  ApiKind kind = ApiKind::Completion;
};

class RequestParserRejects : public ::testing::TestWithParam<BadCase> {};

TEST_P(RequestParserRejects, With400NamingTheParam) {
  const BadCase& c = GetParam();
  const ApiError e = error_of(c.body, c.kind);
  EXPECT_EQ(e.status(), 400) << c.body;
  EXPECT_EQ(e.type(), "invalid_request_error") << c.body;
  EXPECT_EQ(e.param(), c.param) << c.body << " -> " << e.what();
  EXPECT_FALSE(std::string(e.what()).empty());
}

INSTANTIATE_TEST_SUITE_P(
    Malformed, RequestParserRejects,
    ::testing::Values(
        // invalid JSON and wrong top-level shapes
        BadCase{"", ""}, BadCase{"{", ""}, BadCase{"{\"prompt\": \"x\",}", ""}, BadCase{"[1,2]", ""},
        BadCase{"\"just a string\"", ""}, BadCase{"null", ""}, BadCase{"{\"prompt\":\"\xff\xfe\"}", ""},
        BadCase{"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]", ""},
        // missing required fields
        BadCase{R"({"model":"m"})", "prompt"}, BadCase{R"({"model":"m"})", "messages", ApiKind::Chat},
        // wrong types
        BadCase{R"({"prompt":5})", "prompt"}, BadCase{R"({"prompt":[]})", "prompt"},
        BadCase{R"({"prompt":[1,"a"]})", "prompt[1]"}, BadCase{R"({"prompt":["a",1]})", "prompt[1]"},
        BadCase{R"({"prompt":[[1],[]]})", "prompt[1]"}, BadCase{R"({"prompt":[-1]})", "prompt[0]"},
        BadCase{R"({"prompt":"x","model":7})", "model"}, BadCase{R"({"prompt":"x","max_tokens":"5"})", "max_tokens"},
        BadCase{R"({"prompt":"x","temperature":"hot"})", "temperature"},
        BadCase{R"({"prompt":"x","stream":"yes"})", "stream"}, BadCase{R"({"prompt":"x","stop":5})", "stop"},
        BadCase{R"({"prompt":"x","stop":["a",5]})", "stop[1]"}, BadCase{R"({"prompt":"x","n":true})", "n"},
        BadCase{R"({"prompt":"x","seed":"s"})", "seed"}, BadCase{R"({"prompt":"x","user":1})", "user"},
        BadCase{R"({"prompt":"x","logprobs":true})", "logprobs"},
        BadCase{R"({"prompt":"x","stream":true,"stream_options":5})", "stream_options"},
        BadCase{R"({"prompt":"x","stream":true,"stream_options":{"include_usage":1}})", "stream_options.include_usage"},
        BadCase{R"({"messages":"hi"})", "messages", ApiKind::Chat},
        BadCase{R"({"messages":[]})", "messages", ApiKind::Chat},
        BadCase{R"({"messages":["hi"]})", "messages[0]", ApiKind::Chat},
        BadCase{R"({"messages":[{"content":"hi"}]})", "messages[0].role", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"wizard","content":"hi"}]})", "messages[0].role", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user"}]})", "messages[0].content", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":5}]})", "messages[0].content", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":null}]})", "messages[0].content", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})",
                "messages[0].content[0].type", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"logprobs":1})", "logprobs", ApiKind::Chat},
        // out of range
        BadCase{R"({"prompt":"x","max_tokens":0})", "max_tokens"},
        BadCase{R"({"prompt":"x","max_tokens":-5})", "max_tokens"},
        BadCase{R"({"prompt":"x","max_tokens":99999999999999999999})", "max_tokens"},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":0})", "max_completion_tokens",
                ApiKind::Chat},
        BadCase{R"({"prompt":"x","temperature":2.5})", "temperature"},
        BadCase{R"({"prompt":"x","temperature":-0.1})", "temperature"},
        BadCase{R"({"prompt":"x","top_p":1.5})", "top_p"}, BadCase{R"({"prompt":"x","top_k":-2})", "top_k"},
        BadCase{R"({"prompt":"x","min_p":2})", "min_p"},
        BadCase{R"({"prompt":"x","presence_penalty":3})", "presence_penalty"},
        BadCase{R"({"prompt":"x","frequency_penalty":-3})", "frequency_penalty"},
        BadCase{R"({"prompt":"x","n":0})", "n"}, BadCase{R"({"prompt":"x","n":1000})", "n"},
        BadCase{R"({"prompt":"x","logprobs":21})", "logprobs"},
        BadCase{R"({"prompt":"x","stop":["a","b","c","d","e"]})", "stop"},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", "top_logprobs",
                ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", "top_logprobs", ApiKind::Chat},
        // inconsistent or unsupported
        BadCase{R"({"prompt":"x","stream_options":{"include_usage":true}})", "stream_options"},
        BadCase{R"({"prompt":"x","best_of":3})", "best_of"}, BadCase{R"({"prompt":"x","echo":true,"logprobs":1})", "echo"},
        BadCase{R"({"prompt":"x","suffix":"s"})", "suffix"}, BadCase{R"({"prompt":"x","logit_bias":{"x":1}})", "logit_bias"},
        BadCase{R"({"prompt":"x","logit_bias":{"5":101}})", "logit_bias"}, BadCase{R"({"prompt":"x","logit_bias":{"-1":1}})", "logit_bias"},
        BadCase{R"({"prompt":"x","logit_bias":{"5":"a"}})", "logit_bias"},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", "tools", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}})",
                "response_format", ApiKind::Chat},
        BadCase{R"({"prompt":[["a"]]})", "prompt[0][0]"}),
    // Names: the case number and the parameter it must blame ("body" for the whole body).
    [](const ::testing::TestParamInfo<BadCase>& info) {
      std::string name = std::to_string(info.index) + "_";
      const std::string p = *info.param.param ? info.param.param : "body";
      for (char c : p) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      return name;
    });

TEST(RequestParser, DepthLimitIgnoresBracketsInStrings) {
  // 100 brackets inside a string are text, not nesting.
  const std::string deep_text(100, '[');
  EXPECT_EQ(completion(R"({"prompt":")" + deep_text + R"("})").prompts[0].text, deep_text);
  EXPECT_EQ(completion(R"({"prompt":"\"[[[[\\"})").prompts[0].text, "\"[[[[\\");
}

TEST(RequestParser, ManyPromptsTimesNIsBounded) {
  std::string prompts = "[";
  for (int i = 0; i < 10; ++i) prompts += std::string(i ? "," : "") + "\"p\"";
  prompts += "]";
  EXPECT_EQ(completion(R"({"prompt":)" + prompts + R"(,"n":12})").prompts.size(), 10u);
  EXPECT_EQ(error_of(R"({"prompt":)" + prompts + R"(,"n":13})").param(), "n");
}
