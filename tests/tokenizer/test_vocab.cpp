// Tokenizers built from small in-memory GGUF vocabularies: merge order, fallbacks and the
// validation of malformed metadata. Needs no fixture files.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_vocab {
namespace {

using test::gguf_floats;
using test::gguf_ints;
using test::gguf_strings;
GgufValue strings(const std::vector<std::string>& v) { return gguf_strings(v); }
GgufValue ints(const std::vector<int32_t>& v) { return gguf_ints(v); }
std::unique_ptr<Tokenizer> build(const GgufWriter& w) { return test::tokenizer_from(w); }
GgufValue floats(const std::vector<float>& v) { return gguf_floats(v); }





// <unk> <s> </s> ▁ a b c ab bc; "bc" outscores "ab".
GgufWriter spm_writer() {
  GgufWriter w;
  w.set("tokenizer.ggml.model", GgufValue::string("llama"));
  w.set("tokenizer.ggml.tokens",
        strings({"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "c", "ab", "bc"}));
  w.set("tokenizer.ggml.scores", floats({0, 0, 0, -1, -2, -2, -2, -5, -3}));
  w.set("tokenizer.ggml.token_type", ints({2, 3, 3, 1, 1, 1, 1, 1, 1}));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(1));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(2));
  return w;
}

// Byte-level vocabulary over "h e l o" and space ("Ġ" = U+0120).
GgufWriter gpt2_writer(const std::vector<std::string>& merges) {
  GgufWriter w;
  w.set("tokenizer.ggml.model", GgufValue::string("gpt2"));
  w.set("tokenizer.ggml.tokens", strings({"h", "e", "l", "o", "\xC4\xA0", "he", "ll", "hell",
                                          "hello", "\xC4\xA0h", "<|endoftext|>"}));
  w.set("tokenizer.ggml.token_type", ints({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3}));
  w.set("tokenizer.ggml.merges", strings(merges));
  return w;
}

void expect_error(const GgufWriter& w, const std::string& needle) {
  try {
    build(w);
    ADD_FAILURE() << "expected tern::Error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TokenizerVocab, SpmMergesByScore) {
  const auto tok = build(spm_writer());
  EXPECT_EQ(tok->model_kind(), "llama");
  EXPECT_TRUE(tok->add_bos_default());  // the llama default
  // "▁abc": "bc" (-3) beats "ab" (-5); "▁a" is no piece.
  EXPECT_EQ(tok->encode("abc", true), (std::vector<int32_t>{1, 3, 4, 8}));
  EXPECT_EQ(tok->decode({1, 3, 4, 8}), "abc");
  // No byte tokens: a character outside the vocabulary becomes <unk>.
  EXPECT_EQ(tok->encode("az", false), (std::vector<int32_t>{3, 4, 0}));
}

TEST(TokenizerVocab, SpmWithoutSpacePrefix) {
  GgufWriter w = spm_writer();
  w.set("tokenizer.ggml.add_space_prefix", GgufValue::boolean(false));
  w.set("tokenizer.ggml.add_bos_token", GgufValue::boolean(false));
  const auto tok = build(w);
  EXPECT_FALSE(tok->add_bos_default());
  EXPECT_EQ(tok->encode("abc", false), (std::vector<int32_t>{4, 8}));
  EXPECT_EQ(tok->encode("ab c", false), (std::vector<int32_t>{7, 3, 6}));
  EXPECT_EQ(tok->decode({1, 7, 3, 6}), "ab c");
}

TEST(TokenizerVocab, SpmWithoutTokenTypes) {
  // Without tokenizer.ggml.token_type the BOS/EOS/UNK roles still hold.
  GgufWriter w = spm_writer();
  w.remove("tokenizer.ggml.token_type");
  const auto tok = build(w);
  EXPECT_EQ(tok->token_to_piece(1), "");
  EXPECT_EQ(tok->token_to_piece(1, true), "<s>");
  EXPECT_EQ(tok->encode("<s>", false, true), (std::vector<int32_t>{1}));
}

TEST(TokenizerVocab, Gpt2MergesByRank) {
  // "Ġ h" outranks "h e", so " hello" becomes "Ġh e ll o".
  const auto tok = build(gpt2_writer({"l l", "\xC4\xA0 h", "h e", "he ll", "hell o"}));
  EXPECT_EQ(tok->model_kind(), "gpt2");
  EXPECT_FALSE(tok->add_bos_default());
  EXPECT_EQ(tok->bos_id(), 10);  // <|endoftext|> by default
  EXPECT_EQ(tok->eos_id(), 10);
  EXPECT_EQ(tok->encode("hello hello", false), (std::vector<int32_t>{8, 9, 1, 6, 3}));
  EXPECT_EQ(tok->decode({8, 9, 1, 6, 3}), "hello hello");
  // Without the last merge the word stops at "hell" + "o".
  const auto partial = build(gpt2_writer({"l l", "h e", "he ll"}));
  EXPECT_EQ(partial->encode("hello", false), (std::vector<int32_t>{7, 3}));
  // Rank order matters: with "e l" first, "hello" can never form "ll".
  const auto other = build(gpt2_writer({"e l", "l l", "h e", "he ll", "hell o"}));
  // "el" is no vocabulary piece, so it falls back to its characters.
  EXPECT_EQ(other->encode("hello", false), (std::vector<int32_t>{0, 1, 2, 2, 3}));
}

TEST(TokenizerVocab, EmptyTextAndBos) {
  const auto tok = build(spm_writer());
  EXPECT_TRUE(tok->encode("", false).empty());
  EXPECT_EQ(tok->encode("", true), std::vector<int32_t>{1});
}

TEST(TokenizerVocab, NoneIdsAccepted) {
  GgufWriter w = spm_writer();
  w.set("tokenizer.ggml.padding_token_id", GgufValue::u32(0xFFFFFFFFu));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::i32(-1));
  const auto tok = build(w);
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_FALSE(tok->add_bos_default());
  EXPECT_THROW(tok->encode("a", true), Error);
  EXPECT_EQ(tok->encode("a", false), (std::vector<int32_t>{3, 4}));
}

TEST(TokenizerVocab, MalformedVocabularies) {
  auto with = [](std::function<void(GgufWriter&)> edit) {
    GgufWriter w = spm_writer();
    edit(w);
    return w;
  };
  expect_error(with([](GgufWriter& w) { w.set("tokenizer.ggml.scores", floats({0, 0, 0})); }),
               "tokenizer.ggml.scores has 3 entries");
  expect_error(with([](GgufWriter& w) { w.set("tokenizer.ggml.token_type", ints({1, 1})); }),
               "tokenizer.ggml.token_type has 2 entries");
  expect_error(with([](GgufWriter& w) {
                 w.set("tokenizer.ggml.token_type", ints({2, 3, 3, 1, 1, 1, 1, 1, 9}));
               }),
               "unknown token type 9");
  expect_error(with([](GgufWriter& w) { w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(9)); }),
               "tokenizer.ggml.bos_token_id = 9 is out of range");
  expect_error(with([](GgufWriter& w) { w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(1000)); }),
               "out of range");
  expect_error(with([](GgufWriter& w) { w.set("tokenizer.ggml.model", GgufValue::string("bert")); }),
               "unsupported tokenizer model 'bert'");
  expect_error(with([](GgufWriter& w) { w.set("tokenizer.ggml.model", GgufValue::u32(1)); }),
               "tokenizer.ggml.model");
  expect_error(with([](GgufWriter& w) { w.remove("tokenizer.ggml.model"); }), "no tokenizer");
  expect_error(with([](GgufWriter& w) { w.remove("tokenizer.ggml.tokens"); }),
               "missing required key tokenizer.ggml.tokens");
  expect_error(with([](GgufWriter& w) { w.set("tokenizer.ggml.tokens", ints({1, 2, 3})); }),
               "expected strings");
  expect_error(with([](GgufWriter& w) { w.set("tokenizer.ggml.tokens", strings({})); }),
               "tokenizer.ggml.tokens is empty");
  expect_error(with([](GgufWriter& w) { w.set("tokenizer.ggml.scores", strings({"x"})); }),
               "expected floats");
  expect_error(with([](GgufWriter& w) {
                 w.set("tokenizer.ggml.add_bos_token", GgufValue::string("yes"));
               }),
               "tokenizer.ggml.add_bos_token");

  GgufWriter no_merges = gpt2_writer({});
  no_merges.remove("tokenizer.ggml.merges");
  expect_error(no_merges, "missing required key tokenizer.ggml.merges");
  expect_error(gpt2_writer({"l l", "hello"}), "merge 1 ('hello') is not of the form");
}

TEST(TokenizerVocab, OutOfRangeIds) {
  const auto tok = build(spm_writer());
  EXPECT_THROW(tok->token_to_piece(9), Error);
  EXPECT_THROW(tok->decode({1, 4, 42}), Error);
  StreamDecoder sd(*tok);
  EXPECT_THROW(sd.push(-3), Error);
}

}  // namespace
}  // namespace tern::test_vocab
