// tern under mpirun (docs/distributed.md): the parallel layouts give the single process's greedy
// tokens, each tensor-parallel rank holds about 1/N of the split weights, the pipeline reports
// its timeline, and bad layouts, mismatched files and a dying rank end the job with a message
// instead of a hang. Skipped where mpirun or an MPI build is missing. Every mpirun is bounded by
// `timeout`, so a hang fails the test instead of stalling the suite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <unistd.h>

#include "models/lora.h"
#include "models/model.h"
#include "test_util.h"

namespace tern::testing {
namespace {

const std::string& mpirun_prefix() {
  // Oversubscribed (4 ranks on a 2-core machine), as root where the tests run as root.
  static const std::string p =
      std::string("timeout 300 mpirun --oversubscribe") + (::geteuid() == 0 ? " --allow-run-as-root" : "");
  return p;
}

// Why the suite cannot run here, or "".
std::string skip_reason() {
  std::string out;
  if (run_command("command -v mpirun", &out) != 0) return "mpirun is not installed (libopenmpi-dev openmpi-bin)";
  const TernResult r = run_tern("run -m " + real_model_path() + " -p hi -n 1 --tp 2");
  if (r.err.find("built without MPI") != std::string::npos) return "tern was built without MPI";
  return "";
}

// `mpirun -np N tern ARGS`: exit status, stdout, stderr.
TernResult mpirun(int np, const std::string& args) {
  TernResult r;
  r.rc = run_command(mpirun_prefix() + " -np " + std::to_string(np) + " " + TERN_BINARY + " " + args, &r.out, &r.err);
  return r;
}

struct Mpi : ::testing::Test {
  void SetUp() override {
    static const std::string why = skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
  }
};

std::vector<int> generated_ids(const std::string& json_out) {
  const auto j = nlohmann::json::parse(json_out);
  return j.at("ids").get<std::vector<int>>();
}

struct Layout {
  int np;
  std::string flags;
};

// extra: more flags for every run (adapters); want_out: the single process's tokens, when asked.
void expect_same_tokens(const std::string& model, const std::string& prompt, int n, const std::vector<Layout>& layouts,
                        const std::string& extra = "", std::vector<int>* want_out = nullptr) {
  const std::string args =
      "run -m " + model + " -p '" + prompt + "' -n " + std::to_string(n) + " --temp 0 --json -t 1 " + extra;
  const TernResult single = run_tern(args);
  ASSERT_EQ(single.rc, 0) << single.err;
  const std::vector<int> want = generated_ids(single.out);
  ASSERT_EQ(int(want.size()), n);
  if (want_out) *want_out = want;
  for (const Layout& l : layouts) {
    const TernResult r = mpirun(l.np, args + " " + l.flags);
    ASSERT_EQ(r.rc, 0) << l.flags << "\n" << r.err;
    EXPECT_EQ(generated_ids(r.out), want) << l.flags;
  }
}

TEST_F(Mpi, GreedyTokensEqualTheSingleProcessOnARealModel) {
  expect_same_tokens(real_model_path(), "Once upon a time", 32,
                     {{2, "--tp 2"}, {2, "--pp 2"}, {4, "--tp 2 --pp 2"}, {3, "--pp 3 --micro-batches 2"}});
}

// LoRA adapters under every layout: each rank gets the adapter from rank 0 (not from its disk)
// and applies its share (tensor parallelism: the rows or columns of its split; a pipeline stage:
// its layers' pairs). Two adapters stacked, one held as IEEE half (an F16 file), one as f32.
TEST_F(Mpi, AdaptersGiveTheSingleProcessTokensUnderEveryLayout) {
  const std::string dir = make_temp_dir("tern_mpi_lora");
  const auto file = open_model_file(real_model_path());
  const std::string a16 = dir + "/a16.gguf", a32 = dir + "/a32.gguf";
  write_lora_adapter(a16, file->get_string("general.architecture"), 8.0f, LoraAdapter::random_pairs(*file, 4, 11, 0.5f),
                     DType::F16);
  write_lora_adapter(a32, file->get_string("general.architecture"), 0.0f, LoraAdapter::random_pairs(*file, 2, 12, 0.3f),
                     DType::F32);
  std::vector<int> base, adapted;
  expect_same_tokens(real_model_path(), "Once upon a time", 24, {}, "", &base);
  expect_same_tokens(real_model_path(), "Once upon a time", 24,
                     {{2, "--tp 2"}, {2, "--pp 2"}, {4, "--tp 2 --pp 2"}, {3, "--pp 3 --micro-batches 2"}},
                     "--lora " + a16 + ":0.9 --lora " + a32, &adapted);
  EXPECT_NE(adapted, base) << "the adapters change nothing: the test would not see them missing";
  remove_temp_dir(dir);
}

// KV eviction under every layout, 300 tokens in a 96-token context: rank 0 chooses what to keep
// and every rank's cache follows its plans. StreamingLLM's sinks that follow the window are
// re-rotated on each rank from that rank's kept copies (the sink keys requests); H2O's key masses
// are summed over the ranks' heads and layers before rank 0 ranks them.
TEST_F(Mpi, KvPoliciesGiveTheSingleProcessTokensUnderEveryLayout) {
  for (const std::string policy : {"--kv-policy streaming --sinks 4 --window 48",
                                   "--kv-policy streaming --sinks 4 --window 48 --sink-positions original",
                                   "--kv-policy h2o --kv-budget 64 --window 16"}) {
    SCOPED_TRACE(policy);
    expect_same_tokens(real_model_path(), "Once upon a time", 300,
                       {{2, "--tp 2"}, {2, "--pp 2"}, {4, "--tp 2 --pp 2"}}, "-c 96 " + policy);
  }
}

// The TinyLlama-1.1B shape (2048 wide, 32 query / 4 KV heads, 5632 FFN channels, 32000 tokens;
// two of its 22 layers, to keep the suite small), in f16 and in q4_K (block-aligned splits of
// real sizes).
struct MpiTinyLlama : Mpi {
  static void SetUpTestSuite() {
    dir_ = make_temp_dir("tern_mpi");
    f16_ = dir_ + "/tinyllama2-f16.gguf";
    q4k_ = dir_ + "/tinyllama2-q4k.gguf";
    for (const auto& [path, type] : {std::pair{f16_, "f16"}, std::pair{q4k_, "q4_k"}}) {
      const TernResult r = run_tern("synth --shape tinyllama-1.1b --layers 2 --type " + std::string(type) + " -o " + path);
      ASSERT_EQ(r.rc, 0) << r.err;
    }
  }
  static void TearDownTestSuite() { remove_temp_dir(dir_); }
  static std::string dir_, f16_, q4k_;
};
std::string MpiTinyLlama::dir_, MpiTinyLlama::f16_, MpiTinyLlama::q4k_;

// Every position's logits of `ids` ([n][32000]), from `tern logits` alone (np 0) or under mpirun.
std::vector<float> logits_of(const std::string& model, const std::string& ids, int np, const std::string& flags,
                             const std::string& out) {
  const std::string args = "logits -m " + model + " --ids '" + ids + "' --no-bos -t 1 -o " + out + " " + flags;
  const TernResult r = np == 0 ? run_tern(args) : mpirun(np, args);
  EXPECT_EQ(r.rc, 0) << flags << "\n" << r.err;
  const std::string bytes = read_file_bytes(out);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

// max over rows of max |a - b| / max |a|.
double max_relative_diff(const std::vector<float>& a, const std::vector<float>& b, int64_t n_vocab) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t r0 = 0; r0 + size_t(n_vocab) <= std::min(a.size(), b.size()); r0 += size_t(n_vocab)) {
    double d = 0, m = 0;
    for (size_t i = r0; i < r0 + size_t(n_vocab); ++i) {
      d = std::max(d, double(std::fabs(a[i] - b[i])));
      m = std::max(m, double(std::fabs(a[i])));
    }
    worst = std::max(worst, d / m);
  }
  return worst;
}

TEST_F(MpiTinyLlama, GreedyTokensEqualTheSingleProcess) {
  expect_same_tokens(f16_, "Once upon a time", 16, {{2, "--tp 2"}, {4, "--tp 4"}, {4, "--tp 2 --pp 2"}, {2, "--pp 2"}});
}

// The bound. Pipeline stages run the same kernels on the same rows: bit-identical logits.
// Tensor parallelism sums attn_output's and ffn_down's partial products per rank and then over
// the ranks (in rank order): only the order of the f32 additions changes, so with float
// weights the logits stay within 1e-4 of max |logit| (measured ~3e-6 on this model). Quantized
// weights pair with quantized activations (q8_K for q4_K): a residual that moved by one ulp can
// round one activation to the next 8-bit step, a jump of one quantum that later layers carry,
// so their bound is looser: 5% of max |logit| (measured up to ~1.7% over 27 positions of this
// random-weight model; a wrong split gives differences of the logits' own size).
TEST_F(MpiTinyLlama, LogitsStayWithinTheBound) {
  const std::string ids = "1 259 300 273 413 1568 734 331 350 577 264 26050 22598 16078 15249 9937 11303";
  const int64_t V = 32000;
  const auto f16_ref = logits_of(f16_, ids, 0, "", dir_ + "/ref.bin");
  ASSERT_EQ(f16_ref.size(), size_t(17 * V));
  for (const Layout& l : std::vector<Layout>{{2, "--tp 2"}, {4, "--tp 4"}, {4, "--tp 2 --pp 2"}}) {
    const double rel = max_relative_diff(f16_ref, logits_of(f16_, ids, l.np, l.flags, dir_ + "/par.bin"), V);
    std::printf("f16 %s: max |diff| = %.2e of max |logit|\n", l.flags.c_str(), rel);
    EXPECT_LE(rel, 1e-4) << l.flags;
  }
  EXPECT_EQ(logits_of(f16_, ids, 2, "--pp 2", dir_ + "/par.bin"), f16_ref);
  const auto q4k_ref = logits_of(q4k_, ids, 0, "", dir_ + "/ref.bin");
  EXPECT_EQ(logits_of(q4k_, ids, 2, "--pp 2 --micro-batches 3", dir_ + "/par.bin"), q4k_ref);
  for (const Layout& l : std::vector<Layout>{{2, "--tp 2"}, {4, "--tp 4"}}) {
    const double rel = max_relative_diff(q4k_ref, logits_of(q4k_, ids, l.np, l.flags, dir_ + "/par.bin"), V);
    std::printf("q4_K %s: max |diff| = %.2e of max |logit|\n", l.flags.c_str(), rel);
    EXPECT_LE(rel, 0.05) << l.flags;
  }
}

// `tern bench` of `model` alone, then under `mpirun -np 2 ... --tp 2`: the whole model's weight
// bytes and each rank's report. Checks that each rank holds 45-55% of the split weights (the
// bytes beyond `whole_per_rank`, which every rank holds whole: its looked-up embeddings) and
// that they add up to the whole's (nothing lost, nothing doubled, within `slack` of the whole).
nlohmann::json expect_tp2_halves(const std::string& model, int64_t whole_per_rank, double slack) {
  const std::string bench = "bench -m " + model + " -p 16 -n 4 -r 1 --json -t 1";
  const TernResult single = run_tern(bench);
  EXPECT_EQ(single.rc, 0) << single.err;
  if (single.rc != 0) return {};
  const int64_t whole = nlohmann::json::parse(single.out).at("weight_bytes").get<int64_t>();
  const TernResult r = mpirun(2, bench + " --tp 2");
  EXPECT_EQ(r.rc, 0) << r.err;
  if (r.rc != 0) return {};
  const nlohmann::json ranks = nlohmann::json::parse(r.out).at("parallel").at("ranks");
  EXPECT_EQ(ranks.size(), 2u);
  int64_t sum = 0;
  for (const auto& rank : ranks) {
    const int64_t b = rank.at("weight_bytes").get<int64_t>();
    sum += b - whole_per_rank;
    const double share = double(b - whole_per_rank) / double(whole - whole_per_rank);
    EXPECT_GT(share, 0.45) << rank.dump();
    EXPECT_LT(share, 0.55) << rank.dump();
    std::printf("rank %d: %.1f MiB (whole model %.1f MiB), %.3f of the split weights\n", rank.at("rank").get<int>(),
                double(b) / 1048576.0, double(whole) / 1048576.0, share);
  }
  EXPECT_NEAR(double(sum), double(whole - whole_per_rank), slack * double(whole));
  return ranks;
}

TEST_F(MpiTinyLlama, EachTensorParallelRankHoldsHalfTheSplitWeights) {
  // Every rank looks its token embeddings up from the mapped file (32000 rows of 2048 in q4_K:
  // 8 blocks of 144 bytes); everything else (layers, output projection) is split in two.
  const nlohmann::json ranks = expect_tp2_halves(q4k_, int64_t(32000) * (2048 / 256) * 144, 0.01);
  // Each rank's K/V holds 2 of the 4 KV heads (of 64), K and V, 2 layers, f32.
  for (const auto& rank : ranks) EXPECT_EQ(rank.at("kv_bytes_per_token").get<int64_t>(), int64_t(2) * 2 * 2 * 64 * 4);
}

TEST_F(MpiTinyLlama, PipelineReportsEveryStageAndMicroBatch) {
  const TernResult r = mpirun(2, "bench -m " + q4k_ + " -p 64 -n 0 -r 1 --json -t 1 --pp 2 --micro-batches 4");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto p = nlohmann::json::parse(r.out).at("parallel").at("pipeline");
  EXPECT_EQ(p.at("stages").get<int>(), 2);
  EXPECT_EQ(p.at("micro_batches").get<int>(), 4);
  EXPECT_NEAR(p.at("ideal_bubble").get<double>(), 1.0 / 5.0, 1e-12);
  const double bubble = p.at("bubble").get<double>();
  EXPECT_GE(bubble, 0.0);
  EXPECT_LE(bubble, 1.0);
  // Each stage ran each micro-batch once, stage 1 after stage 0 had finished it.
  std::map<std::pair<int, int>, std::pair<double, double>> seen;  // (stage, mb) -> (start, end)
  int64_t tokens = 0;
  for (const auto& b : p.at("timeline")) {
    const auto key = std::make_pair(b.at("stage").get<int>(), b.at("micro_batch").get<int>());
    EXPECT_TRUE(seen.emplace(key, std::make_pair(b.at("start_ms").get<double>(), b.at("end_ms").get<double>())).second);
    if (key.first == 0) tokens += b.at("n_tokens").get<int64_t>();
  }
  EXPECT_EQ(seen.size(), 8u);
  EXPECT_EQ(tokens, 64);
  for (int mb = 0; mb < 4; ++mb) {
    const auto s1 = seen[{1, mb}];
    const auto s0 = seen[{0, mb}];
    EXPECT_GE(s1.first, s0.second) << "micro-batch " << mb;
  }
}

// Mixture-of-experts layers under tensor parallelism (models/partition.h): every expert's
// channels split over the ranks, the router whole on each. Greedy tokens on float models
// (Mixtral's experts; Qwen2-MoE's shared expert with its gate), alone and with a pipeline;
// Mixtral's layer at its real width (8 experts of 2816 channels, q4_0: 44 blocks each per rank)
// within the quantized bound, each rank holding about half of the experts' bytes.
struct MpiMoe : Mpi {
  static void SetUpTestSuite() {
    dir_ = make_temp_dir("tern_mpi_moe");
    for (const auto& [path, args] : {std::pair{dir_ + "/mixtral-tiny.gguf", "--shape mixtral-tiny --type f32"},
                                     std::pair{dir_ + "/qwen2moe-tiny.gguf", "--shape qwen2moe-tiny --type f32"},
                                     std::pair{dir_ + "/mixtral2-q4_0.gguf", "--shape mixtral-mini --layers 2 --type q4_0"}}) {
      const TernResult r = run_tern("synth " + std::string(args) + " -o " + path);
      ASSERT_EQ(r.rc, 0) << r.err;
    }
  }
  static void TearDownTestSuite() { remove_temp_dir(dir_); }
  static std::string dir_;
};
std::string MpiMoe::dir_;

TEST_F(MpiMoe, GreedyTokensEqualTheSingleProcess) {
  for (const char* name : {"/mixtral-tiny.gguf", "/qwen2moe-tiny.gguf"}) {
    SCOPED_TRACE(name);
    expect_same_tokens(dir_ + name, "Once upon a time", 16, {{2, "--tp 2"}, {4, "--tp 2 --pp 2"}});
  }
}

TEST_F(MpiMoe, RealWidthLogitsStayWithinTheBoundAndRanksHoldHalf) {
  const std::string model = dir_ + "/mixtral2-q4_0.gguf";
  const std::string ids = "1 259 300 273 413 1568 734 331 350 577 264 26050 22598";
  const auto ref = logits_of(model, ids, 0, "", dir_ + "/ref.bin");
  ASSERT_EQ(ref.size(), size_t(13 * 32000));
  const double rel = max_relative_diff(ref, logits_of(model, ids, 2, "--tp 2", dir_ + "/par.bin"), 32000);
  std::printf("mixtral-mini (2 layers, q4_0) --tp 2: max |diff| = %.2e of max |logit|\n", rel);
  EXPECT_LE(rel, 0.05);

  // The token embeddings (32000 rows of 1024 in q4_0, looked up) are whole on each rank; the
  // rest, nearly all of it the experts, is split in two (the routers, 8 rows per layer, whole on
  // each rank: within the 1% slack).
  expect_tp2_halves(model, int64_t(32000) * (1024 / 32) * 18, 0.01);
}

TEST_F(Mpi, BadLayoutsAreClearErrors) {
  const std::string run = "run -m " + real_model_path() + " -p hi -n 2 -t 1 ";
  struct Case {
    int np;
    std::string flags, message;
  } cases[] = {
      {3, "--tp 3", "--tp 3 does not divide layer 0's head counts"},
      {2, "--pp 64", "more pipeline stages than the model's"},
      {3, "--tp 2", "needs 2 ranks, but mpirun started 3"},
      {2, "--tp 2 --lora " + real_model_path(), "not a LoRA adapter"},
  };
  for (const Case& c : cases) {
    const TernResult r = mpirun(c.np, run + c.flags);
    EXPECT_NE(r.rc, 0) << c.flags;
    EXPECT_NE(r.rc, 124) << c.flags << ": timed out";
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.flags << "\n" << r.err;
  }
  // Without mpirun a layout says how to start it.
  const TernResult alone = run_tern(run + "--tp 2");
  EXPECT_EQ(alone.rc, 1);
  EXPECT_NE(alone.err.find("mpirun -np 2"), std::string::npos) << alone.err;
}

TEST_F(Mpi, ARankWithAnotherModelFileIsRefused) {
  // Rank 1 opens its own copy ($TERN_RANK_MODEL): another model than rank 0's.
  const std::string other = std::string(TERN_SOURCE_DIR) + "/models/tern-stories.gguf";
  const std::string mine = real_model_path();
  if (mine == other) GTEST_SKIP() << "needs ../shared's stories260K beside the repository's model";
  TernResult r;
  r.rc = run_command(mpirun_prefix() + " -np 1 " + TERN_BINARY + " run -m " + mine + " -p hi -n 2 -t 1 --tp 2 : -np 1 -x TERN_RANK_MODEL=" +
                         other + " " + TERN_BINARY,
                     &r.out, &r.err);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("rank 1: " + other + " on this rank is not rank 0's model file"), std::string::npos) << r.err;
}

