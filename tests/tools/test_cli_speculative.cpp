// `tern run --lookup N` / `--draft FILE`: speculative decoding as a user runs it. Greedy output
// is plain greedy's, the JSON report carries the speculative metrics, and each bad flag is one
// clear error naming it, with a non-zero exit.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_cli_speculative {
namespace {

using tern::testing::run_command;
using tern::testing::shared_path;

const std::string kTern = TERN_BINARY;

std::string stories260k() { return shared_path("models/stories260K.gguf"); }
std::string tern_stories() { return std::string(TERN_SOURCE_DIR) + "/models/tern-stories.gguf"; }

const std::string kPrompt =
    "\"Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, Lily "
    "saw a big red ball.\"";

nlohmann::json run_json(const std::string& args) {
  std::string out, err;
  const int rc = run_command(kTern + " run " + args + " --json", &out, &err);
  EXPECT_EQ(rc, 0) << err;
  return rc == 0 ? nlohmann::json::parse(out) : nlohmann::json::object();
}

// Runs `tern run ARGS`, expects it to fail, and returns stderr.
std::string run_error(const std::string& args) {
  std::string out, err;
  const int rc = run_command(kTern + " run " + args, &out, &err);
  EXPECT_NE(rc, 0) << args << ": " << out;
  return err;
}

void expect_speculative_metrics(const nlohmann::json& j, const std::string& draft) {
  const auto& m = j["metrics"];
  EXPECT_EQ(m["draft"], draft);
  for (const char* k : {"acceptance_rate", "accepted_per_step", "n_drafted", "n_accepted", "n_target_steps", "draft_ms"})
    EXPECT_TRUE(m.contains(k)) << k;
  EXPECT_GT(m["n_drafted"].get<int64_t>(), 0);
  EXPECT_GT(m["n_accepted"].get<int64_t>(), 0);
  EXPECT_LE(m["n_accepted"].get<int64_t>(), m["n_drafted"].get<int64_t>());
  EXPECT_GT(m["acceptance_rate"].get<double>(), 0.0);
  EXPECT_GT(m["accepted_per_step"].get<double>(), 1.0);
}

TEST(CliSpeculative, LookupGivesPlainGreedyIds) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string args = "-m " + stories260k() + " -p " + kPrompt + " -n 96 --temp 0 -t 2 --ctx 256";
  const auto plain = run_json(args);
  EXPECT_EQ(plain["metrics"]["draft"], "none");
  EXPECT_EQ(plain["metrics"]["n_drafted"], 0);
  EXPECT_EQ(plain["metrics"]["accepted_per_step"], 1.0);
  const auto lookup = run_json(args + " --lookup 3");
  ASSERT_EQ(lookup["ids"].size(), 96u);
  EXPECT_EQ(lookup["ids"], plain["ids"]);
  EXPECT_EQ(lookup["text"], plain["text"]);
  expect_speculative_metrics(lookup, "lookup");
  // A fixed draft length and other bounds: the same ids.
  EXPECT_EQ(run_json(args + " --lookup 2 --draft-max 3 --draft-min 2 --draft-fixed")["ids"], plain["ids"]);
  // --lookup 0 is off (tools/spec_args.h, shared with serve and bench).
  EXPECT_EQ(run_json(args + " --lookup 0")["metrics"]["draft"], "none");
}

TEST(CliSpeculative, DraftModelGivesPlainGreedyIds) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string args = "-m " + tern_stories() + " -p " + kPrompt + " -n 96 --temp 0 -t 2";
  const auto plain = run_json(args);
  const auto draft = run_json(args + " --draft " + stories260k());
  EXPECT_EQ(draft["ids"], plain["ids"]);
  expect_speculative_metrics(draft, "draft");
}

// Self-speculation: the model's own weights requantized in memory draft for it.
TEST(CliSpeculative, SelfDraftGivesPlainGreedyIds) {
  const std::string args = "-m " + tern_stories() + " -p " + kPrompt + " -n 96 --temp 0 -t 2";
  const auto plain = run_json(args);
  for (const char* type : {"q4_0", "q4_k"}) {
    const auto self = run_json(args + " --draft-self " + type);
    EXPECT_EQ(self["ids"], plain["ids"]) << type;
    expect_speculative_metrics(self, "draft");
  }
}

TEST(CliSpeculative, ReportLineSummarisesSpeculation) {
  std::string out, err;
  ASSERT_EQ(run_command(kTern + " run -m " + tern_stories() + " -p " + kPrompt + " -n 32 --temp 0 -t 2 --lookup 3", &out,
                        &err),
            0)
      << err;
  EXPECT_NE(err.find("speculative (lookup)"), std::string::npos) << err;
  EXPECT_NE(err.find("drafts accepted"), std::string::npos) << err;
  ASSERT_EQ(run_command(kTern + " run -m " + tern_stories() + " -p " + kPrompt + " -n 8 --temp 0 -t 2", &out, &err), 0);
  EXPECT_EQ(err.find("speculative"), std::string::npos) << err;
}

TEST(CliSpeculative, BadFlagsAreErrorsNamingTheFlag) {
  const std::string m = "-m " + tern_stories() + " -p hi -n 4 ";
  struct Case {
    std::string args, must_name;
  };
  const Case cases[] = {
      {"--lookup -1", "--lookup"},
      {"--lookup 17", "--lookup"},
      {"--lookup 3 --draft-max 0", "--draft-max"},
      {"--lookup 3 --draft-max 33", "--draft-max"},
      {"--lookup 3 --draft-min -1", "--draft-min"},
      {"--lookup 3 --draft-min 9", "--draft-min"},  // above the default --draft-max 8
      {"--lookup 3 --draft " + tern_stories(), "--lookup"},
      {"--draft-max 4", "--draft-max"},  // no drafter
      {"--draft-fixed", "--draft-fixed"},
      {"--draft /nonexistent/draft.gguf", "/nonexistent/draft.gguf"},
      {"--lookup 3 -i", "not for -i"},
      {"--draft-self q9_9", "--draft-self"},
      {"--draft-self q4_0 --lookup 2", "--draft-self"},
  };
  for (const Case& c : cases) {
    const std::string err = run_error(m + c.args);
    EXPECT_NE(err.find(c.must_name), std::string::npos) << c.args << ": " << err;
  }
}

TEST(CliSpeculative, LlamaCBinDraftIsRefused) {
  const std::string bin = ::testing::TempDir() + "/draft_model.bin";
  std::ofstream(bin) << "not a checkpoint";
  const std::string err = run_error("-m " + tern_stories() + " -p hi -n 4 --draft " + bin);
  EXPECT_NE(err.find("--draft"), std::string::npos) << err;
  EXPECT_NE(err.find("llama2.c"), std::string::npos) << err;
}

// A draft with another vocabulary is refused before anything is generated, naming both files.
TEST(CliSpeculative, DraftWithAnotherVocabularyNamesBothFiles) {
  TERN_REQUIRE_SHARED("models/llama-2-tiny-random.gguf");
  const std::string other = shared_path("models/llama-2-tiny-random.gguf");
  const std::string err = run_error("-m " + tern_stories() + " -p hi -n 4 --draft " + other);
  EXPECT_NE(err.find(other), std::string::npos) << err;
  EXPECT_NE(err.find(tern_stories()), std::string::npos) << err;
}

}  // namespace
}  // namespace tern::test_cli_speculative
