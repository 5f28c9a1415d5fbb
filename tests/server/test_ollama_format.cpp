// Ollama's API over tern's request machinery (server/ollama_format.h): the request parsers and
// every error they give, the tool-call ids given to an Ollama history, option precedence and
// types, format and keep_alive, that the OpenAI bodies they make are what parse_openai_json
// accepts, and the answers' shapes: the key sets and types of the official JS client's
// interfaces (ollama@0.6.3, src/interfaces.ts), written out here.
#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/ollama_format.h"
#include "server/openai_request.h"

namespace tern::server::ollama {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// The ApiError fn throws; a failure when it throws none.
template <class Fn>
ApiError error_of(Fn&& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError";
  return ApiError(0, "", "", "", "");
}

ApiError chat_error(const std::string& body) {
  return error_of([&] { parse_chat(body); });
}
ApiError generate_error(const std::string& body) {
  return error_of([&] { parse_generate(body); });
}
ApiError embed_error(const std::string& body, bool legacy = false) {
  return error_of([&] { parse_embed(body, legacy); });
}

template <class J>
std::set<std::string> keys(const J& obj) {
  std::set<std::string> out;
  for (const auto& [k, v] : obj.items()) out.insert(k);
  return out;
}

// A body with these options (JSON text), through apply_options with no model defaults.
ojson options_body(const std::string& options, const json& defaults = json::object(), const ojson& format = nullptr) {
  ojson body = ojson::object();
  apply_options(ojson::parse(options), defaults, format, body);
  return body;
}

ApiError option_error(const std::string& options, const json& defaults = json::object()) {
  return error_of([&] { options_body(options, defaults); });
}

ModelEntry sample_entry(const std::string& name = "qwen2-0.5b") {
  ModelEntry e;
  e.name = name;
  e.path = "/models/" + name + ".gguf";
  e.file_bytes = 397000000;
  e.modified_unix = 1714566896;  // 2024-05-01T12:34:56Z
  e.architecture = "qwen2";
  e.general_name = "Qwen2 0.5B";
  e.file_type = "Q4_0";
  e.context_length = 32768;
  e.n_params = 494000000;
  e.parameter_size = "494.0M";
  e.digest = std::string(64, 'a');
  return e;
}

// ----------------------------------------------------------------------------------- chat ---

TEST(OllamaParseChat, MinimalBodyAndDefaults) {
  const ChatRequest r = parse_chat(R"({"model":"m","messages":[{"role":"user","content":"hi"}]})");
  EXPECT_EQ(r.common.model, "m");
  EXPECT_TRUE(r.common.stream);
  EXPECT_FALSE(r.common.keep_alive_s.has_value());
  EXPECT_FALSE(r.load_only);
  EXPECT_FALSE(r.unload_only);
  EXPECT_FALSE(r.has_system);
  EXPECT_TRUE(r.tools.is_null());
  EXPECT_TRUE(r.format.is_null());
  EXPECT_TRUE(r.options.is_object());
  EXPECT_TRUE(r.options.empty());
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0], ojson({{"role", "user"}, {"content", "hi"}}));
}

TEST(OllamaParseChat, FieldsAreRead) {
  const ChatRequest r = parse_chat(R"({"model":"m","stream":false,"keep_alive":"10m","think":true,
      "messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi","images":[]}],
      "format":"json","options":{"temperature":0.2,"num_ctx":4096},
      "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]})");
  EXPECT_FALSE(r.common.stream);
  ASSERT_TRUE(r.common.keep_alive_s.has_value());
  EXPECT_DOUBLE_EQ(*r.common.keep_alive_s, 600.0);
  EXPECT_TRUE(r.has_system);
  EXPECT_EQ(r.format, "json");
  EXPECT_EQ(r.options["temperature"], 0.2);
  ASSERT_TRUE(r.tools.is_array());
  EXPECT_EQ(r.tools[0]["function"]["name"], "get_weather");
  // think as a string is accepted as well, and ignored.
  EXPECT_NO_THROW(parse_chat(R"({"model":"m","think":"high","messages":[{"role":"user","content":"x"}]})"));
  // Null fields count as absent.
  const ChatRequest n = parse_chat(R"({"model":"m","stream":null,"format":null,"options":null,"tools":null,
      "keep_alive":null,"messages":[{"role":"user","content":null}]})");
  EXPECT_TRUE(n.common.stream);
  EXPECT_EQ(n.messages[0]["content"], "");
}

TEST(OllamaParseChat, Errors) {
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"model":"m",)", ""},                                              // invalid JSON
      {R"([1,2])", ""},                                                      // not an object
      {R"({"messages":[]})", "model"},                                       // model missing
      {R"({"model":"","messages":[]})", "model"},                            // model empty
      {R"({"model":7})", "model"},                                           // model not a string
      {R"({"model":"m","stream":"yes"})", "stream"},
      {R"({"model":"m","messages":{}})", "messages"},
      {R"({"model":"m","messages":["hi"]})", "messages[0]"},
      {R"({"model":"m","messages":[{"content":"hi"}]})", "messages[0].role"},
      {R"({"model":"m","messages":[{"role":"robot","content":"hi"}]})", "messages[0].role"},
      {R"({"model":"m","messages":[{"role":"user","content":5}]})", "messages[0].content"},
      {R"({"model":"m","messages":[{"role":"user","content":"x","images":["aGk="]}]})", "messages[0].images"},
      {R"({"model":"m","messages":[{"role":"user","content":"x","images":"aGk="}]})", "messages[0].images"},
      {R"({"model":"m","messages":[{"role":"user","content":"x","tool_calls":[]}]})", "messages[0].tool_calls"},
      {R"({"model":"m","messages":[{"role":"assistant","tool_calls":{}}]})", "messages[0].tool_calls"},
      {R"({"model":"m","messages":[{"role":"assistant","tool_calls":[{}]}]})", "messages[0].tool_calls[0].function"},
      {R"({"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":{}}}]}]})",
       "messages[0].tool_calls[0].function.name"},
      {R"({"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":3}}]}]})",
       "messages[0].tool_calls[0].function.arguments"},
      // Arguments as a string must be the JSON text of an object (the OpenAI parser's check).
      {R"({"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}]})",
       "messages[0].tool_calls[0].function.arguments"},
      // A tool message with no call to answer.
      {R"({"model":"m","messages":[{"role":"user","content":"x"},{"role":"tool","content":"42"}]})", "messages[1].role"},
      {R"({"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f"}}]},
          {"role":"user","content":"x"},{"role":"tool","content":"42"}]})", "messages[2].role"},
      {R"({"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f"}}]},
          {"role":"tool","content":"42","tool_name":5}]})", "messages[1].tool_name"},
      {R"({"model":"m","tools":{}})", "tools"},
      {R"({"model":"m","tools":[{"type":"function","function":{"description":"no name"}}]})", "tools[0].function.name"},
      {R"({"model":"m","format":"yaml"})", "format"},
      {R"({"model":"m","format":["json"]})", "format"},
      {R"({"model":"m","format":{"type":"nonsense"}})", "response_format.json_schema.schema.type"},
      {R"({"model":"m","options":[]})", "options"},
      {R"({"model":"m","options":{"temperature":"hot"}})", "options.temperature"},
      {R"({"model":"m","think":3})", "think"},
      {R"({"model":"m","keep_alive":"5 minutes"})", "keep_alive"},
      {R"({"model":"m","keep_alive":true})", "keep_alive"},
  };
  for (const Case& c : cases) {
    const ApiError e = chat_error(c.body);
    EXPECT_EQ(e.status(), 400) << c.body;
    EXPECT_EQ(e.param(), c.param) << c.body << " -> " << e.what();
  }
}

