// tern eval (base-model replacement): the answer metrics against hand-computed values, the
// suite file's validation (every missing or mistyped field is an error naming the suite and the
// scenario), the gate's rules, and the command end to end on two real bases (adapters trained,
// reused or refused, the three-way report, the exit status of a failed gate, the chart).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tools/eval_suite.h"
#include "tools/text_metrics.h"
#include "test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_eval {
namespace {

using nlohmann::json;
using tern::testing::make_temp_dir;
using tern::testing::remove_temp_dir;
using tern::testing::run_command;

const std::string kTern = TERN_BINARY;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

// ---- metrics ----

TEST(EvalMetrics, NormalizationIsSquads) {
  EXPECT_EQ(normalize_answer("  The Cat, sat on  a MAT!  "), "cat sat on mat");
  EXPECT_EQ(normalize_answer("Don't stop."), "dont stop");
  EXPECT_EQ(normalize_answer(""), "");
  EXPECT_EQ(normalize_answer("the a an"), "");
}

TEST(EvalMetrics, ExactMatchAndTokenF1) {
  EXPECT_EQ(exact_match("The cat sat.", "cat sat"), 1.0);
  EXPECT_EQ(exact_match("The cat sat.", "cat sat down"), 0.0);
  EXPECT_DOUBLE_EQ(token_f1("a cat sat on the mat", "the cat sat on the mat"), 1.0);
  // common 1 of 2 generated, 1 of 3 reference: P 1/2, R 1/3, F1 = 2 PR / (P + R) = 0.4.
  EXPECT_NEAR(token_f1("cat dog", "cat bird fish"), 0.4, 1e-12);
  // Repeated words count as often as both sides have them: common "cat" x1 of 3 and of 1.
  EXPECT_NEAR(token_f1("cat cat cat", "cat"), 2.0 * (1.0 / 3.0) * 1.0 / (1.0 / 3.0 + 1.0), 1e-12);
  EXPECT_EQ(token_f1("", ""), 1.0);
  EXPECT_EQ(token_f1("cat", ""), 0.0);
  EXPECT_EQ(token_f1("dog", "cat"), 0.0);
}

TEST(EvalMetrics, RougeLIsTheLcsFMeasure) {
  EXPECT_DOUBLE_EQ(rouge_l("the cat sat on the mat", "the cat sat on the mat"), 1.0);
  // words g = [police killed gunman], r = [gunman killed police]: LCS 1 -> P = R = 1/3.
  EXPECT_NEAR(rouge_l("police killed the gunman", "the gunman killed police"), 1.0 / 3.0, 1e-12);
  // g = [a b c d e] (letters are not articles except a: use x), r = [x b d e y]: LCS b d e = 3,
  // P 3/5, R 3/5.
  EXPECT_NEAR(rouge_l("x b c d e", "x2 b d e y"), 0.6, 1e-12);
  // Order matters for ROUGE-L but not for token F1.
  EXPECT_DOUBLE_EQ(token_f1("one two three", "three two one"), 1.0);
  EXPECT_NEAR(rouge_l("one two three", "three two one"), 1.0 / 3.0, 1e-12);
  EXPECT_EQ(rouge_l("", ""), 1.0);
  EXPECT_EQ(rouge_l("", "cat"), 0.0);
}

TEST(EvalMetrics, Checks) {
  TextCheck c{"bird", TextCheck::Kind::Contains, "Bird", true};
  EXPECT_TRUE(check_passes(c, "a little bird sang"));
  c.ignore_case = false;
  EXPECT_FALSE(check_passes(c, "a little bird sang"));
  TextCheck nc{"nl", TextCheck::Kind::NotContains, "\n", true};
  EXPECT_TRUE(check_passes(nc, "one line"));
  EXPECT_FALSE(check_passes(nc, "two\nlines"));
  TextCheck sw{"open", TextCheck::Kind::StartsWith, "long ago", true};
  EXPECT_TRUE(check_passes(sw, "  Long ago and far away"));
  EXPECT_FALSE(check_passes(sw, "Once, long ago"));
  TextCheck re{"re", TextCheck::Kind::Regex, "\\bbirds?\\b", true};
  EXPECT_TRUE(check_passes(re, "Two Birds flew"));
  EXPECT_FALSE(check_passes(re, "a birdhouse"));
  TextCheck bad{"broken", TextCheck::Kind::Regex, "(unclosed", true};
  try {
    validate_check(bad, "suite s.json: scenario \"x\"");
    FAIL() << "a regex that does not compile was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("broken"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("does not compile"), std::string::npos) << e.what();
  }
}

// ---- the suite file ----

struct SuiteDir {
  std::string dir = make_temp_dir("tern_eval_suite");
  ~SuiteDir() { remove_temp_dir(dir); }
  std::string path(const std::string& name) const { return dir + "/" + name; }
  SuiteDir() {
    write_text(path("train.txt"), "Once upon a time, there was a bird.\n\nThe bird sang.\n");
    write_text(path("eval.jsonl"), "{\"prompt\": \"Once upon a time,\", \"reference\": \" there was a bird.\"}\n\n"
                                   "{\"prompt\": \"The bird\", \"reference\": \" sang.\"}\n");
  }
  json scenario() const {
    return json{{"name", "birds"},
                {"train", "train.txt"},
                {"recipe", {{"rank", 4}, {"steps", 3}}},
                {"online_adapter", "birds.online.gguf"},
                {"eval", "eval.jsonl"}};
  }
  // Loads a suite with `scenario` (after edit) and returns the error text ("" when it loads).
  std::string error_of(const json& suite) const {
    write_text(path("suite.json"), suite.dump());
    try {
      load_eval_suite(path("suite.json"));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

TEST(EvalSuite, LoadsAndResolvesPathsAgainstTheSuitesFolder) {
  SuiteDir d;
  json sc = d.scenario();
  sc["checks"] = json::array({{{"name", "bird"}, {"contains", "bird"}}});
  sc["thresholds"] = {{"ppl", {{"max", 50}}}, {"check:bird", {{"min", 0.5}}}};
  sc["production"] = {{"ppl", 4.5}, {"rouge_l", 0.3}};
  sc["max_regression"] = {{"ppl", 0.02}};
  const json suite = {{"name", "s"}, {"defaults", {{"recipe", {{"lr", 0.001}, {"steps", 10}}}, {"max_regression", 0.1}}},
                      {"scenarios", json::array({sc})}};
  ASSERT_EQ(d.error_of(suite), "");
  const EvalSuite s = load_eval_suite(d.path("suite.json"));
  ASSERT_EQ(s.scenarios.size(), 1u);
  const EvalScenario& e = s.scenarios[0];
  EXPECT_EQ(e.train, d.path("train.txt"));
  EXPECT_EQ(e.online_adapter, d.path("birds.online.gguf"));
  ASSERT_EQ(e.items.size(), 2u);
  EXPECT_EQ(e.items[1].reference, " sang.");
  EXPECT_EQ(e.recipe["steps"], 3);      // the scenario's over the defaults'
  EXPECT_EQ(e.recipe["lr"], 0.001);     // the defaults' kept
  EXPECT_DOUBLE_EQ(e.tolerance("ppl"), 0.02);
  EXPECT_DOUBLE_EQ(e.tolerance("rouge_l"), 0.1);
  EXPECT_EQ(e.metric_names().back(), "check:bird");
  const std::vector<std::string> args = recipe_arguments(e.recipe, "x");
  const std::vector<std::string> want = {"--lr", "0.001", "--rank", "4", "--steps", "3"};
  EXPECT_EQ(args, want);
}

TEST(EvalSuite, EveryMissingOrWrongFieldIsAClearError) {
  SuiteDir d;
  auto with = [&](const std::function<void(json&)>& edit) {
    json sc = d.scenario();
    edit(sc);
    return d.error_of(json{{"scenarios", json::array({sc})}});
  };
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"no eval", [](json& s) { s.erase("eval"); }, "missing field \"eval\""},
      {"no train", [](json& s) { s.erase("train"); }, "missing field \"train\""},
      {"no online adapter", [](json& s) { s.erase("online_adapter"); }, "missing field \"online_adapter\""},
      {"no recipe", [](json& s) { s.erase("recipe"); }, "missing field \"recipe\""},
      {"no steps", [](json& s) { s["recipe"].erase("steps"); }, "no \"steps\""},
      {"unknown recipe key", [](json& s) { s["recipe"]["rnak"] = 4; }, "unknown recipe key \"rnak\""},
      {"rank as text", [](json& s) { s["recipe"]["rank"] = "8"; }, "recipe.rank must be an integer"},
      {"unknown field", [](json& s) { s["thresholdz"] = json::object(); }, "unknown field \"thresholdz\""},
      {"unknown metric", [](json& s) { s["thresholds"] = {{"bleu", {{"min", 1}}}}; }, "unknown metric \"bleu\""},
      {"threshold without bound", [](json& s) { s["thresholds"] = {{"ppl", json::object()}}; }, "neither"},
      {"missing train file", [](json& s) { s["train"] = "nope.txt"; }, "does not exist"},
      {"missing eval file", [](json& s) { s["eval"] = "nope.jsonl"; }, "\"eval\" file"},
      {"bad name", [](json& s) { s["name"] = "../x"; }, "must be letters"},
      {"check of two kinds", [](json& s) { s["checks"] = json::array({{{"name", "c"}, {"contains", "a"}, {"regex", "b"}}}); },
       "exactly one"},
      {"negative tolerance", [](json& s) { s["max_regression"] = -0.1; }, "must not be negative"},
  };
  for (const Case& c : cases) {
    const std::string err = with(c.edit);
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.what << ": " << err;
    EXPECT_NE(err.find(d.path("suite.json")), std::string::npos) << c.what << " names no suite file: " << err;
    if (std::string(c.what) != "bad name") {
      EXPECT_NE(err.find("birds"), std::string::npos) << c.what << " names no scenario: " << err;
    }
  }
  EXPECT_NE(d.error_of(json::object()).find("missing field \"scenarios\""), std::string::npos);
  EXPECT_NE(d.error_of(json{{"scenarios", json::array()}}).find("non-empty"), std::string::npos);
  write_text(d.path("eval.jsonl"), "{\"prompt\": \"x\"}\n");
  const std::string err = with([](json&) {});
  EXPECT_NE(err.find("eval.jsonl:1"), std::string::npos) << err;
  EXPECT_NE(err.find("missing field \"reference\""), std::string::npos) << err;
  write_text(d.path("suite.json"), "{not json");
  try {
    load_eval_suite(d.path("suite.json"));
    FAIL() << "malformed JSON accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not JSON"), std::string::npos) << e.what();
  }
}

