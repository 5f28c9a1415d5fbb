// Byte-level BPE ("gpt2" vocabularies): the GPT-2 pre-tokenizer splits the text into words,
// each word's bytes are mapped to printable code points (GPT-2's bytes_to_unicode), and the
// word is merged pairwise by merge rank (lowest first, ties leftmost).
#include <algorithm>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace tern::detail {

namespace {

enum Kind : uint8_t { kLetter, kNumber, kOther, kSpace };

Kind kind_of(uint32_t cp) {
  if (unicode::is_whitespace(cp)) return kSpace;
  switch (unicode::char_class(cp)) {
    case unicode::CharClass::Letter: return kLetter;
    case unicode::CharClass::Number: return kNumber;
    default: return kOther;
  }
}

}  // namespace

// Hand-written matcher for the regex; at each position the first alternative that matches
// wins, and every alternative is greedy:
//   1. 's 't 're 've 'm 'll 'd          (case-sensitive, as in GPT-2)
//   2-4. an optional ' ' then a run of letters | numbers | other non-space characters
//   5. \s+(?!\S): a whitespace run, minus its last character when a non-space follows
//      (that character then prefixes the next word, e.g. "  Hello" -> " ", " Hello")
//   6. \s+: a single whitespace character before a non-space
void gpt2_pretokenize(std::string_view text, const std::function<void(size_t, size_t)>& emit) {
  std::vector<uint32_t> cps;   // [n] code points (U+FFFD for each invalid byte)
  std::vector<size_t> offs;    // [n + 1] byte offset of each code point, then text.size()
  std::vector<uint8_t> kinds;  // [n]
  cps.reserve(text.size());
  offs.reserve(text.size() + 1);
  kinds.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    offs.push_back(i);
    const uint32_t cp = unicode::next_codepoint(text, i);
    cps.push_back(cp);
    kinds.push_back(kind_of(cp));
  }
  offs.push_back(text.size());
  const size_t n = cps.size();

  for (size_t i = 0; i < n;) {
    size_t end = i;
    const uint32_t c = cps[i];
    if (c == '\'' && i + 1 < n) {
      const uint32_t c1 = cps[i + 1];
      const uint32_t c2 = i + 2 < n ? cps[i + 2] : 0;
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
        end = i + 2;
      else if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
        end = i + 3;
    }
    if (end == i) {
      const size_t k = (c == ' ' && i + 1 < n && kinds[i + 1] != kSpace) ? i + 1 : i;
      if (kinds[k] != kSpace) {
        end = k + 1;
        while (end < n && kinds[end] == kinds[k]) ++end;
      } else {
        while (end < n && kinds[end] == kSpace) ++end;
        if (end < n && end - i >= 2) --end;
      }
    }
    emit(offs[i], offs[end] - offs[i]);
    i = end;
  }
}

BpeTokenizer::BpeTokenizer(VocabData d) : VocabTokenizer(std::move(d)) {
  // GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68
  // bytes take the code points 256, 257, ... in byte order.
  std::fill(std::begin(cp_to_byte_), std::end(cp_to_byte_), int16_t(-1));
  uint32_t next_cp = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const uint32_t cp = printable ? uint32_t(b) : next_cp++;
    unicode::append_utf8(byte_to_utf8_[b], cp);
    cp_to_byte_[cp] = static_cast<int16_t>(b);
  }
  merge_rank_.reserve(merges_.size());
  for (size_t i = 0; i < merges_.size(); ++i)
    merge_rank_.emplace(merges_[i], static_cast<int32_t>(i));  // a repeated merge keeps its first rank
}

void BpeTokenizer::encode_text(std::string_view text, bool, std::vector<int32_t>& out) const {
  std::string mapped, key;  // reused across words
  gpt2_pretokenize(text, [&](size_t off, size_t len) {
    encode_word(text.substr(off, len), mapped, key, out);
  });
}

void BpeTokenizer::encode_word(std::string_view word, std::string& mapped, std::string& key,
                               std::vector<int32_t>& out) const {
  mapped.clear();
  std::vector<MergeSymbol> syms;
  syms.reserve(word.size());
  for (char c : word) {
    const std::string& u = byte_to_utf8_[static_cast<uint8_t>(c)];
    const auto idx = static_cast<int32_t>(syms.size());
    syms.push_back({static_cast<uint32_t>(mapped.size()), static_cast<uint32_t>(u.size()),
                    idx - 1, idx + 1});
    mapped += u;
  }
  if (syms.empty()) return;
  syms.back().next = -1;

  merge_symbols(mapped, syms, [&](std::string_view left, std::string_view right) -> std::optional<double> {
    key.assign(left);
    key += ' ';
    key.append(right);
    const auto it = merge_rank_.find(key);
    if (it == merge_rank_.end()) return std::nullopt;
    return -double(it->second);  // lower rank = higher priority
  });

  for (int32_t i = 0; i != -1; i = syms[i].next) {
    const std::string_view piece = std::string_view(mapped).substr(syms[i].off, syms[i].len);
    const int32_t id = text_piece_id(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    // A merge produced a piece the vocabulary lacks (inconsistent files): fall back to
    // the single mapped characters, which every byte-level vocabulary has.
    for (size_t j = 0; j < piece.size();) {
      const size_t n = std::min(unicode::utf8_len_from_lead(static_cast<uint8_t>(piece[j])),
                                piece.size() - j);
      const int32_t cid = text_piece_id(piece.substr(j, n));
      if (cid >= 0)
        out.push_back(cid);
      else if (unk_id_ >= 0)
        out.push_back(unk_id_);
      else
        fail("cannot tokenize: the vocabulary has no token for byte piece '", piece.substr(j, n),
             "' and no unknown token");
      j += n;
    }
  }
}

std::string BpeTokenizer::token_to_piece(int32_t id, bool render_special) const {
  check_id(id);
  const std::string& text = tokens_[id];
  switch (type_of(id)) {
    case TokenType::Normal:
    case TokenType::Byte: {
      std::string out;
      out.reserve(text.size());
      for (size_t i = 0; i < text.size();) {
        const size_t start = i;
        const uint32_t cp = unicode::next_codepoint(text, i);
        if (cp < 512 && cp_to_byte_[cp] >= 0)
          out += static_cast<char>(cp_to_byte_[cp]);
        else
          out.append(text, start, i - start);  // not a mapped byte: keep it as written
      }
      return out;
    }
    case TokenType::UserDefined:
      return text;
    case TokenType::Control:
    case TokenType::Unknown:
    case TokenType::Unused:
    case TokenType::Undefined:
      break;
  }
  return render_special ? text : std::string();
}

}  // namespace tern::detail