TEST_F(Mpi, ADyingRankEndsTheJobWithoutAHang) {
  // Rank 1 (whose command line carries a marker: a worker reads none of it; the pattern is
  // anchored at the binary so that mpirun's and the shell's command lines do not match) is killed
  // mid-benchmark; mpirun must end every rank and say so. timeout's 124 would mean a hang.
  const std::string marker = "tern-dying-rank-" + std::to_string(::getpid());
  const std::string cmd = mpirun_prefix() + " -np 1 " + TERN_BINARY + " bench -m " + real_model_path() +
                          " -p 256 -n 256 -r 1000 --no-bandwidth -t 1 --tp 2 : -np 1 " + TERN_BINARY + " " + marker +
                          " & sleep 3; pkill -9 -f \"^" + std::string(TERN_BINARY) + " " + marker + "\"; wait $!";
  TernResult r;
  r.rc = run_command("bash -c '" + cmd + "'", &r.out, &r.err);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.rc, 124) << "the job hung after a rank died";
  EXPECT_NE(r.err.find("signal 9"), std::string::npos) << r.err;
}

TEST_F(Mpi, AFailedPipelineStepEndsTheRunWithItsMessageWithoutAHang) {
  // Rank 0's stage fails in the third step's second micro-batch (injected): the later stage
  // still gets the step's micro-batches (zeros), so the workers finish it and exit when rank 0
  // reports the error. Before, they waited for the rest of the step forever.
  TernResult r;
  r.rc = run_command(mpirun_prefix() + " -x TERN_TEST_FAIL_PIPELINE_STEP=3 -np 2 " +
                         TERN_BINARY + " run -m " + real_model_path() +
                         " -p 'Once upon a time' -n 8 --pp 2 --micro-batches 2 -t 1 --temp 0",
                     &r.out, &r.err);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.rc, 124) << "the job hung after a failed step";
  EXPECT_NE(r.err.find("a failure injected into pipelined step 3"), std::string::npos) << r.err;
}

