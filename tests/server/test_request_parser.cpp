// The OpenAI request parser: every accepted shape, and a 400 naming the parameter for each
// malformed one (item 5 of the server issue: invalid JSON, wrong types, out-of-range values).
#include <gtest/gtest.h>

#include <map>

#include <cctype>

#include "server/api_error.h"
#include "server/openai_request.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace test_request_parser {

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
// tern's extension: "speculative": false opts a request out of speculative decoding; the
// default (absent, or null as every absent field) is on; anything but a boolean is a 400
// naming the field.
TEST(RequestParser, SpeculativeOptOut) {
  EXPECT_TRUE(completion(R"({"prompt":"x"})").speculative);
  EXPECT_TRUE(completion(R"({"prompt":"x","speculative":null})").speculative);
  EXPECT_TRUE(completion(R"({"prompt":"x","speculative":true})").speculative);
  EXPECT_FALSE(completion(R"({"prompt":"x","speculative":false})").speculative);
  EXPECT_FALSE(chat(R"({"messages":[{"role":"user","content":"x"}],"speculative":false})").speculative);
  for (const char* bad : {R"({"prompt":"x","speculative":"no"})", R"({"prompt":"x","speculative":0})"}) {
    const ApiError e = error_of(bad);
    EXPECT_EQ(e.status(), 400) << bad;
    EXPECT_EQ(e.param(), "speculative") << bad;
    EXPECT_NE(std::string(e.what()).find("'speculative'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(error_of(R"({"messages":[{"role":"user","content":"x"}],"speculative":"no"})", ApiKind::Chat).param(),
            "speculative");
}

// tern's extension: "kv_policy" chooses a request's KV eviction policy (docs/kv.md); what
// make_kv_policy refuses is a 400 naming kv_policy, with its reason.
TEST(RequestParser, KvPolicy) {
  EXPECT_FALSE(completion(R"({"prompt":"x"})").kv_policy);
  const auto s = completion(R"({"prompt":"x","kv_policy":{"type":"streaming","sinks":2,"window":30}})").kv_policy;
  ASSERT_TRUE(s);
  EXPECT_EQ(s->kind, tern::KvPolicyKind::Streaming);
  EXPECT_EQ(s->sinks, 2);
  EXPECT_EQ(s->window, 30);
  const auto h = chat(R"({"messages":[{"role":"user","content":"x"}],"kv_policy":{"type":"h2o","budget":"50%"}})").kv_policy;
  ASSERT_TRUE(h);
  EXPECT_EQ(h->kind, tern::KvPolicyKind::H2O);
  EXPECT_DOUBLE_EQ(h->budget_frac, 0.5);
  EXPECT_EQ(completion(R"({"prompt":"x","kv_policy":{"type":"h2o","budget":64}})").kv_policy->budget, 64);
  EXPECT_FALSE(completion(R"({"prompt":"x","kv_policy":{"type":"none"}})").kv_policy->evicts());
  for (const auto& [bad, needle] : std::vector<std::pair<const char*, const char*>>{
           {R"({"prompt":"x","kv_policy":"streaming"})", "object"},
           {R"({"prompt":"x","kv_policy":{}})", "'type'"},
           {R"({"prompt":"x","kv_policy":{"type":"lru"}})", "lru"},
           {R"({"prompt":"x","kv_policy":{"type":"streaming","sinks":8,"window":4}})", "smaller than the sinks"},
           {R"({"prompt":"x","kv_policy":{"type":"h2o","budget":"0%"}})", "zero"},
           {R"({"prompt":"x","kv_policy":{"type":"streaming","window":8,"size":3}})", "size"}}) {
    const ApiError e = error_of(bad);
    EXPECT_EQ(e.status(), 400) << bad;
    EXPECT_EQ(e.param().substr(0, 9), "kv_policy") << bad;
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << bad << ": " << e.what();
  }
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
        BadCase{R"({"prompt":"x","best_of":3})", "best_of"}, BadCase{R"({"prompt":"x","max_tokens":0,"echo":true})", "max_tokens"},
        BadCase{R"({"prompt":"x","suffix":"s"})", "suffix"}, BadCase{R"({"prompt":"x","logit_bias":{"x":1}})", "logit_bias"},
        BadCase{R"({"prompt":"x","logit_bias":{"5":101}})", "logit_bias"}, BadCase{R"({"prompt":"x","logit_bias":{"-1":1}})", "logit_bias"},
        BadCase{R"({"prompt":"x","logit_bias":{"5":"a"}})", "logit_bias"},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", "tools[0].function",
                ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}})",
                "response_format.type", ApiKind::Chat},
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