// ---- the gate ----

TEST(EvalGate, ThresholdsOnlineAndProduction) {
  EvalScenario sc;
  sc.name = "s";
  sc.thresholds["rouge_l"].min = 0.2;
  sc.max_regression["*"] = 0.05;
  sc.production = {{"ppl", 4.0}};
  // ppl: lower is better; 4.1 <= 4.0 * 1.05 and <= 4.0 * 1.05 (online 4.0): pass.
  GateVerdict v = gate_scenario(sc, {{"ppl", 4.0}, {"rouge_l", 0.30}}, {{"ppl", 4.1}, {"rouge_l", 0.29}});
  EXPECT_TRUE(v.pass);
  EXPECT_EQ(v.row_verdict("ppl"), "pass");
  EXPECT_EQ(v.row_verdict("token_f1"), "-");
  // 4.3 > 4.2: fails against online and production; rouge_l 0.28 < 0.30 * 0.95 = 0.285 fails.
  v = gate_scenario(sc, {{"ppl", 4.0}, {"rouge_l", 0.30}}, {{"ppl", 4.3}, {"rouge_l", 0.28}});
  EXPECT_FALSE(v.pass);
  EXPECT_EQ(v.row_verdict("ppl"), "FAIL");
  EXPECT_EQ(v.row_verdict("rouge_l"), "FAIL");
  EXPECT_EQ(v.failures.size(), 3u);
  // A threshold alone can fail a candidate better than the online base.
  v = gate_scenario(sc, {{"rouge_l", 0.10}}, {{"rouge_l", 0.15}});
  EXPECT_FALSE(v.pass);
  ASSERT_EQ(v.failures.size(), 1u);
  EXPECT_NE(v.failures[0].find("threshold"), std::string::npos) << v.failures[0];
}

