#include "tokenizer/unicode.h"

#include <algorithm>

namespace tern::unicode {

CharClass char_class(uint32_t cp) {
  if (cp < 0x80) {  // fast path: most text is ASCII
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CharClass::Letter;
    if (cp >= '0' && cp <= '9') return CharClass::Number;
    return CharClass::Other;
  }
  const CodepointRange* end = kClassRanges + kClassRangeCount;
  const CodepointRange* it = std::upper_bound(
      kClassRanges, end, cp, [](uint32_t c, const CodepointRange& r) { return c < r.first; });
  if (it == kClassRanges) return CharClass::Other;
  --it;
  return cp <= it->last ? static_cast<CharClass>(it->cls) : CharClass::Other;
}

bool is_whitespace(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

int utf8_valid_len(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return 1;
  int n;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return 0;
  }
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return -1;
    const auto b = static_cast<uint8_t>(s[i + k]);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
  }
  return n;
}

uint32_t next_codepoint(std::string_view s, size_t& i) {
  const int n = utf8_valid_len(s, i);
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (n == 1) {
    ++i;
    return b0;
  }
  if (n <= 0) {
    ++i;
    return 0xFFFD;
  }
  uint32_t cp = b0 & (0xFF >> (n + 1));
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace tern::unicode
