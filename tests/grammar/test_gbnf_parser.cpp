// GBNF parsing: every construct of llama.cpp's syntax, and the errors (line, column, what was
// expected) for malformed, undefined, root-less, left-recursive and oversized grammars.
#include <gtest/gtest.h>

#include "grammar_test_util.h"

namespace tern::grammar {
namespace {

using testing::matches;
using testing::parse_error;

TEST(GbnfParser, ParsesEveryConstruct) {
  const std::string g = R"(
# a comment line
root ::= greeting " " name ("!" | "?")? tail   # trailing comment
greeting ::= "hello" | "hi"
name ::= [A-Z] [a-z]*
tail ::=
  ( "\n" [0-9]{2}
  | "\t" [^\n]+ )*
)";
  EXPECT_EQ(parse_error(g), "");
  EXPECT_TRUE(matches(g, "hello World!"));
  EXPECT_TRUE(matches(g, "hi Bo"));
  EXPECT_TRUE(matches(g, "hi Bo?\n12\tanything"));
  EXPECT_FALSE(matches(g, "hi bo"));
  EXPECT_FALSE(matches(g, "hi Bo\n1"));
  EXPECT_FALSE(matches(g, "hey Bo"));
}

TEST(GbnfParser, Escapes) {
  EXPECT_TRUE(matches(R"(root ::= "\n\t\\\"\x41\u00e9\U0001F600")", "\n\t\\\"A\xC3\xA9\xF0\x9F\x98\x80"));
  EXPECT_TRUE(matches(R"(root ::= [\x00-\x1F\]\[] "é")", "]\xC3\xA9"));
  EXPECT_TRUE(matches(R"(root ::= [\-a]+)", "-a-"));
  // Literal UTF-8 in the grammar text is one code point per character.
  EXPECT_TRUE(matches("root ::= [α-ω]{3}", "αβγ"));
  EXPECT_FALSE(matches("root ::= [α-ω]{3}", "αβ"));
}

TEST(GbnfParser, AnyCharAndNegatedClasses) {
  EXPECT_TRUE(matches("root ::= . . .", "a€\xF0\x9F\x98\x80"));
  EXPECT_FALSE(matches("root ::= . .", "a"));
  EXPECT_TRUE(matches("root ::= [^abc]+", "xyz€"));
  EXPECT_FALSE(matches("root ::= [^abc]+", "xay"));
  EXPECT_TRUE(matches("root ::= [^]", "q"));  // the complement of nothing: any character
}

