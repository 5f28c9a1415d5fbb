// Tool calls (server/tool_calls.h): the streaming parser on every format, fed whole, split at
// every byte boundary and a byte at a time (same events once concatenated); marker hold-back;
// malformed calls kept as content; several calls; the forced-call grammar through the grammar
// engine's matcher; tools, tool_calls and tool messages through the chat templates.
#include <gtest/gtest.h>

#include <cctype>
#include <map>
#include <set>

#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "server/api_error.h"
#include "server/chat_template.h"
#include "server/openai_request.h"
#include "server/tool_calls.h"

using namespace tern::server;

namespace {

ToolParserOptions opts(std::vector<std::string> names = {"get_weather", "get_time"}, bool parallel = true) {
  ToolParserOptions o;
  o.tool_names = std::move(names);
  o.parallel = parallel;
  o.id_seed = 42;
  return o;
}

// Events with consecutive content merged and argument fragments of a call joined: the same
// stream whatever the feeding.
struct Flat {
  std::string content;
  std::vector<std::string> calls;  // "index|id|name|arguments"
  std::string order;               // "c" for a content run, "t" per call start, in order
  bool operator==(const Flat&) const = default;
};

Flat flatten(const std::vector<ToolCallEvent>& events) {
  Flat f;
  for (const ToolCallEvent& e : events) {
    switch (e.kind) {
      case ToolCallEvent::Kind::Content:
        EXPECT_FALSE(e.text.empty());
        f.content += e.text;
        if (f.order.empty() || f.order.back() != 'c') f.order += 'c';
        break;
      case ToolCallEvent::Kind::CallStart:
        EXPECT_EQ(e.index, int(f.calls.size()));
        EXPECT_TRUE(e.text.empty());
        f.calls.push_back(std::to_string(e.index) + "|" + e.id + "|" + e.name + "|");
        f.order += 't';
        break;
      case ToolCallEvent::Kind::CallArguments:
        EXPECT_EQ(e.index, int(f.calls.size()) - 1) << "arguments follow their call's start";
        if (!f.calls.empty()) f.calls.back() += e.text;
        break;
    }
  }
  return f;
}

// Feeds `pieces` and returns every event (feed()s then finish()) and the final result.
std::pair<Flat, ToolParseResult> run(ToolFormat fmt, const std::vector<std::string>& pieces, const ToolParserOptions& o) {
  ToolCallParser p(fmt, o);
  std::vector<ToolCallEvent> all;
  for (const std::string& piece : pieces) {
    auto ev = p.feed(piece);
    all.insert(all.end(), ev.begin(), ev.end());
  }
  ToolParseResult r = p.finish();
  all.insert(all.end(), r.events.begin(), r.events.end());
  return {flatten(all), r};
}

// The text whole, split in two at every byte, and a byte at a time: the same stream each time,
// and the stream agrees with finish()'s content and calls.
ToolParseResult check_every_split(ToolFormat fmt, const std::string& text, const ToolParserOptions& o = opts()) {
  const auto [whole, result] = run(fmt, {text}, o);
  EXPECT_EQ(whole.content, result.content) << text;
  EXPECT_EQ(whole.calls.size(), result.calls.size()) << text;
  for (size_t i = 0; i < result.calls.size() && i < whole.calls.size(); ++i) {
    const ToolCall& c = result.calls[i];
    EXPECT_EQ(whole.calls[i], std::to_string(i) + "|" + c.id + "|" + c.name + "|" + c.arguments);
  }
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const auto [split, r] = run(fmt, {text.substr(0, cut), text.substr(cut)}, o);
    EXPECT_EQ(split, whole) << "split at byte " << cut << " of " << text;
    if (split != whole) break;
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_EQ(run(fmt, bytes, o).first, whole) << "byte at a time: " << text;
  return result;
}

}  // namespace