// ---- tool calling and structured output (#23) ----

namespace {

const std::string kUser = R"("messages":[{"role":"user","content":"x"}])";
const std::string kWeatherTool =
    R"({"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"a":{"type":"integer"}},"required":["city"]},"strict":true}})";

std::string chat_body(const std::string& extra) { return "{" + kUser + extra + "}"; }

}  // namespace

TEST(RequestParserTools, ToolsAndDefaults) {
  OpenAiRequest r = chat(chat_body(""));
  EXPECT_TRUE(r.tools.empty());
  EXPECT_EQ(r.tool_choice.mode, ToolChoiceMode::None);
  EXPECT_TRUE(r.parallel_tool_calls);
  r = chat(chat_body(",\"tools\":[" + kWeatherTool + R"(,{"type":"function","function":{"name":"noop"}}])"));
  ASSERT_EQ(r.tools.size(), 2u);
  EXPECT_EQ(r.tool_choice.mode, ToolChoiceMode::Auto);  // tools given: auto
  EXPECT_EQ(r.tools[0].name, "get_weather");
  EXPECT_EQ(r.tools[0].description, "Weather");
  EXPECT_TRUE(r.tools[0].strict);
  // The client's key order is kept (templates print the schema).
  EXPECT_EQ(r.tools[0].parameters.dump(),
            R"({"type":"object","properties":{"city":{"type":"string"},"a":{"type":"integer"}},"required":["city"]})");
  EXPECT_EQ(r.tools[1].parameters.dump(), R"({"type":"object","properties":{}})");  // the default
  EXPECT_FALSE(r.tools[1].strict);
  EXPECT_EQ(chat(chat_body(R"(,"tools":[])")).tool_choice.mode, ToolChoiceMode::None);
}

TEST(RequestParserTools, ToolChoice) {
  const std::string tools = ",\"tools\":[" + kWeatherTool + "]";
  EXPECT_EQ(chat(chat_body(tools + R"(,"tool_choice":"none")")).tool_choice.mode, ToolChoiceMode::None);
  EXPECT_EQ(chat(chat_body(tools + R"(,"tool_choice":"auto")")).tool_choice.mode, ToolChoiceMode::Auto);
  EXPECT_EQ(chat(chat_body(tools + R"(,"tool_choice":"required")")).tool_choice.mode, ToolChoiceMode::Required);
  const OpenAiRequest r =
      chat(chat_body(tools + R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}},"parallel_tool_calls":false)"));
  EXPECT_EQ(r.tool_choice.mode, ToolChoiceMode::Named);
  EXPECT_EQ(r.tool_choice.name, "get_weather");
  EXPECT_FALSE(r.parallel_tool_calls);
  // A named function that is not a tool: 400 naming it.
  const ApiError e = error_of(chat_body(tools + R"(,"tool_choice":{"type":"function","function":{"name":"fly"}})"), ApiKind::Chat);
  EXPECT_EQ(e.param(), "tool_choice");
  EXPECT_NE(std::string(e.what()).find("'fly'"), std::string::npos) << e.what();
  EXPECT_EQ(chat(chat_body(R"(,"tool_choice":"none")")).tool_choice.mode, ToolChoiceMode::None);
}

