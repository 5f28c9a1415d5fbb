// The trie mask against a brute-force per-token check on real vocabularies: Llama's 32000
// SentencePiece tokens (byte-fallback tokens split characters) and GPT-2's 50257 byte-level BPE
// tokens (pieces routinely end mid-character). Also prints the mask's cost per token (never
// asserts timings).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>

#include "grammar_test_util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::grammar::test_vocab_mask {
namespace {

using testing::brute_mask;
using testing::mask_of;

constexpr const char* k_llama = "models/llama-2-tiny-random.gguf";
constexpr const char* k_gpt2 = "tokenizer/llama.cpp-vocab/ggml-vocab-gpt-2.gguf";

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& rel) {
  const GgufFile f = GgufFile::open(::tern::testing::shared_path(rel));
  return Tokenizer::from_gguf(f);
}

const char* k_unicode = R"(root ::= "«" [α-ωА-я一-龥 ]{1,12} "»" ("\n" root)?)";
const char* k_arith = R"g(root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*)g";

// Random walks: at every step the trie mask must equal the brute-force mask; the next token is
// drawn from the allowed ones (preferring multi-byte tokens, which exercise the trie more).
void check_walks(const Tokenizer& tok, const std::string& gbnf, int walks, int steps, uint32_t seed) {
  auto vocab = build_vocab_index(tok);
  ASSERT_EQ(vocab->n_vocab, tok.n_vocab());
  auto g = compile_gbnf(gbnf);
  std::mt19937 rng(seed);
  for (int w = 0; w < walks; ++w) {
    auto c = make_grammar_constraint(g, vocab);
    Matcher m(g);
    std::string text;  // accepted so far
    for (int s = 0; s < steps; ++s) {
      const std::vector<uint8_t> mask = mask_of(*c, vocab->n_vocab);
      const std::vector<uint8_t> brute = brute_mask(g, text, *vocab);
      size_t n_allowed = 0, n_diff = 0;
      for (size_t i = 0; i < mask.size(); ++i) {
        n_allowed += mask[i];
        if (mask[i] != brute[i]) {
          if (n_diff++ < 5)
            ADD_FAILURE() << "walk " << w << " step " << s << ": token " << i << " ('" << vocab->pieces[i]
                          << "') trie " << int(mask[i]) << " brute " << int(brute[i]);
        }
      }
      ASSERT_EQ(n_diff, 0u);
      for (int32_t id = 0; id < vocab->n_vocab; ++id) {
        if (vocab->kind[size_t(id)] == VocabIndex::Never) {
          ASSERT_EQ(mask[size_t(id)], 0) << id;
        }
        if (tok.is_eog(id)) {
          ASSERT_EQ(mask[size_t(id)], m.is_complete() ? 1 : 0);
        }
      }
      ASSERT_GT(n_allowed, 0u) << "walk " << w << " step " << s;
      std::vector<int32_t> ok, long_ok;
      for (int32_t id = 0; id < vocab->n_vocab; ++id) {
        if (!mask[size_t(id)] || vocab->kind[size_t(id)] != VocabIndex::Text) continue;
        ok.push_back(id);
        if (vocab->pieces[size_t(id)].size() > 1) long_ok.push_back(id);
      }
      if (ok.empty()) break;
      const auto& from = (!long_ok.empty() && rng() % 3) ? long_ok : ok;
      const int32_t id = from[rng() % from.size()];
      c->accept(id);
      ASSERT_TRUE(m.accept_bytes(vocab->pieces[size_t(id)]));
      text += vocab->pieces[size_t(id)];
    }
  }
}

TEST(GrammarVocab, LlamaMaskEqualsBruteForce) {
  TERN_REQUIRE_SHARED(k_llama);
  auto tok = load_tokenizer(k_llama);
  ASSERT_EQ(tok->n_vocab(), 32000);
  check_walks(*tok, json_object_gbnf(), 3, 25, 1);
  check_walks(*tok, k_arith, 2, 20, 2);
  check_walks(*tok, k_unicode, 3, 15, 3);
}

TEST(GrammarVocab, Gpt2ByteLevelMaskEqualsBruteForce) {
  TERN_REQUIRE_SHARED(k_gpt2);
  auto tok = load_tokenizer(k_gpt2);
  check_walks(*tok, json_object_gbnf(), 2, 25, 4);
  check_walks(*tok, k_unicode, 4, 15, 5);
}