TEST(ToolFormats, TraitsAndDetection) {
  for (ToolFormat f : {ToolFormat::Hermes, ToolFormat::Llama3, ToolFormat::Mistral, ToolFormat::Generic}) {
    EXPECT_EQ(tool_format_traits(f).format, f);
    EXPECT_EQ(tool_format_from_name(tool_format_name(f)), f);
    EXPECT_FALSE(tool_format_traits(f).openers.empty());
  }
  EXPECT_EQ(tool_format_from_name("qwen"), ToolFormat::Hermes);
  EXPECT_FALSE(tool_format_from_name("xml").has_value());
  EXPECT_EQ(detect_tool_format("... <tool_call>\\n{\"name\": ... <|im_start|>"), ToolFormat::Hermes);
  EXPECT_EQ(detect_tool_format("{{- '\"parameters\": ' }} <|start_header_id|>"), ToolFormat::Llama3);
  EXPECT_EQ(detect_tool_format("<|python_tag|>"), ToolFormat::Llama3);
  EXPECT_EQ(detect_tool_format("[AVAILABLE_TOOLS] [TOOL_CALLS] [INST]"), ToolFormat::Mistral);
  EXPECT_EQ(detect_tool_format("{% for m in messages %}{{ m.content }}{% endfor %}"), ToolFormat::Generic);
}

TEST(ToolFormats, CallIds) {
  std::mt19937_64 rng(1);
  std::set<std::string> seen;
  for (int i = 0; i < 200; ++i) {
    const std::string id = new_tool_call_id(rng);
    ASSERT_EQ(id.size(), 5u + 24u);
    EXPECT_EQ(id.substr(0, 5), "call_");
    for (char c : id.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << id;
    EXPECT_TRUE(seen.insert(id).second) << "duplicate id " << id;
  }
  const std::string m = new_tool_call_id(rng, ToolFormat::Mistral);  // its template wants 9 alphanumerics
  EXPECT_EQ(m.size(), 9u);
  // Random ids by default: two parsers do not repeat each other.
  ToolCallParser a(ToolFormat::Hermes), b(ToolFormat::Hermes);
  const std::string call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
  a.feed(call);
  b.feed(call);
  EXPECT_NE(a.finish().calls.at(0).id, b.finish().calls.at(0).id);
}

TEST(ToolCallParser, HermesOneCall) {
  const std::string text =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>";
  const ToolParseResult r = check_every_split(ToolFormat::Hermes, text);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris","days":3})");  // compact, in the model's order
  EXPECT_EQ(r.calls[0].id.substr(0, 5), "call_");
  EXPECT_EQ(r.content, "");
}

TEST(ToolCallParser, HermesTextAroundAndSeveralCalls) {
  const std::string text =
      "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}\n</tool_call>\n";
  const ToolParseResult r = check_every_split(ToolFormat::Hermes, text);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[1].name, "get_time");
  EXPECT_EQ(r.calls[1].arguments, R"({"tz":"Europe/Paris"})");
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
  EXPECT_EQ(r.content, "Let me check both.");  // whitespace before, between and after calls is not content
  const auto [flat, res] = run(ToolFormat::Hermes, {text}, opts());
  EXPECT_EQ(flat.order, "ctt");
}

TEST(ToolCallParser, PlainTextPassesThroughUnchanged) {
  for (const std::string text : {"Hello, world!", "  spaced  ", "a < b and <tool> is not a marker; 3<4", "<tool_cal",
                                 "x\n\n", "\n", "{\"name\" in prose}", ""}) {
    const ToolParseResult r = check_every_split(ToolFormat::Hermes, text);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty());
  }
}

TEST(ToolCallParser, MarkerPrefixIsHeldBackUntilItCannotBeAMarker) {
  ToolCallParser p(ToolFormat::Hermes, opts());
  auto ev = p.feed("Sure <tool");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].text, "Sure");  // "<tool" may start <tool_call>: held (and the space before it)
  ev = p.feed("_ca");
  EXPECT_TRUE(ev.empty());
  ev = p.feed("t and more");  // "<tool_cat": not a marker after all, released whole
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].text, " <tool_cat and more");
  ev = p.feed("<");
  EXPECT_TRUE(ev.empty());
  const ToolParseResult r = p.finish();  // the end: a held prefix is text
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].text, "<");
  EXPECT_EQ(r.content, "Sure <tool_cat and more<");
}