TEST(OllamaParseChat, MessagesStateTheProblem) {
  EXPECT_STREQ(chat_error(R"({"messages":[]})").what(), "model is required");
  EXPECT_STREQ(chat_error(R"({"model":"m","messages":[{"role":"user","content":"x","images":["aGk="]}]})").what(),
               "images are not supported: this server runs text models");
  EXPECT_STREQ(chat_error(R"({"model":"m","options":{"temperature":"hot"}})").what(),
               "invalid option \"temperature\": must be a number");
  EXPECT_NE(std::string(chat_error(R"({"model":"m","keep_alive":"5x"})").what()).find("unknown unit \"x\""),
            std::string::npos);
}

TEST(OllamaParseChat, DepthLimit) {
  std::string deep = R"({"model":"m","options":{"x":)";
  for (int i = 0; i < 80; ++i) deep += "[";
  for (int i = 0; i < 80; ++i) deep += "]";
  deep += "}}";
  EXPECT_EQ(chat_error(deep).status(), 400);
  EXPECT_NO_THROW(parse_chat(deep, 100));  // an unknown option is ignored, however deep
}

TEST(OllamaParseChat, LoadAndUnload) {
  const ChatRequest absent = parse_chat(R"({"model":"m"})");
  EXPECT_TRUE(absent.load_only);
  EXPECT_FALSE(absent.unload_only);
  const ChatRequest empty = parse_chat(R"({"model":"m","messages":[]})");
  EXPECT_TRUE(empty.load_only);
  EXPECT_FALSE(empty.unload_only);
  const ChatRequest unload = parse_chat(R"({"model":"m","messages":[],"keep_alive":0})");
  EXPECT_TRUE(unload.load_only);
  EXPECT_TRUE(unload.unload_only);
  EXPECT_TRUE(parse_chat(R"({"model":"m","keep_alive":"0s"})").unload_only);
  EXPECT_FALSE(parse_chat(R"({"model":"m","keep_alive":"5m"})").unload_only);
  EXPECT_FALSE(parse_chat(R"({"model":"m","keep_alive":-1})").unload_only);
  // keep_alive 0 with messages: answer, then unload (not unload_only).
  const ChatRequest answer = parse_chat(R"({"model":"m","keep_alive":0,"messages":[{"role":"user","content":"x"}]})");
  EXPECT_FALSE(answer.load_only);
  EXPECT_FALSE(answer.unload_only);
  EXPECT_EQ(*answer.common.keep_alive_s, 0.0);
}

TEST(OllamaKeepAlive, DurationsAndNumbers) {
  struct Case {
    const char* value;  // JSON
    double seconds;
  };
  const Case cases[] = {
      {R"("5m")", 300},     {R"("1h30m")", 5400}, {R"("10s")", 10},    {R"("300ms")", 0.3},  {R"("-1")", -1},
      {R"("0")", 0},        {R"("-1m")", -1},     {R"("1.5h")", 5400}, {R"("2h45m")", 9900}, {R"("+2s")", 2},
      {R"("1500us")", 0.0015}, {"\"2\xC2\xB5s\"", 2e-6}, {R"("100ns")", 1e-7}, {R"(".5s")", 0.5}, {R"("30")", 30},
      {"600", 600},         {"0", 0},             {"-5", -1},          {"2.5", 2.5},         {R"("-10h")", -1},
  };
  for (const Case& c : cases) {
    const std::string body = std::string(R"({"model":"m","keep_alive":)") + c.value + "}";
    const ChatRequest r = parse_chat(body);
    ASSERT_TRUE(r.common.keep_alive_s.has_value()) << c.value;
    EXPECT_NEAR(*r.common.keep_alive_s, c.seconds, 1e-12) << c.value;
  }
  for (const char* bad : {R"("")", R"("5x")", R"("m")", R"("1h 30m")", R"("--1")", R"("5m3")",
                          R"("abc")", "[]", "{}", "true"}) {
    const std::string body = std::string(R"({"model":"m","keep_alive":)") + bad + "}";
    try {
      parse_chat(body);
      ADD_FAILURE() << "accepted keep_alive " << bad;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.param(), "keep_alive") << bad;
    }
  }
}

// --------------------------------------------------------------------------- tool call ids ---

TEST(OllamaToolCalls, IdsGivenAndMatchedByName) {
  // Two calls, answered in the other order by tool_name; a third call in a later turn.
  const ChatRequest r = parse_chat(R"({"model":"m","messages":[
      {"role":"user","content":"weather and time?"},
      {"role":"assistant","content":"","tool_calls":[
         {"function":{"name":"get_weather","arguments":{"city":"Paris"}}},
         {"function":{"name":"get_time","arguments":{"tz":"CET"}}}]},
      {"role":"tool","content":"12:00","tool_name":"get_time"},
      {"role":"tool","content":"sunny","tool_name":"get_weather"},
      {"role":"assistant","content":"Sunny, noon.","tool_calls":[{"function":{"name":"get_time","arguments":{}}}]},
      {"role":"tool","content":"12:01"}]})");
  const ojson& m = r.messages;
  ASSERT_EQ(m.size(), 6u);
  const ojson& calls = m[1]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["id"], "call_0");
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(calls[0]["function"]["arguments"], R"({"city":"Paris"})");  // JSON text, OpenAI's form
  EXPECT_EQ(calls[1]["id"], "call_1");
  EXPECT_TRUE(m[1]["content"].is_null());  // only calls: OpenAI's null content
  EXPECT_EQ(m[2]["tool_call_id"], "call_1");
  EXPECT_EQ(m[2]["name"], "get_time");
  EXPECT_EQ(m[3]["tool_call_id"], "call_0");
  EXPECT_EQ(m[3]["name"], "get_weather");
  EXPECT_EQ(m[4]["content"], "Sunny, noon.");
  EXPECT_EQ(m[4]["tool_calls"][0]["id"], "call_2");
  EXPECT_EQ(m[4]["tool_calls"][0]["function"]["arguments"], "{}");
  EXPECT_EQ(m[5]["tool_call_id"], "call_2");
  EXPECT_EQ(m[5]["name"], "get_time");  // from the call when the message names none
}

