// SentencePiece-style BPE ("llama" vocabularies), matching llama.cpp's llm_tokenizer_spm:
// spaces become U+2581, a dummy U+2581 starts the text, the text is split into UTF-8
// characters, and adjacent symbols are merged greedily by the score of the merged piece.
// Symbols that are not vocabulary pieces at the end fall back to <0xNN> byte tokens.
#include <algorithm>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace tern::detail {

namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";         // U+2581 LOWER ONE EIGHTH BLOCK
constexpr std::string_view kUnknownGlyph = "\xE2\x96\x85";  // U+2585, llama.cpp's <unk> glyph

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

SpmTokenizer::SpmTokenizer(VocabData d) : VocabTokenizer(std::move(d)) {
  byte_of_.assign(tokens_.size(), -1);
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const std::string& t = tokens_[i];
    if (type_of(static_cast<int32_t>(i)) != TokenType::Byte || t.size() != 6 ||
        t.compare(0, 3, "<0x") != 0 || t[5] != '>')
      continue;
    const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
    if (hi >= 0 && lo >= 0) byte_of_[i] = static_cast<int16_t>(hi * 16 + lo);
  }
  std::fill(std::begin(barrier_), std::end(barrier_), true);
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const std::string& t = tokens_[i];
    if (t.size() < 2 || text_piece_id(t) != static_cast<int32_t>(i)) continue;
    for (char c : t)
      if (static_cast<uint8_t>(c) < 128) barrier_[static_cast<uint8_t>(c)] = false;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    byte_to_id_[b] = text_piece_id(name);
  }
}

void SpmTokenizer::encode_text(std::string_view text, bool after_special,
                               std::vector<int32_t>& out) const {
  std::string s;  // the escaped text the symbols point into
  s.reserve(text.size() + text.size() / 4 + kSpmSpace.size());
  if (add_space_prefix_ && after_special) s += kSpmSpace;
  for (char c : text) {
    if (c == ' ')
      s += kSpmSpace;
    else
      s += c;
  }
  if (s.size() > size_t(std::numeric_limits<int32_t>::max()))
    fail("text of ", text.size(), " bytes is too long to tokenize in one piece");

  const std::string_view sv = s;
  std::vector<MergeSymbol> syms;
  auto emit_piece = [&](std::string_view piece) {
    const int32_t id = text_piece_id(piece);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
    for (char c : piece) {
      const int32_t b = byte_to_id_[static_cast<uint8_t>(c)];
      if (b >= 0) {
        out.push_back(b);
      } else if (unk_id_ >= 0) {
        out.push_back(unk_id_);
      } else {
        fail("cannot tokenize byte 0x", std::hex, int(static_cast<uint8_t>(c)),
             ": the vocabulary has neither its byte token nor an unknown token");
      }
    }
  };
  auto merge_segment = [&](size_t begin, size_t end) {  // s[begin, end), no barriers inside
    syms.clear();
    for (size_t off = begin; off < end;) {
      const size_t len =
          std::min(unicode::utf8_len_from_lead(static_cast<uint8_t>(s[off])), end - off);
      const auto idx = static_cast<int32_t>(syms.size());
      syms.push_back({static_cast<uint32_t>(off), static_cast<uint32_t>(len), idx - 1,
                      off + len < end ? idx + 1 : -1});
      off += len;
    }
    if (syms.empty()) return;
    merge_symbols(sv, syms, [&](std::string_view left, std::string_view right) -> std::optional<double> {
      const int32_t id = text_piece_id(std::string_view(left.data(), left.size() + right.size()));
      if (id < 0) return std::nullopt;
      return scores_.empty() ? 0.0 : double(scores_[id]);
    });
    for (int32_t i = 0; i != -1; i = syms[i].next) emit_piece(sv.substr(syms[i].off, syms[i].len));
  };

  // Step by the same symbol lengths as merge_segment, so that a barrier byte swallowed by a
  // malformed multi-byte symbol does not cut it.
  size_t seg = 0;
  for (size_t i = 0, len; i < s.size(); i += len) {
    const auto b = static_cast<uint8_t>(s[i]);
    len = std::min(unicode::utf8_len_from_lead(b), s.size() - i);
    if (b >= 128 || !barrier_[b]) continue;
    merge_segment(seg, i);
    emit_piece(sv.substr(i, 1));
    seg = i + 1;
  }
  merge_segment(seg, s.size());
}

std::string SpmTokenizer::token_to_piece(int32_t id, bool render_special) const {
  check_id(id);
  const std::string& text = tokens_[id];
  switch (type_of(id)) {
    case TokenType::Normal: {
      std::string out;
      out.reserve(text.size());
      for (size_t i = 0; i < text.size();) {
        if (text.compare(i, kSpmSpace.size(), kSpmSpace) == 0) {
          out += ' ';
          i += kSpmSpace.size();
        } else {
          out += text[i++];
        }
      }
      return out;
    }
    case TokenType::Byte:
      return byte_of_[id] >= 0 ? std::string(1, static_cast<char>(byte_of_[id])) : text;
    case TokenType::UserDefined:
      return text;
    case TokenType::Unknown:
      return render_special ? text : std::string(kUnknownGlyph);
    case TokenType::Control:
    case TokenType::Unused:
    case TokenType::Undefined:
      break;
  }
  return render_special ? text : std::string();
}

}  // namespace tern::detail