TEST(ToolCallParser, NothingOfACallLeaksIntoContentWhileItStreams) {
  const std::string text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
  ToolCallParser p(ToolFormat::Hermes, opts());
  for (size_t i = 0; i + 1 < text.size(); ++i) {
    for (const ToolCallEvent& e : p.feed(text.substr(i, 1)))
      ADD_FAILURE() << "event before the call is complete, at byte " << i << ": " << e.text;
  }
  const auto ev = p.feed(text.substr(text.size() - 1));
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].kind, ToolCallEvent::Kind::CallStart);
  EXPECT_EQ(ev[0].name, "get_weather");
  EXPECT_FALSE(ev[0].id.empty());
  EXPECT_EQ(ev[1].kind, ToolCallEvent::Kind::CallArguments);
  EXPECT_EQ(ev[1].text, R"({"city":"Oslo"})");
}

TEST(ToolCallParser, MalformedCallsAreContentByteForByte) {
  const std::vector<std::string> bad = {
      "<tool_call>\nnot json at all\n</tool_call>",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }}\n</tool_call>",
      "<tool_call>\n{\"arguments\": {}}\n</tool_call>",                              // no name
      "<tool_call>\n{\"name\": \"launch_rockets\", \"arguments\": {}}\n</tool_call>",  // not a tool
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": [1, 2]}\n</tool_call>",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{not json\"}\n</tool_call>",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa",  // cut off (max_tokens)
      "<tool_call>\n[]\n</tool_call>",
      "<tool_call>",
  };
  for (const std::string& text : bad) {
    const ToolParseResult r = check_every_split(ToolFormat::Hermes, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
  // A malformed call between good ones: both good calls, the bad one's text as content.
  const std::string mixed =
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{oops}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
  const ToolParseResult r = check_every_split(ToolFormat::Hermes, mixed);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.content, "\n<tool_call>\n{oops}\n</tool_call>");
}

TEST(ToolCallParser, LenientShapes) {
  // No closing marker (the model stopped at end-of-generation), arguments as a JSON string,
  // "parameters" for "arguments", no arguments at all.
  auto r = check_every_split(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"tz":"UTC"})");
  r = check_every_split(ToolFormat::Hermes,
                        "<tool_call>{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"UTC\\\"}\"}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"tz":"UTC"})");
  r = check_every_split(ToolFormat::Generic, "<tool_call>{\"name\":\"get_time\",\"parameters\":{\"a\":[1,{\"b\":null}]}}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"a":[1,{"b":null}]})");
  r = check_every_split(ToolFormat::Hermes, "<tool_call>{\"name\": \"get_time\"}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{}");
  // Unicode and escapes survive compaction.
  r = check_every_split(ToolFormat::Hermes,
                        "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Z\\u00fcrich \xe6\x97\xa5\", "
                        "\"q\": \"a\\\"b\"}}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"city\":\"Z\xc3\xbcrich \xe6\x97\xa5\",\"q\":\"a\\\"b\"}");
  // Any name when no tool list is given.
  r = check_every_split(ToolFormat::Hermes, "<tool_call>{\"name\": \"anything\", \"arguments\": {}}</tool_call>", opts({}));
  ASSERT_EQ(r.calls.size(), 1u);
}

TEST(ToolCallParser, Llama3) {
  auto r = check_every_split(ToolFormat::Llama3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Lima\"}}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Lima"})");
  EXPECT_EQ(r.content, "");
  r = check_every_split(ToolFormat::Llama3, "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "");
  r = check_every_split(ToolFormat::Llama3, "\n { \"name\": \"get_time\", \"parameters\": {\"tz\": \"}\"}}\n{\"name\": \"get_weather\", \"parameters\": {}}");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].arguments, R"({"tz":"}"})");  // a brace inside a string does not end the call
  // JSON that is not a call, and a call-shaped text after prose: text.
  for (const std::string text : {"{\"answer\": 42}", "The call is {\"name\": \"get_time\", \"parameters\": {}}",
                                 "{\"name\": \"get_time\", \"parameters\": {", "{\"name\": 5}", "{\"nam"}) {
    r = check_every_split(ToolFormat::Llama3, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
  // A call, then prose.
  r = check_every_split(ToolFormat::Llama3, "{\"name\": \"get_time\", \"parameters\": {}} and then text");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, " and then text");
}