TEST_F(Mpi, BenchServeDrivesThePipelineEnginesServeRuns) {
  // Under --pp, bench-serve builds tern serve's pipeline engines (two by default here), each
  // stepped on its own thread: every request completes with its tokens, through both engines.
  const std::string args = "bench-serve -m " + real_model_path() +
                           " --pp 2 -t 1 --num-prompts 12 --concurrency 6 --max-tokens 8 --input-len 24 --json";
  const TernResult r = mpirun(2, args);
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("pipeline_engines").get<int>(), 2);
  EXPECT_EQ(j.at("completed").get<int>(), 12);
  EXPECT_EQ(j.at("failed").get<int>(), 0);
  EXPECT_EQ(j.at("output_tokens").get<int>(), 12 * 8);
  EXPECT_GT(j.at("output_tok_s").get<double>(), 0.0);
  const TernResult one = mpirun(2, args + " --pipeline-engines 1");
  ASSERT_EQ(one.rc, 0) << one.err;
  EXPECT_EQ(nlohmann::json::parse(one.out).at("pipeline_engines").get<int>(), 1);
  // Engines without a pipeline, or beside --spec-compare, are refused before any work.
  TernResult bad = run_tern("bench-serve -m " + real_model_path() + " --pipeline-engines 2");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("needs a pipeline"), std::string::npos) << bad.err;
  bad = mpirun(2, args + " --pipeline-engines 2 --spec-compare --lookup 3");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("does not combine with --spec-compare"), std::string::npos) << bad.err;
}

