// The matcher over strings and bytes, and the constraint over small vocabularies: the trie
// mask equals a brute-force check, EOG only when complete, specials never, clone() independent.
#include <gtest/gtest.h>

#include <random>

#include "grammar_test_util.h"

namespace tern::grammar {
namespace {

using testing::brute_mask;
using testing::is_prefix;
using testing::mask_of;
using testing::matches;

const char* k_arith = R"g(
root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
)g";

TEST(GrammarMatcher, AcceptsAndRejectsStrings) {
  EXPECT_TRUE(matches(k_arith, "1+2=3\n"));
  EXPECT_TRUE(matches(k_arith, "(a *b) -c_1 = x\n2=2\n"));
  EXPECT_FALSE(matches(k_arith, "(a * b)=1\n"));  // no space after an operator in this grammar
  EXPECT_FALSE(matches(k_arith, "1+2=3"));        // a prefix only
  EXPECT_TRUE(is_prefix(k_arith, "1+2=3"));
  EXPECT_FALSE(is_prefix(k_arith, "1++2"));
  EXPECT_FALSE(is_prefix(k_arith, "=1"));
  EXPECT_FALSE(matches(k_arith, ""));
}

TEST(GrammarMatcher, RejectionLeavesTheStateUnchanged) {
  Matcher m(compile_gbnf(k_arith));
  ASSERT_TRUE(m.accept_bytes("12"));
  EXPECT_FALSE(m.accept_bytes("+=x"));
  ASSERT_TRUE(m.accept_bytes("+3=4\n"));
  EXPECT_TRUE(m.is_complete());
  EXPECT_TRUE(m.can_continue());
}

TEST(GrammarMatcher, PartialUtf8AcrossCalls) {
  // é = C3 A9, € = E2 82 AC, 😀 = F0 9F 98 80, each fed one byte at a time.
  Matcher m(compile_gbnf(R"(root ::= "é" [€-€] [\U0001F600-\U0001F64F] "!")"));
  for (char c : std::string("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80!")) {
    EXPECT_FALSE(m.is_complete());
    ASSERT_TRUE(m.accept_bytes(std::string(1, c)));
  }
  EXPECT_TRUE(m.is_complete());
  EXPECT_FALSE(m.can_continue());
  // A lead byte is kept only when some allowed code point starts with it.
  Matcher a(compile_gbnf("root ::= [α-ω]"));
  EXPECT_TRUE(a.accept_bytes("\xCE"));   // α..ο start with CE
  EXPECT_FALSE(a.is_complete());         // a code point is pending
  Matcher b(compile_gbnf("root ::= [α-ω]"));
  EXPECT_FALSE(b.accept_bytes("\xC3"));  // no Greek letter starts with C3
  EXPECT_FALSE(b.accept_bytes("\xE2"));
}

TEST(GrammarMatcher, InvalidUtf8IsRejected) {
  const std::string any = "root ::= .*";
  EXPECT_TRUE(matches(any, "a\xC3\xA9"));
  EXPECT_FALSE(is_prefix(any, "\x80"));              // continuation without a lead
  EXPECT_FALSE(is_prefix(any, "\xC0\x80"));          // overlong
  EXPECT_FALSE(is_prefix(any, "\xE0\x80\x80"));      // overlong
  EXPECT_FALSE(is_prefix(any, "\xED\xA0\x80"));      // a surrogate
  EXPECT_FALSE(is_prefix(any, "\xF5\x80\x80\x80"));  // beyond U+10FFFF
  EXPECT_FALSE(is_prefix(any, "\xC3" "a"));          // interrupted sequence
}

TEST(GrammarMatcher, AmbiguousGrammarsStaySmall) {
  // Two repetitions of the same class: every split is a separate parse, merged into few stacks.
  Matcher m(compile_gbnf(R"(root ::= [a]* [a]* "b")"));
  ASSERT_TRUE(m.accept_bytes(std::string(500, 'a')));
  EXPECT_LE(m.n_stacks(), 4u);
  ASSERT_TRUE(m.accept_bytes("b"));
  EXPECT_TRUE(m.is_complete());
}

// A toy vocabulary: some multi-byte tokens split code points, one EOG, one control token.
std::shared_ptr<const VocabIndex> toy_vocab() {
  std::vector<std::string> pieces = {"",     "",   "1",  "12", "+",  "=",  "\n", "=3\n", "a",  "ab", " ",
                                     "\xC3", "\xA9", "\xC3\xA9", "x\xE2", "\x82\xAC", "(", ")", "1+1", "b_"};
  std::vector<uint8_t> kinds(pieces.size(), VocabIndex::Text);
  kinds[0] = VocabIndex::Never;  // a control token
  kinds[1] = VocabIndex::Eog;
  return build_vocab_index(pieces, kinds);
}

TEST(GrammarConstraint, MaskEqualsBruteForceOnAToyVocabulary) {
  auto g = compile_gbnf(R"g(root ::= (expr "=" ws term "\n")+ | "é" "x€"*
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*)g");
  auto vocab = toy_vocab();
  std::mt19937 rng(7);
  for (int run = 0; run < 40; ++run) {
    auto c = make_grammar_constraint(g, vocab);
    Matcher m(g);
    std::string text;  // accepted so far
    for (int step = 0; step < 30; ++step) {
      const std::vector<uint8_t> mask = mask_of(*c, vocab->n_vocab);
      ASSERT_EQ(mask, brute_mask(g, text, *vocab)) << "run " << run << " step " << step;
      EXPECT_EQ(mask[0], 0);                   // never a control token
      EXPECT_EQ(mask[1], m.is_complete());     // EOG exactly when complete
      std::vector<int32_t> ok;
      for (int32_t id = 0; id < vocab->n_vocab; ++id)
        if (mask[size_t(id)]) ok.push_back(id);
      if (ok.empty()) break;
      const int32_t id = ok[rng() % ok.size()];
      c->accept(id);
      if (id == 1) {
        EXPECT_TRUE(c->is_dead());
        break;
      }
      ASSERT_TRUE(m.accept_bytes(vocab->pieces[size_t(id)]));
      text += vocab->pieces[size_t(id)];
      EXPECT_EQ(c->is_complete(), m.is_complete());
    }
  }
}

TEST(GrammarConstraint, AcceptRejectsWhatApplyRejects) {
  auto c = make_grammar_constraint(compile_gbnf(k_arith), toy_vocab());
  EXPECT_THROW(c->accept(4), Error);  // "+" cannot start
  EXPECT_THROW(c->accept(1), Error);  // EOG before the end
  EXPECT_THROW(c->accept(0), Error);  // control
  EXPECT_THROW(c->accept(999), Error);
  try {
    c->accept(5);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "grammar: token 5 ('=') is not allowed by the grammar here");
  }
  c->accept(3);  // "12"
  c->accept(7);  // "=3\n"
  EXPECT_TRUE(c->is_complete());
  EXPECT_FALSE(c->is_dead());
  c->accept(1);
  EXPECT_TRUE(c->is_dead());
}

