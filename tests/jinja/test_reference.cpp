// tern's Jinja engine against reference renderings of real chat templates: the JSON that
// tests/jinja/js/run.sh writes (transformers.js, or Python's Jinja2 where transformers.js
// cannot parse the template), named by $TERN_JINJA_REFERENCE. Every case must render to the
// same bytes. Skipped when the variable is unset (CTest runs it through run.sh).
//
// Tool-calling cases (those with an `openai` request: tools, tool_calls, tool messages) are
// rendered a second way too: the request through the server's parser and ChatTemplate (what
// `tern serve` sends the model), which must give the reference's bytes less the BOS text the
// tokenizer adds.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>

#include "jinja/template.h"
#include "server/chat_template.h"
#include "server/openai_request.h"

using namespace tern::jinja;

namespace {

// The case's OpenAI request through the server: parse_openai_json, then ChatTemplate::apply
// (which always adds the generation prompt, and leaves a leading BOS text to the tokenizer).
std::string render_as_server(const nlohmann::ordered_json& c) {
  nlohmann::ordered_json body = c.at("openai");
  const auto req = tern::server::parse_openai_json(body, tern::server::ApiKind::Chat);
  tern::server::ChatTemplate t;
  t.jinja = std::make_shared<const Template>(Template::parse(c.at("template").get<std::string>()));
  t.jinja_tools = true;
  const auto& vars = c.at("vars");
  t.bos_text = vars.value("bos_token", "");
  t.eos_text = vars.value("eos_token", "");
  return t.apply(req.messages, req.tools);
}

}  // namespace

TEST(JinjaReference, MatchesReference) {
  const char* path = std::getenv("TERN_JINJA_REFERENCE");
  if (!path || !*path) GTEST_SKIP() << "TERN_JINJA_REFERENCE is not set (tests/jinja/js/run.sh sets it)";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const auto doc = nlohmann::ordered_json::parse(in);
  std::map<std::string, std::pair<int, int>> per_template;  // name -> (identical, compared)
  int compared = 0, compared_server = 0;
  for (const auto& c : doc.at("cases")) {
    const std::string name = c.at("name");
    const std::string tmpl_name = name.substr(0, name.find('/'));
    if (c.at("expected").is_null()) {  // transformers.js cannot parse it and python3-jinja2 is absent
      std::printf("  not compared (no reference rendering): %s\n", name.c_str());
      continue;
    }
    const std::string expected = c.at("expected");
    const Value vars = from_json(c.at("vars"), /*mark=*/true);
    std::string got;
    try {
      got = Template::parse(c.at("template").get<std::string>()).render(vars.obj()).str();
    } catch (const TemplateError& e) {
      ADD_FAILURE() << name << ": " << e.what();
      continue;
    }
    auto& [same, total] = per_template[tmpl_name + " (" + c.value("reference", "?") + ")"];
    ++total;
    ++compared;
    if (c.contains("openai") && c.at("vars").at("add_generation_prompt").get<bool>()) {
      std::string want = expected;
      const std::string bos = c.at("vars").value("bos_token", "");
      if (!bos.empty() && want.starts_with(bos)) want.erase(0, bos.size());
      std::string server;
      try {
        server = render_as_server(c);
      } catch (const std::exception& e) {
        server = std::string("(threw) ") + e.what();
      }
      ++compared_server;
      EXPECT_EQ(server, want) << name << ": the server's rendering of the OpenAI request";
    }
    if (got == expected) {
      ++same;
      continue;
    }
    size_t i = 0;
    while (i < got.size() && i < expected.size() && got[i] == expected[i]) ++i;
    ADD_FAILURE() << name << ": differs at byte " << i << "\n  tern: " << nlohmann::json(got.substr(i, 80)).dump()
                  << "\n  ref:  " << nlohmann::json(expected.substr(i, 80)).dump();
  }
  for (const auto& [t, st] : per_template)
    std::printf("  %-40s %d/%d byte-identical\n", t.c_str(), st.first, st.second);
  std::printf("  %d tool-calling requests rendered by the server's ChatTemplate\n", compared_server);
  // Which templates render tools themselves, and in which call syntax (the server's choice at
  // start-up): the three with tool support, and none of the others.
  const std::map<std::string, tern::server::ToolFormat> with_tools = {
      {"qwen3", tern::server::ToolFormat::Hermes},
      {"llama-3.1-8b-instruct", tern::server::ToolFormat::Llama3},
      {"mistral-large-2407", tern::server::ToolFormat::Mistral}};
  std::map<std::string, bool> checked;
  for (const auto& c : doc.at("cases")) {
    const std::string name = c.at("name");
    const std::string tmpl_name = name.substr(0, name.find('/'));
    if (checked[tmpl_name]) continue;
    checked[tmpl_name] = true;
    const auto& vars = c.at("vars");
    const auto t = tern::server::select_chat_template("", c.at("template").get<std::string>(), vars.value("bos_token", ""),
                                                      vars.value("eos_token", ""));
    ASSERT_TRUE(t.jinja) << tmpl_name;
    const auto it = with_tools.find(tmpl_name);
    EXPECT_EQ(t.jinja_tools, it != with_tools.end()) << tmpl_name;
    EXPECT_EQ(t.tool_format, it != with_tools.end() ? it->second : tern::server::ToolFormat::Generic) << tmpl_name;
  }
  EXPECT_EQ(checked.size(), 9u);
  EXPECT_GE(compared, 10);
}
