// The compression methods on stories260K: calibration statistics, GPTQ's and AWQ's layer-wise
// reconstruction error against round-to-nearest, the files they write, and clear errors for bad
// input.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "compress/calibrate.h"
#include "compress/gptq.h"
#include "compress/linalg.h"
#include "compress/methods.h"
#include "core/error.h"
#include "calib_test_util.h"
#include "compress_test_util.h"
#include "gguf/gguf.h"
#include "models/model.h"
#include "quant/quant_traits.h"

namespace tern {
namespace {

using namespace tern::testing;

class StoriesMethods : public StoriesCalibrated<4096> {};

const char* kLinears[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};

TEST_F(StoriesMethods, CalibrationCollectsEverySite) {
  const CalibStats& c = *calib_;
  EXPECT_GE(c.n_tokens, 4096);
  // Per layer: attn_q/k/v share one input, ffn_gate/up another; attn_output and ffn_down their
  // own; plus the output projection.
  EXPECT_EQ(c.sites.size(), 5u * 4 + 1);
  for (int il = 0; il < 5; ++il)
    for (const char* l : kLinears) {
      const std::string name = "blk." + std::to_string(il) + "." + l + ".weight";
      const SiteStats& s = c.of(name);
      EXPECT_EQ(s.n_in, std::string(l) == "ffn_down" ? 172 : 64) << name;
      EXPECT_EQ(s.n_tokens, c.n_tokens) << name;
      EXPECT_EQ(int64_t(s.hessian.size()), s.n_in * s.n_in) << name;
      EXPECT_GT(s.n_samples, 0) << name;
      for (int64_t j = 0; j < s.n_in; ++j) {
        EXPECT_GE(s.absmax[size_t(j)] * s.absmax[size_t(j)], s.mean_sq(j) * 0.999) << name;
        // The Hessian's diagonal is the sum of squares.
        EXPECT_NEAR(s.hessian[size_t(j * s.n_in + j)], s.sum_sq[size_t(j)], 1e-6 * s.sum_sq[size_t(j)] + 1e-9);
      }
    }
  EXPECT_EQ(&c.of("blk.2.attn_q.weight"), &c.of("blk.2.attn_v.weight"));
  EXPECT_NE(&c.of("blk.2.attn_q.weight"), &c.of("blk.2.attn_output.weight"));
}

// GPTQ's objective is the layer-wise output error on calibration data; at the same bits and
// group size it must beat round-to-nearest on every linear layer of the model.
TEST_F(StoriesMethods, GptqBeatsRoundToNearestOnEveryLayer) {
  ThreadPool pool(2);
  const GgufFile f = GgufFile::open(stories());
  for (int bits : {4, 3}) {
    for (int il = 0; il < 5; ++il)
      for (const char* l : kLinears) {
        const std::string name = "blk." + std::to_string(il) + "." + l + ".weight";
        const GgufTensorInfo* t = f.find_tensor(name);
        ASSERT_NE(t, nullptr);
        const auto* w = reinterpret_cast<const float*>(t->data);
        const int64_t n_in = t->ne[0], n_out = t->ne[1];
        const SiteStats& s = calib_->of(name);
        GptqOptions go;
        go.bits = bits;
        go.group = choose_group(n_in, 128);
        const GroupQuant g = gptq_quantize(w, n_out, n_in, s.hessian, go, pool);
        const GroupQuant r = rtn_group_quant(w, n_out, n_in, bits, go.group, pool);
        const double eg = output_error_gram(w, g.dequantize().data(), n_out, n_in, s.hessian, pool);
        const double er = output_error_gram(w, r.dequantize().data(), n_out, n_in, s.hessian, pool);
        EXPECT_LT(eg, er) << name << " int" << bits << ": gptq " << eg << " rtn " << er;
      }
  }
}

TEST_F(StoriesMethods, GptqActOrderAlsoBeatsRoundToNearest) {
  ThreadPool pool(2);
  const GgufFile f = GgufFile::open(stories());
  for (const char* name : {"blk.1.attn_q.weight", "blk.3.ffn_down.weight"}) {
    const GgufTensorInfo* t = f.find_tensor(name);
    const auto* w = reinterpret_cast<const float*>(t->data);
    const int64_t n_in = t->ne[0], n_out = t->ne[1];
    GptqOptions go;
    go.group = choose_group(n_in, 128);
    go.act_order = true;
    const SiteStats& s = calib_->of(name);
    const GroupQuant g = gptq_quantize(w, n_out, n_in, s.hessian, go, pool);
    const GroupQuant r = rtn_group_quant(w, n_out, n_in, 4, go.group, pool);
    EXPECT_LT(output_error_gram(w, g.dequantize().data(), n_out, n_in, s.hessian, pool),
              output_error_gram(w, r.dequantize().data(), n_out, n_in, s.hessian, pool))
        << name;
  }
}

// AWQ searches its scales on the calibration activations: on average over the layers its output
// error is lower than round-to-nearest's; GPTQ's report agrees with the direct test above.
TEST_F(StoriesMethods, MethodReportsShowLowerErrorThanRtn) {
  MethodOptions mo;
  for (const char* method : {"awq-int4", "gptq-int4"}) {
    const MethodReport rep = apply_method(method, stories(), temp_path(std::string("s-") + method + ".gguf"), calib_, mo);
    double ratio = 0;
    int n = 0;
    for (const auto& l : rep.layers) {
      ASSERT_GE(l.err, 0) << l.name;
      ratio += l.err / l.err_rtn;
      ++n;
    }
    EXPECT_EQ(n, 35) << method;
    EXPECT_LT(ratio / n, 0.95) << method;
  }
}

// The files: every linear weight that fits the format is in it, everything else follows the
// documented rules, and the tern.quant.* metadata says what was done.
TEST_F(StoriesMethods, FilesUseTheirFormatsAndDocumentThemselves) {
  MethodOptions mo;
  struct Expect {
    const char* method;
    DType linear;
  };
  for (const Expect& e : {Expect{"gptq-int4", DType::TQ4_G64}, Expect{"rtn-int4", DType::TQ4_G64},
                          Expect{"rtn-int8", DType::TQ8_G64}, Expect{"smoothquant-w8a8", DType::TI8}}) {
    const std::string out = temp_path(std::string("f-") + e.method + ".gguf");
    apply_method(e.method, stories(), out, calib_, mo);
    const GgufFile f = GgufFile::open(out);
    EXPECT_EQ(f.get_string("tern.quant.method"), e.method);
    for (const auto& t : f.tensors()) {
      if (t.name.find("ffn_down") != std::string::npos) {
        EXPECT_EQ(t.type, DType::F16) << t.name;  // 172 wide: no block format fits
      } else if (t.name.rfind("blk.", 0) == 0 && t.ne.size() == 2) {
        EXPECT_EQ(t.type, e.linear) << e.method << " " << t.name;
      } else if (t.ne.size() == 1) {
        EXPECT_EQ(t.type, DType::F32) << t.name;
      }
    }
  }
  // LLM.int8(): the layers with outliers above 6.0 get a wider TI8 class holding them.
  const std::string out = temp_path("f-llm.int8.gguf");
  const MethodReport rep = apply_method("llm.int8", stories(), out, calib_, mo);
  const GgufFile f = GgufFile::open(out);
  EXPECT_GT(f.get_uint("tern.quant.llm_int8.outlier_columns"), 0u);
  int with_outliers = 0;
  for (const auto& l : rep.layers) with_outliers += l.outliers > 0;
  EXPECT_GT(with_outliers, 0);
}

TEST_F(StoriesMethods, CalibrationTextTooShortIsAClearError) {
  const std::string path = temp_path("short.txt");
  std::ofstream(path) << "Once upon a time there was a cat.";
  CalibOptions co;
  co.text_file = path;
  co.n_tokens = 512;
  try {
    calibrate(open_model_file(stories()), co);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("too short"), std::string::npos) << e.what();
  }
}

TEST(Methods, UnknownMethodAndQuantizedSourceAreClearErrors) {
  TERN_REQUIRE_SHARED("quant-interop/small-q4_0.gguf");
  std::string out, err;
  EXPECT_NE(run_command(kTern + " quantize " + shared_path("quant-interop/small-f16src.gguf") + " " +
                            temp_path("x.gguf") + " --method gptq-int5",
                        &out, &err),
            0);
  EXPECT_NE(err.find("unknown method 'gptq-int5'"), std::string::npos) << err;
  MethodOptions mo;
  try {
    apply_method("awq-int4", shared_path("quant-interop/small-q4_0.gguf"), temp_path("y.gguf"), nullptr, mo);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already quantized"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("q4_0"), std::string::npos) << e.what();
  }
  // A method that needs calibration, without it.
  EXPECT_NE(run_command(kTern + " quantize " + shared_path("quant-interop/small-f16src.gguf") + " " +
                            temp_path("z.gguf") + " --method gptq-int4",
                        &out, &err),
            0);
  EXPECT_NE(err.find("--calib"), std::string::npos) << err;
}

}  // namespace
}  // namespace tern

