// tern's Jinja engine against reference renderings of real chat templates: the JSON that
// tests/jinja/js/run.sh writes (transformers.js, or Python's Jinja2 where transformers.js
// cannot parse the template), named by $TERN_JINJA_REFERENCE. Every case must render to the
// same bytes. Skipped when the variable is unset (CTest runs it through run.sh).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>

#include "jinja/template.h"

using namespace tern::jinja;

TEST(JinjaReference, MatchesReference) {
  const char* path = std::getenv("TERN_JINJA_REFERENCE");
  if (!path || !*path) GTEST_SKIP() << "TERN_JINJA_REFERENCE is not set (tests/jinja/js/run.sh sets it)";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const auto doc = nlohmann::ordered_json::parse(in);
  std::map<std::string, std::pair<int, int>> per_template;  // name -> (identical, compared)
  int compared = 0;
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
  EXPECT_GE(compared, 10);
}
