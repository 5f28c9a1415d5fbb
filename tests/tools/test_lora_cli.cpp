// LoRA on the command line: `--lora FILE[:SCALE]` in run / logits / ppl, `tern lora merge`
// (merged weights give the logits of the base + adapter at run time), `tern inspect` on an
// adapter, and clear errors for bad adapters, bad arguments and outputs over inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <unistd.h>

#include "gguf/gguf.h"
#include "models/lora.h"
#include "models/synth.h"
#include "test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_lora_cli {
namespace {

using tern::testing::run_command;

const std::string kTern = TERN_BINARY;

struct Files {
  std::string dir;
  Files() {
    dir = ::testing::TempDir() + "tern_lora_cli_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir);
  }
  ~Files() { std::filesystem::remove_all(dir); }
  std::string operator()(const std::string& name) const { return dir + "/" + name; }
};

void write_adapter(const std::string& base_path, const std::string& out, int64_t rank, uint32_t seed, bool embd = true,
                   DType type = DType::F32) {
  const GgufFile base = GgufFile::open(base_path);
  std::mt19937 rng(seed);
  std::vector<LoraPair> pairs;
  for (const GgufTensorInfo& t : base.tensors()) {
    const bool layer = t.name.rfind("blk.", 0) == 0 && t.ne.size() == 2 && t.name.find("norm") == std::string::npos;
    const bool top = t.name == "output.weight" || (embd && t.name == "token_embd.weight");
    if (!layer && !top) continue;
    LoraPair p;
    p.target = t.name;
    p.rank = rank;
    p.n_in = t.ne[0];
    p.n_out = t.ne[1];
    const bool e = p.embedding();
    std::normal_distribution<float> na(0.0f, e ? 0.5f : 1.0f / std::sqrt(float(p.n_in))), nb(0.0f, 0.5f);
    p.a.resize(size_t(rank * (e ? p.n_out : p.n_in)));
    p.b.resize(size_t(rank * (e ? p.n_in : p.n_out)));
    for (float& x : p.a) x = na(rng);
    for (float& x : p.b) x = nb(rng);
    pairs.push_back(std::move(p));
  }
  write_lora_adapter(out, base.get_string("general.architecture"), float(rank), pairs, type);
}

std::vector<float> logits_of(const std::vector<std::string>& args) {
  std::string cmd = kTern + " logits";
  for (const auto& a : args) cmd += " '" + a + "'";
  std::string out, err;
  EXPECT_EQ(run_command(cmd + " --json", &out, &err), 0) << err;
  const auto j = nlohmann::json::parse(out);
  std::vector<float> v;
  for (const auto& x : j["logits"]) v.push_back(x.get<float>());
  return v;
}

class LoraCli : public ::testing::Test {
 protected:
  void SetUp() override {
    base = files("base.gguf");
    SynthOptions o;
    o.shape = "qwen2-tiny";  // biases, GQA: the adapter's update goes in before the bias and RoPE
    synth_model(o, base);
    adapter = files("adapter.gguf");
    write_adapter(base, adapter, 4, 5);
  }
  Files files;
  std::string base, adapter;
};

TEST_F(LoraCli, MergedModelGivesTheLogitsOfTheAdapterAtRunTime) {
  const std::string merged = files("merged.gguf");
  std::string out, err;
  ASSERT_EQ(run_command(kTern + " lora merge -m " + base + " --lora " + adapter + ":0.8 -o " + merged + " --json", &out, &err), 0) << err;
  const auto report = nlohmann::json::parse(out);
  EXPECT_GE(report["merged_tensors"].size(), 8u);
  const std::vector<std::string> prompt = {"--ids", "1 5 9 33 40 41 7 100 2 3"};
  auto args = [&](std::vector<std::string> a) {
    a.insert(a.end(), prompt.begin(), prompt.end());
    return a;
  };
  const std::vector<float> with = logits_of(args({"-m", base, "--lora", adapter + ":0.8"}));
  const std::vector<float> via_merge = logits_of(args({"-m", merged}));
  const std::vector<float> plain = logits_of(args({"-m", base}));
  ASSERT_EQ(with.size(), via_merge.size());
  ASSERT_FALSE(with.empty());
  float scale = 0.0f, diff = 0.0f, moved = 0.0f;
  for (size_t i = 0; i < with.size(); ++i) {
    scale = std::max(scale, std::fabs(via_merge[i]));
    diff = std::max(diff, std::fabs(with[i] - via_merge[i]));
    moved = std::max(moved, std::fabs(with[i] - plain[i]));
  }
  EXPECT_LE(diff, 1e-4f * std::max(1.0f, scale)) << "max |logit| " << scale;
  EXPECT_GT(moved, 0.05f * scale) << "the adapter should move the logits";
  // Re-quantized: runs, and says so.
  const std::string q8 = files("merged-q8.gguf");
  ASSERT_EQ(run_command(kTern + " lora merge -m " + base + " --lora " + adapter + " -o " + q8 + " --type q8_0", &out, &err), 0)
      << err;
  EXPECT_NE(out.find("quantized to q8_0"), std::string::npos) << out;
  ASSERT_EQ(run_command(kTern + " run -m " + q8 + " -p hello -n 4 --temp 0", &out, &err), 0) << err;
}

// An F16 adapter: the reference kernels (TERN_FORCE_ISA=ref: the generic half kernels) and the
// CPU's (F16C kernels where it has them) give the same logits within float noise (the base's
// attention differs by variant in the last bits, so this is no bit comparison).
TEST_F(LoraCli, HalfAdapterAgreesOnEveryKernel) {
  const std::string half = files("half.gguf");
  write_adapter(base, half, 8, 17, /*embd=*/true, DType::F16);
  const std::vector<std::string> args = {"-m", base, "--lora", half + ":0.6", "--ids", "1 5 9 33 40 41 7 100 2 3"};
  const std::vector<float> fast = logits_of(args);
  setenv("TERN_FORCE_ISA", "ref", 1);
  const std::vector<float> ref = logits_of(args);
  unsetenv("TERN_FORCE_ISA");
  const std::vector<float> plain = logits_of({"-m", base, "--ids", "1 5 9 33 40 41 7 100 2 3"});
  ASSERT_EQ(fast.size(), ref.size());
  float scale = 0.0f, diff = 0.0f, moved = 0.0f;
  for (size_t i = 0; i < fast.size(); ++i) {
    scale = std::max(scale, std::fabs(ref[i]));
    diff = std::max(diff, std::fabs(fast[i] - ref[i]));
    moved = std::max(moved, std::fabs(fast[i] - plain[i]));
  }
  EXPECT_LE(diff, 1e-5f * std::max(1.0f, scale));
  EXPECT_GT(moved, 0.05f * scale);
}

TEST_F(LoraCli, InspectShowsTheAdapter) {
  std::string out, err;
  ASSERT_EQ(run_command(kTern + " inspect " + adapter, &out, &err), 0) << err;
  EXPECT_NE(out.find("LoRA adapter for qwen2:"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 4, alpha 4"), std::string::npos) << out;
  EXPECT_NE(out.find("blk.1.ffn_down.weight"), std::string::npos) << out;
  ASSERT_EQ(run_command(kTern + " inspect --json " + adapter, &out, &err), 0) << err;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["adapter"]["architecture"], "qwen2");
  EXPECT_EQ(j["adapter"]["max_rank"], 4);
  EXPECT_GE(j["adapter"]["targets"].size(), 8u);
  EXPECT_EQ(j["adapter"]["targets"][0]["scale"], 1.0);
}

TEST_F(LoraCli, StackedAdaptersAndPerplexity) {
  const std::string second = files("second.gguf");
  write_adapter(base, second, 2, 9, /*embd=*/false);
  std::string out, err;
  ASSERT_EQ(run_command(kTern + " run -m " + base + " --lora " + adapter + " --lora " + second +
                            ":0.5 -p hello -n 8 --temp 0 --json", &out, &err), 0) << err;
  const std::string text = files("t.txt");
  { std::ofstream(text) << "once upon a time there was a cat who sat on a mat and looked at the sun all day.\n"; }
  ASSERT_EQ(run_command(kTern + " ppl -m " + base + " --lora " + adapter + " -f " + text + " --ctx 16 --json", &out, &err), 0)
      << err;
}

TEST_F(LoraCli, BadAdaptersAndArgumentsAreClearErrors) {
  std::string out, err;
  // A file that does not exist, and one that is no adapter.
  EXPECT_EQ(run_command(kTern + " run -m " + base + " --lora " + files("none.gguf") + " -p hi -n 2", &out, &err), 1);
  EXPECT_NE(err.find("none.gguf"), std::string::npos) << err;
  EXPECT_EQ(run_command(kTern + " run -m " + base + " --lora " + base + " -p hi -n 2", &out, &err), 1);
  EXPECT_NE(err.find("not a LoRA adapter"), std::string::npos) << err;
  // An adapter made for another base: named with the tensor.
  const std::string other_base = files("other.gguf"), other = files("other-adapter.gguf");
  SynthOptions o;
  o.shape = "llama3-tiny";
  synth_model(o, other_base);
  write_adapter(other_base, other, 2, 3);
  EXPECT_EQ(run_command(kTern + " run -m " + base + " --lora " + other + " -p hi -n 2", &out, &err), 1);
  EXPECT_NE(err.find("the adapter is for architecture \"llama\""), std::string::npos) << err;
  // A non-finite scale.
  EXPECT_EQ(run_command(kTern + " run -m " + base + " --lora " + adapter + ":nan -p hi -n 2", &out, &err), 1);
  EXPECT_NE(err.find("finite"), std::string::npos) << err;
  // merge: output over its input, unknown subcommand, no --lora.
  EXPECT_NE(run_command(kTern + " lora merge -m " + base + " --lora " + adapter + " -o " + base, &out, &err), 0);
  EXPECT_TRUE(std::filesystem::exists(base));
  EXPECT_NE(err.find(base), std::string::npos) << err;
  EXPECT_EQ(run_command(kTern + " lora frobnicate", &out, &err), 2);
  EXPECT_NE(err.find("unknown subcommand"), std::string::npos) << err;
  EXPECT_EQ(run_command(kTern + " lora merge -m " + base + " -o " + files("x.gguf"), &out, &err), 2);
  EXPECT_FALSE(std::filesystem::exists(files("x.gguf")));
}

}  // namespace
}  // namespace tern::test_lora_cli
