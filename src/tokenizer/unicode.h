#pragma once
// Minimal Unicode support for the tokenizers: UTF-8 coding and the character classes the
// GPT-2 pre-tokenizer regex uses (\p{L}, \p{N}, \s). Internal to the tokenizer layer.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tern::unicode {

enum class CharClass : uint8_t { Other = 0, Letter = 1, Number = 2 };

struct CodepointRange {
  uint32_t first, last;
  uint8_t cls;  // CharClass
};
// Generated table (unicode_tables.cpp).
extern const CodepointRange kClassRanges[];
extern const size_t kClassRangeCount;

// General category L* -> Letter, N* -> Number, anything else -> Other.
CharClass char_class(uint32_t cp);
// The White_Space property (what \s matches in Unicode-aware regex engines).
bool is_whitespace(uint32_t cp);

// Length of the UTF-8 sequence announced by lead byte `b`, from its high bits only
// (continuation bytes count as 1). This is the rule llama.cpp's SPM splitter uses.
inline size_t utf8_len_from_lead(uint8_t b) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[b >> 4];
}

// Length of the valid UTF-8 sequence starting at s[i]: 1..4; 0 when the bytes there are
// not a valid (shortest-form, non-surrogate, <= U+10FFFF) sequence; -1 when they are a valid
// but truncated prefix (the string ends too early).
int utf8_valid_len(std::string_view s, size_t i);

// Decodes the code point at s[i] and advances i. An invalid or truncated sequence yields
// U+FFFD (class Other, not whitespace) and advances by one byte, so callers that slice the
// original bytes by offsets keep every byte.
uint32_t next_codepoint(std::string_view s, size_t& i);

void append_utf8(std::string& out, uint32_t cp);

}  // namespace tern::unicode
