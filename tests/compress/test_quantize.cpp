// `tern quantize` as a user runs it: llama-quantize's bytes with --pure, llama.cpp's default
// per-tensor rules, per-tensor fallbacks, --keep, perplexity of the result, llama.cpp loading
// it, and one clear error for bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "compress_test_util.h"
#include "compress/quantize.h"
#include "gguf/gguf.h"
#include "models/model.h"
#include "core/thread_pool.h"

namespace tern {
namespace {

using namespace tern::testing;

// Removes the scratch folder of this test process (temp_path) at the end of the run.
class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(std::filesystem::path(temp_path("x")).parent_path(), ec);
  }
};
[[maybe_unused]] ::testing::Environment* const kCleanup = ::testing::AddGlobalTestEnvironment(new ScratchCleanup);

nlohmann::json quantize_json(const std::string& args) {
  std::string out, err;
  const int rc = run_command(kTern + " quantize " + args + " --json", &out, &err);
  EXPECT_EQ(rc, 0) << err;
  return rc == 0 ? nlohmann::json::parse(out) : nlohmann::json{};
}

class PureInterop : public ::testing::TestWithParam<const char*> {};

// llama-quantize --pure quantized every 2-D tensor of the F16 source; the same command in tern
// must reproduce its tensors byte for byte (round-to-nearest rules shared with llama.cpp).
TEST_P(PureInterop, ReproducesLlamaQuantizeTensorBytes) {
  const std::string type = GetParam();
  TERN_REQUIRE_SHARED("quant-interop/small-f16src.gguf");
  TERN_REQUIRE_SHARED("quant-interop/small-" + type + ".gguf");
  const std::string out = temp_path("small-" + type + ".gguf");
  quantize_json(shared_path("quant-interop/small-f16src.gguf") + " " + out + " --type " + type + " --pure");
  const GgufFile ours = GgufFile::open(out);
  const GgufFile ref = GgufFile::open(shared_path("quant-interop/small-" + type + ".gguf"));
  ASSERT_EQ(ours.tensors().size(), ref.tensors().size());
  int n_quantized = 0;
  for (const auto& rt : ref.tensors()) {
    const GgufTensorInfo* t = ours.find_tensor(rt.name);
    ASSERT_NE(t, nullptr) << rt.name;
    EXPECT_EQ(t->type, rt.type) << rt.name;
    EXPECT_EQ(t->ne, rt.ne) << rt.name;
    ASSERT_EQ(t->n_bytes, rt.n_bytes) << rt.name;
    EXPECT_EQ(std::memcmp(t->data, rt.data, rt.n_bytes), 0) << rt.name << " differs";
    n_quantized += rt.ne.size() == 2;
  }
  EXPECT_EQ(n_quantized, 9);
  EXPECT_EQ(ours.get_uint("general.file_type"), ref.get_uint("general.file_type"));
}

INSTANTIATE_TEST_SUITE_P(Types, PureInterop, ::testing::Values("q8_0", "q4_0", "q4_k", "q6_k"));

const nlohmann::json& tensor_of(const nlohmann::json& rep, const std::string& name) {
  for (const auto& t : rep["tensors"])
    if (t["name"] == name) return t;
  static const nlohmann::json none;
  ADD_FAILURE() << "no tensor " << name << " in the report";
  return none;
}