TEST(GrammarVocab, Gpt2TokensSplittingACharacterAreAllowedWhenTheyCanComplete) {
  TERN_REQUIRE_SHARED(k_gpt2);
  auto tok = load_tokenizer(k_gpt2);
  auto vocab = build_vocab_index(*tok);
  // A grammar of CJK characters only: some allowed tokens must be incomplete UTF-8.
  auto c = make_grammar_constraint(compile_gbnf("root ::= [一-龥]+"), vocab);
  const auto mask = mask_of(*c, vocab->n_vocab);
  size_t partial = 0;
  for (int32_t id = 0; id < vocab->n_vocab; ++id) {
    if (!mask[size_t(id)]) continue;
    const std::string& p = vocab->pieces[size_t(id)];
    const unsigned char c0 = static_cast<unsigned char>(p[0]);
    EXPECT_TRUE(c0 >= 0xE4 && c0 <= 0xE9) << id;
    if (p.size() % 3) ++partial;
  }
  EXPECT_GT(partial, 0u);
}

// apply() + accept() per token on the 32000-token Llama vocabulary under a JSON grammar, over
// random generations (a random-weights model's outputs look like this). Prints, never asserts.
TEST(GrammarBench, JsonMaskCostPerTokenAt32k) {
  TERN_REQUIRE_SHARED(k_llama);
  auto tok = load_tokenizer(k_llama);
  auto vocab = build_vocab_index(*tok);
  auto g = compile_gbnf(json_object_gbnf());
  std::mt19937 rng(11);
  std::vector<float> logits(size_t(vocab->n_vocab));
  double total_ms = 0, worst_ms = 0;
  int64_t n_tokens = 0;
  for (int w = 0; w < 8; ++w) {
    auto c = make_grammar_constraint(g, vocab);
    for (int s = 0; s < 64 && !c->is_dead(); ++s) {
      std::fill(logits.begin(), logits.end(), 0.0f);
      const auto t0 = std::chrono::steady_clock::now();
      c->apply(logits.data(), vocab->n_vocab);
      const auto t1 = std::chrono::steady_clock::now();
      // Drawing among the allowed tokens is the test's own sampling, not timed.
      std::vector<int32_t> ok;
      for (int32_t id = 0; id < vocab->n_vocab; ++id)
        if (!std::isinf(logits[size_t(id)])) ok.push_back(id);
      const int32_t id = ok[rng() % ok.size()];
      const auto t2 = std::chrono::steady_clock::now();
      c->accept(id);
      const auto t3 = std::chrono::steady_clock::now();
      const double ms = std::chrono::duration<double, std::milli>((t1 - t0) + (t3 - t2)).count();
      total_ms += ms;
      worst_ms = std::max(worst_ms, ms);
      ++n_tokens;
    }
  }
  std::printf("[grammar bench] json grammar, 32000-token vocab: apply+accept %.3f ms/token mean, %.3f ms worst, "
              "%lld tokens (states met again reuse their mask)\n",
              total_ms / double(n_tokens), worst_ms, static_cast<long long>(n_tokens));
  EXPECT_GT(n_tokens, 0);
  // The cold cost: a fresh matcher (no cached transitions or masks) inside a JSON string, where
  // nearly every token is allowed and the whole trie is walked.
  std::vector<uint8_t> allowed(size_t(vocab->n_vocab));
  double cold_ms = 0;
  const int reps = 10;
  for (int r = 0; r < reps; ++r) {
    Matcher m(g);
    ASSERT_TRUE(m.accept_bytes("{\"key\": \"some text"));
    std::fill(allowed.begin(), allowed.end(), 0);
    const auto t0 = std::chrono::steady_clock::now();
    m.fill_allowed(*vocab, allowed.data());
    cold_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  size_t n_allowed = 0;
  for (uint8_t a : allowed) n_allowed += a;
  std::printf("[grammar bench] cold mask inside a JSON string: %.3f ms (%zu of %d tokens allowed, %zu trie nodes)\n",
              cold_ms / reps, n_allowed, vocab->n_vocab, vocab->nodes.size());
  EXPECT_GT(n_allowed, 30000u);
}

}  // namespace
}  // namespace tern::grammar::test_vocab_mask