TEST(GrammarConstraint, DeadWhenNothingMayFollow) {
  auto c = make_grammar_constraint(compile_gbnf(R"(root ::= "ab")"), toy_vocab());
  EXPECT_FALSE(c->is_dead());
  c->accept(9);  // "ab"
  EXPECT_TRUE(c->is_complete());
  EXPECT_TRUE(c->is_dead());
  const std::vector<uint8_t> mask = mask_of(*c, toy_vocab()->n_vocab);
  for (size_t i = 0; i < mask.size(); ++i) EXPECT_EQ(mask[i], i == 1 ? 1 : 0) << i;
}

TEST(GrammarConstraint, CloneIsIndependent) {
  auto vocab = toy_vocab();
  auto c = make_grammar_constraint(compile_gbnf(k_arith), vocab);
  c->accept(2);  // "1"
  auto d = c->clone();
  d->accept(4);  // "+" on the clone only
  const auto mc = mask_of(*c, vocab->n_vocab), md = mask_of(*d, vocab->n_vocab);
  EXPECT_EQ(mc[5], 1);  // "=" after "1"
  EXPECT_EQ(md[5], 0);  // not after "1+"
  EXPECT_EQ(md[2], 1);
  c->accept(7);         // "=3\n" on the original
  EXPECT_TRUE(c->is_complete());
  EXPECT_FALSE(d->is_complete());
}

TEST(GrammarConstraint, ModelRowsBeyondTheVocabularyAreMasked) {
  auto vocab = toy_vocab();
  auto c = make_grammar_constraint(compile_gbnf(k_arith), vocab);
  std::vector<float> logits(size_t(vocab->n_vocab) + 5, 1.0f);
  c->apply(logits.data(), int32_t(logits.size()));
  for (size_t i = size_t(vocab->n_vocab); i < logits.size(); ++i) EXPECT_TRUE(std::isinf(logits[i]));
  EXPECT_FALSE(std::isinf(logits[2]));
}

TEST(GrammarConstraint, PartialUtf8TokensCarryOver) {
  auto vocab = toy_vocab();
  auto g = compile_gbnf(R"(root ::= "é" "x€"*)");
  auto c = make_grammar_constraint(g, vocab);
  auto mask = mask_of(*c, vocab->n_vocab);
  EXPECT_EQ(mask[11], 1);  // C3: starts é
  EXPECT_EQ(mask[13], 1);  // é whole
  EXPECT_EQ(mask[12], 0);  // A9 alone
  c->accept(11);
  mask = mask_of(*c, vocab->n_vocab);
  EXPECT_FALSE(c->is_complete());
  EXPECT_EQ(mask[12], 1);  // now A9 completes é
  EXPECT_EQ(mask[11], 0);
  EXPECT_EQ(mask[1], 0);   // no EOG mid-character
  c->accept(12);
  EXPECT_TRUE(c->is_complete());
  c->accept(14);           // "x" + E2
  EXPECT_FALSE(c->is_complete());
  mask = mask_of(*c, vocab->n_vocab);
  EXPECT_EQ(mask[15], 1);  // 82 AC completes €
  c->accept(15);
  EXPECT_TRUE(c->is_complete());
}

}  // namespace
}  // namespace tern::grammar