TEST(OllamaToolCalls, InOrderWithoutNamesAndExtraAnswers) {
  const ChatRequest r = parse_chat(R"({"model":"m","messages":[
      {"role":"assistant","tool_calls":[{"function":{"name":"a"}},{"function":{"name":"b","arguments":"{\"x\":1}"}}]},
      {"role":"tool","content":"1"},
      {"role":"tool","content":"2"},
      {"role":"tool","content":"3"},
      {"role":"tool","content":"4","tool_name":"a"},
      {"role":"tool","content":"5","tool_name":"zzz"}]})");
  const ojson& m = r.messages;
  EXPECT_EQ(m[0]["tool_calls"][1]["function"]["arguments"], R"({"x":1})");  // a string is kept
  EXPECT_EQ(m[1]["tool_call_id"], "call_0");
  EXPECT_EQ(m[2]["tool_call_id"], "call_1");
  // More answers than calls: the last call (of that name when there is one).
  EXPECT_EQ(m[3]["tool_call_id"], "call_1");
  EXPECT_EQ(m[4]["tool_call_id"], "call_0");
  EXPECT_EQ(m[5]["tool_call_id"], "call_1");
  EXPECT_EQ(m[5]["name"], "zzz");
  // A name with no unanswered call of that name takes the earliest unanswered one.
  const ChatRequest s = parse_chat(R"({"model":"m","messages":[
      {"role":"assistant","tool_calls":[{"function":{"name":"a"}},{"function":{"name":"b"}}]},
      {"role":"tool","content":"1","tool_name":"b"},
      {"role":"tool","content":"2","tool_name":"b"}]})");
  EXPECT_EQ(s.messages[1]["tool_call_id"], "call_1");
  EXPECT_EQ(s.messages[2]["tool_call_id"], "call_0");
}

TEST(OllamaToolCalls, GivenIdsAreKept) {
  const ChatRequest r = parse_chat(R"({"model":"m","messages":[
      {"role":"assistant","content":"checking","tool_calls":[{"id":"abc","function":{"name":"a","arguments":{}}},
                                                             {"function":{"name":"b","arguments":{}}}]},
      {"role":"tool","content":"1","tool_call_id":"abc"},
      {"role":"tool","content":"2"}]})");
  EXPECT_EQ(r.messages[0]["content"], "checking");
  EXPECT_EQ(r.messages[0]["tool_calls"][0]["id"], "abc");
  EXPECT_EQ(r.messages[0]["tool_calls"][1]["id"], "call_0");
  EXPECT_EQ(r.messages[1]["tool_call_id"], "abc");
  EXPECT_EQ(r.messages[1]["name"], "a");
  EXPECT_EQ(r.messages[2]["tool_call_id"], "call_0");  // "abc" was answered by id
}

TEST(OllamaToolCalls, HistoryParsesAsOpenAi) {
  const ChatRequest r = parse_chat(R"({"model":"m","messages":[
      {"role":"user","content":"weather?"},
      {"role":"assistant","content":"","thinking":"let me call","tool_calls":[
         {"function":{"index":0,"name":"get_weather","arguments":{"city":"Paris"}}}]},
      {"role":"tool","content":"sunny","tool_name":"get_weather"}]})");
  const OpenAiRequest o = parse_openai_json(chat_to_openai(r, json::object(), ""), ApiKind::Chat);
  ASSERT_EQ(o.messages.size(), 3u);
  ASSERT_EQ(o.messages[1].tool_calls.size(), 1u);
  EXPECT_TRUE(o.messages[1].content_null);
  EXPECT_EQ(o.messages[1].tool_calls[0].id, "call_0");
  EXPECT_EQ(o.messages[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(o.messages[1].tool_calls[0].arguments), json({{"city", "Paris"}}));
  EXPECT_EQ(o.messages[2].role, "tool");
  EXPECT_EQ(o.messages[2].tool_call_id, "call_0");
  EXPECT_EQ(o.messages[2].name, "get_weather");
  EXPECT_EQ(o.messages[2].content, "sunny");
}

// ------------------------------------------------------------------------------- generate ---

TEST(OllamaParseGenerate, FieldsAndDefaults) {
  const GenerateRequest r = parse_generate(R"({"model":"m","prompt":"Why is the sky blue?"})");
  EXPECT_EQ(r.common.model, "m");
  EXPECT_TRUE(r.common.stream);
  EXPECT_EQ(r.prompt, "Why is the sky blue?");
  EXPECT_EQ(r.system, "");
  EXPECT_FALSE(r.raw);
  EXPECT_TRUE(r.context.empty());
  EXPECT_FALSE(r.load_only);

  const GenerateRequest f = parse_generate(R"({"model":"m","prompt":"go on","system":"be terse","raw":true,
      "context":[1,2,3.0],"stream":false,"keep_alive":"1h","format":{"type":"object"},"options":{"num_predict":5},
      "suffix":"","template":"","images":null,"think":false})");
  EXPECT_EQ(f.system, "be terse");
  EXPECT_TRUE(f.raw);
  EXPECT_EQ(f.context, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_FALSE(f.common.stream);
  EXPECT_DOUBLE_EQ(*f.common.keep_alive_s, 3600);
  EXPECT_EQ(f.format, ojson({{"type", "object"}}));
  EXPECT_EQ(f.options["num_predict"], 5);
}

TEST(OllamaParseGenerate, LoadAndUnload) {
  EXPECT_TRUE(parse_generate(R"({"model":"m"})").load_only);
  EXPECT_TRUE(parse_generate(R"({"model":"m","prompt":""})").load_only);
  EXPECT_FALSE(parse_generate(R"({"model":"m","prompt":"","context":[5]})").load_only);
  const GenerateRequest u = parse_generate(R"({"model":"m","keep_alive":0})");
  EXPECT_TRUE(u.load_only);
  EXPECT_TRUE(u.unload_only);
  EXPECT_FALSE(parse_generate(R"({"model":"m","prompt":"x","keep_alive":0})").unload_only);
}

TEST(OllamaParseGenerate, Errors) {
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"prompt":"x"})", "model"},
      {R"({"model":"m","prompt":5})", "prompt"},
      {R"({"model":"m","prompt":"x","suffix":"end"})", "suffix"},
      {R"({"model":"m","prompt":"x","suffix":3})", "suffix"},
      {R"({"model":"m","prompt":"x","template":"{{ .Prompt }}"})", "template"},
      {R"({"model":"m","prompt":"x","system":1})", "system"},
      {R"({"model":"m","prompt":"x","raw":"yes"})", "raw"},
      {R"({"model":"m","prompt":"x","images":["aGk="]})", "images"},
      {R"({"model":"m","prompt":"x","context":"1,2"})", "context"},
      {R"({"model":"m","prompt":"x","context":[1,-2]})", "context"},
      {R"({"model":"m","prompt":"x","context":[1.5]})", "context"},
      {R"({"model":"m","prompt":"x","context":[4294967296]})", "context"},
      {R"({"model":"m","prompt":"x","format":"xml"})", "format"},
      {R"({"model":"m","prompt":"x","format":{"type":"bogus"}})", "response_format.json_schema.schema.type"},
      {R"({"model":"m","prompt":"x","options":{"top_k":"many"}})", "options.top_k"},
      {R"({"model":"m","prompt":"x","keep_alive":"forever"})", "keep_alive"},
      {R"({"model":"m","prompt":"x","stream":1})", "stream"},
  };
  for (const Case& c : cases) {
    const ApiError e = generate_error(c.body);
    EXPECT_EQ(e.status(), 400) << c.body;
    EXPECT_EQ(e.param(), c.param) << c.body << " -> " << e.what();
  }
  EXPECT_STREQ(generate_error(R"({"model":"m","template":"x"})").what(),
               "template is not supported: tern renders the model's chat template");
  EXPECT_EQ(std::string(generate_error(R"({"model":"m","suffix":"x"})").what()).rfind("suffix is not supported", 0), 0u);
}

