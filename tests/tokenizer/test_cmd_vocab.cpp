// `tern vocab --from-hf`, run as the built binary on small tokenizer.json files written here:
// the keys it writes (as llama.cpp's converter would), tokenizing with the result, and the
// errors it gives for bad input. (tests/tokenizer/js/run.sh checks real tokenizers.)
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_cmd_vocab {
namespace {

namespace fs = std::filesystem;

using test::RunResult;
std::string quote(const std::string& s) { return test::shell_quote(s); }
RunResult run_tern(const std::string& args) { return test::run_tern_args(args, /*merge_stderr=*/true); }

class CmdVocab : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tern_cmd_vocab_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// Qwen2's Split regex as tokenizer.json spells it (JSON-escaped).
constexpr const char* kQwenRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+)";

std::string byte_level_json(const std::string& regex) {
  return R"({"added_tokens": [
      {"id": 6, "content": "<|endoftext|>", "special": true, "normalized": false},
      {"id": 7, "content": "<think>", "special": false, "normalized": false}],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": ")" + regex + R"("}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "\u0120": 2, "ab": 3, "\u0120ab": 4, "c": 5},
              "merges": [["a", "b"], ["\u0120", "ab"]]}})";
}

const GgufArray& array(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (!v) throw std::runtime_error("missing " + key);
  return v->as_array(key);
}

TEST_F(CmdVocab, ByteLevelBpe) {
  const std::string tj = write("tokenizer.json", byte_level_json(kQwenRegex));
  const std::string cfg = write("tokenizer_config.json",
                                R"({"eos_token": "<|endoftext|>", "bos_token": null, "add_bos_token": false,
                                    "pad_token": {"content": "<|endoftext|>"}, "chat_template": "{{ messages }}"})");
  const std::string out = path("v.gguf");
  RunResult r = run_tern("vocab --from-hf " + quote(tj) + " --config " + quote(cfg) + " -o " + quote(out));
  ASSERT_EQ(r.exit_code, 0) << r.out;

  const GgufFile f = GgufFile::open(out);
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "qwen2");
  const GgufArray& tokens = array(f, "tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.items.size(), 8u);
  EXPECT_EQ(tokens.items[4].as_string(), "\xC4\xA0" "ab");
  const GgufArray& types = array(f, "tokenizer.ggml.token_type");
  EXPECT_EQ(types.items[0].as_int(), 1);  // normal
  EXPECT_EQ(types.items[6].as_int(), 3);  // special added token: control
  EXPECT_EQ(types.items[7].as_int(), 4);  // other added token: user-defined
  const GgufArray& merges = array(f, "tokenizer.ggml.merges");
  ASSERT_EQ(merges.items.size(), 2u);
  EXPECT_EQ(merges.items[1].as_string(), "\xC4\xA0 ab");
  EXPECT_FALSE(f.has("tokenizer.ggml.scores"));
  EXPECT_EQ(f.get_uint("tokenizer.ggml.eos_token_id"), 6u);
  EXPECT_EQ(f.get_uint("tokenizer.ggml.padding_token_id"), 6u);
  EXPECT_FALSE(f.has("tokenizer.ggml.bos_token_id"));
  EXPECT_FALSE(f.get("tokenizer.ggml.add_bos_token").as_bool());
  EXPECT_EQ(f.get_string("tokenizer.chat_template"), "{{ messages }}");
  EXPECT_EQ(f.get_string("general.name"), dir_.filename().string());

  // The result tokenizes; <think> is split out without --parse-special.
  r = run_tern("tokenize -m " + quote(out) + " --no-bos ' ab<think>ab'");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "4 7 3\n");
}