TEST(ToolCallParser, Mistral) {
  const std::string text =
      "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bern\"}}, "
      "{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}, \"id\": \"abc123XYZ\"}]";
  auto r = check_every_split(ToolFormat::Mistral, text);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Bern"})");
  EXPECT_EQ(r.calls[1].name, "get_time");
  EXPECT_EQ(r.calls[1].id.size(), 9u);
  EXPECT_EQ(r.content, "");
  // Without the marker's text (a special token the detokenizer left out), at the start.
  r = check_every_split(ToolFormat::Mistral, "[{\"name\": \"get_time\", \"arguments\": {}}]");
  ASSERT_EQ(r.calls.size(), 1u);
  r = check_every_split(ToolFormat::Mistral, "Prose first. [TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}]");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "Prose first.");
  for (const std::string bad : {"[TOOL_CALLS] nope", "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}, {\"x\": 1}]",
                                "[TOOL_CALLS][{\"name\": \"get_time\""}) {
    r = check_every_split(ToolFormat::Mistral, bad);
    EXPECT_TRUE(r.calls.empty()) << bad;
    EXPECT_EQ(r.content, bad);
  }
}

// An answer cut (max_tokens) inside Mistral's array of calls keeps the calls it completed; the
// unfinished rest is text, so nothing the model wrote is lost.
TEST(ToolCallParser, MistralArrayCutShortKeepsItsCompleteCalls) {
  const std::string done = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bern\"}}, "
                           "{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}";
  for (const std::string& tail : {std::string(""), std::string(", "), std::string(", {\"name\": \"get_wea"),
                                 std::string(", {\"name\": \"get_weather\", \"arguments\": {\"city\": \"]}")}) {
    const auto r = check_every_split(ToolFormat::Mistral, done + tail);
    ASSERT_EQ(r.calls.size(), 2u) << tail;
    EXPECT_EQ(r.calls[0].arguments, R"({"city":"Bern"})");
    EXPECT_EQ(r.calls[1].name, "get_time");
    // The text is the unfinished element, without the ", " before it.
    EXPECT_EQ(r.content, tail.size() > 2 ? tail.substr(2) : "") << tail;
  }
  // Complete elements that are not calls leave the whole region as text.
  const std::string not_calls = "[TOOL_CALLS] [{\"x\": 1}, {\"name\": \"get_time\"";
  const auto r = check_every_split(ToolFormat::Mistral, not_calls);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, not_calls);
}

TEST(ToolCallParser, ParallelFalseAsksToStopAfterOneCall) {
  ToolCallParser p(ToolFormat::Hermes, opts({"get_time"}, /*parallel=*/false));
  p.feed("<tool_call>{\"name\": \"get_time\", \"arguments\": {}}");
  EXPECT_FALSE(p.stop_requested());
  p.feed("</tool_call>");
  EXPECT_TRUE(p.stop_requested());
  EXPECT_EQ(p.n_calls(), 1u);
  ToolCallParser q(ToolFormat::Hermes, opts({"get_time"}, /*parallel=*/true));
  q.feed("<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>");
  EXPECT_FALSE(q.stop_requested());
}

TEST(ToolCallParser, WholeTextHelperMatchesTheStream) {
  const std::string text = "Hi <tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call> bye";
  const ToolParseResult r = parse_tool_calls(ToolFormat::Hermes, text, opts());
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "Hi bye");
  EXPECT_EQ(flatten(r.events).content, r.content);
}