// ---------------------------------------------------------------------------------- embed ---

TEST(OllamaParseEmbed, InputForms) {
  const EmbedRequest one = parse_embed(R"({"model":"e","input":"hello"})", false);
  EXPECT_EQ(one.common.model, "e");
  EXPECT_EQ(one.inputs, (std::vector<std::string>{"hello"}));
  EXPECT_TRUE(one.truncate);
  EXPECT_FALSE(one.dimensions.has_value());
  EXPECT_FALSE(one.legacy);

  const EmbedRequest many = parse_embed(
      R"({"model":"e","input":["a","b"],"truncate":false,"dimensions":64,"keep_alive":"5m","options":{"num_ctx":8}})",
      false);
  EXPECT_EQ(many.inputs, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(many.truncate);
  EXPECT_EQ(many.dimensions, 64);
  EXPECT_DOUBLE_EQ(*many.common.keep_alive_s, 300);

  const EmbedRequest legacy = parse_embed(R"({"model":"e","prompt":"old form"})", true);
  EXPECT_TRUE(legacy.legacy);
  EXPECT_EQ(legacy.inputs, (std::vector<std::string>{"old form"}));
}

TEST(OllamaParseEmbed, Errors) {
  struct Case {
    const char* body;
    bool legacy;
    const char* param;
  };
  const Case cases[] = {
      {R"({"input":"x"})", false, "model"},
      {R"({"model":"e"})", false, "input"},
      {R"({"model":"e","input":[]})", false, "input"},
      {R"({"model":"e","input":""})", false, "input"},
      {R"({"model":"e","input":["a",""]})", false, "input[1]"},
      {R"({"model":"e","input":["a",3]})", false, "input[1]"},
      {R"({"model":"e","input":5})", false, "input"},
      {R"({"model":"e","input":"x","truncate":"no"})", false, "truncate"},
      {R"({"model":"e","input":"x","dimensions":0})", false, "dimensions"},
      {R"({"model":"e","input":"x","dimensions":-3})", false, "dimensions"},
      {R"({"model":"e","input":"x","dimensions":"64"})", false, "dimensions"},
      {R"({"model":"e","input":"x","options":"fast"})", false, "options"},
      {R"({"model":"e","input":"x","keep_alive":"1y"})", false, "keep_alive"},
      {R"({"model":"e"})", true, "prompt"},
      {R"({"model":"e","prompt":""})", true, "prompt"},
      {R"({"model":"e","prompt":["a"]})", true, "prompt"},
      {R"({"model":"e","input":"x"})", true, "prompt"},  // the old form reads prompt only
  };
  for (const Case& c : cases) {
    const ApiError e = embed_error(c.body, c.legacy);
    EXPECT_EQ(e.status(), 400) << c.body;
    EXPECT_EQ(e.param(), c.param) << c.body << " -> " << e.what();
  }
}

TEST(OllamaParseModelName, ModelOrName) {
  EXPECT_EQ(parse_model_name(R"({"model":"llama"})"), "llama");
  EXPECT_EQ(parse_model_name(R"({"name":"older"})"), "older");
  EXPECT_EQ(parse_model_name(R"({"model":"a","name":"b"})"), "a");
  EXPECT_EQ(error_of([] { parse_model_name("{}"); }).param(), "model");
  EXPECT_EQ(error_of([] { parse_model_name(R"({"model":""})"); }).param(), "model");
  EXPECT_EQ(error_of([] { parse_model_name(R"({"model":1})"); }).param(), "model");
  EXPECT_EQ(error_of([] { parse_model_name(R"({"name":[]})"); }).param(), "name");
  EXPECT_EQ(error_of([] { parse_model_name("not json"); }).status(), 400);
}

// -------------------------------------------------------------------------------- options ---

TEST(OllamaOptions, OllamaDefaultsWhenNothingIsSet) {
  const ojson body = options_body("{}");
  EXPECT_EQ(keys(body), (std::set<std::string>{"temperature", "top_k", "top_p"}));
  EXPECT_EQ(body["temperature"], 0.8);
  EXPECT_EQ(body["top_k"], 40);
  EXPECT_EQ(body["top_p"], 0.9);
}

TEST(OllamaOptions, RequestWinsOverModelDefaultsWinOverOllamas) {
  const json defaults = {{"temperature", 0.5}, {"top_k", 20}, {"seed", 7}, {"num_predict", 64}};
  const ojson body = options_body(R"({"temperature":0.1,"num_predict":null})", defaults);
  EXPECT_EQ(body["temperature"], 0.1);  // request
  EXPECT_EQ(body["top_k"], 20);         // model default
  EXPECT_EQ(body["seed"], 7);           // model default
  EXPECT_EQ(body["max_tokens"], 64);    // a null in the request leaves the default
  EXPECT_EQ(body["top_p"], 0.9);        // Ollama's
}

TEST(OllamaOptions, Mapping) {
  const ojson body = options_body(R"({"temperature":0,"top_p":0.5,"top_k":-1,"min_p":0.05,"seed":42,
      "num_predict":128,"stop":["\n\n","User:"],"repeat_penalty":1.1,"presence_penalty":0.5,"frequency_penalty":-0.5,
      "num_ctx":4096,"num_thread":2,"mirostat":0,"typical_p":1.0,"use_mmap":true,"penalize_newline":false,
      "some_future_option":"whatever"})");
  EXPECT_EQ(keys(body), (std::set<std::string>{"temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "stop",
                                               "repetition_penalty", "presence_penalty", "frequency_penalty"}));
  EXPECT_EQ(body["temperature"], 0);
  EXPECT_EQ(body["top_p"], 0.5);
  EXPECT_EQ(body["top_k"], 0);  // Ollama's "off" as OpenAI's
  EXPECT_EQ(body["min_p"], 0.05);
  EXPECT_EQ(body["seed"], 42);
  EXPECT_EQ(body["max_tokens"], 128);
  EXPECT_EQ(body["stop"], ojson::array({"\n\n", "User:"}));
  EXPECT_EQ(body["repetition_penalty"], 1.1);
  EXPECT_EQ(body["presence_penalty"], 0.5);
  EXPECT_EQ(body["frequency_penalty"], -0.5);

  EXPECT_EQ(options_body(R"({"stop":"END"})")["stop"], ojson::array({"END"}));
  EXPECT_EQ(options_body(R"({"top_k":40.0})")["top_k"], 40);
  // num_predict: positive -> max_tokens; 0, -1 (unlimited), -2 (fill the context) -> none.
  for (const char* none : {R"({"num_predict":0})", R"({"num_predict":-1})", R"({"num_predict":-2})"})
    EXPECT_FALSE(options_body(none).contains("max_tokens")) << none;
  // seed -1 is Ollama's "random": no seed.
  EXPECT_FALSE(options_body(R"({"seed":-1})").contains("seed"));
  EXPECT_EQ(options_body(R"({"seed":0})")["seed"], 0);
}