// tern batch: one rank here, two under mpirun (the same completions, both ranks working).
struct Batch : ::testing::Test {
  void SetUp() override { dir_ = make_temp_dir("tern_batch"); }
  void TearDown() override { remove_temp_dir(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    FILE* f = std::fopen(path.c_str(), "wb");
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
    return path;
  }
  static std::vector<nlohmann::json> lines_of(const std::string& path) {
    std::vector<nlohmann::json> out;
    std::string text = read_file_bytes(path);
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t end = text.find('\n', pos);
      out.push_back(nlohmann::json::parse(text.substr(pos, end - pos)));
      pos = end + 1;
    }
    return out;
  }
  std::string dir_;
};

const char* kBatchPrompts = "Once upon a time\nThe little dog\n\nLily wanted to\n{\"prompt\": \"Tom had a red ball\"}\nThe sun was\n";
const std::vector<std::string> kBatchTexts = {"Once upon a time", "The little dog", "Lily wanted to", "Tom had a red ball",
                                              "The sun was"};

TEST_F(Batch, WritesEveryPromptInTheFilesOrder) {
  const std::string in = write("p.txt", kBatchPrompts), out = dir_ + "/out.jsonl";
  const TernResult r = run_tern("batch -m " + real_model_path() + " -f " + in + " -o " + out + " -n 12 --ignore-eos -t 1 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto report = nlohmann::json::parse(r.out);
  EXPECT_EQ(report.at("prompts").get<int>(), 5);
  EXPECT_EQ(report.at("generated_tokens").get<int>(), 60);
  const auto lines = lines_of(out);
  ASSERT_EQ(lines.size(), 5u);
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i].at("index").get<size_t>(), i);
    EXPECT_EQ(lines[i].at("prompt").get<std::string>(), kBatchTexts[i]);
    EXPECT_EQ(lines[i].at("n_generated").get<int>(), 12);
    EXPECT_FALSE(lines[i].at("completion").get<std::string>().empty());
  }
  // The first completion is the model's greedy continuation, as `tern run` gives it.
  const TernResult run = run_tern("run -m " + real_model_path() + " -p 'Once upon a time' -n 12 --ignore-eos --temp 0 --json -t 1");
  ASSERT_EQ(run.rc, 0) << run.err;
  EXPECT_EQ(lines[0].at("completion").get<std::string>(), nlohmann::json::parse(run.out).at("text").get<std::string>());
}

