// llama.cpp's tokenizer test vectors and real vocabularies from ../shared.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace tern {
namespace {

using test::file_exists;
using test::shared_path;

constexpr const char* kSpmVocab = "tokenizer/llama.cpp-vocab/ggml-vocab-llama-spm.gguf";
constexpr const char* kGpt2Vocab = "tokenizer/llama.cpp-vocab/ggml-vocab-gpt-2.gguf";
constexpr const char* kStories = "models/stories260K.gguf";
constexpr const char* kWiki = "data/wikitext-2-raw/wiki.test.raw";

#define REQUIRE_SHARED(rel)                                          \
  do {                                                               \
    if (!file_exists(shared_path(rel))) GTEST_SKIP() << "missing " << shared_path(rel); \
  } while (0)

// Every case of VOCAB.inp must encode (no BOS, parse_special=false) to its line of VOCAB.out.
void check_vectors(const std::string& vocab_rel) {
  const std::string vocab = shared_path(vocab_rel);
  const auto inputs = test::read_vector_inputs(vocab + ".inp");
  const auto expected = test::read_vector_outputs(vocab + ".out");
  ASSERT_FALSE(inputs.empty());
  ASSERT_EQ(inputs.size(), expected.size());
  const auto tok = test::load_tokenizer(vocab);
  size_t matched = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto got = tok->encode(inputs[i], /*add_bos=*/false, /*parse_special=*/false);
    EXPECT_EQ(got, expected[i]) << "case " << i << ": '" << inputs[i] << "'";
    matched += got == expected[i];
  }
  EXPECT_EQ(matched, inputs.size());
}

TEST(TokenizerVectors, LlamaSpm) {
  REQUIRE_SHARED(std::string(kSpmVocab) + ".inp");
  REQUIRE_SHARED(std::string(kSpmVocab) + ".out");
  REQUIRE_SHARED(kSpmVocab);
  check_vectors(kSpmVocab);
}

TEST(TokenizerVectors, Gpt2) {
  REQUIRE_SHARED(std::string(kGpt2Vocab) + ".inp");
  REQUIRE_SHARED(std::string(kGpt2Vocab) + ".out");
  REQUIRE_SHARED(kGpt2Vocab);
  check_vectors(kGpt2Vocab);
}

// llama.cpp's vectors for the other byte-level vocabularies in ../shared, each naming its
// pre-tokenizer in tokenizer.ggml.pre: starcoder and refact split digits one by one, mpt uses
// GPT-2's regex.
class TokenizerVectorsPre : public ::testing::TestWithParam<const char*> {};

TEST_P(TokenizerVectorsPre, MatchesLlamaCpp) {
  const std::string rel = std::string("tokenizer/llama.cpp-vocab/ggml-vocab-") + GetParam() + ".gguf";
  REQUIRE_SHARED(rel + ".inp");
  REQUIRE_SHARED(rel + ".out");
  REQUIRE_SHARED(rel);
  check_vectors(rel);
}

INSTANTIATE_TEST_SUITE_P(Vocabs, TokenizerVectorsPre,
                         ::testing::Values("starcoder", "refact", "mpt"),
                         [](const auto& info) { return std::string(info.param); });

TEST(TokenizerVectors, RoundTripSpm) {
  REQUIRE_SHARED(std::string(kSpmVocab) + ".inp");
  REQUIRE_SHARED(kSpmVocab);
  const auto tok = test::load_tokenizer(shared_path(kSpmVocab));
  for (const auto& text : test::read_vector_inputs(shared_path(kSpmVocab) + ".inp")) {
    // The dummy-prefix space is dropped after BOS, so decode(encode(x, BOS)) == x.
    EXPECT_EQ(tok->decode(tok->encode(text, true)), text);
    // Without BOS the prefix space stays (this is how a continuation is decoded).
    if (!text.empty()) {
      EXPECT_EQ(tok->decode(tok->encode(text, false)), " " + text);
    }
  }
}