// ---- the command ----

struct CliSuite {
  std::string dir = make_temp_dir("tern_eval_cli");
  ~CliSuite() { remove_temp_dir(dir); }
  std::string path(const std::string& name) const { return dir + "/" + name; }
  void write(const json& thresholds) const {
    write_text(path("train.jsonl"),
               "{\"prompt\": \"Title: Sam\\n\", \"completion\": \"Long ago and far away, there was a boy named Sam.\"}\n"
               "{\"prompt\": \"Title: Mia\\n\", \"completion\": \"Long ago and far away, there was a girl named Mia.\"}\n");
    write_text(path("eval.jsonl"),
               "{\"prompt\": \"Title: Tom\\n\", \"reference\": \"Long ago and far away, there was a cat named Tom.\"}\n"
               "{\"prompt\": \"Title: Sue\\n\", \"reference\": \"Long ago and far away, there was a bird named Sue.\"}\n");
    const json suite = {
        {"name", "cli"},
        {"scenarios", json::array({{{"name", "opening"},
                                    {"train", "train.jsonl"},
                                    {"recipe", {{"rank", 2}, {"steps", 3}, {"batch", 2}, {"ctx", 32}, {"seed", 1}}},
                                    {"online_adapter", "opening.online.gguf"},
                                    {"eval", "eval.jsonl"},
                                    {"checks", json::array({{{"name", "formula"}, {"starts_with", "Long ago"}}})},
                                    {"thresholds", thresholds},
                                    {"max_regression", 100.0}}})}};
    write_text(path("suite.json"), suite.dump(2));
  }
};

