// The byte-level pre-tokenizers (tokenizer.ggml.pre) split by hand, piece by piece, and the
// special-token rules around them: user-defined tokens, Phi-3's rstrip, Llama 3's defaults.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"
#include "tokenizer/tokenizer_impl.h"

namespace tern {
namespace {

using test::gguf_floats;
using test::gguf_ints;
using test::gguf_strings;
GgufValue strings(const std::vector<std::string>& v) { return gguf_strings(v); }
GgufValue ints(const std::vector<int32_t>& v) { return gguf_ints(v); }
std::unique_ptr<Tokenizer> build(const GgufWriter& w) { return test::tokenizer_from(w, "test.gguf"); }

using detail::PreTokenizer;

std::vector<std::string> split(PreTokenizer pre, const std::string& text) {
  std::vector<std::string> out;
  size_t covered = 0;
  detail::pretokenize(pre, text, [&](size_t off, size_t len) {
    EXPECT_EQ(off, covered) << "pieces must cover the text in order";
    EXPECT_GT(len, 0u);
    covered = off + len;
    out.push_back(text.substr(off, len));
  });
  EXPECT_EQ(covered, text.size());
  return out;
}

using Pieces = std::vector<std::string>;

// Expected pieces worked out from the regex
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
TEST(Pretokenizer, Llama3Regex) {
  const auto P = PreTokenizer::Llama3;
  EXPECT_EQ(split(P, "Hello world"), (Pieces{"Hello", " world"}));
  // Contractions in any ASCII case; digits in threes.
  EXPECT_EQ(split(P, "I'VE 1234567"), (Pieces{"I", "'VE", " ", "123", "456", "7"}));
  EXPECT_EQ(split(P, "we'Re it'S"), (Pieces{"we", "'Re", " it", "'S"}));
  // One non-letter, non-newline character (space, tab, punctuation) joins the letters after it.
  EXPECT_EQ(split(P, "(hello\tthere"), (Pieces{"(hello", "\tthere"}));
  // Punctuation runs keep the newlines after them.
  EXPECT_EQ(split(P, "end...\n\nNext"), (Pieces{"end", "...\n\n", "Next"}));
  EXPECT_EQ(split(P, " {\n"), (Pieces{" {\n"}));
  // A whitespace run up to its last newline is one piece; a run before a word leaves its
  // last space to the word.
  EXPECT_EQ(split(P, "a  \n  \n b"), (Pieces{"a", "  \n  \n", " b"}));
  EXPECT_EQ(split(P, "x    y"), (Pieces{"x", "   ", " y"}));
  EXPECT_EQ(split(P, "x   "), (Pieces{"x", "   "}));
  EXPECT_EQ(split(P, "\n\nx"), (Pieces{"\n\n", "x"}));
  // A newline does not join the letters after it; a space before digits stays alone.
  EXPECT_EQ(split(P, "\nabc 42"), (Pieces{"\n", "abc", " ", "42"}));
  // Letters beyond ASCII; CJK has no spaces to split at.
  EXPECT_EQ(split(P, "naïve 日本語です"), (Pieces{"naïve", " 日本語です"}));
  EXPECT_EQ(split(P, "🙂🙂 ok"), (Pieces{"🙂🙂", " ok"}));
}

TEST(Pretokenizer, Qwen2IsLlama3WithSingleDigits) {
  EXPECT_EQ(split(PreTokenizer::Qwen2, "v12345 x"), (Pieces{"v", "1", "2", "3", "4", "5", " x"}));
  EXPECT_EQ(split(PreTokenizer::Qwen2, "I'm  ok"), (Pieces{"I", "'m", " ", " ok"}));
}

TEST(Pretokenizer, DigitsThenGpt2) {
  // Every digit is a piece, and GPT-2's regex splits each run between digits on its own, so
  // the spaces before a digit are one piece at the end of their run.
  EXPECT_EQ(split(PreTokenizer::DigitsGpt2, "abc123 x"), (Pieces{"abc", "1", "2", "3", " x"}));
  EXPECT_EQ(split(PreTokenizer::DigitsGpt2, "a  7"), (Pieces{"a", "  ", "7"}));
  EXPECT_EQ(split(PreTokenizer::Gpt2, "a  7"), (Pieces{"a", " ", " 7"}));
}

TEST(Pretokenizer, Names) {
  bool ignore = false;
  EXPECT_EQ(detail::pretokenizer_from_name("llama-bpe", ignore), PreTokenizer::Llama3);
  EXPECT_TRUE(ignore);
  EXPECT_EQ(detail::pretokenizer_from_name("qwen2", ignore), PreTokenizer::Qwen2);
  EXPECT_FALSE(ignore);
  EXPECT_EQ(detail::pretokenizer_from_name("", ignore), PreTokenizer::Gpt2);
  EXPECT_EQ(detail::pretokenizer_from_name("starcoder", ignore), PreTokenizer::DigitsGpt2);
  EXPECT_FALSE(detail::pretokenizer_from_name("deepseek-coder", ignore).has_value());
}

// ---- tokenizers built from small vocabularies ------------------------------------------------



// Byte-level: the printable ASCII bytes stand for themselves ('Ġ' is the space).
GgufWriter bpe_writer(const std::string& pre) {
  GgufWriter w;
  w.set("tokenizer.ggml.model", GgufValue::string("gpt2"));
  w.set("tokenizer.ggml.pre", GgufValue::string(pre));
  //                       0    1    2    3    4      5     6        7         8     9    10   11
  w.set("tokenizer.ggml.tokens",
        strings({"a", "b", "c", "Ġ", "ab", "abc", "<s>", "<tool>", "bc", "<", ">", "s"}));
  w.set("tokenizer.ggml.token_type", ints({1, 1, 1, 1, 1, 1, 3, 4, 1, 1, 1, 1}));
  w.set("tokenizer.ggml.merges", strings({"a b", "b c"}));  // "abc" is made by no merge
  w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(6));
  return w;
}

TEST(PretokenizerVocab, Llama3IgnoresMergesForWholeWords) {
  // llama-bpe: a word that is a piece is that token; qwen2: the merges decide.
  EXPECT_EQ(build(bpe_writer("llama-bpe"))->encode("abc", false), (std::vector<int32_t>{5}));
  EXPECT_EQ(build(bpe_writer("qwen2"))->encode("abc", false), (std::vector<int32_t>{4, 2}));
}

TEST(PretokenizerVocab, Llama3AddsBosByDefault) {
  EXPECT_TRUE(build(bpe_writer("llama-bpe"))->add_bos_default());
  EXPECT_FALSE(build(bpe_writer("qwen2"))->add_bos_default());
  GgufWriter w = bpe_writer("llama-bpe");
  w.set("tokenizer.ggml.add_bos_token", GgufValue::boolean(false));
  EXPECT_FALSE(build(w)->add_bos_default());
}

TEST(PretokenizerVocab, UnknownPreTokenizerIsAnError) {
  try {
    build(bpe_writer("deepseek-coder"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("test.gguf"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'deepseek-coder'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tokenizer.ggml.pre"), std::string::npos) << msg;
  }
}

TEST(PretokenizerVocab, UserDefinedTokensSplitWithoutParseSpecial) {
  const auto tok = build(bpe_writer("qwen2"));
  // <tool> is user-defined: split out either way; <s> is control: only with parse_special.
  EXPECT_EQ(tok->encode("a<tool>b", false, false), (std::vector<int32_t>{0, 7, 1}));
  EXPECT_EQ(tok->encode("a<s>", false, false), (std::vector<int32_t>{0, 9, 11, 10}));
  EXPECT_EQ(tok->encode("a<s>", false, true), (std::vector<int32_t>{0, 6}));
}

TEST(PretokenizerVocab, Phi3SpecialTokensDropTheWhitespaceAfterThem) {
  GgufWriter w = bpe_writer("qwen2");
  EXPECT_EQ(build(w)->encode("<tool> a", false), (std::vector<int32_t>{7, 3, 0}));
  w.set("general.name", GgufValue::string("Phi-3 mini"));
  EXPECT_EQ(build(w)->encode("<tool> \n a", false), (std::vector<int32_t>{7, 0}));
  // <s> keeps its whitespace (llama.cpp's exception list).
  EXPECT_EQ(build(w)->encode("<s> a", false, true), (std::vector<int32_t>{6, 3, 0}));
}

TEST(PretokenizerVocab, ManySpecialTokens) {
  // Thousands of added tokens (Gemma has 6,000+): only those in the text are looked for, and
  // the longest text still wins.
  std::vector<std::string> toks = {"a", "b", "Ġ"};
  std::vector<int32_t> types = {1, 1, 1};
  for (int i = 0; i < 5000; ++i) {
    toks.push_back("<u" + std::to_string(i) + ">");
    types.push_back(4);
  }
  toks.push_back("<u1");  // a prefix of many
  types.push_back(4);
  GgufWriter w;
  w.set("tokenizer.ggml.model", GgufValue::string("gpt2"));
  w.set("tokenizer.ggml.tokens", strings(toks));
  w.set("tokenizer.ggml.token_type", ints(types));
  w.set("tokenizer.ggml.merges", strings({"a b"}));
  const auto tok = build(w);
  EXPECT_EQ(tok->encode("a<u12>b<u1a", false), (std::vector<int32_t>{0, 3 + 12, 1, 3 + 5000, 0}));
}

}  // namespace
}  // namespace tern