TEST(OllamaOptions, WrongTypesAndRanges) {
  struct Case {
    const char* options;
    const char* message;
  };
  const Case cases[] = {
      {R"({"temperature":"hot"})", "invalid option \"temperature\": must be a number"},
      {R"({"top_p":true})", "invalid option \"top_p\": must be a number"},
      {R"({"top_k":4.5})", "invalid option \"top_k\": must be an integer"},
      {R"({"seed":"42"})", "invalid option \"seed\": must be an integer"},
      {R"({"num_predict":[1]})", "invalid option \"num_predict\": must be an integer"},
      {R"({"stop":5})", "invalid option \"stop\": must be a string or an array of strings"},
      {R"({"stop":["a",1]})", "invalid option \"stop\": must be a string or an array of strings"},
      {R"({"repeat_penalty":"1.1"})", "invalid option \"repeat_penalty\": must be a number"},
      {R"({"num_ctx":"big"})", "invalid option \"num_ctx\": must be an integer"},
      {R"({"mirostat_tau":null,"tfs_z":"x"})", "invalid option \"tfs_z\": must be a number"},
      {R"({"use_mmap":1})", "invalid option \"use_mmap\": must be a boolean"},
      {R"({"temperature":3})", "invalid option \"temperature\": must be in [0.0, 2.0], got 3"},
      {R"({"top_p":1.5})", "invalid option \"top_p\": must be in [0.0, 1.0], got 1.5"},
      {R"({"repeat_penalty":0})", "invalid option \"repeat_penalty\": must be in [0.001, 100.0], got 0"},
      {R"({"num_predict":9999999999})", "invalid option \"num_predict\": must be at most 2147483648.0, got 9999999999"},
  };
  for (const Case& c : cases) {
    const ApiError e = option_error(c.options);
    EXPECT_EQ(e.status(), 400) << c.options;
    EXPECT_STREQ(e.what(), c.message) << c.options;
  }
  EXPECT_EQ(option_error(R"({"temperature":"hot"})").param(), "options.temperature");
  // A model default of the wrong type is refused the same way.
  EXPECT_STREQ(option_error("{}", json{{"top_k", "x"}}).what(), "invalid option \"top_k\": must be an integer");
}

// tern's own option: options.speculative (a boolean) becomes the OpenAI body's "speculative",
// which RequestParams::speculative takes; another type is a 400 naming options.speculative,
// from the parsers too (they check the options before the server runs anything).
TEST(OllamaOptions, SpeculativeOptOut) {
  EXPECT_FALSE(options_body("{}").contains("speculative"));
  EXPECT_EQ(options_body(R"({"speculative":false})")["speculative"], false);
  EXPECT_EQ(options_body(R"({"speculative":true})")["speculative"], true);
  EXPECT_EQ(options_body("{}", json{{"speculative", false}})["speculative"], false);  // a models.json default
  const ApiError e = option_error(R"({"speculative":"no"})");
  EXPECT_EQ(e.status(), 400);
  EXPECT_EQ(e.param(), "options.speculative");
  EXPECT_STREQ(e.what(), "invalid option \"speculative\": must be a boolean");

  const ChatRequest chat = parse_chat(R"({"model":"m","messages":[{"role":"user","content":"hi"}],
      "options":{"speculative":false}})");
  EXPECT_FALSE(parse_openai_json(chat_to_openai(chat, json::object(), ""), ApiKind::Chat).speculative);
  const GenerateRequest gen = parse_generate(R"({"model":"m","prompt":"hi","options":{"speculative":false}})");
  EXPECT_FALSE(parse_openai_json(generate_to_openai(gen, {1, 2}, json::object()), ApiKind::Completion).speculative);
  EXPECT_TRUE(parse_openai_json(generate_to_openai(parse_generate(R"({"model":"m","prompt":"hi"})"), {1, 2},
                                                   json::object()),
                                ApiKind::Completion)
                  .speculative);
  EXPECT_EQ(chat_error(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"options":{"speculative":"no"}})")
                .param(),
            "options.speculative");
  EXPECT_EQ(generate_error(R"({"model":"m","prompt":"hi","options":{"speculative":1}})").param(),
            "options.speculative");
}

TEST(OllamaFormat, Mapping) {
  EXPECT_FALSE(options_body("{}", json::object(), nullptr).contains("response_format"));
  EXPECT_FALSE(options_body("{}", json::object(), "").contains("response_format"));
  EXPECT_EQ(options_body("{}", json::object(), "json")["response_format"], ojson({{"type", "json_object"}}));
  const ojson schema = ojson::parse(R"({"type":"object","properties":{"age":{"type":"integer"}},"required":["age"]})");
  EXPECT_EQ(options_body("{}", json::object(), schema)["response_format"],
            ojson({{"type", "json_schema"}, {"json_schema", {{"name", "format"}, {"schema", schema}}}}));
  for (const ojson& bad : {ojson("yaml"), ojson(3), ojson::array({"json"}), ojson(true)}) {
    const ApiError e = error_of([&] { options_body("{}", json::object(), bad); });
    EXPECT_EQ(e.status(), 400) << bad.dump();
    EXPECT_EQ(e.param(), "format") << bad.dump();
  }
}

// ------------------------------------------------------------------- bodies for the parser ---