// Without --pure, llama.cpp's defaults: the output gets q6_k (rows of 256 fit), norms stay f32,
// the embedding takes the base type; q4_k is the Q4_K_M mix.
TEST(Quantize, DefaultRulesFollowLlamaQuantize) {
  TERN_REQUIRE_SHARED("quant-interop/small-f16src.gguf");
  const std::string src = shared_path("quant-interop/small-f16src.gguf");
  const auto q4 = quantize_json(src + " " + temp_path("small-def-q4_0.gguf") + " --type q4_0");
  EXPECT_EQ(tensor_of(q4, "output.weight")["type"], "q6_k");
  EXPECT_EQ(tensor_of(q4, "token_embd.weight")["type"], "q4_0");
  EXPECT_EQ(tensor_of(q4, "blk.0.attn_q.weight")["type"], "q4_0");
  EXPECT_EQ(tensor_of(q4, "blk.0.attn_norm.weight")["type"], "f32");
  EXPECT_EQ(q4["file_type"], 2);
  const auto q8 = quantize_json(src + " " + temp_path("small-def-q8_0.gguf") + " --type q8_0");
  EXPECT_EQ(tensor_of(q8, "output.weight")["type"], "q8_0");
  EXPECT_EQ(q8["file_type"], 7);
  const auto qk = quantize_json(src + " " + temp_path("small-def-q4_k.gguf") + " --type q4_k");
  EXPECT_EQ(tensor_of(qk, "blk.0.attn_v.weight")["type"], "q6_k");   // one layer: a "more bits" layer
  EXPECT_EQ(tensor_of(qk, "blk.0.ffn_down.weight")["type"], "q6_k");
  EXPECT_EQ(tensor_of(qk, "blk.0.attn_q.weight")["type"], "q4_k");
  const auto q5k = quantize_json(src + " " + temp_path("small-def-q5_k.gguf") + " --type q5_k");
  EXPECT_EQ(tensor_of(q5k, "blk.0.attn_v.weight")["type"], "q6_k");  // Q5_K_M: the same pattern
  EXPECT_EQ(tensor_of(q5k, "blk.0.ffn_down.weight")["type"], "q6_k");
  EXPECT_EQ(tensor_of(q5k, "blk.0.attn_q.weight")["type"], "q5_k");
  EXPECT_EQ(tensor_of(q5k, "output.weight")["type"], "q6_k");
  EXPECT_EQ(q5k["file_type"], 17);  // LLAMA_FTYPE_MOSTLY_Q5_K_M
  const auto q50 = quantize_json(src + " " + temp_path("small-def-q5_0.gguf") + " --type q5_0");
  EXPECT_EQ(tensor_of(q50, "blk.0.attn_q.weight")["type"], "q5_0");
  EXPECT_EQ(q50["file_type"], 8);
  const auto f16 = quantize_json(src + " " + temp_path("small-def-f32.gguf") + " --type f32");
  EXPECT_EQ(tensor_of(f16, "output.weight")["type"], "f32");
  EXPECT_EQ(f16["n_fallbacks"], 0);
}

// --type tq1_0 / tq2_0 are llama-quantize's MOSTLY_TQ1_0 / _TQ2_0 (general.file_type 36 / 37):
// the output in q6_k (the output rule), an untied token embedding in q4_k, every other matrix
// ternary; 1-D tensors kept. The files run. Rows that do not fit 256-blocks take q4_0, as in
// llama.cpp (stories260K's 64-wide rows: every matrix; its untied embedding q4_k -> q5_0).
TEST(Quantize, TernaryRulesFollowLlamaQuantize) {
  TERN_REQUIRE_SHARED("quant-interop/small-f16src.gguf");
  const std::string src = shared_path("quant-interop/small-f16src.gguf");
  for (const char* type : {"tq1_0", "tq2_0"}) {
    SCOPED_TRACE(type);
    const std::string out = temp_path(std::string("small-def-") + type + ".gguf");
    const auto rep = quantize_json(src + " " + out + " --type " + type);
    EXPECT_EQ(rep["file_type"], std::string(type) == "tq1_0" ? 36 : 37);
    EXPECT_EQ(tensor_of(rep, "output.weight")["type"], "q6_k");
    EXPECT_EQ(tensor_of(rep, "token_embd.weight")["type"], "q4_k");
    for (const char* name : {"blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.ffn_down.weight", "blk.0.ffn_gate.weight"})
      EXPECT_EQ(tensor_of(rep, name)["type"], type) << name;
    EXPECT_EQ(tensor_of(rep, "blk.0.attn_norm.weight")["type"], "f32");
    std::string o;
    ASSERT_EQ(run_command(std::string(TERN_BINARY) + " run -m " + out + " -p hello -n 4 --temp 0", &o), 0) << o;
    const auto pure = quantize_json(src + " " + temp_path(std::string("small-pure-") + type + ".gguf") + " --type " + type +
                                    " --pure");
    for (const char* name : {"output.weight", "token_embd.weight", "blk.0.attn_q.weight"})
      EXPECT_EQ(tensor_of(pure, name)["type"], type) << name;
  }
  EXPECT_EQ(fit_row_type(DType::TQ1_0, 64), DType::Q4_0);
  EXPECT_EQ(fit_row_type(DType::TQ2_0, 172), DType::F16);
}