const std::string kCandidate = std::string(TERN_SOURCE_DIR) + "/models/tern-stories.gguf";

TEST(EvalCli, TrainsEvaluatesReusesAndGates) {
  CliSuite s;
  s.write(json{{"ppl", {{"max", 1e9}}}});
  const std::string online = tern::testing::real_model_path();
  const std::string base_args = kTern + " eval --suite " + s.path("suite.json") + " --online-base " + online +
                                " --candidate-base " + kCandidate + " --work " + s.path("work") + " -q -t 2";
  std::string out, err;
  int rc = run_command(base_args + " --json --show-bases --svg " + s.path("chart.svg"), &out, &err);
  ASSERT_EQ(rc, 0) << err;
  const json j = json::parse(out);
  EXPECT_TRUE(j["pass"].get<bool>());
  ASSERT_EQ(j["scenarios"].size(), 1u);
  const json& sc = j["scenarios"][0];
  EXPECT_TRUE(sc["online_adapter"]["trained"].get<bool>()) << "the missing online adapter is trained";
  EXPECT_TRUE(sc["candidate_adapter"]["trained"].get<bool>());
  EXPECT_TRUE(std::filesystem::exists(s.path("opening.online.gguf")));
  EXPECT_TRUE(std::filesystem::exists(s.path("work/opening.tern-stories.gguf")));
  for (const char* side : {"online", "candidate", "online_base", "candidate_base"}) {
    const json& m = sc["metrics"][side];
    ASSERT_TRUE(m.contains("ppl")) << side;
    const double ppl = m["ppl"].get<double>();
    EXPECT_TRUE(std::isfinite(ppl) && ppl > 1.0) << side << " ppl " << ppl;
    for (const char* rate : {"exact_match", "token_f1", "rouge_l", "check:formula"}) {
      const double v = m[rate].get<double>();
      EXPECT_TRUE(v >= 0.0 && v <= 1.0) << side << " " << rate << " " << v;
    }
  }
  // The adapters change the model: with them the references' perplexity differs from the base's.
  EXPECT_NE(sc["metrics"]["candidate"]["ppl"].get<double>(), sc["metrics"]["candidate_base"]["ppl"].get<double>());
  ASSERT_EQ(sc["samples"].size(), 2u);
  const std::string svg = tern::testing::read_file_bytes(s.path("chart.svg"));
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("opening"), std::string::npos);

  // The candidate's adapter exists now: neither --reuse nor --retrain is an error.
  rc = run_command(base_args, &out, &err);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("--reuse"), std::string::npos) << err;

  // Reused, and a threshold no model meets: the gate fails with status 3 and says why.
  s.write(json{{"rouge_l", {{"min", 1.5}}}});
  rc = run_command(base_args + " --reuse", &out, &err);
  EXPECT_EQ(rc, 3) << out << err;
  EXPECT_NE(out.find("(reused)"), std::string::npos) << out;
  EXPECT_NE(out.find("FAIL"), std::string::npos) << out;
  EXPECT_NE(out.find("gate: FAIL"), std::string::npos) << out;
  EXPECT_NE(out.find("threshold min"), std::string::npos) << out;
}