TEST(ToolCallParser, FuzzedInputNeverCrashesAndKeepsEveryByte) {
  // Random mixtures of marker pieces, JSON pieces and text: content plus calls account for the
  // text (every byte that is not in a call is content, nothing invented).
  const std::vector<std::string> atoms = {"<tool_call>", "</tool_call>", "<tool", "_call>", "{", "}", "[", "]", "\"",
                                          "\\", "\"name\"", ": ", "\"get_time\"", ", ", "\"arguments\"", "{}", "\n",
                                          "x", " ", "[TOOL_CALLS]", "<|python_tag|>", "{\"name\""};
  std::mt19937_64 rng(7);
  for (ToolFormat f : {ToolFormat::Hermes, ToolFormat::Llama3, ToolFormat::Mistral, ToolFormat::Generic}) {
    for (int iter = 0; iter < 300; ++iter) {
      std::string text;
      const int n = int(rng() % 24);
      for (int i = 0; i < n; ++i) text += atoms[rng() % atoms.size()];
      const auto [flat, r] = run(f, {text}, opts());
      EXPECT_EQ(flat.content, r.content);
      if (r.calls.empty()) {
        EXPECT_EQ(r.content, text) << tool_format_name(f) << ": " << text;
      }
      EXPECT_LE(r.content.size(), text.size());
      // Split feeding agrees.
      const size_t cut = text.empty() ? 0 : rng() % text.size();
      EXPECT_EQ(run(f, {text.substr(0, cut), text.substr(cut)}, opts()).first, flat) << text;
    }
  }
}

// ---- grammars ----

TEST(ToolGrammar, PrefixRulesRenamesRulesOnly) {
  const std::string g =
      "root ::= obj space # root and obj\nobj ::= \"{\" space \"obj\" [a-z root] \"}\"\nspace ::= [ ]{0,2} item{1,3}\n"
      "item ::= \"x\"";
  const std::string p = prefix_gbnf_rules(g, "t0-");
  EXPECT_EQ(p,
            "t0-root ::= t0-obj t0-space # root and obj\nt0-obj ::= \"{\" t0-space \"obj\" [a-z root] \"}\"\n"
            "t0-space ::= [ ]{0,2} t0-item{1,3}\nt0-item ::= \"x\"");
  EXPECT_EQ(prefix_gbnf_rules("root ::= \"a\\\"root\"", "p-"), "p-root ::= \"a\\\"root\"");
}

namespace {

std::vector<ToolDef> weather_tools() {
  ToolDef w;
  w.name = "get_weather";
  w.description = "Weather of a city";
  w.parameters = nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]})");
  ToolDef t;
  t.name = "get_time";
  t.parameters = nlohmann::ordered_json::parse(R"({"type":"object","properties":{}})");
  return {w, t};
}

bool matches(const std::string& gbnf, const std::string& text) {
  tern::grammar::Matcher m(tern::grammar::Grammar::parse(gbnf));
  return m.accept_bytes(text) && m.is_complete();
}

}  // namespace

TEST(ToolGrammar, NoForcingForAutoAndNone) {
  EXPECT_EQ(tool_call_grammar(ToolFormat::Hermes, weather_tools(), {ToolChoiceMode::Auto, ""}, true), "");
  EXPECT_EQ(tool_call_grammar(ToolFormat::Hermes, weather_tools(), {ToolChoiceMode::None, ""}, true), "");
}

TEST(ToolGrammar, ForcedCallsAcceptValidCallsOnly) {
  const auto tools = weather_tools();
  const std::string weather = R"(<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}
</tool_call>)";
  const std::string time = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  const std::string required = tool_call_grammar(ToolFormat::Hermes, tools, {ToolChoiceMode::Required, ""}, false);
  EXPECT_TRUE(matches(required, weather)) << required;
  EXPECT_TRUE(matches(required, time));
  EXPECT_FALSE(matches(required, weather + "\n" + time));  // one call only without parallel
  EXPECT_FALSE(matches(required, "Sure! " + weather));
  EXPECT_FALSE(matches(required, R"(<tool_call>
{"name": "get_weather", "arguments": {"days": 2}}
</tool_call>)"));  // city is required
  EXPECT_FALSE(matches(required, R"(<tool_call>
{"name": "get_weather", "arguments": {"city": 5}}
</tool_call>)"));  // city is a string
  EXPECT_FALSE(matches(required, "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>"));
  // Parallel: one or more.
  const std::string parallel = tool_call_grammar(ToolFormat::Hermes, tools, {ToolChoiceMode::Required, ""}, true);
  EXPECT_TRUE(matches(parallel, weather + "\n" + time));
  EXPECT_TRUE(matches(parallel, time));
  EXPECT_FALSE(matches(parallel, ""));
  // Named: that function only.
  const std::string named = tool_call_grammar(ToolFormat::Hermes, tools, {ToolChoiceMode::Named, "get_time"}, false);
  EXPECT_TRUE(matches(named, time));
  EXPECT_FALSE(matches(named, weather));
  // What the grammar forces, the parser reads back as the call.
  const ToolParseResult r = parse_tool_calls(ToolFormat::Hermes, weather, opts());
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris","days":2})");
}