TEST(OllamaChatToOpenAi, AcceptedByTheOpenAiParser) {
  const ChatRequest r = parse_chat(R"({"model":"m","stream":true,"keep_alive":"5m","messages":[
      {"role":"user","content":"Give me JSON"}],
      "tools":[{"type":"function","function":{"name":"get_weather","description":"d",
                "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
      "format":"json","options":{"temperature":0.3,"num_predict":50,"stop":["###"],"seed":9,"repeat_penalty":1.2}})");
  const ojson body = chat_to_openai(r, json{{"top_k", 12}, {"temperature", 1.5}}, "");
  EXPECT_EQ(keys(body), (std::set<std::string>{"messages", "tools", "temperature", "top_k", "top_p", "max_tokens",
                                               "stop", "seed", "repetition_penalty", "response_format"}));
  EXPECT_FALSE(body.contains("stream"));  // the server's concern
  EXPECT_FALSE(body.contains("model"));
  const OpenAiRequest o = parse_openai_json(body, ApiKind::Chat);
  ASSERT_EQ(o.messages.size(), 1u);
  EXPECT_EQ(o.messages[0].role, "user");
  EXPECT_EQ(o.messages[0].content, "Give me JSON");
  EXPECT_FLOAT_EQ(o.sampling.temperature, 0.3f);
  EXPECT_EQ(o.sampling.top_k, 12);
  EXPECT_FLOAT_EQ(o.sampling.top_p, 0.9f);
  EXPECT_FLOAT_EQ(o.sampling.repeat_penalty, 1.2f);
  EXPECT_EQ(o.max_tokens, 50);
  EXPECT_EQ(o.stop, (std::vector<std::string>{"###"}));
  EXPECT_EQ(o.seed, 9u);
  EXPECT_EQ(o.response_format.kind, ResponseFormatKind::JsonObject);
  ASSERT_EQ(o.tools.size(), 1u);
  EXPECT_EQ(o.tools[0].name, "get_weather");
  EXPECT_EQ(o.tool_choice.mode, ToolChoiceMode::Auto);
  EXPECT_FALSE(o.stream);
}

TEST(OllamaChatToOpenAi, DefaultSystemPrompt) {
  const ChatRequest plain = parse_chat(R"({"model":"m","messages":[{"role":"user","content":"hi"}]})");
  const OpenAiRequest with = parse_openai_json(chat_to_openai(plain, json::object(), "You are terse."), ApiKind::Chat);
  ASSERT_EQ(with.messages.size(), 2u);
  EXPECT_EQ(with.messages[0].role, "system");
  EXPECT_EQ(with.messages[0].content, "You are terse.");
  EXPECT_EQ(with.messages[1].content, "hi");
  // No default, or a system message of the request's own: nothing added.
  EXPECT_EQ(chat_to_openai(plain, json::object(), "")["messages"].size(), 1u);
  const ChatRequest own = parse_chat(
      R"({"model":"m","messages":[{"role":"user","content":"hi"},{"role":"system","content":"mine"}]})");
  const ojson body = chat_to_openai(own, json::object(), "You are terse.");
  ASSERT_EQ(body["messages"].size(), 2u);
  EXPECT_EQ(body["messages"][1]["content"], "mine");
}

TEST(OllamaChatToOpenAi, SchemaFormat) {
  const ChatRequest r = parse_chat(R"({"model":"m","messages":[{"role":"user","content":"age?"}],
      "format":{"type":"object","properties":{"age":{"type":"integer"}},"required":["age"]}})");
  const OpenAiRequest o = parse_openai_json(chat_to_openai(r, json::object(), ""), ApiKind::Chat);
  EXPECT_EQ(o.response_format.kind, ResponseFormatKind::JsonSchema);
  EXPECT_EQ(o.response_format.name, "format");
  EXPECT_EQ(o.response_format.schema["properties"]["age"]["type"], "integer");
  EXPECT_FALSE(o.max_tokens.has_value());  // no num_predict: until the context is full
}

TEST(OllamaGenerateToOpenAi, TokenPromptAcceptedAsCompletion) {
  const GenerateRequest r =
      parse_generate(R"({"model":"m","prompt":"hi","options":{"num_predict":7,"top_p":0.5},"format":"json"})");
  const ojson body = generate_to_openai(r, {1, 15043, 29871}, json{{"temperature", 0.0}});
  EXPECT_EQ(keys(body), (std::set<std::string>{"prompt", "temperature", "top_k", "top_p", "max_tokens",
                                               "response_format"}));
  EXPECT_EQ(body["prompt"], ojson::array({1, 15043, 29871}));
  const OpenAiRequest o = parse_openai_json(body, ApiKind::Completion);
  ASSERT_EQ(o.prompts.size(), 1u);
  EXPECT_TRUE(o.prompts[0].is_tokens);
  EXPECT_EQ(o.prompts[0].tokens, (std::vector<int64_t>{1, 15043, 29871}));
  EXPECT_EQ(o.max_tokens, 7);
  EXPECT_FLOAT_EQ(o.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(o.sampling.top_p, 0.5f);
  EXPECT_EQ(o.sampling.top_k, 40);
  EXPECT_EQ(o.response_format.kind, ResponseFormatKind::JsonObject);
  EXPECT_FALSE(o.echo);
  // Without num_predict no max_tokens: the server must not apply the completions default (16).
  const GenerateRequest unbounded = parse_generate(R"({"model":"m","prompt":"hi"})");
  EXPECT_FALSE(parse_openai_json(generate_to_openai(unbounded, {1}, json::object()), ApiKind::Completion)
                   .max_tokens.has_value());
}

// ------------------------------------------------------------------------------- answers ---

// The JS client's ChatResponse / GenerateResponse final fields.
const std::set<std::string> kDurationKeys = {"total_duration", "load_duration", "prompt_eval_count",
                                             "prompt_eval_duration", "eval_count", "eval_duration"};

std::set<std::string> with(std::set<std::string> a, const std::set<std::string>& b) {
  a.insert(b.begin(), b.end());
  return a;
}

TEST(OllamaRfc3339, AsGoPrintsUtc) {
  using namespace std::chrono;
  const system_clock::time_point base{seconds(1714566896)};
  EXPECT_EQ(rfc3339(base), "2024-05-01T12:34:56Z");
  EXPECT_EQ(rfc3339(base + nanoseconds(123456789)), "2024-05-01T12:34:56.123456789Z");
  EXPECT_EQ(rfc3339(base + milliseconds(500)), "2024-05-01T12:34:56.5Z");  // trailing zeros dropped
  EXPECT_EQ(rfc3339(base + nanoseconds(1000)), "2024-05-01T12:34:56.000001Z");
  EXPECT_EQ(rfc3339(system_clock::time_point{}), "1970-01-01T00:00:00Z");
  EXPECT_EQ(rfc3339(system_clock::time_point{seconds(951782400)}), "2000-02-29T00:00:00Z");
  EXPECT_EQ(rfc3339(system_clock::time_point{seconds(-1)}), "1969-12-31T23:59:59Z");
}

TEST(OllamaResponses, ChatChunkAndFinal) {
  const json chunk = chat_chunk("m", "2024-05-01T12:34:56Z", "Hel", {}, Durations{90, 1, 12, 30, 3, 40});
  // Every field the ollama client's ChatResponse declares, the running figures included.
  EXPECT_EQ(keys(chunk), with({"model", "created_at", "message", "done", "done_reason"}, kDurationKeys));
  EXPECT_EQ(chunk["done"], false);
  EXPECT_EQ(chunk["done_reason"], "");
  EXPECT_EQ(chunk["total_duration"], 90);
  EXPECT_EQ(chunk["prompt_eval_count"], 12);
  EXPECT_EQ(chunk["eval_count"], 3);
  EXPECT_EQ(chunk["eval_duration"], 40);
  EXPECT_EQ(chunk["model"], "m");
  EXPECT_EQ(chunk["created_at"], "2024-05-01T12:34:56Z");
  EXPECT_EQ(keys(chunk["message"]), (std::set<std::string>{"role", "content"}));
  EXPECT_EQ(chunk["message"]["role"], "assistant");
  EXPECT_EQ(chunk["message"]["content"], "Hel");

  const Durations d{1000000000, 20000000, 12, 30000000, 5, 400000000};
  const std::vector<ToolCall> calls = {{"call_x", "get_weather", R"({"city":"Paris"})"}, {"call_y", "broken", "{oops"}};
  const json last = chat_final("m", "2024-05-01T12:34:57Z", "", calls, "stop", d);
  EXPECT_EQ(keys(last), with({"model", "created_at", "message", "done", "done_reason"}, kDurationKeys));
  EXPECT_EQ(last["done"], true);
  EXPECT_EQ(last["done_reason"], "stop");
  for (const std::string& k : kDurationKeys) EXPECT_TRUE(last[k].is_number_integer()) << k;
  EXPECT_EQ(last["total_duration"], 1000000000);
  EXPECT_EQ(last["load_duration"], 20000000);
  EXPECT_EQ(last["prompt_eval_count"], 12);
  EXPECT_EQ(last["prompt_eval_duration"], 30000000);
  EXPECT_EQ(last["eval_count"], 5);
  EXPECT_EQ(last["eval_duration"], 400000000);
  const json& msg = last["message"];
  EXPECT_EQ(keys(msg), (std::set<std::string>{"role", "content", "tool_calls"}));
  ASSERT_EQ(msg["tool_calls"].size(), 2u);
  // ToolCall of the JS client: {function: {name, arguments: object}}.
  EXPECT_EQ(keys(msg["tool_calls"][0]), (std::set<std::string>{"function"}));
  EXPECT_EQ(keys(msg["tool_calls"][0]["function"]), (std::set<std::string>{"name", "arguments"}));
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], json({{"city", "Paris"}}));
  EXPECT_EQ(msg["tool_calls"][1]["function"]["arguments"], "{oops");  // not an object: kept as text

  // Streamed calls appear in a chunk too; an empty list is left out.
  EXPECT_TRUE(chat_chunk("m", "t", "", calls)["message"].contains("tool_calls"));
  EXPECT_FALSE(chat_final("m", "t", "all", {}, "length", d)["message"].contains("tool_calls"));
  EXPECT_EQ(chat_final("m", "t", "all", {}, "length", d)["message"]["content"], "all");
}