// Rows that do not fit a k-quant's 256-blocks get llama-quantize's substitutes (q4_k -> q5_0,
// q5_k -> q5_1, q6_k -> q8_0), and f16 where those do not fit either.
TEST(Quantize, KQuantSubstitutesFollowLlamaQuantize) {
  EXPECT_EQ(fit_row_type(DType::Q4_K, 896), DType::Q5_0);  // Qwen2-0.5B's n_embd
  EXPECT_EQ(fit_row_type(DType::Q5_K, 896), DType::Q5_1);
  EXPECT_EQ(fit_row_type(DType::Q6_K, 896), DType::Q8_0);
  EXPECT_EQ(fit_row_type(DType::Q3_K, 896), DType::Q4_0);  // llama.cpp: iq4_nl
  EXPECT_EQ(fit_row_type(DType::Q2_K, 64), DType::Q4_0);
  EXPECT_EQ(fit_row_type(DType::Q4_K, 4864), DType::Q4_K);
  EXPECT_EQ(fit_row_type(DType::Q4_K, 172), DType::F16);
  EXPECT_EQ(fit_row_type(DType::Q5_0, 172), DType::F16);
  EXPECT_EQ(fit_row_type(DType::Q8_0, 64), DType::Q8_0);
}

TEST(Quantize, KeepLeavesMatchingTensorsAlone) {
  TERN_REQUIRE_SHARED("quant-interop/small-f16src.gguf");
  const auto rep = quantize_json(shared_path("quant-interop/small-f16src.gguf") + " " +
                                 temp_path("small-keep.gguf") + " --type q8_0 --keep 'blk.*.attn_?.weight'" +
                                 " --keep token_embd.weight");
  for (const char* n : {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight", "token_embd.weight"})
    EXPECT_EQ(tensor_of(rep, n)["type"], "f16") << n;
  EXPECT_EQ(tensor_of(rep, "blk.0.attn_output.weight")["type"], "q8_0");
}

// A mixture of experts: the router (ffn_gate_inp) stays as it is, as llama-quantize keeps it; the
// 3-D expert tensors are quantized like any matrix; the result runs.
TEST(Quantize, MoeRouterIsKeptAndExpertsQuantized) {
  const std::string src = temp_path("mixtral-tiny-f32.gguf"), out = temp_path("mixtral-tiny-q8.gguf");
  std::string o;
  ASSERT_EQ(run_command(std::string(TERN_BINARY) + " synth --shape mixtral-tiny -o " + src, &o), 0) << o;
  const auto rep = quantize_json(src + " " + out + " --type q8_0");
  EXPECT_EQ(tensor_of(rep, "blk.0.ffn_gate_inp.weight")["type"], "f32");
  EXPECT_EQ(tensor_of(rep, "blk.0.ffn_gate_inp.weight")["reason"], "router: kept");
  EXPECT_EQ(tensor_of(rep, "blk.1.ffn_up_exps.weight")["type"], "q8_0");
  ASSERT_EQ(run_command(std::string(TERN_BINARY) + " run -m " + out + " -p hello -n 4 --temp 0", &o), 0) << o;
}

// --type mxfp4 is llama-quantize's MXFP4_MOE: the 3-D expert tensors in mxfp4, every other matrix
// (the output included) in q8_0, general.file_type 38; --pure puts every matrix in mxfp4. Both run.
TEST(Quantize, Mxfp4MoeRuleQuantizesTheExperts) {
  const std::string src = temp_path("mixtral-tiny-f32-mx.gguf"), out = temp_path("mixtral-tiny-mxfp4.gguf"),
                    pure = temp_path("mixtral-tiny-mxfp4-pure.gguf");
  std::string o;
  ASSERT_EQ(run_command(std::string(TERN_BINARY) + " synth --shape mixtral-tiny -o " + src, &o), 0) << o;
  const auto rep = quantize_json(src + " " + out + " --type mxfp4");
  EXPECT_EQ(rep["file_type"], 38);
  for (const char* name : {"blk.0.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight"})
    EXPECT_EQ(tensor_of(rep, name)["type"], "mxfp4") << name;
  for (const char* name : {"blk.0.attn_q.weight", "blk.1.attn_output.weight", "output.weight", "token_embd.weight"})
    EXPECT_EQ(tensor_of(rep, name)["type"], "q8_0") << name;
  EXPECT_EQ(tensor_of(rep, "blk.0.ffn_gate_inp.weight")["type"], "f32");
  ASSERT_EQ(run_command(std::string(TERN_BINARY) + " run -m " + out + " -p hello -n 4 --temp 0", &o), 0) << o;
  const auto rep_pure = quantize_json(src + " " + pure + " --type mxfp4 --pure");
  for (const char* name : {"blk.0.attn_q.weight", "output.weight", "blk.1.ffn_down_exps.weight"})
    EXPECT_EQ(tensor_of(rep_pure, name)["type"], "mxfp4") << name;
  ASSERT_EQ(run_command(std::string(TERN_BINARY) + " run -m " + pure + " -p hello -n 4 --temp 0", &o), 0) << o;
}

// State-space models: the conv taps (Mamba's and Mamba-2's ssm_conv1d, 2-D with rows of 4) and
// Mamba-2's 2-D grouped ssm_norm stay f32, as llama-quantize keeps them (the loaders refuse any
// other type), ssm_a / ssm_d are copied, the projections quantized; both files load and run.
TEST(Quantize, StateSpaceConvAndNormsAreKept) {
  for (const char* shape : {"mamba-tiny", "mamba2-tiny"}) {
    SCOPED_TRACE(shape);
    const std::string src = temp_path(std::string(shape) + "-f32.gguf"), out = temp_path(std::string(shape) + "-q8.gguf");
    std::string o;
    ASSERT_EQ(run_command(std::string(TERN_BINARY) + " synth --shape " + shape + " -o " + src, &o), 0) << o;
    const auto rep = quantize_json(src + " " + out + " --type q8_0");
    for (const char* name : {"blk.0.ssm_conv1d.weight", "blk.2.ssm_conv1d.weight", "blk.1.ssm_a", "blk.1.ssm_d"})
      EXPECT_EQ(tensor_of(rep, name)["type"], "f32") << name;
    if (std::string(shape) == "mamba2-tiny") {
      EXPECT_EQ(tensor_of(rep, "blk.1.ssm_norm.weight")["type"], "f32");
    }
    for (const char* name : {"blk.0.ssm_in.weight", "blk.2.ssm_out.weight"})
      EXPECT_EQ(tensor_of(rep, name)["type"], "q8_0") << name;
    // The loaders read the conv taps and norms as f32 only: the file loads and runs a step.
    auto model = load_model(std::make_shared<const GgufFile>(GgufFile::open(out)));
    model->reserve(3);
    KvStore kv = make_kv_store(model->hparams(), 8, KvType::F32, 1);
    const std::vector<int32_t> ids = {1, 5, 70}, slots = {0, 1, 2};
    SeqBatch sb{0, std::span<const int32_t>(ids), std::span<const int32_t>(slots), false};
    sb.state_slot = 0;
    std::vector<float> logits(size_t(model->hparams().n_vocab));
    ThreadPool pool(2);
    model->forward(std::span<const SeqBatch>(&sb, 1), kv, logits.data(), pool);
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
    std::remove(src.c_str());
    std::remove(out.c_str());
  }
}

// RWKV-7: the LoRAs (time_mix_{w,a,v,g}{1,2}) and the token-shift mixes (time_mix_lerp_fused,
// 4-D) stay as they are, as llama-quantize keeps them (the loader reads lerp_fused as f32 only);
// the projections are quantized; the file loads and runs a step.
TEST(Quantize, RwkvLorasAndMixesAreKept) {
  const std::string src = temp_path("rwkv7-tiny-f32.gguf"), out = temp_path("rwkv7-tiny-q8.gguf");
  std::string o;
  ASSERT_EQ(run_command(std::string(TERN_BINARY) + " synth --shape rwkv7-tiny -o " + src, &o), 0) << o;
  const auto rep = quantize_json(src + " " + out + " --type q8_0");
  for (const char* name : {"blk.0.time_mix_lerp_fused.weight", "blk.1.time_mix_w1.weight", "blk.1.time_mix_a2.weight",
                           "blk.2.time_mix_v1.weight", "blk.2.time_mix_g2.weight", "blk.0.time_mix_k_k.weight"})
    EXPECT_EQ(tensor_of(rep, name)["type"], "f32") << name;
  for (const char* name : {"blk.0.time_mix_key.weight", "blk.2.channel_mix_value.weight", "output.weight"})
    EXPECT_EQ(tensor_of(rep, name)["type"], "q8_0") << name;
  auto model = load_model(std::make_shared<const GgufFile>(GgufFile::open(out)));
  model->reserve(3);
  KvStore kv = make_kv_store(model->hparams(), 8, KvType::F32, 1);
  const std::vector<int32_t> ids = {1, 5, 70}, slots = {0, 1, 2};
  SeqBatch sb{0, std::span<const int32_t>(ids), std::span<const int32_t>(slots), false};
  sb.state_slot = 0;
  std::vector<float> logits(size_t(model->hparams().n_vocab));
  ThreadPool pool(2);
  model->forward(std::span<const SeqBatch>(&sb, 1), kv, logits.data(), pool);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  std::remove(src.c_str());
  std::remove(out.c_str());
}

class QuantizeStories : public ::testing::Test {
 protected:
  void SetUp() override {
    TERN_REQUIRE_SHARED("models/stories260K.gguf");
    TERN_REQUIRE_SHARED("data/tinystories/tinystories_val.txt");
  }
};

// stories260K's ffn_down rows are 172 wide: llama.cpp refuses them; tern falls back per tensor
// and says so, and the q8_0 model keeps its perplexity within 1% of F32.
TEST_F(QuantizeStories, Q8_0FallsBackPerTensorAndKeepsPerplexity) {
  const std::string out = temp_path("stories-q8_0.gguf");
  const auto rep = quantize_json(stories() + " " + out + " --type q8_0");
  EXPECT_EQ(rep["n_fallbacks"], 5);
  for (const auto& t : rep["tensors"]) {
    const std::string name = t["name"];
    if (name.find("ffn_down") != std::string::npos) {
      EXPECT_EQ(t["type"], "f16") << name;
      EXPECT_TRUE(t["fallback"].get<bool>()) << name;
      EXPECT_NE(t["reason"].get<std::string>().find("172"), std::string::npos) << t["reason"];
    } else if (t["ne"].size() == 2) {
      EXPECT_EQ(t["type"], "q8_0") << name;
    }
  }
  const double f32 = ppl_of(stories(), 100);
  const double q8 = ppl_of(out, 100);
  EXPECT_LT(std::fabs(q8 / f32 - 1.0), 0.01) << "f32 " << f32 << " q8_0 " << q8;
}

// The 32-block formats on a real model, perplexity against F32 (measured: q5_1 +0.5%, q5_0
// +1.8%, q4_1 +5.7%, q4_0 +6.9%): more bits lose less, and at equal bits the offset formats
// (q4_1, q5_1: a min per block) less than the symmetric ones.
TEST_F(QuantizeStories, BlocksOf32PerplexityOrder) {
  const double f32 = ppl_of(stories(), 100);
  std::map<std::string, double> ppl;
  for (const char* type : {"q5_1", "q5_0", "q4_1", "q4_0"}) {
    const std::string out = temp_path(std::string("stories-ppl-") + type + ".gguf");
    quantize_json(stories() + " " + out + " --type " + type);
    ppl[type] = ppl_of(out, 100);
  }
  EXPECT_LT(ppl["q5_1"] / f32, 1.01) << ppl["q5_1"];
  EXPECT_LT(ppl["q5_0"] / f32, 1.03) << ppl["q5_0"];
  EXPECT_LT(ppl["q4_1"] / f32, 1.08) << ppl["q4_1"];
  EXPECT_LT(ppl["q5_1"], ppl["q5_0"]);
  EXPECT_LT(ppl["q5_0"], ppl["q4_1"]);
  EXPECT_LT(ppl["q4_1"], ppl["q4_0"]);
  for (const auto& [type, p] : ppl) EXPECT_GT(p, f32 * 0.999) << type;
}

TEST_F(QuantizeStories, LlamaCppLoadsTheResult) {
  const std::string script = peer_script();
  if (script.empty()) GTEST_SKIP() << "llama.cpp peer not installed (../shared/peer/setup.sh)";
  // q4_k and q5_k: stories260K's 64-wide rows take the substitutes q5_0 and q5_1.
  for (const char* type : {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k"}) {
    const std::string out = temp_path(std::string("stories-peer-") + type + ".gguf");
    quantize_json(stories() + " " + out + " --type " + type);
    std::string peer_out, err;
    ASSERT_EQ(run_command("node " + script + " --model " + out + " --greedy 'Once upon a time' --n 8 --bos", &peer_out,
                          &err),
              0)
        << err;
    const auto peer = nlohmann::json::parse(peer_out.substr(peer_out.find('{')));
    std::string tern_out;
    ASSERT_EQ(run_command(kTern + " run -m " + out + " -p 'Once upon a time' -n 8 --temp 0 --json", &tern_out), 0);
    const auto ours = nlohmann::json::parse(tern_out);
    EXPECT_EQ(peer["prompt_ids"], ours["prompt_ids"]) << type;
    // Both engines quantize activations differently; the first tokens of a greedy run agree.
    const auto& a = peer["ids"];
    const auto& b = ours["ids"];
    ASSERT_EQ(a.size(), 8u);
    EXPECT_EQ(a[0], b[0]) << type;
  }
}

// The k-quant files (Q2_K, Q3_K; Q4_K_M, Q5_K_M mixes: q6_k in the "more bits" layer) and Q5_0 / Q5_1 of the
// quant-interop model, whose 256- and 512-wide rows fit the k-quants: llama.cpp loads them and
// its greedy run starts as tern's (measured: 12 of 12 tokens equal for q2_k, q3_k, q4_k, q5_k and q5_0).
// Likewise the ternary types TQ1_0 / TQ2_0 (every matrix but the output and the embedding
// ternary; measured: 12 of 12 tokens equal for both).
TEST(Quantize, LlamaCppLoadsKQuantFiles) {
  TERN_REQUIRE_SHARED("quant-interop/small-f16src.gguf");
  const std::string script = peer_script();
  if (script.empty()) GTEST_SKIP() << "llama.cpp peer not installed (../shared/peer/setup.sh)";
  for (const char* type : {"q2_k", "q3_k", "q4_k", "q5_k", "q5_0", "q5_1", "tq1_0", "tq2_0"}) {
    const std::string out = temp_path(std::string("small-peer-") + type + ".gguf");
    quantize_json(shared_path("quant-interop/small-f16src.gguf") + " " + out + " --type " + type);
    std::string peer_out, err;
    ASSERT_EQ(run_command("node " + script + " --model " + out + " --greedy 'Once upon a time' --n 4 --bos", &peer_out,
                          &err),
              0)
        << err;
    const auto peer = nlohmann::json::parse(peer_out.substr(peer_out.find('{')));
    std::string tern_out;
    ASSERT_EQ(run_command(kTern + " run -m " + out + " -p 'Once upon a time' -n 4 --temp 0 --json", &tern_out), 0);
    const auto ours = nlohmann::json::parse(tern_out);
    ASSERT_EQ(peer["ids"].size(), 4u) << type;
    EXPECT_EQ(peer["ids"][0], ours["ids"][0]) << type;
  }
}

TEST(Quantize, RequantizingNeedsItsFlag) {
  TERN_REQUIRE_SHARED("quant-interop/small-q4_0.gguf");
  const std::string src = shared_path("quant-interop/small-q4_0.gguf");
  std::string out, err;
  EXPECT_EQ(run_command(kTern + " quantize " + src + " " + temp_path("rq.gguf") + " --type q8_0", &out, &err), 1);
  EXPECT_NE(err.find("--allow-requantize"), std::string::npos) << err;
  EXPECT_EQ(run_command(kTern + " quantize " + src + " " + temp_path("rq.gguf") + " --type q8_0 --allow-requantize",
                        &out, &err),
            0)
      << err;
  // Dequantizing is lossless and needs no flag.
  EXPECT_EQ(run_command(kTern + " quantize " + src + " " + temp_path("dq.gguf") + " --type f32", &out, &err), 0) << err;
}

TEST(Quantize, BadInputIsOneClearError) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  std::string out, err;
  const std::string any = shared_path("models/stories260K.gguf");
  EXPECT_NE(run_command(kTern + " quantize " + any + " " + temp_path("x.gguf") + " --type q3_z", &out, &err), 0);
  EXPECT_NE(err.find("unknown type 'q3_z'"), std::string::npos) << err;
  EXPECT_EQ(run_command(kTern + " quantize /nonexistent/in.gguf " + temp_path("x.gguf") + " --type q8_0", &out, &err), 1);
  EXPECT_NE(err.find("/nonexistent/in.gguf"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  // The output path naming the input (here through a different spelling) must not clobber it.
  const std::string copy = temp_path("self.gguf");
  std::filesystem::copy_file(any, copy, std::filesystem::copy_options::overwrite_existing);
  const auto size = std::filesystem::file_size(copy);
  const std::string dir = std::filesystem::path(copy).parent_path().string();
  EXPECT_EQ(run_command(kTern + " quantize " + copy + " " + dir + "/./self.gguf --type q8_0", &out, &err), 1);
  EXPECT_NE(err.find("is the input file"), std::string::npos) << err;
  EXPECT_EQ(std::filesystem::file_size(copy), size);
  EXPECT_NE(run_command(kTern + " quantize " + any, &out, &err), 0);  // no output, no --type
}

}  // namespace
}  // namespace tern