TEST(ToolGrammar, EveryFormatsForcedCallParsesBack) {
  const auto tools = weather_tools();
  const std::map<ToolFormat, std::string> two_calls = {
      {ToolFormat::Hermes, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
                           "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"},
      {ToolFormat::Generic, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
                            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"},
      {ToolFormat::Llama3, "{\"name\": \"get_time\", \"parameters\": {}}\n{\"name\": \"get_weather\", \"parameters\": "
                           "{\"city\": \"Oslo\"}}"},
      {ToolFormat::Mistral, "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"get_weather\", "
                            "\"arguments\": {\"city\": \"Oslo\"}}]"},
  };
  for (const auto& [f, text] : two_calls) {
    const std::string g = tool_call_grammar(f, tools, {ToolChoiceMode::Required, ""}, true);
    EXPECT_TRUE(matches(g, text)) << tool_format_name(f) << "\n" << g;
    const ToolParseResult r = parse_tool_calls(f, text, opts());
    ASSERT_EQ(r.calls.size(), 2u) << tool_format_name(f);
    EXPECT_EQ(r.calls[1].arguments, R"({"city":"Oslo"})");
    EXPECT_EQ(r.content, "");
  }
}

TEST(ToolGrammar, BadSchemaIsA400NamingTheTool) {
  auto tools = weather_tools();
  tools[1].parameters = nlohmann::ordered_json::parse(R"({"type":"object","properties":{"n":{"type":"number","multipleOf":3}}})");
  try {
    tool_call_grammar(ToolFormat::Hermes, tools, {ToolChoiceMode::Required, ""}, false);
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "tools[1].function.parameters");
  }
  // A named tool with a good schema is fine whatever the others are.
  EXPECT_NE(tool_call_grammar(ToolFormat::Hermes, tools, {ToolChoiceMode::Named, "get_weather"}, false), "");
}

TEST(ToolGrammar, RequestGrammarPicksTheOneConstraint) {
  const auto req = [](const std::string& body) { return parse_openai_request(body, ApiKind::Chat); };
  const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
  EXPECT_EQ(request_grammar(req("{" + msgs + "}"), ToolFormat::Hermes), "");
  EXPECT_EQ(request_grammar(req("{" + msgs + R"(,"grammar":"root ::= \"yes\""})"), ToolFormat::Hermes), "root ::= \"yes\"");
  const std::string js = request_grammar(
      req("{" + msgs + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"p","schema":{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]}}}})"),
      ToolFormat::Hermes);
  EXPECT_TRUE(matches(js, R"({"a": true})")) << js;
  EXPECT_FALSE(matches(js, R"({"a": 1})"));
  const std::string obj = request_grammar(req("{" + msgs + R"(,"response_format":{"type":"json_object"}})"), ToolFormat::Hermes);
  EXPECT_TRUE(matches(obj, R"({"x": [1, 2]})"));
  EXPECT_FALSE(matches(obj, "[1]"));
  const std::string ls = request_grammar(req("{" + msgs + R"(,"json_schema":{"type":"string"}})"), ToolFormat::Hermes);
  EXPECT_TRUE(matches(ls, R"("hi")"));
  const std::string tools = R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}])";
  const std::string forced = request_grammar(req("{" + msgs + tools + R"(,"tool_choice":"required"})"), ToolFormat::Hermes);
  EXPECT_TRUE(matches(forced, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_EQ(request_grammar(req("{" + msgs + tools + "}"), ToolFormat::Hermes), "");  // auto: not forced
  try {
    request_grammar(req("{" + msgs + R"(,"json_schema":{"type":"number","multipleOf":2}})"), ToolFormat::Hermes);
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "json_schema");
  }
}

