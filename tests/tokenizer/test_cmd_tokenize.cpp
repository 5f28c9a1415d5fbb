// `tern tokenize`, run as the built binary on llama.cpp's vocabularies.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "tokenizer_test_util.h"

namespace tern {
namespace {

using test::file_exists;
using test::shared_path;

using test::RunResult;
std::string quote(const std::string& s) { return test::shell_quote(s); }
RunResult run_tern(const std::string& args) { return test::run_tern_args("tokenize " + args, /*merge_stderr=*/false); }

const std::string kSpm = "tokenizer/llama.cpp-vocab/ggml-vocab-llama-spm.gguf";
const std::string kGpt2 = "tokenizer/llama.cpp-vocab/ggml-vocab-gpt-2.gguf";

TEST(CmdTokenize, TextArgument) {
  if (!file_exists(shared_path(kSpm))) GTEST_SKIP() << "missing " << shared_path(kSpm);
  if (!file_exists(shared_path(kGpt2))) GTEST_SKIP() << "missing " << shared_path(kGpt2);
  // Vector cases: " Hello World!" (SPM, without BOS) and "Hello world" (GPT-2, no BOS by default).
  RunResult r = run_tern("-m " + quote(shared_path(kSpm)) + " --no-bos ' Hello World!'");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "29871 15043 2787 29991\n");
  r = run_tern("-m " + quote(shared_path(kSpm)) + " ' Hello World!'");
  EXPECT_EQ(r.out, "1 29871 15043 2787 29991\n");
  r = run_tern("-m " + quote(shared_path(kGpt2)) + " --json 'Hello world'");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "[15496,995]\n");
}

TEST(CmdTokenize, FileBytes) {
  if (!file_exists(shared_path(kSpm))) GTEST_SKIP() << "missing " << shared_path(kSpm);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("tern_tokenize_" + std::to_string(getpid()))).string();
  {
    std::ofstream f(path, std::ios::binary);
    f << "\t\n";  // vector case -> " 29871 12 13"; a file's trailing newline is kept
  }
  const RunResult r = run_tern("-m " + quote(shared_path(kSpm)) + " --no-bos --file " + quote(path));
  std::filesystem::remove(path);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "29871 12 13\n");
}

TEST(CmdTokenize, Errors) {
  EXPECT_NE(run_tern("-m /nonexistent/model.gguf hello").exit_code, 0);
  if (!file_exists(shared_path(kSpm))) GTEST_SKIP() << "missing " << shared_path(kSpm);
  EXPECT_EQ(run_tern("-m " + quote(shared_path(kSpm))).exit_code, 2);  // neither TEXT nor --file
  EXPECT_EQ(run_tern("-m " + quote(shared_path(kSpm)) + " hi --file /dev/null").exit_code, 2);
}

}  // namespace
}  // namespace tern