TEST_F(Batch, APromptThatCannotRunFailsAlone) {
  std::string long_prompt;
  for (int i = 0; i < 200; ++i) long_prompt += "the little dog ran ";
  const std::string in = write("p.txt", "Once upon a time\n" + long_prompt + "\nThe sun was\n"), out = dir_ + "/out.jsonl";
  const TernResult r = run_tern("batch -m " + real_model_path() + " -f " + in + " -o " + out + " -n 8 -c 64 -t 1");
  EXPECT_EQ(r.rc, 1) << r.err;
  const auto lines = lines_of(out);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_FALSE(lines[0].contains("error"));
  EXPECT_TRUE(lines[1].contains("error")) << lines[1].dump();
  EXPECT_FALSE(lines[2].contains("error"));
}

TEST_F(Batch, BadInputsAreClearErrors) {
  const std::string in = write("p.txt", kBatchPrompts);
  const std::string before = read_file_bytes(in);
  TernResult r = run_tern("batch -m " + real_model_path() + " -f " + in + " -o " + in);
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(read_file_bytes(in), before);  // the input is never overwritten
  r = run_tern("batch -m " + real_model_path() + " -f " + write("bad.jsonl", "{\"text\": 1}\n") + " -o " + dir_ + "/o");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("bad.jsonl:1: expected {\"prompt\""), std::string::npos) << r.err;
  r = run_tern("batch -m " + real_model_path() + " -f " + write("empty.txt", "\n\n") + " -o " + dir_ + "/o");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("no prompts"), std::string::npos) << r.err;
}

