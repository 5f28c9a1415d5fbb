#pragma once
// Answer-quality metrics of `tern eval` (docs/eval.md): a generated answer against a reference.
//
// Both texts are normalized first as SQuAD's evaluation script does: lower case (ASCII),
// punctuation removed, the articles a / an / the dropped, whitespace collapsed; the metrics then
// work on the words that remain.
//   exact match  1 when the normalized texts are equal, else 0
//   token F1     the harmonic mean of precision and recall of the bag of words (SQuAD's F1;
//                1 when both are empty, 0 when only one is)
//   ROUGE-L      the F-measure (beta = 1) of the longest common subsequence of the word
//                sequences (Lin 2004), 1 when both are empty
// Checks are the format / keyword tests a scenario lists; they look at the raw generated text.
#include <string>
#include <string_view>
#include <vector>

namespace tern {

std::string normalize_answer(std::string_view text);
std::vector<std::string> answer_words(std::string_view text);  // the normalized text's words

double exact_match(std::string_view generated, std::string_view reference);
double token_f1(std::string_view generated, std::string_view reference);
double rouge_l(std::string_view generated, std::string_view reference);

// One keyword / format check of a scenario. The kinds:
//   contains / not_contains   a substring (case-insensitive when ignore_case)
//   starts_with               a prefix of the text after leading blanks (same case rule)
//   regex                     ECMAScript regular expression searched anywhere in the text
struct TextCheck {
  enum class Kind { Contains, NotContains, StartsWith, Regex };
  std::string name;
  Kind kind = Kind::Contains;
  std::string pattern;
  bool ignore_case = true;
};

const char* check_kind_name(TextCheck::Kind kind);  // "contains", ...
// Throws tern::Error (for a regex that does not compile) naming the check; what = context.
void validate_check(const TextCheck& check, const std::string& what);
bool check_passes(const TextCheck& check, std::string_view text);

}  // namespace tern