namespace tern {
namespace {

using namespace tern::testing;

bool tern_formats_registered() { return quant_traits(DType::TQ4_G64) != nullptr && quant_traits(DType::TI8) != nullptr; }

// The acceptance table, end to end through `tern compare` (quantize, run, perplexity on
// tinystories_val.txt at --ctx 256, first 100 chunks).
TEST(Compare, StoriesTableMeetsTheTargets) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  TERN_REQUIRE_SHARED("data/tinystories/tinystories_val.txt");
  if (!tern_formats_registered()) GTEST_SKIP() << "tern's TI8/TQ types are not in the traits table yet";
  const std::string chart = temp_path("chart.svg");
  std::string out, err;
  ASSERT_EQ(run_command(kTern + " compare -m " + stories() +
                            " --methods f32,q8_0,q4_0,gptq-int4,awq-int4,llm.int8,smoothquant-w8a8 --ppl-file " +
                            tinystories_val() + " --ctx 256 --ppl-chunks 100 --gen-tokens 16 --prompt-tokens 32" +
                            " --json --chart " + chart,
                        &out, &err),
            0)
      << err;
  const auto rows = nlohmann::json::parse(out);
  ASSERT_EQ(rows.size(), 7u);
  std::map<std::string, nlohmann::json> by;
  for (const auto& r : rows) {
    for (const char* k : {"method", "ppl", "weight_bytes", "peak_rss_bytes", "pp_tok_s", "tg_tok_s", "ttft_ms", "tbt_ms"})
      ASSERT_TRUE(r.contains(k)) << k;
    EXPECT_GT(r["tg_tok_s"].get<double>(), 0) << r["method"];
    EXPECT_GT(r["peak_rss_bytes"].get<double>(), 0) << r["method"];
    by[r["method"]] = r;
  }
  const double f32 = by["f32"]["ppl"];
  for (const char* m : {"q8_0", "llm.int8", "smoothquant-w8a8"})
    EXPECT_LT(std::fabs(by[m]["ppl"].get<double>() / f32 - 1.0), 0.01) << m << " " << by[m]["ppl"] << " vs " << f32;
  // Every row after the first is compared with f32's next-token distributions: the 8-bit
  // methods far closer than q4_0, GPTQ and AWQ closer than q4_0 (what their lower PPL says,
  // measured per position).
  EXPECT_FALSE(by["f32"].contains("kld"));
  for (const char* m : {"q8_0", "q4_0", "gptq-int4", "awq-int4", "llm.int8", "smoothquant-w8a8"}) {
    ASSERT_TRUE(by[m].contains("kld")) << m;
    EXPECT_GT(by[m]["kld"].get<double>(), 0.0) << m;
    EXPECT_GT(by[m]["same_top_pct"].get<double>(), 50.0) << m;
  }
  for (const char* m : {"q8_0", "llm.int8", "smoothquant-w8a8"})
    EXPECT_LT(by[m]["kld"].get<double>() * 4, by["q4_0"]["kld"].get<double>()) << m;
  for (const char* m : {"gptq-int4", "awq-int4"}) {
    EXPECT_LT(by[m]["kld"].get<double>(), by["q4_0"]["kld"].get<double>()) << m;
    EXPECT_LT(by[m]["ppl"].get<double>(), by["q4_0"]["ppl"].get<double>()) << m;
    EXPECT_LE(by[m]["weight_bytes"].get<int64_t>(), by["q4_0"]["weight_bytes"].get<int64_t>()) << m;
    EXPECT_LE(by[m]["bpw"].get<double>(), by["q4_0"]["bpw"].get<double>()) << m;
  }
  const std::string svg = read_file_bytes(chart);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("gptq-int4"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST(Compare, BadInputIsAClearErrorBeforeAnyWork) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  TERN_REQUIRE_SHARED("quant-interop/small-q4_0.gguf");
  std::string out, err;
  EXPECT_NE(run_command(kTern + " compare -m " + stories() + " --methods q8_0,awq-int2 --ppl-file " + tinystories_val(),
                        &out, &err),
            0);
  EXPECT_NE(err.find("unknown method 'awq-int2'"), std::string::npos) << err;
  EXPECT_NE(run_command(kTern + " compare -m " + shared_path("quant-interop/small-q4_0.gguf") +
                            " --methods gptq-int4 --ppl-file " + tinystories_val() + " --calib-tokens 64",
                        &out, &err),
            0);
  EXPECT_NE(err.find("already quantized"), std::string::npos) << err;
  const std::string short_text = temp_path("short-calib.txt");
  std::ofstream(short_text) << "Once upon a time there was a dog. The end.";
  EXPECT_NE(run_command(kTern + " compare -m " + stories() + " --methods llm.int8 --ppl-file " + tinystories_val() +
                            " --calib " + short_text,
                        &out, &err),
            0);
  EXPECT_NE(err.find("too short"), std::string::npos) << err;
  EXPECT_NE(run_command(kTern + " compare -m " + stories() + " --methods q8_0", &out, &err), 0);
  EXPECT_NE(err.find("--ppl-file"), std::string::npos) << err;
}

}  // namespace
}  // namespace tern