TEST_F(Batch, ReadsShareGptPrompts) {
  const std::string sharegpt = shared_path("data/prompts/ShareGPT_V3_filtered_500.json");
  if (!std::filesystem::exists(sharegpt)) GTEST_SKIP() << "needs ../shared";
  const std::string out = dir_ + "/out.jsonl";
  const TernResult r = run_tern("batch -m " + real_model_path() + " -f " + sharegpt + " --limit 6 -o " + out + " -n 4 -c 2048 -t 1");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto lines = lines_of(out);
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_NE(lines[0].at("prompt").get<std::string>().find("WSUS"), std::string::npos);
}

TEST_F(Mpi, BatchOverTwoRanksGivesTheSameCompletions) {
  const std::string dir = make_temp_dir("tern_batch_mpi");
  const std::string in = dir + "/p.txt", one = dir + "/one.jsonl", two = dir + "/two.jsonl";
  {
    FILE* f = std::fopen(in.c_str(), "wb");
    std::fputs(kBatchPrompts, f);
    std::fclose(f);
  }
  const std::string args = "batch -m " + real_model_path() + " -f " + in + " -n 16 --ignore-eos -t 1 -o ";
  const TernResult a = run_tern(args + one);
  const TernResult b = mpirun(2, args + two);
  ASSERT_EQ(a.rc, 0) << a.err;
  ASSERT_EQ(b.rc, 0) << b.err;
  const auto la = Batch::lines_of(one), lb = Batch::lines_of(two);
  std::set<int> ranks_used;
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) {
    EXPECT_EQ(la[i].at("completion"), lb[i].at("completion")) << i;
    ranks_used.insert(lb[i].at("rank").get<int>());
  }
  EXPECT_EQ(ranks_used, (std::set<int>{0, 1}));  // both ranks took a share
  remove_temp_dir(dir);
}

}  // namespace
}  // namespace tern::testing