TEST(TokenizerVectors, RoundTripGpt2) {
  REQUIRE_SHARED(std::string(kGpt2Vocab) + ".inp");
  REQUIRE_SHARED(kGpt2Vocab);
  const auto tok = test::load_tokenizer(shared_path(kGpt2Vocab));
  for (const auto& text : test::read_vector_inputs(shared_path(kGpt2Vocab) + ".inp"))
    EXPECT_EQ(tok->decode(tok->encode(text, false)), text);
}

// A longer natural text through both tokenizers: byte-exact round trip and a plausible
// compression ratio (guards against silently degenerate byte-by-byte output).
TEST(TokenizerVectors, RoundTripWikiText) {
  REQUIRE_SHARED(kWiki);
  REQUIRE_SHARED(kSpmVocab);
  REQUIRE_SHARED(kGpt2Vocab);
  const std::string text = test::read_bytes(shared_path(kWiki)).substr(0, 200000);
  for (const char* vocab : {kSpmVocab, kGpt2Vocab}) {
    const auto tok = test::load_tokenizer(shared_path(vocab));
    const auto ids = tok->encode(text, true);
    EXPECT_EQ(tok->decode(ids), text) << vocab;
    EXPECT_LT(ids.size(), text.size() / 3) << vocab;
  }
}

TEST(TokenizerVectors, SpmMetadata) {
  REQUIRE_SHARED(kSpmVocab);
  const auto tok = test::load_tokenizer(shared_path(kSpmVocab));
  EXPECT_EQ(tok->model_kind(), "llama");
  EXPECT_EQ(tok->n_vocab(), 32000);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->eot_id(), -1);
  EXPECT_TRUE(tok->add_bos_default());
  EXPECT_FALSE(tok->add_eos_default());
  EXPECT_TRUE(tok->is_eog(2));
  EXPECT_FALSE(tok->is_eog(1));
  EXPECT_EQ(tok->tokens().size(), 32000u);
  EXPECT_EQ(tok->scores().size(), 32000u);
  EXPECT_EQ(tok->token_types().size(), 32000u);
  EXPECT_TRUE(tok->merges().empty());
  EXPECT_EQ(tok->encode("", true), std::vector<int32_t>{1});
  EXPECT_TRUE(tok->encode("", false).empty());
}

TEST(TokenizerVectors, SpmPieces) {
  REQUIRE_SHARED(kSpmVocab);
  const auto tok = test::load_tokenizer(shared_path(kSpmVocab));
  EXPECT_EQ(tok->token_to_piece(29871), " ");        // "▁"
  EXPECT_EQ(tok->token_to_piece(15043), " Hello");   // "▁Hello"
  EXPECT_EQ(tok->token_to_piece(13), "\n");          // <0x0A>
  EXPECT_EQ(tok->token_to_piece(243), "\xF0");       // <0xF0>, half a character
  EXPECT_EQ(tok->token_to_piece(1), "");             // <s>
  EXPECT_EQ(tok->token_to_piece(1, true), "<s>");
  EXPECT_EQ(tok->decode({1, 15043, 3186}), "Hello world");
  EXPECT_EQ(tok->decode({15043, 3186}), " Hello world");
  EXPECT_THROW(tok->token_to_piece(32000), Error);
  EXPECT_THROW(tok->token_to_piece(-1), Error);
}

TEST(TokenizerVectors, SpmParseSpecial) {
  REQUIRE_SHARED(kSpmVocab);
  const auto tok = test::load_tokenizer(shared_path(kSpmVocab));
  // As text, "<s>" is ordinary characters; parsed, it is BOS and the text after it gets the
  // dummy space prefix again (llama.cpp).
  const auto plain = tok->encode("<s>Hello", false, false);
  EXPECT_EQ(std::find(plain.begin(), plain.end(), 1), plain.end());
  EXPECT_EQ(tok->encode("<s>Hello", false, true), (std::vector<int32_t>{1, 15043}));
  EXPECT_EQ(tok->encode("Hello</s>", false, true), (std::vector<int32_t>{15043, 2}));
}