TEST(OllamaResponses, GenerateChunkAndFinal) {
  const json chunk = generate_chunk("m", "t0", "The", Durations{9, 0, 2, 3, 1, 0});
  EXPECT_EQ(keys(chunk), with({"model", "created_at", "response", "done", "done_reason", "context"}, kDurationKeys));
  EXPECT_EQ(chunk["response"], "The");
  EXPECT_EQ(chunk["context"], json::array()) << "the whole context comes with the last line";
  EXPECT_EQ(chunk["eval_count"], 1);
  EXPECT_EQ(chunk["done"], false);
  const json last = generate_final("m", "t1", "", "length", Durations{5, 1, 2, 3, 4, 6}, {1, 2, 3});
  EXPECT_EQ(keys(last), with({"model", "created_at", "response", "done", "done_reason", "context"}, kDurationKeys));
  EXPECT_EQ(last["done"], true);
  EXPECT_EQ(last["done_reason"], "length");
  EXPECT_EQ(last["context"], json::array({1, 2, 3}));
  EXPECT_EQ(last["eval_duration"], 6);
  for (const std::string& k : kDurationKeys) EXPECT_TRUE(last[k].is_number_integer()) << k;
  // Load / unload answers: empty response, the reason.
  EXPECT_EQ(generate_final("m", "t", "", "load", {}, {})["done_reason"], "load");
  EXPECT_TRUE(generate_final("m", "t", "", "unload", {}, {})["context"].is_array());
}

TEST(OllamaResponses, EmbeddingVectorsAreNormalizedThenCut) {
  const std::vector<float> v = embedding_vector({3.0f, 4.0f, 12.0f}, std::nullopt);  // |v| = 13
  ASSERT_EQ(v.size(), 3u);
  EXPECT_FLOAT_EQ(v[0], 3.0f / 13);
  EXPECT_FLOAT_EQ(v[1], 4.0f / 13);
  EXPECT_FLOAT_EQ(v[2], 12.0f / 13);
  // dimensions 2: the first two of the normalized vector, normalized again (3-4-5).
  const std::vector<float> cut = embedding_vector({3.0f, 4.0f, 12.0f}, 2);
  ASSERT_EQ(cut.size(), 2u);
  EXPECT_FLOAT_EQ(cut[0], 0.6f);
  EXPECT_FLOAT_EQ(cut[1], 0.8f);
  EXPECT_EQ(embedding_vector({3.0f, 4.0f}, 5).size(), 2u) << "a larger dimensions leaves the vector whole";
  EXPECT_EQ(embedding_vector({0.0f, 0.0f}, std::nullopt), (std::vector<float>{0.0f, 0.0f}));
  EXPECT_THROW(embedding_vector({1.0f, std::numeric_limits<float>::quiet_NaN()}, std::nullopt), ApiError);
  EXPECT_THROW(embedding_vector({std::numeric_limits<float>::infinity()}, std::nullopt), ApiError);
}

TEST(OllamaResponses, Embeddings) {
  const json e = embed_response("e", {{0.5f, -1.0f}, {0.25f, 2.0f}}, Durations{100, 10, 7, 0, 0, 0});
  EXPECT_EQ(keys(e), (std::set<std::string>{"model", "embeddings", "total_duration", "load_duration", "prompt_eval_count"}));
  EXPECT_EQ(e["embeddings"], json::parse("[[0.5,-1.0],[0.25,2.0]]"));
  EXPECT_EQ(e["total_duration"], 100);
  EXPECT_EQ(e["load_duration"], 10);
  EXPECT_EQ(e["prompt_eval_count"], 7);
  EXPECT_TRUE(embed_response("e", {}, {})["embeddings"].is_array());
  const json legacy = legacy_embedding_response({1.0f, 0.5f});
  EXPECT_EQ(keys(legacy), (std::set<std::string>{"embedding"}));
  EXPECT_EQ(legacy["embedding"], json::parse("[1.0,0.5]"));
}

const std::set<std::string> kDetailsKeys = {"parent_model", "format", "family", "families", "parameter_size",
                                            "quantization_level"};

TEST(OllamaResponses, ModelDetails) {
  const json d = model_details(sample_entry());
  EXPECT_EQ(keys(d), kDetailsKeys);
  EXPECT_EQ(d["parent_model"], "");
  ModelEntry variant = sample_entry("v");
  variant.parent = "qwen2-0.5b";
  EXPECT_EQ(model_details(variant)["parent_model"], "qwen2-0.5b");
  EXPECT_EQ(d["format"], "gguf");
  EXPECT_EQ(d["family"], "qwen2");
  EXPECT_EQ(d["families"], json::array({"qwen2"}));
  EXPECT_EQ(d["parameter_size"], "494.0M");
  EXPECT_EQ(d["quantization_level"], "Q4_0");
}

