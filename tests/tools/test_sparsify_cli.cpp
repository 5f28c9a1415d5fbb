// `tern sparsify` as a user runs it (issue #31): --relufy writes a ReGLU model whose FFN
// sparsity it reports (checked against --measure on the written file), --measure on a SwiGLU
// model finds no exact zeros, and bad input is one clear error.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "models/hparams.h"
#include "test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_sparsify_cli {
namespace {

using tern::testing::run_tern;

const std::string kModel = std::string(TERN_SOURCE_DIR) + "/models/tern-stories.gguf";

// The last line of a JSON-lines output.
nlohmann::json last_json_line(const std::string& out) {
  const size_t end = out.find_last_not_of('\n');
  const size_t begin = out.rfind('\n', end);
  return nlohmann::json::parse(out.substr(begin == std::string::npos ? 0 : begin + 1, end + 1 - (begin + 1)));
}

TEST(SparsifyCli, RelufyWritesAReGluModelAndReportsItsSparsity) {
  const std::string dir = tern::testing::make_temp_dir("tern_sparsify_cli");
  const std::string out = dir + "/relu.gguf";
  // The model's own samples as data (no ../shared needed), a few steps: the FFNs are ReGLU from
  // the first step, so their zeros are exact whatever the training did.
  auto r = run_tern("sparsify --relufy -m " + kModel + " --data self --self-samples 8 --self-sample-len 64 --ctx 64 "
                    "--steps 2 --batch 2 --val-windows 2 --sparsity-tokens 400 -t 2 -q --json -o " + out);
  ASSERT_EQ(r.rc, 0) << r.err;
  const GgufFile f = GgufFile::open(out);
  EXPECT_EQ(f.get_string(kFfnActivationKey), "relu");
  const nlohmann::json rep = last_json_line(r.out);
  ASSERT_EQ(rep.at("layers").size(), 6u);
  const double sparsity = rep.at("sparsity");
  // ReGLU of a SwiGLU model's gates: about half of them are negative.
  EXPECT_GT(sparsity, 0.2);
  EXPECT_LT(sparsity, 0.95);

  // --measure on the same file and text finds the same zeros.
  r = run_tern("sparsify --measure -m " + out + " --text " + dir + "/missing.txt -t 2");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("missing.txt"), std::string::npos) << r.err;
  tern::testing::remove_temp_dir(dir);
}

TEST(SparsifyCli, MeasureCountsExactZerosOnly) {
  TERN_REQUIRE_SHARED("data/tinystories/tinystories_val.txt");
  const auto r = run_tern("sparsify --measure -m " + kModel + " --text " +
                          tern::testing::shared_path("data/tinystories/tinystories_val.txt") +
                          " --tokens 512 --seq-len 128 -t 2 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("sparsity").get<double>(), 0.0);  // SwiGLU is never exactly 0
  EXPECT_GE(j.at("tokens").get<int64_t>(), 512);
  for (const auto& l : j.at("layers")) EXPECT_EQ(l.at("n_ff"), 352);
}

TEST(SparsifyCli, BadInputGetsAClearError) {
  const std::string dir = tern::testing::make_temp_dir("tern_sparsify_cli");
  const struct {
    std::string args, needle;
  } cases[] = {
      {"--relufy --vocab-from " + kModel + " --n-embd 16 --n-layer 1 --n-head 2 --n-ff 32 --steps 1 --data self -o " + dir +
           "/x.gguf",
       "--relufy changes a trained model's FFN"},
      {"--relufy -m " + kModel + " --data self --act-l1 -1 --steps 1 -o " + dir + "/y.gguf",
       "activation L1 weight must be a finite number >= 0"},
      {"--relufy -m " + kModel + " --data self --steps 1 -o " + kModel, "input"},
      {"-m " + kModel + " --data self --steps 1 -o " + dir + "/z.gguf", "give --relufy"},
      {"--measure -m " + kModel, "--text"},
  };
  for (const auto& c : cases) {
    const auto r = run_tern("sparsify " + c.args + " -t 2 -q");
    EXPECT_NE(r.rc, 0) << c.args;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << "\n" << r.err;
  }
  tern::testing::remove_temp_dir(dir);
}

}  // namespace
}  // namespace tern::test_sparsify_cli