TEST_F(CmdVocab, SentencePieceStyleBpe) {
  // Gemma's shape: spaces become U+2581 by a normalizer, no prefix, byte fallback, added
  // whitespace tokens.
  const std::string tj = write("tokenizer.json", R"({
    "added_tokens": [
      {"id": 0, "content": "<pad>", "special": true}, {"id": 1, "content": "<eos>", "special": true},
      {"id": 2, "content": "<bos>", "special": true}, {"id": 3, "content": "<unk>", "special": true},
      {"id": 9, "content": "\u2581\u2581", "special": false},
      {"id": 11, "content": "<unused0>", "special": false}],
    "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
    "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false},
    "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": true,
              "vocab": {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<0x41>": 4, "\u2581": 5,
                        "h": 6, "i": 7, "hi": 8, "\u2581\u2581": 9, "\u2581hi": 10, "<unused0>": 11},
              "merges": [["\u2581", "\u2581"], ["h", "i"], ["\u2581", "hi"]]}})");
  const std::string cfg = write("cfg.json", R"({"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>",
                                                 "add_bos_token": true, "add_eos_token": false,
                                                 "chat_template": [{"name": "default", "template": "A"},
                                                                   {"name": "tool_use", "template": "B"}]})");
  const std::string out = path("spm.gguf");
  RunResult r = run_tern("vocab --from-hf " + quote(tj) + " --config " + quote(cfg) + " --name gemma-test -o " +
                         quote(out) + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"model\":\"llama\""), std::string::npos) << r.out;

  const GgufFile f = GgufFile::open(out);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "default");
  EXPECT_EQ(f.get_string("general.name"), "gemma-test");
  EXPECT_FALSE(f.get("tokenizer.ggml.add_space_prefix").as_bool());
  const GgufArray& tokens = array(f, "tokenizer.ggml.tokens");
  const GgufArray& types = array(f, "tokenizer.ggml.token_type");
  const GgufArray& scores = array(f, "tokenizer.ggml.scores");
  ASSERT_EQ(tokens.items.size(), 12u);
  EXPECT_EQ(types.items[4].as_int(), 6);   // <0x41>: byte
  EXPECT_EQ(types.items[3].as_int(), 3);   // <unk> is a special added token: control
  EXPECT_EQ(tokens.items[9].as_string(), "  ");  // user-defined, U+2581 written as a space
  EXPECT_EQ(types.items[9].as_int(), 4);
  EXPECT_EQ(types.items[11].as_int(), 3);  // <unused0> looks special
  EXPECT_FLOAT_EQ(scores.items[9].as_float(), -1000.0f);
  EXPECT_FLOAT_EQ(scores.items[8].as_float(), -1.0f);  // "hi": made by merge 1
  EXPECT_FLOAT_EQ(scores.items[10].as_float(), -2.0f);
  EXPECT_EQ(f.get_uint("tokenizer.ggml.bos_token_id"), 2u);
  EXPECT_EQ(f.get_uint("tokenizer.ggml.unknown_token_id"), 3u);
  EXPECT_TRUE(f.get("tokenizer.ggml.add_bos_token").as_bool());
  EXPECT_EQ(f.get_string("tokenizer.chat_template"), "A");
  EXPECT_EQ(f.get_string("tokenizer.chat_template.tool_use"), "B");

  // hi + ▁hi by score, A by byte fallback, two spaces as the user-defined token.
  r = run_tern("tokenize -m " + quote(out) + " --no-bos 'hi hiA  hi'");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "8 10 4 9 8\n");
  r = run_tern("tokenize -m " + quote(out) + " hi");
  EXPECT_EQ(r.out, "2 8\n");  // add_bos from the config
}

TEST_F(CmdVocab, PrependNormalizerMeansSpacePrefix) {
  // Phi-3 / Llama 2 shape: the normalizer prepends U+2581.
  const std::string tj = write("tokenizer.json", R"({
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                   {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
    "pre_tokenizer": null,
    "model": {"type": "BPE", "byte_fallback": true, "vocab": {"\u2581": 0, "h": 1, "\u2581h": 2},
              "merges": [["\u2581", "h"]]}})");
  const std::string out = path("p.gguf");
  RunResult r = run_tern("vocab --from-hf " + quote(tj) + " -o " + quote(out));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const GgufFile f = GgufFile::open(out);
  EXPECT_TRUE(f.get("tokenizer.ggml.add_space_prefix").as_bool());
  r = run_tern("tokenize -m " + quote(out) + " --no-bos h");
  EXPECT_EQ(r.out, "2\n");
}

TEST_F(CmdVocab, RefusesBadInput) {
  auto expect_refused = [&](const std::string& args, const std::string& needle) {
    const RunResult r = run_tern("vocab " + args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.out.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.out;
  };
  const std::string out = path("out.gguf");
  expect_refused("--from-hf " + quote(path("absent.json")) + " -o " + quote(out), "absent.json");
  const std::string bad = write("bad.json", "{\"model\": ");
  expect_refused("--from-hf " + quote(bad) + " -o " + quote(out), "not a valid JSON file");
  const std::string uni = write("uni.json", R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})");
  expect_refused("--from-hf " + quote(uni) + " -o " + quote(out), "model.type 'Unigram'");
  const std::string rx = write("rx.json", byte_level_json(R"(\\p{L}+)"));
  expect_refused("--from-hf " + quote(rx) + " -o " + quote(out), "pre-tokenizer regex");
  const std::string ok = write("tokenizer.json", byte_level_json(kQwenRegex));
  expect_refused("--from-hf " + quote(ok) + " --config " + quote(bad) + " -o " + quote(out), "bad.json");
  expect_refused("--from-hf " + quote(ok) + " -o " + quote(ok), "");  // the output is the input
  EXPECT_FALSE(fs::exists(out));
  EXPECT_NE(run_tern("vocab --from-hf " + quote(ok)).exit_code, 0);  // -o is required
}

}  // namespace
}  // namespace tern::test_cmd_vocab
