// The default model that ships in the repository (models/tern-stories.gguf, made by
// scripts/train-default-model.sh): its size, that it writes readable text, and, with ../shared,
// its perplexity against its teacher stories260K (issue #17: within 10% of it).
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

std::string default_model() { return std::string(TERN_SOURCE_DIR) + "/models/tern-stories.gguf"; }

TEST(DefaultModel, FitsInFourMebibytesAndIsTheOnlyModelFile) {
  ASSERT_TRUE(fs::exists(default_model())) << default_model();
  EXPECT_LE(fs::file_size(default_model()), 4u * 1024 * 1024);
  for (const auto& e : fs::directory_iterator(std::string(TERN_SOURCE_DIR) + "/models")) {
    if (e.path().extension() == ".gguf") {
      EXPECT_EQ(e.path(), fs::path(default_model()));
    }
  }
}

// Readable: words of letters with ordinary punctuation, as a story has (a model with random
// weights writes byte tokens and fragments: this fails for it).
TEST(DefaultModel, WritesReadableText) {
  std::string out, err;
  ASSERT_EQ(testing::run_command(std::string(TERN_BINARY) + " run -m " + default_model() +
                                     " -p 'Once upon a time' -n 120 --temp 0 --json -t 2", &out, &err), 0) << err;
  const std::string text = nlohmann::json::parse(out).at("text").get<std::string>();
  int64_t words = 0, plain_words = 0, odd_chars = 0;
  std::istringstream in(text);
  for (std::string w; in >> w;) {
    ++words;
    std::string core;
    for (char c : w)
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '\'') core += c;
    if (!core.empty() && core.size() + 3 >= w.size() && core.size() <= 14) ++plain_words;
  }
  for (unsigned char c : text)
    if (!(std::isalnum(c) || std::isspace(c) || std::string(".,!?'\"-:;").find(char(c)) != std::string::npos)) ++odd_chars;
  EXPECT_GE(words, 60) << text;
  EXPECT_GE(double(plain_words), 0.95 * double(words)) << text;
  EXPECT_LE(odd_chars, 2) << text;
}

double ppl_of(const std::string& model, const std::string& text, int64_t chunks) {
  std::string out, err;
  const int rc = testing::run_command(std::string(TERN_BINARY) + " ppl -m " + model + " -f " + text +
                                          " --ctx 256 --chunks " + std::to_string(chunks) + " --json -t 2", &out, &err);
  EXPECT_EQ(rc, 0) << err;
  return rc == 0 ? nlohmann::json::parse(out).at("ppl").get<double>() : 0.0;
}

TEST(DefaultModel, PerplexityIsWithinTenPercentOfItsTeacher) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  TERN_REQUIRE_SHARED("data/tinystories/tinystories_val.txt");
  const std::string val = testing::shared_path("data/tinystories/tinystories_val.txt");
  // Of 1535: a quarter of the file keeps the test short. Under AddressSanitizer the ppl child
  // runs ~40x slower (163 s in CI's sanitizer stage): 40 chunks still check the margin there
  // (default model 4.037 against stories260K's 3.823 on them: 1.056x).
#if defined(__SANITIZE_ADDRESS__)
  const int64_t chunks = 40;
#else
  const int64_t chunks = 400;
#endif
  const double teacher = ppl_of(testing::shared_path("models/stories260K.gguf"), val, chunks);
  const double ours = ppl_of(default_model(), val, chunks);
  RecordProperty("teacher_ppl", std::to_string(teacher));
  RecordProperty("default_model_ppl", std::to_string(ours));
  EXPECT_LE(ours, 1.10 * teacher) << "default model PPL " << ours << ", stories260K " << teacher;
}

}  // namespace
}  // namespace tern