// ---- templates ----

namespace {

// A hermes template in the manner of Qwen's (tools in the system turn, tool_calls with their
// arguments as objects, tool results as user turns).
const char* kHermesJinja =
    "{%- if tools %}{{ '<|im_start|>system\\n' }}{% if messages[0].role == 'system' %}{{ messages[0].content + '\\n\\n' }}"
    "{% endif %}{{ '# Tools\\n<tools>' }}{% for t in tools %}{{ '\\n' }}{{ t | tojson }}{% endfor %}"
    "{{ '\\n</tools>\\n<tool_call>...</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' + m.content }}"
    "{%- for c in m.tool_calls %}{{ '<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' }}"
    "{{ c.function.arguments | tojson }}{{ '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}{{ '<|im_start|>assistant\\n' }}";

const char* kPlainJinja =
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    "<|im_start|>assistant\n";

std::vector<ChatMessage> tool_conversation() {
  ChatMessage call{"assistant", ""};
  call.content_null = true;
  call.tool_calls = {{"call_1", "get_weather", R"({"city":"Paris"})"}};
  ChatMessage result{"tool", "{\"temp\": 21}"};
  result.tool_call_id = "call_1";
  return {{"user", "Weather in Paris?"}, call, result};
}

}  // namespace

TEST(ToolTemplates, TemplatesThatShowToolsAreDetected) {
  std::string note;
  const ChatTemplate hermes = select_chat_template("", kHermesJinja, "<s>", "</s>", &note);
  ASSERT_TRUE(hermes.jinja);
  EXPECT_TRUE(hermes.jinja_tools);
  EXPECT_EQ(hermes.tool_format, ToolFormat::Hermes);
  EXPECT_NE(note.find("tool calls: hermes"), std::string::npos) << note;
  const ChatTemplate plain = select_chat_template("", kPlainJinja, "<s>", "</s>", &note);
  ASSERT_TRUE(plain.jinja);
  EXPECT_FALSE(plain.jinja_tools);
  EXPECT_EQ(plain.tool_format, ToolFormat::Generic);
  EXPECT_FALSE(select_chat_template("llama3", "", "<s>", "</s>").jinja_tools);
}

TEST(ToolTemplates, JinjaGetsToolsAndCallsInHfShape) {
  const ChatTemplate t = select_chat_template("", kHermesJinja, "<s>", "</s>");
  const std::string out = t.apply(tool_conversation(), weather_tools());
  EXPECT_EQ(out,
            "<|im_start|>system\n# Tools\n<tools>\n"
            "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather of a city\", "
            "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": "
            "\"integer\"}}, \"required\": [\"city\"]}}}\n"
            "{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": \"object\", "
            "\"properties\": {}}}}\n</tools>\n<tool_call>...</tool_call><|im_end|>\n"
            "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
            "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n");
  // Without tools the template sees none.
  EXPECT_EQ(t.apply({{"user", "hi"}}), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ToolTemplates, GenericSchemeForTemplatesWithoutTools) {
  for (const ChatTemplate& t : {select_chat_template("", kPlainJinja, "<s>", "</s>"),
                                select_chat_template("chatml", "", "<s>", "</s>")}) {
    std::vector<ChatMessage> conv = tool_conversation();
    conv.insert(conv.begin(), ChatMessage{"system", "Be brief."});
    const std::string out = t.apply(conv, weather_tools());
    const std::string block = generic_tools_prompt(weather_tools());
    EXPECT_EQ(out.find("<|im_start|>system\nBe brief.\n\n" + block + "<|im_end|>\n"), 0u) << out;
    EXPECT_NE(out.find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                       "\"Paris\"}}\n</tool_call><|im_end|>\n"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n"),
              std::string::npos)
        << out;
    // No system message: one is made for the tools.
    EXPECT_EQ(t.apply({{"user", "hi"}}, weather_tools()).find("<|im_start|>system\n" + block + "<|im_end|>\n"), 0u);
  }
  const std::string block = generic_tools_prompt(weather_tools());
  EXPECT_NE(block.find("{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""), std::string::npos) << block;
  EXPECT_NE(block.find("<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"),
            std::string::npos);
  // Families that need alternating roles still render: tool results are a user turn.
  ChatTemplate mistral = select_chat_template("mistral", "", "<s>", "</s>");
  std::vector<ChatMessage> conv = tool_conversation();
  conv.push_back({"assistant", "It is 21 degrees."});
  conv.push_back({"user", "Thanks"});
  EXPECT_NO_THROW(mistral.apply(conv, weather_tools()));
  // A user message straight after the results joins their turn.
  std::vector<ChatMessage> direct = tool_conversation();
  direct.push_back({"user", "And tomorrow?"});
  const std::string out = mistral.apply(direct, weather_tools());
  EXPECT_NE(out.find("<tool_response>\n{\"temp\": 21}\n</tool_response>\n\nAnd tomorrow? [/INST]"), std::string::npos) << out;
}

TEST(ToolGrammar, UserGrammarThatDoesNotParseIsA400) {
  const OpenAiRequest r =
      parse_openai_request(R"({"messages":[{"role":"user","content":"x"}],"grammar":"root ::= (\"a\""})", ApiKind::Chat);
  try {
    request_grammar(r, ToolFormat::Hermes);
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "grammar");
  }
  const OpenAiRequest ok = parse_openai_request(
      R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"parallel_tool_calls":false})",
      ApiKind::Chat);
  const ToolParserOptions o = tool_parser_options(ok);
  EXPECT_EQ(o.tool_names, std::vector<std::string>{"f"});
  EXPECT_FALSE(o.parallel);
}

