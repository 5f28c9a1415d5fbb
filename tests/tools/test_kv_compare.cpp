// tern compare --kv (src/tools/kv_compare.h), run as a user runs it on stories260K: one JSON row
// per entry, bytes per token exactly the types' block sizes, q8_0's perplexity next to f16's, the
// policies' bounded caches, and clear errors for bad entries, mixed options and a model that
// cannot run a policy (the child's own message).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_kv_compare {
namespace {

using tern::testing::run_command;
using tern::testing::shared_path;

const std::string kTern = TERN_BINARY;

using Result = tern::testing::TernResult;
Result tern(const std::string& args) { return tern::testing::run_tern(args); }

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

std::string base_args() {
  return "compare -m " + shared_path("models/stories260K.gguf") + " --ppl-file " +
         shared_path("data/tinystories/tinystories_val.txt") + " --ctx 64 --gen-tokens 8";
}

#define REQUIRE_STORIES()                         \
  TERN_REQUIRE_SHARED("models/stories260K.gguf"); \
  TERN_REQUIRE_SHARED("data/tinystories/tinystories_val.txt")

TEST(KvCompare, OneRowPerEntryWithExactBytesAndCloseQ8Perplexity) {
  REQUIRE_STORIES();
  const Result r = tern(base_args() + " --kv f16,q8_0,q4_0,streaming-32,q8_0+h2o-50% --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 5u);
  const char* names[] = {"f16", "q8_0", "q4_0", "streaming-32", "q8_0+h2o-50%"};
  for (size_t i = 0; i < j.size(); ++i) {
    EXPECT_EQ(j[i]["entry"], names[i]);
    EXPECT_GT(j[i]["ppl"].get<double>(), 1.0) << names[i];
    EXPECT_GT(j[i]["decode_tok_s"].get<double>(), 0.0) << names[i];
    EXPECT_GT(j[i]["peak_rss_bytes"].get<int64_t>(), 0) << names[i];
    EXPECT_EQ(j[i]["n_tokens"].get<int64_t>(), 64) << names[i];  // --kv-long defaults to --ctx
    // Peak KV: the cache's capacity at the type's bytes per token.
    EXPECT_EQ(j[i]["kv_bytes"].get<int64_t>(),
              j[i]["kv_capacity"].get<int64_t>() * j[i]["bytes_per_token"].get<int64_t>()) << names[i];
  }
  // Per 32 elements: f16 64 bytes, q8_0 34 (a half scale + 32 bytes), q4_0 18 (a half + 16).
  const int64_t f16 = j[0]["bytes_per_token"], q8 = j[1]["bytes_per_token"], q4 = j[2]["bytes_per_token"];
  ASSERT_GT(f16, 0);
  EXPECT_EQ(f16 * 34, q8 * 64);
  EXPECT_EQ(f16 * 18, q4 * 64);
  // q8_0 K/V costs under 1% of f16's perplexity; f16 is the baseline its delta is taken from.
  const double p16 = j[0]["ppl"], p8 = j[1]["ppl"];
  EXPECT_LT(std::abs(p8 / p16 - 1.0), 0.01) << p16 << " vs " << p8;
  EXPECT_DOUBLE_EQ(j[0]["ppl_delta"].get<double>(), 0.0);
  EXPECT_NEAR(j[1]["ppl_delta_pct"].get<double>(), 100.0 * (p8 / p16 - 1.0), 1e-9);
  // The full rows cache every token; the policies hold 32 (streaming: 4 sinks + 28; h2o: 50% of
  // 64) and evict the rest. A policy alone runs on f16, TYPE+POLICY on the type.
  EXPECT_EQ(j[0]["kv_capacity"].get<int64_t>(), 64);
  EXPECT_EQ(j[0]["policy"], "none");
  EXPECT_EQ(j[3]["kv_capacity"].get<int64_t>(), 32);
  EXPECT_GT(j[3]["n_evicted"].get<int64_t>(), 0);
  EXPECT_EQ(j[3]["kv_type"], "f16");
  EXPECT_TRUE(j[3]["kv_type_default"].get<bool>());
  EXPECT_EQ(j[3]["bytes_per_token"].get<int64_t>(), f16);
  EXPECT_TRUE(contains(j[3]["policy"].get<std::string>(), "streaming (4 sinks + 28 window)")) << j[3]["policy"];
  EXPECT_EQ(j[4]["kv_capacity"].get<int64_t>(), 32);
  EXPECT_EQ(j[4]["kv_type"], "q8_0");
  EXPECT_FALSE(j[4]["kv_type_default"].get<bool>());
  EXPECT_EQ(j[4]["bytes_per_token"].get<int64_t>(), q8);
  EXPECT_TRUE(contains(j[4]["policy"].get<std::string>(), "h2o")) << j[4]["policy"];
  // Every row after the first is compared with the first's distributions (tern ppl
  // --kl-divergence): q8_0 a little, q4_0 more, the policies (which evicted tokens) not at all
  // like the full cache.
  EXPECT_FALSE(j[0].contains("kl_divergence"));
  for (size_t i = 1; i < j.size(); ++i) {
    ASSERT_TRUE(j[i].contains("kl_divergence")) << names[i];
    EXPECT_EQ(j[i]["kl_divergence"]["n_positions"].get<int64_t>(), 63) << names[i];
    EXPECT_NEAR(j[i]["kl_divergence"]["ppl_base"].get<double>(), p16, p16 * 1e-4) << names[i];
  }
  const double kl8 = j[1]["kl_divergence"]["kld"]["mean"], kl4 = j[2]["kl_divergence"]["kld"]["mean"];
  EXPECT_GT(kl8, 0.0);
  EXPECT_GT(kl4, kl8);
  EXPECT_GT(j[3]["kl_divergence"]["kld"]["mean"].get<double>(), kl8);
  // The decode test: --gen-tokens after a prompt filling the rest of the context.
  EXPECT_EQ(j[0]["decode_gen_tokens"].get<int64_t>(), 8);
  EXPECT_NEAR(j[0]["decode_prompt_tokens"].get<double>(), 64 - 8 - 1, 2);
}

TEST(KvCompare, PrintsAnAlignedTable) {
  REQUIRE_STORIES();
  const Result r = tern(base_args() + " --kv f32,h2o-50");
  ASSERT_EQ(r.rc, 0) << r.err;
  for (const char* s : {"entry", "bytes/token", "peak KV", "Δppl vs first", "KLD vs first", "same top",
                        "decode tok/s @", "peak RSS", "baseline",
                        "1280 B", "640 B", "f16*", "h2o (budget 50%"})
    EXPECT_TRUE(contains(r.out, s)) << s << " not in\n" << r.out;
  EXPECT_TRUE(contains(r.err, "[2/2] h2o-50")) << r.err;  // a progress line per row
}

TEST(KvCompare, BadEntriesAndOptionsAreClearErrors) {
  REQUIRE_STORIES();
  for (const std::string bad : {"streeming-64", "streaming-4", "h2o-0", "h2o-150%", "q5_1", "q8_0+f16", "f16+lru-3"}) {
    const Result r = tern(base_args() + " --kv f16," + bad);
    EXPECT_NE(r.rc, 0) << bad;
    EXPECT_TRUE(contains(r.err, "\"" + bad + "\"")) << bad << ": " << r.err;
    EXPECT_TRUE(contains(r.err, "streaming-W")) << bad << ": " << r.err;  // the accepted forms
    EXPECT_TRUE(r.out.empty()) << bad;  // refused before any measurement
  }
  Result r = tern(base_args() + " --kv f16,streaming-100");  // 100 resident tokens in a context of 64
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(contains(r.err, "streaming-100")) << r.err;
  r = tern(base_args() + " --kv f16 --methods q8_0");
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(contains(r.err, "--methods")) << r.err;
  r = tern(base_args() + " --kv f16 --ratio-of layers");  // a structured pruning option
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(contains(r.err, "--ratio-of is for the compression methods' table")) << r.err;
  r = tern("compare -m " + shared_path("models/stories260K.gguf") + " --kv f16");
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(contains(r.err, "--ppl-file")) << r.err;
}

TEST(KvCompare, ChildErrorIsSurfaced) {
  REQUIRE_STORIES();
  // A sliding-window model cannot run an eviction policy: tern ppl's own reason reaches the user,
  // with the entry it belongs to.
  const std::string dir = tern::testing::make_temp_dir("tern_kv_compare");
  const std::string model = dir + "/gemma2.gguf";
  Result r = tern("synth --shape gemma2-tiny --seed 1 -o " + model);
  ASSERT_EQ(r.rc, 0) << r.err;
  r = tern("compare -m " + model + " --ppl-file " + shared_path("data/tinystories/tinystories_val.txt") +
           " --ctx 32 --gen-tokens 4 --kv streaming-16");
  tern::testing::remove_temp_dir(dir);
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(contains(r.err, "streaming-16: tern ppl failed")) << r.err;
  EXPECT_TRUE(contains(r.err, "sliding-window")) << r.err;
}

}  // namespace
}  // namespace tern::test_kv_compare