TEST(EvalCli, ExactMatchOfTheModelsOwnGreedyAnswer) {
  // The reference is what `tern run` generates greedily for the prompt: the base evaluated
  // alone (--show-bases) must reproduce it exactly (exact match 1, ROUGE-L 1).
  CliSuite s;
  s.write(json::object());
  std::string out, err;
  const std::string prompt = "Once upon a time, there was a little bird";
  int rc = run_command(kTern + " run -m " + kCandidate + " -p '" + prompt + "' -n 12 --temp 0 --kv-type f32 -t 2 --json",
                       &out, &err);
  ASSERT_EQ(rc, 0) << err;
  const std::string reference = json::parse(out)["text"].get<std::string>();
  ASSERT_FALSE(reference.empty());
  write_text(s.path("eval.jsonl"), json{{"prompt", prompt}, {"reference", reference}}.dump() + "\n");
  rc = run_command(kTern + " eval --suite " + s.path("suite.json") + " --online-base " + kCandidate +
                       " --candidate-base " + kCandidate + " --work " + s.path("work") + " -q -t 2 --json --show-bases",
                   &out, &err);
  ASSERT_EQ(rc, 0) << err;
  const json m = json::parse(out)["scenarios"][0]["metrics"]["candidate_base"];
  EXPECT_EQ(m["exact_match"].get<double>(), 1.0) << "reference: " << reference << "\n" << out;
  EXPECT_EQ(m["rouge_l"].get<double>(), 1.0);
}

TEST(EvalCli, BadArgumentsAreClearErrors) {
  CliSuite s;
  s.write(json::object());
  std::string out, err;
  EXPECT_EQ(run_command(kTern + " eval --suite " + s.path("suite.json") + " --online-base /nonexistent.gguf --candidate-base " +
                            kCandidate,
                        &out, &err),
            1);
  EXPECT_NE(err.find("/nonexistent.gguf"), std::string::npos) << err;
  EXPECT_EQ(run_command(kTern + " eval --suite " + s.path("nope.json") + " --online-base " + kCandidate +
                            " --candidate-base " + kCandidate,
                        &out, &err),
            1);
  EXPECT_NE(err.find("nope.json"), std::string::npos) << err;
  EXPECT_EQ(run_command(kTern + " eval --suite " + s.path("suite.json") + " --online-base " + kCandidate +
                            " --candidate-base " + kCandidate + " --scenario ghost --work " + s.path("w"),
                        &out, &err),
            1);
  EXPECT_NE(err.find("ghost"), std::string::npos) << err;
  EXPECT_EQ(run_command(kTern + " eval --suite " + s.path("suite.json") + " --online-base " + kCandidate +
                            " --candidate-base " + kCandidate + " --reuse --retrain",
                        &out, &err),
            1);
  // Outputs: --work that is a file, a chart over an input or onto a folder.
  const std::string common = kTern + " eval --suite " + s.path("suite.json") + " --online-base " + kCandidate +
                             " --candidate-base " + kCandidate + " -q -t 2";
  EXPECT_EQ(run_command(common + " --work " + s.path("train.jsonl"), &out, &err), 1);
  EXPECT_NE(err.find("is not a folder"), std::string::npos) << err;
  const std::string suite_before = tern::testing::read_file_bytes(s.path("suite.json"));
  EXPECT_EQ(run_command(common + " --work " + s.path("w1") + " --svg " + s.path("suite.json"), &out, &err), 1);
  EXPECT_EQ(tern::testing::read_file_bytes(s.path("suite.json")), suite_before) << "the suite was overwritten";
  EXPECT_EQ(run_command(common + " --work " + s.path("w1") + " --svg " + s.dir, &out, &err), 1);
  EXPECT_FALSE(err.empty());
  // An online adapter made for another base is refused, naming the scenario.
  write_text(s.path("opening.online.gguf"), "not a gguf file at all");
  EXPECT_EQ(run_command(kTern + " eval --suite " + s.path("suite.json") + " --online-base " + kCandidate +
                            " --candidate-base " + kCandidate + " -q -t 2 --work " + s.path("w2"),
                        &out, &err),
            1);
  EXPECT_NE(err.find("opening"), std::string::npos) << err;
  EXPECT_NE(err.find("opening.online.gguf"), std::string::npos) << err;
}

}  // namespace
}  // namespace tern::test_eval