TEST(ToolRequests, MutatedToolRequestsParseOrGet400AndRender) {
  // Tool-bearing requests, mutated: each parses or is refused with a 400; what parses renders
  // through a template that shows tools and through the generic scheme (400 or a prompt).
  const std::string seed = R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":"Weather?"},)"
                           R"({"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",)"
                           R"("function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"n\":[1,{}]}"}}]},)"
                           R"({"role":"tool","tool_call_id":"call_1","content":"21"}],"tools":[{"type":"function",)"
                           R"("function":{"name":"get_weather","description":"d","parameters":{"type":"object",)"
                           R"("properties":{"city":{"type":"string"}},"required":["city"]}}}],"tool_choice":"auto",)"
                           R"("parallel_tool_calls":true,"response_format":{"type":"text"}})";
  const ChatTemplate hermes = select_chat_template("", kHermesJinja, "<s>", "</s>");
  const ChatTemplate generic = select_chat_template("gemma", "", "<s>", "</s>");
  const std::string alphabet = "{}[]\":,0123456789abcnrtu \\-.";
  std::mt19937_64 rng(11);
  int parsed = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string body = seed;
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % body.size();
      switch (rng() % 3) {
        case 0: body[pos] = alphabet[rng() % alphabet.size()]; break;
        case 1: body.erase(pos, 1 + rng() % 8); break;
        default: body.insert(pos, 1, alphabet[rng() % alphabet.size()]);
      }
    }
    try {
      const OpenAiRequest r = parse_openai_request(body, ApiKind::Chat);
      ++parsed;
      for (const ChatTemplate* t : {&hermes, &generic}) {
        try {
          (void)t->apply(r.messages, r.tools);
        } catch (const ApiError& e) {
          EXPECT_EQ(e.status(), 400) << body << ": " << e.what();
        }
      }
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << body;
    }
  }
  EXPECT_GT(parsed, 100);  // the mutations reach the tool fields' checks, not only the JSON's
  // Arguments nested deeper than the body may be (JSON text inside a string escapes the body's
  // pre-scan): refused, not walked.
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  try {
    parse_openai_request(R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"c",)"
                         R"("function":{"name":"f","arguments":"{\"a\":)" + deep + R"(}"}}]}]})",
                         ApiKind::Chat);
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "messages[1].tool_calls[0].function.arguments");
  }
  // The same depth in a generated call is text, not a call.
  const ToolParseResult r = parse_tool_calls(
      ToolFormat::Hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": " + deep + "}}</tool_call>", opts({}));
  EXPECT_TRUE(r.calls.empty());
}
