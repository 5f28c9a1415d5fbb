// Random mutations of grammar texts must parse or throw tern::Error, never crash or hang; what
// parses is then run on random bytes (the matcher may throw tern::Error for a grammar too
// ambiguous to follow, nothing else).
#include <gtest/gtest.h>

#include <random>

#include "grammar_test_util.h"

namespace tern::grammar {
namespace {

const char* k_seeds[] = {
    R"g(root ::= object
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
value ::= object | array | string | [0-9]+ ws | ("true" | "false" | "null") ws
array ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
ws ::= | " " | "\n" [ \t]{0,20}
)g",
    R"g(root ::= (expr "=" ws term "\n")+
expr ::= term ([-+*/] term)*
term ::= [a-z] [a-z0-9_]* ws | [0-9]+ ws | "(" ws expr ")" ws
ws ::= [ \t\n]*
)g",
    R"g(root ::= item{1,3} "." [^\u2028]? # c
item ::= "- " .+ "\n" | "é"{2,}
)g",
};

const char k_alphabet[] = "()[]{}|*+?.\"\\^-,:=# \n\tab019xuU";

TEST(GrammarFuzz, MutatedGrammarsThrowOrParseNeverCrash) {
  std::mt19937 rng(1234);
  int parsed = 0, refused = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text = k_seeds[iter % 3];
    const int n_mut = 1 + int(rng() % 6);
    for (int k = 0; k < n_mut && !text.empty(); ++k) {
      const size_t at = rng() % text.size();
      switch (rng() % 4) {
        case 0: text.erase(at, 1 + rng() % 3); break;
        case 1: text.insert(at, 1, k_alphabet[rng() % (sizeof(k_alphabet) - 1)]); break;
        case 2: text[at] = k_alphabet[rng() % (sizeof(k_alphabet) - 1)]; break;
        default: text[at] = char(rng() & 0xFF); break;
      }
    }
    std::shared_ptr<const Grammar> g;
    try {
      g = compile_gbnf(text);
    } catch (const Error&) {
      ++refused;
      continue;
    }
    ++parsed;
    try {
      Matcher m(g);
      for (int t = 0; t < 20; ++t) {
        std::string bytes;
        const int len = 1 + int(rng() % 4);
        for (int i = 0; i < len; ++i) bytes += k_alphabet[rng() % (sizeof(k_alphabet) - 1)];
        m.accept_bytes(bytes);
      }
    } catch (const Error&) {
    }
  }
  // Both outcomes must occur for the test to mean anything.
  EXPECT_GT(parsed, 100);
  EXPECT_GT(refused, 100);
}

TEST(GrammarFuzz, RandomBytesNeverCrash) {
  std::mt19937 rng(99);
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text = "root ::= ";
    const int len = int(rng() % 40);
    for (int i = 0; i < len; ++i) text += char(rng() & 0xFF);
    try {
      compile_gbnf(text);
    } catch (const Error&) {
    }
  }
}

}  // namespace
}  // namespace tern::grammar