TEST(RequestParserTools, HistoryWithToolCallsAndResults) {
  const OpenAiRequest r = chat(R"({"messages":[
    {"role":"user","content":"Weather?"},
    {"role":"assistant","content":null,"tool_calls":[
      {"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},
      {"id":"call_b","type":"function","function":{"name":"get_weather","arguments":{"city":"Rome"}}}]},
    {"role":"tool","tool_call_id":"call_a","content":"21C"},
    {"role":"tool","tool_call_id":"call_b","name":"get_weather","content":[{"type":"text","text":"25C"}]},
    {"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]}]})");
  ASSERT_EQ(r.messages.size(), 5u);
  const ChatMessage& a = r.messages[1];
  EXPECT_TRUE(a.content_null);
  EXPECT_EQ(a.content, "");
  ASSERT_EQ(a.tool_calls.size(), 2u);
  EXPECT_EQ(a.tool_calls[0].id, "call_a");
  EXPECT_EQ(a.tool_calls[0].name, "get_weather");
  EXPECT_EQ(a.tool_calls[0].arguments, R"({"city": "Paris"})");  // as sent
  EXPECT_EQ(a.tool_calls[1].arguments, R"({"city":"Rome"})");    // an object is taken too
  EXPECT_EQ(r.messages[2].role, "tool");
  EXPECT_EQ(r.messages[2].tool_call_id, "call_a");
  EXPECT_EQ(r.messages[2].content, "21C");
  EXPECT_EQ(r.messages[3].name, "get_weather");
  EXPECT_EQ(r.messages[3].content, "25C");
  EXPECT_TRUE(r.messages[4].content_null);  // content absent with tool_calls
  // Plain assistant null content is still "" (not null) for the templates.
  EXPECT_FALSE(chat(R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":null}]})").messages[1].content_null);
}

TEST(RequestParserTools, StructuredOutputFields) {
  OpenAiRequest r = chat(chat_body(R"(,"response_format":{"type":"json_object"})"));
  EXPECT_EQ(r.response_format.kind, ResponseFormatKind::JsonObject);
  r = chat(chat_body(
      R"(,"response_format":{"type":"json_schema","json_schema":{"name":"person","schema":{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"number"}}},"strict":true}})"));
  EXPECT_EQ(r.response_format.kind, ResponseFormatKind::JsonSchema);
  EXPECT_EQ(r.response_format.name, "person");
  EXPECT_TRUE(r.response_format.strict);
  EXPECT_EQ(r.response_format.schema.dump(), R"({"type":"object","properties":{"z":{"type":"string"},"a":{"type":"number"}}})");
  EXPECT_EQ(chat(chat_body(R"(,"response_format":{"type":"text"})")).response_format.kind, ResponseFormatKind::Text);
  r = chat(chat_body(R"(,"grammar":"root ::= \"a\"")"));
  EXPECT_EQ(r.grammar, "root ::= \"a\"");
  r = completion(R"({"prompt":"x","json_schema":{"type":"array","items":{"type":"integer"}}})");
  ASSERT_TRUE(r.json_schema.has_value());
  EXPECT_EQ(r.json_schema->dump(), R"({"type":"array","items":{"type":"integer"}})");
  EXPECT_EQ(completion(R"({"prompt":"x","response_format":{"type":"json_object"}})").response_format.kind,
            ResponseFormatKind::JsonObject);
  // truncate_prompt_tokens (vLLM): N >= 1 or -1.
  EXPECT_FALSE(completion(R"({"prompt":"x"})").truncate_prompt_tokens.has_value());
  EXPECT_EQ(completion(R"({"prompt":"x","truncate_prompt_tokens":7})").truncate_prompt_tokens, 7);
  EXPECT_EQ(chat(chat_body(R"(,"truncate_prompt_tokens":-1)")).truncate_prompt_tokens, -1);
}

INSTANTIATE_TEST_SUITE_P(
    ToolFields, RequestParserRejects,
    ::testing::Values(
        // tools
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":{}})", "tools", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":[5]})", "tools[0]", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"retrieval","function":{"name":"a"}}]})",
                "tools[0].type", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{}}]})",
                "tools[0].function.name", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"has space"}}]})",
                "tools[0].function.name", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}}]})",
                "tools[0].function.name", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"a"}}]})",
                "tools[1].function.name", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a","parameters":"{}"}}]})",
                "tools[0].function.parameters", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a","parameters":{"type":"object","properties":{"q":{"type":"strin"}}}}}]})",
                "tools[0].function.parameters.properties.q.type", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a","parameters":{"type":"object","required":"q"}}}]})",
                "tools[0].function.parameters.required", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a","strict":"yes"}}]})",
                "tools[0].function.strict", ApiKind::Chat},
        BadCase{R"({"prompt":"x","tools":[{"type":"function","function":{"name":"a"}}]})", "tools"},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"functions":[{"name":"a"}]})", "functions", ApiKind::Chat},
        // tool_choice
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", "tool_choice", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a"}}],"tool_choice":"always"})",
                "tool_choice", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a"}}],"tool_choice":5})",
                "tool_choice", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a"}}],"tool_choice":{"type":"function"}})",
                "tool_choice.function", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a"}}],"tool_choice":{"type":"function","function":{"name":"b"}}})",
                "tool_choice", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a"}}],"parallel_tool_calls":1})",
                "parallel_tool_calls", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a"}}],"tool_choice":"required","response_format":{"type":"json_object"}})",
                "tool_choice", ApiKind::Chat},
        // history
        BadCase{R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"a","arguments":"{oops"}}]}]})",
                "messages[1].tool_calls[0].function.arguments", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"a","arguments":"[1]"}}]}]})",
                "messages[1].tool_calls[0].function.arguments", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"a","arguments":"{}"}}]}]})",
                "messages[1].tool_calls[0].id", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"c","function":{"arguments":"{}"}}]}]})",
                "messages[1].tool_calls[0].function.name", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":{}}]})",
                "messages[1].tool_calls", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x","tool_calls":[]}]})", "messages[0].tool_calls", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"a","arguments":"{}"}}]},{"role":"tool","content":"r"}]})",
                "messages[2].tool_call_id", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"},{"role":"tool","tool_call_id":"c","content":"r"}]})",
                "messages[1].role", ApiKind::Chat},
        BadCase{R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"a","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c"}]})",
                "messages[2].content", ApiKind::Chat},
        // structured output
        BadCase{R"({"prompt":"x","response_format":{}})", "response_format.type"},
        BadCase{R"({"prompt":"x","response_format":{"type":"json_schema"}})", "response_format.json_schema"},
        BadCase{R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"a b","schema":{}}}})",
                "response_format.json_schema.name"},
        BadCase{R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"a","schema":[]}}})",
                "response_format.json_schema.schema"},
        BadCase{R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"anyOf":[]}}}})",
                "response_format.json_schema.schema.anyOf"},
        BadCase{R"({"prompt":"x","grammar":5})", "grammar"},
        BadCase{R"({"prompt":"x","json_schema":"{}"})", "json_schema"},
        BadCase{R"({"prompt":"x","json_schema":{"type":"object","properties":{"a":{"minLength":-1}}}})",
                "json_schema.properties.a.minLength"},
        BadCase{R"({"prompt":"x","grammar":"root ::= \"a\"","json_schema":{}})", "json_schema"},
        BadCase{R"({"prompt":"x","response_format":{"type":"json_object"},"grammar":"root ::= \"a\""})", "grammar"},
        BadCase{R"({"prompt":"x","truncate_prompt_tokens":0})", "truncate_prompt_tokens"},
        BadCase{R"({"prompt":"x","truncate_prompt_tokens":-2})", "truncate_prompt_tokens"},
        BadCase{R"({"prompt":"x","truncate_prompt_tokens":"5"})", "truncate_prompt_tokens"}),
    [](const ::testing::TestParamInfo<BadCase>& info) {
      std::string name = std::to_string(info.index) + "_";
      for (const char* c = info.param.param; *c; ++c) name += std::isalnum(static_cast<unsigned char>(*c)) ? *c : '_';
      return name;
    });

}  // namespace test_request_parser