TEST(GbnfParser, Repetitions) {
  const std::string g = R"(root ::= "a"{2,4} "b"{3} "c"{1,} "d"{0,1})";
  EXPECT_TRUE(matches(g, "aabbbc"));
  EXPECT_TRUE(matches(g, "aaaabbbcccd"));
  EXPECT_FALSE(matches(g, "abbbc"));
  EXPECT_FALSE(matches(g, "aaaaabbbc"));
  EXPECT_FALSE(matches(g, "aabbc"));
  EXPECT_FALSE(matches(g, "aabbb"));
  EXPECT_FALSE(matches(g, "aabbbcdd"));
  // A repetition applies to the whole previous item: a literal, a group, a rule.
  EXPECT_TRUE(matches(R"(root ::= "ab"+)", "ababab"));
  EXPECT_FALSE(matches(R"(root ::= "ab"+)", "aba"));
  EXPECT_TRUE(matches(R"(root ::= ("x" | "yz"){ 2 , 3 })", "xyzx"));
  EXPECT_TRUE(matches(R"(root ::= x* "."
x ::= [0-9])", "123."));
  EXPECT_TRUE(matches(R"(root ::= "a" ""* "b")", "ab"));
}

TEST(GbnfParser, EmptyAlternativesAndEmptyRoot) {
  EXPECT_TRUE(matches(R"(root ::= | "a")", ""));
  EXPECT_TRUE(matches(R"(root ::= | "a")", "a"));
  EXPECT_TRUE(matches("root ::= ", ""));
}

TEST(GbnfParser, ErrorsNameLineColumnAndWhatWasExpected) {
  EXPECT_EQ(parse_error("root ::= \"abc"), "grammar line 1, column 10: unterminated string literal (expected a closing '\"')");
  EXPECT_EQ(parse_error("root ::= \"a\"\nfoo \"b\""), "grammar line 2, column 5: expected '::=' after rule name 'foo', found '\"'");
  EXPECT_EQ(parse_error("root ::= [a-"), "grammar line 1, column 10: unterminated character class (expected ']')");
  EXPECT_EQ(parse_error("root ::= (\"a\" | \"b\""),
            "grammar line 1, column 20: expected ')' to close the group opened at line 1, column 10, found the end of the grammar");
  EXPECT_EQ(parse_error("root ::= \"a\" )"), "grammar line 1, column 14: expected the end of the line after rule 'root', found ')'");
  EXPECT_EQ(parse_error("root ::= * \"a\""), "grammar line 1, column 10: expected an item before '*'");
  EXPECT_EQ(parse_error("root ::= \"\\q\""), "grammar line 1, column 11: unknown escape '\\q' (known: \\n \\r \\t \\\\ \\\" \\[ \\] \\xHH \\uHHHH \\UHHHHHHHH)");
  EXPECT_EQ(parse_error("root ::= \"\\x4\""), "grammar line 1, column 14: expected 2 hex digits after '\\x', found '\"'");
  EXPECT_EQ(parse_error("root ::= \"a\"{3,2}"), "grammar line 1, column 13: repetition {3,2} has max below min");
  EXPECT_EQ(parse_error("root ::= \"a\"{2"), "grammar line 1, column 15: expected '}' to close '{m,n}', found the end of the grammar");
  EXPECT_EQ(parse_error("root ::= [z-a]"), "grammar line 1, column 13: character range ends below its start");
  EXPECT_EQ(parse_error("root ::= []"), "grammar line 1, column 10: empty character class '[]' matches nothing");
  EXPECT_EQ(parse_error("root ::= \"a\nb\""),
            "grammar line 1, column 12: newline inside a string literal (write \\n), literal started at line 1, column 10");
  EXPECT_EQ(parse_error("root ::= \"a\"\nroot ::= \"b\""),
            "grammar line 2, column 1: rule 'root' is defined twice (first at line 1, column 1)");
  EXPECT_EQ(parse_error("root ::= (\"a\"\n  x ::= \"b\")"),
            "grammar line 2, column 3: unexpected rule definition 'x ::=' inside a rule (missing ')'?)");
  EXPECT_EQ(parse_error("root ::= \"\xC3\""), "grammar line 1, column 11: invalid UTF-8 in the grammar text");
}

TEST(GbnfParser, UndefinedRuleAndMissingRoot) {
  EXPECT_EQ(parse_error("root ::= item+\nitem ::= \"a\" value"), "grammar line 2, column 14: undefined rule 'value'");
  EXPECT_EQ(parse_error("start ::= \"a\""),
            "grammar: no 'root' rule (the grammar must define `root ::= ...`, where matching starts)");
  EXPECT_EQ(parse_error(""), "grammar: no 'root' rule (the grammar must define `root ::= ...`, where matching starts)");
  EXPECT_EQ(parse_error("# only a comment\n"),
            "grammar: no 'root' rule (the grammar must define `root ::= ...`, where matching starts)");
}

TEST(GbnfParser, LeftRecursionIsAnError) {
  const std::string direct = parse_error("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]");
  EXPECT_NE(direct.find("rule 'expr' is left-recursive (expr -> expr)"), std::string::npos) << direct;
  const std::string indirect = parse_error("root ::= a\na ::= b \"x\"\nb ::= c? a\nc ::= \"c\"");
  EXPECT_NE(indirect.find("is left-recursive (a -> b -> a)"), std::string::npos) << indirect;
  // A repetition of something that may be empty would loop the same way.
  const std::string empty_rep = parse_error("root ::= (\"a\"?)*");
  EXPECT_NE(empty_rep.find("left-recursive"), std::string::npos) << empty_rep;
  // Right recursion is fine.
  EXPECT_EQ(parse_error("root ::= \"(\" root \")\" | \"x\""), "");
  EXPECT_TRUE(matches("root ::= \"(\" root \")\" | \"x\"", "((x))"));
}

TEST(GbnfParser, LimitsStopHostileGrammars) {
  EXPECT_NE(parse_error("root ::= \"a\"{100000}").find("repetition count above the limit of 10000"), std::string::npos);
  std::string deep = "root ::= ";
  for (int i = 0; i < 300; ++i) deep += "(";
  deep += "\"a\"";
  for (int i = 0; i < 300; ++i) deep += ")";
  EXPECT_NE(parse_error(deep).find("groups nested deeper than 256"), std::string::npos);
  // A repeated group is one rule referenced n times, so nesting does not multiply...
  EXPECT_EQ(parse_error("root ::= (\"ab\"{10000}){10000}"), "");
  // ...but many large repetitions add up: 450 x 10000 copies of a literal.
  std::string many = "root ::=";
  for (int i = 0; i < 450; ++i) many += " \"a\"{10000}";
  const std::string blowup = parse_error(many);
  EXPECT_NE(blowup.find("expands to more than 4194304 symbols"), std::string::npos) << blowup;
  // Each bounded optional of {0,n} is a rule: 21 x 10000 of them pass the rule limit.
  std::string rules = "root ::=";
  for (int i = 0; i < 21; ++i) rules += " \"a\"{0,10000}";
  const std::string too_many = parse_error(rules);
  EXPECT_NE(too_many.find("more than 200000 rules"), std::string::npos) << too_many;
  Limits small;
  small.max_text_bytes = 10;
  EXPECT_THROW(Grammar::parse("root ::= \"abcdefgh\"", small), Error);
}

TEST(GbnfParser, ToStringListsTheCompiledRules) {
  const auto g = compile_gbnf("root ::= [a-c]+ x\nx ::= \"\\n\" | [^\\]]");
  const std::string s = g->to_string();
  EXPECT_NE(s.find("root ::= [a-c] root_1 x"), std::string::npos) << s;
  EXPECT_NE(s.find("x ::= [\\n] | [^\\]]"), std::string::npos) << s;
}

}  // namespace
}  // namespace tern::grammar
