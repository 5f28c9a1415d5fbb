// `tern inspect` and `tern convert`, run as the user runs them (the built binary): output,
// JSON, exit codes, and one clear stderr line on bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "gguf_test_util.h"
#include "models/llama2c_import.h"

namespace tern::test {
namespace {

const std::string kModel = "models/stories260K.gguf";
const std::string kBin = "models/stories260K-llama2c/stories260K.bin";
const std::string kTok = "models/stories260K-llama2c/tok512.bin";

#define REQUIRE_SHARED(rel)                                                                          \
  do {                                                                                               \
    if (!std::filesystem::exists(shared_path(rel))) GTEST_SKIP() << "missing " << shared_path(rel); \
  } while (0)

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

size_t count_lines(const std::string& s) { return size_t(std::count(s.begin(), s.end(), '\n')); }

// A failed command: non-zero exit, nothing on stdout, exactly one line on stderr holding
// every needle.
void expect_one_line_error(const RunResult& r, std::initializer_list<std::string> needles) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(count_lines(r.err), 1u) << r.err;
  for (const auto& n : needles) EXPECT_TRUE(contains(r.err, n)) << "'" << n << "' not in: " << r.err;
}

TEST(CliInspect, TextReport) {
  REQUIRE_SHARED(kModel);
  const RunResult r = run_tern({"inspect", shared_path(kModel)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  for (const char* s : {"version:     3", "alignment:   32", "data offset: 14176", "file size:   1185376",
                        "metadata: 19 keys", "general.architecture", "\"llama\"",
                        "[string x 512] [\"<unk>\", \"<s>\", \"</s>\"", ", ...]",
                        "llama.attention.layer_norm_rms_epsilon  f32            1e-05",
                        "hyper-parameters (llama):", "n_vocab         512", "n_ctx_train     2048",
                        "n_embd          64", "n_layer         5", "n_head          8", "n_head_kv       4",
                        "head_dim        8", "n_ff            172", "n_rot           8", "rope_freq_base  10000",
                        "rms_eps         1e-05", "tensors: 48", "blk.4.ffn_down.weight     f32     172 x 64",
                        "total: 48 tensors, 292800 elements, 1171200 bytes (1.12 MiB)"})
    EXPECT_TRUE(contains(r.out, s)) << "'" << s << "' not in output:\n" << r.out;
  // Long arrays are abbreviated: the 512 tokens do not all appear.
  EXPECT_FALSE(contains(r.out, "<0x10>"));
}

TEST(CliInspect, JsonReport) {
  REQUIRE_SHARED(kModel);
  const RunResult r = run_tern({"inspect", shared_path(kModel), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["alignment"], 32);
  EXPECT_EQ(j["data_offset"], 14176);
  EXPECT_EQ(j["file_size"], 1185376);
  ASSERT_EQ(j["metadata"].size(), 19u);
  EXPECT_EQ(j["metadata"][0]["key"], "tokenizer.ggml.tokens");
  EXPECT_EQ(j["metadata"][0]["type"], "array[string]");
  EXPECT_EQ(j["metadata"][0]["count"], 512);
  EXPECT_EQ(j["metadata"][0]["value"].size(), 8u);
  EXPECT_EQ(j["metadata"][0]["value"][1], "<s>");
  EXPECT_EQ(j["metadata"][18]["key"], "llama.attention.layer_norm_rms_epsilon");
  EXPECT_EQ(j["metadata"][18]["value"].get<double>(), 1e-5);
  const auto& hp = j["hparams"];
  EXPECT_EQ(hp["architecture"], "llama");
  EXPECT_EQ(hp["n_vocab"], 512);
  EXPECT_EQ(hp["n_ctx_train"], 2048);
  EXPECT_EQ(hp["n_embd"], 64);
  EXPECT_EQ(hp["n_layer"], 5);
  EXPECT_EQ(hp["n_head"], 8);
  EXPECT_EQ(hp["n_head_kv"], 4);
  EXPECT_EQ(hp["head_dim"], 8);
  EXPECT_EQ(hp["n_ff"], 172);
  EXPECT_EQ(hp["n_rot"], 8);
  EXPECT_EQ(hp["rope_freq_base"].get<double>(), 10000.0);
  EXPECT_EQ(hp["rms_eps"].get<double>(), 1e-5);
  ASSERT_EQ(j["tensors"].size(), 48u);
  EXPECT_EQ(j["tensors"][0]["name"], "token_embd.weight");
  EXPECT_EQ(j["tensors"][0]["type"], "f32");
  EXPECT_EQ(j["tensors"][0]["shape"], nlohmann::json({64, 512}));
  EXPECT_EQ(j["tensors"][0]["bytes"], 131072);
  uint64_t sum = 0;
  for (const auto& t : j["tensors"]) sum += t["bytes"].get<uint64_t>();
  EXPECT_EQ(j["totals"]["n_tensors"], 48);
  EXPECT_EQ(j["totals"]["n_bytes"], sum);
  EXPECT_EQ(j["totals"]["n_elements"], 292800);

  const RunResult all = run_tern({"inspect", shared_path(kModel), "--json", "--max-items", "0"});
  ASSERT_EQ(all.exit_code, 0) << all.err;
  EXPECT_EQ(nlohmann::json::parse(all.out)["metadata"][0]["value"].size(), 512u);
}

TEST(CliInspect, QuantizedAndVocabOnlyFiles) {
  const std::string q = "quant-interop/small-q4_k.gguf";
  const std::string vocab = "tokenizer/llama.cpp-vocab/ggml-vocab-gpt-2.gguf";
  REQUIRE_SHARED(q);
  REQUIRE_SHARED(vocab);
  RunResult r = run_tern({"inspect", shared_path(q)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "q4_k")) << r.out;
  EXPECT_TRUE(contains(r.out, "n_embd          256")) << r.out;
  r = run_tern({"inspect", shared_path(vocab), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tensors"].size(), 0u);
  EXPECT_EQ(j["totals"]["n_bytes"], 0);
}

TEST(CliInspect, MalformedAndMissingFilesGiveOneErrorLine) {
  TempDir dir;
  const std::string bad = dir.file("bad.gguf");
  auto bytes = small_file_bytes();
  bytes.resize(100);
  write_bytes(bad, bytes);
  expect_one_line_error(run_tern({"inspect", bad}), {"tern inspect: error:", bad, "truncated"});
  expect_one_line_error(run_tern({"inspect", bad, "--json"}), {"tern inspect: error:", bad});
  expect_one_line_error(run_tern({"inspect", dir.file("missing.gguf")}), {"cannot open", "missing.gguf"});
  write_bytes(bad, {'G', 'G', 'U', 'F', 1, 0, 0, 0});
  expect_one_line_error(run_tern({"inspect", bad}), {"unsupported GGUF version 1"});
  // usage errors exit 2
  EXPECT_EQ(run_tern({"inspect"}).exit_code, 2);
  EXPECT_EQ(run_tern({"inspect", bad, "--no-such-flag"}).exit_code, 2);
}

TEST(CliConvert, WritesAFileThatReopens) {
  REQUIRE_SHARED(kBin);
  REQUIRE_SHARED(kTok);
  TempDir dir;
  const std::string out = dir.file("stories.gguf");
  const RunResult r = run_tern({"convert", shared_path(kBin), "--tokenizer", shared_path(kTok), "-o", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "wrote " + out)) << r.out;
  EXPECT_FALSE(std::filesystem::exists(out + ".tmp"));
  const GgufFile f = GgufFile::open(out);
  EXPECT_EQ(f.tensors().size(), 48u);
  EXPECT_EQ(f.get_uint("llama.context_length"), 512u);
  EXPECT_EQ(read_bytes(out), llama2c_to_gguf_bytes(shared_path(kBin), shared_path(kTok)));
  // and `tern inspect` reads it
  const RunResult i = run_tern({"inspect", out});
  EXPECT_EQ(i.exit_code, 0) << i.err;
  EXPECT_TRUE(contains(i.out, "n_ctx_train     512")) << i.out;
}

TEST(CliConvert, CtxOptionReproducesLlamaCppOutput) {
  REQUIRE_SHARED(kBin);
  REQUIRE_SHARED(kTok);
  REQUIRE_SHARED(kModel);
  TempDir dir;
  const std::string out = dir.file("stories.gguf");
  const RunResult r =
      run_tern({"convert", shared_path(kBin), "--tokenizer", shared_path(kTok), "--output", out, "--ctx", "2048"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(read_bytes(out) == read_bytes(shared_path(kModel)));
}

TEST(CliConvert, BadInputsGiveOneErrorLineAndNoOutput) {
  TempDir dir;
  const std::string out = dir.file("out.gguf");
  const std::string garbage = dir.file("garbage.bin");
  std::vector<uint8_t> junk(1000);
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = uint8_t(i * 131 + 7);
  write_bytes(garbage, junk);
  const std::string tok = std::filesystem::exists(shared_path(kTok)) ? shared_path(kTok) : garbage;

  expect_one_line_error(run_tern({"convert", dir.file("missing.bin"), "--tokenizer", tok, "-o", out}),
                        {"tern convert: error:", "cannot open", "missing.bin"});
  expect_one_line_error(run_tern({"convert", garbage, "--tokenizer", tok, "-o", out}),
                        {"tern convert: error:", "garbage.bin"});
  if (std::filesystem::exists(shared_path(kBin))) {
    expect_one_line_error(run_tern({"convert", shared_path(kBin), "--tokenizer", garbage, "-o", out}),
                          {"tern convert: error:", "garbage.bin"});
    expect_one_line_error(
        run_tern({"convert", shared_path(kBin), "--tokenizer", tok, "-o", dir.file("no/such/dir/out.gguf")}),
        {"tern convert: error:", "cannot create"});
  }
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_FALSE(std::filesystem::exists(out + ".tmp"));
  // usage errors exit 2
  EXPECT_EQ(run_tern({"convert", garbage, "-o", out}).exit_code, 2);  // no --tokenizer
  EXPECT_EQ(run_tern({"convert"}).exit_code, 2);
}

}  // namespace
}  // namespace tern::test