TEST(TokenizerVectors, Gpt2MetadataAndSpecial) {
  REQUIRE_SHARED(kGpt2Vocab);
  const auto tok = test::load_tokenizer(shared_path(kGpt2Vocab));
  EXPECT_EQ(tok->model_kind(), "gpt2");
  EXPECT_EQ(tok->n_vocab(), 50257);
  EXPECT_EQ(tok->merges().size(), 50000u);
  EXPECT_EQ(tok->bos_id(), 50256);
  EXPECT_EQ(tok->eos_id(), 50256);
  EXPECT_FALSE(tok->add_bos_default());
  EXPECT_TRUE(tok->is_eog(50256));
  EXPECT_EQ(tok->token_to_piece(220), " ");  // "Ġ"
  EXPECT_EQ(tok->token_to_piece(50256), "");
  EXPECT_EQ(tok->token_to_piece(50256, true), "<|endoftext|>");
  EXPECT_EQ(tok->encode("Hello<|endoftext|>", false, true), (std::vector<int32_t>{15496, 50256}));
  const auto plain = tok->encode("Hello<|endoftext|>", false, false);
  EXPECT_GT(plain.size(), 2u);
  EXPECT_EQ(std::find(plain.begin(), plain.end(), 50256), plain.end());
  EXPECT_EQ(tok->decode(plain), "Hello<|endoftext|>");
}

TEST(TokenizerVectors, Stories260K) {
  REQUIRE_SHARED(kStories);
  const auto tok = test::load_tokenizer(shared_path(kStories));
  EXPECT_EQ(tok->n_vocab(), 512);
  EXPECT_TRUE(tok->add_bos_default());
  const auto ids = tok->encode("Once upon a time", true);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(tok->decode(ids), "Once upon a time");
}

TEST(TokenizerVectors, StreamDecoderSplitsCharacterOverByteTokens) {
  REQUIRE_SHARED(kSpmVocab);
  const auto tok = test::load_tokenizer(shared_path(kSpmVocab));
  // " this is 🦙.cpp": the llama has no piece, so it is the byte tokens F0 9F A6 99.
  const std::vector<int32_t> ids = {1, 29871, 445, 338, 29871, 243, 162, 169, 156, 29889, 8223};
  // After BOS the first piece, "▁", loses its (dummy-prefix) space and yields nothing.
  StreamDecoder sd(*tok);
  std::vector<std::string> outs;
  for (int32_t id : ids) outs.push_back(sd.push(id));
  EXPECT_EQ(sd.flush(), "");
  const std::vector<std::string> want = {"", "", " this", " is", " ", "", "", "", "\xF0\x9F\xA6\x99",
                                         ".", "cpp"};
  EXPECT_EQ(outs, want);
  std::string all;
  for (const auto& s : outs) all += s;
  EXPECT_EQ(all, tok->decode(ids));

  // An unfinished character at the end becomes U+FFFD on flush.
  StreamDecoder cut(*tok);
  EXPECT_EQ(cut.push(15043), " Hello");  // no BOS: the space stays
  EXPECT_EQ(cut.push(243), "");
  EXPECT_EQ(cut.push(162), "");
  EXPECT_EQ(cut.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(cut.flush(), "");

  // A byte that can never start a character is replaced at once.
  StreamDecoder bad(*tok);
  EXPECT_EQ(bad.push(3 + 0xFF), "\xEF\xBF\xBD");  // <0xFF>
  EXPECT_EQ(bad.push(3 + 'a'), "a");
  // A lead byte followed by a non-continuation byte is invalid, the next byte is kept.
  EXPECT_EQ(bad.push(3 + 0xE2), "");
  EXPECT_EQ(bad.push(3 + 'b'), "\xEF\xBF\xBD" "b");
}

TEST(TokenizerVectors, StreamDecoderGpt2) {
  REQUIRE_SHARED(kGpt2Vocab);
  const auto tok = test::load_tokenizer(shared_path(kGpt2Vocab));
  const std::string text = "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～";
  const auto ids = tok->encode(text, false);
  StreamDecoder sd(*tok);
  std::string all;
  for (int32_t id : ids) all += sd.push(id);
  all += sd.flush();
  EXPECT_EQ(all, text);
}

}  // namespace
}  // namespace tern