TEST(OllamaResponses, TagsListsUsableModels) {
  ModelEntry broken = sample_entry("broken");
  broken.error = "not a GGUF file";
  const ModelEntry b = sample_entry("b");
  const std::chrono::system_clock::time_point at{std::chrono::seconds(1714566896)};
  const json tags = tags_response({sample_entry("a"), broken, b}, {{&b, 5, at, 4096}});
  EXPECT_EQ(keys(tags), (std::set<std::string>{"models"}));
  ASSERT_EQ(tags["models"].size(), 2u);
  const json& m = tags["models"][0];
  // The client's ModelResponse (shared with /api/ps) declares expires_at and size_vram too.
  EXPECT_EQ(keys(m), (std::set<std::string>{"name", "model", "modified_at", "size", "digest", "details", "expires_at",
                                            "size_vram"}));
  EXPECT_EQ(m["expires_at"], "0001-01-01T00:00:00Z") << "not loaded: Go's zero time";
  EXPECT_EQ(tags["models"][1]["expires_at"], "2024-05-01T12:34:56Z") << "loaded: its expiry";
  EXPECT_EQ(m["size_vram"], 0);
  EXPECT_EQ(m["name"], "a");
  EXPECT_EQ(m["model"], "a");
  EXPECT_EQ(m["modified_at"], "2024-05-01T12:34:56Z");
  EXPECT_TRUE(m["size"].is_number_integer());
  EXPECT_EQ(m["size"], 397000000);
  EXPECT_EQ(m["digest"], std::string(64, 'a'));
  EXPECT_EQ(keys(m["details"]), kDetailsKeys);
  EXPECT_EQ(tags["models"][1]["name"], "b");
  EXPECT_EQ(tags_response({})["models"], json::array());
}

TEST(OllamaResponses, PsShowsLoadedModels) {
  using namespace std::chrono;
  const ModelEntry a = sample_entry("a");
  const ModelEntry b = sample_entry("b");
  const system_clock::time_point at{seconds(1714566896) + milliseconds(250)};
  const json ps = ps_response({{&a, 500000000, at, 4096}, {&b, 600000000, std::nullopt, 2048}, {nullptr, 1, at, 1}});
  EXPECT_EQ(keys(ps), (std::set<std::string>{"models"}));
  ASSERT_EQ(ps["models"].size(), 2u);
  const json& m = ps["models"][0];
  EXPECT_EQ(keys(m), (std::set<std::string>{"name", "model", "size", "digest", "details", "expires_at", "size_vram",
                                            "modified_at", "context_length"}));
  EXPECT_EQ(m["modified_at"], "2024-05-01T12:34:56Z");
  EXPECT_EQ(m["name"], "a");
  EXPECT_EQ(m["size"], 500000000);
  EXPECT_EQ(m["size_vram"], 0);
  EXPECT_EQ(m["context_length"], 4096);
  EXPECT_EQ(m["expires_at"], "2024-05-01T12:34:56.25Z");
  EXPECT_EQ(keys(m["details"]), kDetailsKeys);
  // Kept forever: far in the future, as Ollama shows keep_alive -1.
  EXPECT_EQ(ps["models"][1]["expires_at"], "2318-01-01T00:00:00Z");
}

TEST(OllamaResponses, Show) {
  ModelEntry e = sample_entry();
  e.defaults.system_prompt = "You are a helper.";
  e.defaults.options = json{{"temperature", 0.7}, {"stop", {"<|im_end|>", "<|endoftext|>"}}};
  const json metadata = {{"general.architecture", "qwen2"},
                         {"general.name", "Qwen2"},
                         {"qwen2.context_length", 32768},
                         {"qwen2.embedding_length", 896},
                         {"general.license", "apache-2.0"},
                         {"tokenizer.ggml.tokens", {"a", "b"}}};
  const json show = show_response(e, "{{ messages }}", metadata, {"completion", "tools"});
  EXPECT_EQ(keys(show), (std::set<std::string>{"modelfile", "parameters", "template", "details", "model_info",
                                               "capabilities", "modified_at", "system", "license", "messages"}));
  EXPECT_EQ(show["license"], "apache-2.0");
  EXPECT_EQ(show["messages"], json::array());
  EXPECT_EQ(show["template"], "{{ messages }}");
  EXPECT_EQ(show["system"], "You are a helper.");
  EXPECT_EQ(show["capabilities"], json::array({"completion", "tools"}));
  EXPECT_EQ(show["modified_at"], "2024-05-01T12:34:56Z");
  EXPECT_EQ(keys(show["details"]), kDetailsKeys);
  const std::string modelfile = show["modelfile"];
  EXPECT_EQ(modelfile.rfind("# Modelfile generated by tern\nFROM /models/qwen2-0.5b.gguf\n", 0), 0u) << modelfile;
  EXPECT_NE(modelfile.find("TEMPLATE \"\"\"{{ messages }}\"\"\"\n"), std::string::npos);
  EXPECT_NE(modelfile.find("SYSTEM \"\"\"You are a helper.\"\"\"\n"), std::string::npos);
  EXPECT_NE(modelfile.find("PARAMETER temperature 0.7\n"), std::string::npos);
  EXPECT_NE(modelfile.find("PARAMETER stop \"<|im_end|>\"\n"), std::string::npos);
  // parameters: Ollama's padded lines, one per list element.
  EXPECT_EQ(show["parameters"], "stop                           \"<|im_end|>\"\n"
                                "stop                           \"<|endoftext|>\"\n"
                                "temperature                    0.7");
  const json& info = show["model_info"];
  EXPECT_EQ(info["general.architecture"], "qwen2");
  EXPECT_EQ(info["qwen2.context_length"], 32768);
  EXPECT_EQ(info["general.parameter_count"], 494000000);
  EXPECT_FALSE(info.contains("tokenizer.ggml.tokens"));  // arrays left out

  // No defaults, no template: empty strings (system and license too), a modelfile of FROM alone.
  const json bare = show_response(sample_entry(), "", json::object(), {});
  EXPECT_EQ(bare["parameters"], "");
  EXPECT_EQ(bare["system"], "");
  EXPECT_EQ(bare["license"], "");
  EXPECT_EQ(bare["modelfile"], "# Modelfile generated by tern\nFROM /models/qwen2-0.5b.gguf\n");
  EXPECT_EQ(bare["capabilities"], json::array());
  EXPECT_TRUE(bare["model_info"].is_object());
}

TEST(OllamaResponses, VersionAndError) {
  EXPECT_EQ(version_response("0.1.0"), json({{"version", "0.1.0"}}));
  EXPECT_EQ(error_body("model \"x\" not found"), json({{"error", "model \"x\" not found"}}));
}

}  // namespace
}  // namespace tern::server::ollama
