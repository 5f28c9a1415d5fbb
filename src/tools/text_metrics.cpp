#include "tools/text_metrics.h"

#include <algorithm>
#include <map>
#include <regex>

#include "core/error.h"

namespace tern {
namespace {

char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; }

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = ascii_lower(c);
  return r;
}

bool is_ascii_punct(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  return (u >= 33 && u <= 47) || (u >= 58 && u <= 64) || (u >= 91 && u <= 96) || (u >= 123 && u <= 126);
}

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Precision / recall harmonic mean with SQuAD's conventions for empty sides.
double f_measure(double common, size_t n_generated, size_t n_reference) {
  if (n_generated == 0 && n_reference == 0) return 1.0;
  if (common == 0.0) return 0.0;
  const double p = common / double(n_generated), r = common / double(n_reference);
  return 2.0 * p * r / (p + r);
}

}  // namespace

std::vector<std::string> answer_words(std::string_view text) {
  std::vector<std::string> words;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty() && cur != "a" && cur != "an" && cur != "the") words.push_back(cur);
    cur.clear();
  };
  for (char c : text) {
    if (is_ascii_punct(c)) continue;  // removed, not a separator: "don't" -> "dont"
    if (is_blank(c)) {
      flush();
      continue;
    }
    cur.push_back(ascii_lower(c));
  }
  flush();
  return words;
}

std::string normalize_answer(std::string_view text) {
  std::string r;
  for (const std::string& w : answer_words(text)) {
    if (!r.empty()) r.push_back(' ');
    r += w;
  }
  return r;
}

double exact_match(std::string_view generated, std::string_view reference) {
  return normalize_answer(generated) == normalize_answer(reference) ? 1.0 : 0.0;
}

double token_f1(std::string_view generated, std::string_view reference) {
  const std::vector<std::string> g = answer_words(generated), r = answer_words(reference);
  std::map<std::string, int64_t> counts;
  for (const std::string& w : r) ++counts[w];
  int64_t common = 0;
  for (const std::string& w : g) {
    auto it = counts.find(w);
    if (it != counts.end() && it->second > 0) {
      --it->second;
      ++common;
    }
  }
  return f_measure(double(common), g.size(), r.size());
}

double rouge_l(std::string_view generated, std::string_view reference) {
  const std::vector<std::string> g = answer_words(generated), r = answer_words(reference);
  // LCS length by dynamic programming over one row (answers are sentences: |g| |r| is small).
  std::vector<size_t> prev(r.size() + 1, 0), cur(r.size() + 1, 0);
  for (size_t i = 1; i <= g.size(); ++i) {
    for (size_t j = 1; j <= r.size(); ++j)
      cur[j] = g[i - 1] == r[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], cur[j - 1]);
    std::swap(prev, cur);
  }
  return f_measure(double(prev[r.size()]), g.size(), r.size());
}

const char* check_kind_name(TextCheck::Kind kind) {
  switch (kind) {
    case TextCheck::Kind::Contains: return "contains";
    case TextCheck::Kind::NotContains: return "not_contains";
    case TextCheck::Kind::StartsWith: return "starts_with";
    case TextCheck::Kind::Regex: return "regex";
  }
  return "?";
}

void validate_check(const TextCheck& check, const std::string& what) {
  if (check.pattern.empty()) fail(what, ": check \"", check.name, "\": the ", check_kind_name(check.kind), " text is empty");
  if (check.kind != TextCheck::Kind::Regex) return;
  try {
    auto flags = std::regex::ECMAScript;
    if (check.ignore_case) flags |= std::regex::icase;
    std::regex re(check.pattern, flags);
  } catch (const std::regex_error& e) {
    fail(what, ": check \"", check.name, "\": the regex /", check.pattern, "/ does not compile (", e.what(), ")");
  }
}

bool check_passes(const TextCheck& check, std::string_view text) {
  const std::string hay = check.ignore_case ? lower(text) : std::string(text);
  const std::string needle = check.ignore_case ? lower(check.pattern) : check.pattern;
  switch (check.kind) {
    case TextCheck::Kind::Contains: return hay.find(needle) != std::string::npos;
    case TextCheck::Kind::NotContains: return hay.find(needle) == std::string::npos;
    case TextCheck::Kind::StartsWith: {
      size_t i = 0;
      while (i < hay.size() && is_blank(hay[i])) ++i;
      return hay.compare(i, needle.size(), needle) == 0;
    }
    case TextCheck::Kind::Regex: {
      auto flags = std::regex::ECMAScript;
      if (check.ignore_case) flags |= std::regex::icase;
      const std::regex re(check.pattern, flags);
      return std::regex_search(text.begin(), text.end(), re);
    }
  }
  return false;
}

}  // namespace tern
