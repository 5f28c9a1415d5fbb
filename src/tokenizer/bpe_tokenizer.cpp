// Byte-level BPE ("gpt2" vocabularies): a regex pre-tokenizer splits the text into words,
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

// The text as code points, with each one's byte offset and regex class.
struct CodepointText {
  std::vector<uint32_t> cps;   // [n] code points (U+FFFD for each invalid byte)
  std::vector<size_t> offs;    // [n + 1] byte offset of each code point, then text.size()
  std::vector<uint8_t> kinds;  // [n] Kind

  explicit CodepointText(std::string_view text) {
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
  }
  size_t size() const { return cps.size(); }
};

uint32_t ascii_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

}  // namespace

// Hand-written matcher for the regex; at each position the first alternative that matches
// wins, and every alternative is greedy:
//   1. 's 't 're 've 'm 'll 'd          (case-sensitive, as in GPT-2)
//   2-4. an optional ' ' then a run of letters | numbers | other non-space characters
//   5. \s+(?!\S): a whitespace run, minus its last character when a non-space follows
//      (that character then prefixes the next word, e.g. "  Hello" -> " ", " Hello")
//   6. \s+: a single whitespace character before a non-space
void gpt2_pretokenize(std::string_view text, const std::function<void(size_t, size_t)>& emit) {
  const CodepointText t(text);
  const std::vector<uint32_t>& cps = t.cps;
  const std::vector<size_t>& offs = t.offs;
  const std::vector<uint8_t>& kinds = t.kinds;
  const size_t n = t.size();

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

// Alternatives in order, each greedy, the first that matches wins:
//   1. ' followed by s t m d / re ve ll, any ASCII case
//   2. an optional character that is neither \r, \n, a letter nor a number (a space, a
//      tab, punctuation), then a run of letters
//   3. a run of 1..max_digits numbers
//   4. an optional ' ', a run of characters that are neither whitespace, letters nor
//      numbers, then any \r / \n that follow
//   5. \s*[\r\n]+: a whitespace run up to and including its last \r or \n
//   6. \s+(?!\S): a whitespace run without newlines, minus its last character when a
//      non-space follows
//   7. \s+: a single whitespace character before a non-space
void llama3_pretokenize(std::string_view text, size_t max_digits,
                        const std::function<void(size_t, size_t)>& emit) {
  const CodepointText t(text);
  const size_t n = t.size();
  auto kind = [&](size_t k) { return k < n ? t.kinds[k] : uint8_t(0xFF); };
  auto is_newline = [&](size_t k) { return t.cps[k] == '\r' || t.cps[k] == '\n'; };
  for (size_t i = 0; i < n;) {
    size_t end = i;
    const uint32_t c = t.cps[i];
    const uint8_t k = t.kinds[i];
    if (c == '\'' && i + 1 < n) {  // 1
      const uint32_t c1 = ascii_lower(t.cps[i + 1]);
      const uint32_t c2 = i + 2 < n ? ascii_lower(t.cps[i + 2]) : 0;
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
        end = i + 2;
      else if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
        end = i + 3;
    }
    if (end == i) {  // 2
      size_t s = i;
      if (k != kLetter && k != kNumber && !is_newline(i) && kind(i + 1) == kLetter) s = i + 1;
      if (t.kinds[s] == kLetter) {
        end = s + 1;
        while (kind(end) == kLetter) ++end;
      }
    }
    if (end == i && k == kNumber) {  // 3
      end = i + 1;
      while (end - i < max_digits && kind(end) == kNumber) ++end;
    }
    if (end == i) {  // 4
      const size_t s = c == ' ' && kind(i + 1) == kOther ? i + 1 : i;
      if (t.kinds[s] == kOther) {
        end = s + 1;
        while (kind(end) == kOther) ++end;
        while (end < n && is_newline(end)) ++end;
      }
    }
    if (end == i) {  // 5-7: only whitespace is left here
      size_t j = i, last_newline = n;
      for (; kind(j) == kSpace; ++j)
        if (is_newline(j)) last_newline = j;
      if (last_newline < n)
        end = last_newline + 1;
      else if (j < n && j - i >= 2)
        end = j - 1;
      else
        end = j;
    }
    emit(t.offs[i], t.offs[end] - t.offs[i]);
    i = end;
  }
}

void pretokenize(PreTokenizer pre, std::string_view text,
                 const std::function<void(size_t, size_t)>& emit) {
  switch (pre) {
    case PreTokenizer::Gpt2:
      gpt2_pretokenize(text, emit);
      return;
    case PreTokenizer::Llama3:
      llama3_pretokenize(text, 3, emit);
      return;
    case PreTokenizer::Qwen2:
      llama3_pretokenize(text, 1, emit);
      return;
    case PreTokenizer::DigitsGpt2: {
      // Two splits one after the other, as llama.cpp applies its regex list: \p{N} makes
      // every digit a piece, then GPT-2's regex splits each run between digits on its own.
      size_t run = 0;
      auto flush = [&](size_t end) {
        if (end > run)
          gpt2_pretokenize(text.substr(run, end - run),
                           [&](size_t off, size_t len) { emit(run + off, len); });
      };
      for (size_t i = 0; i < text.size();) {
        const size_t start = i;
        const uint32_t cp = unicode::next_codepoint(text, i);
        if (unicode::char_class(cp) != unicode::CharClass::Number) continue;
        flush(start);
        emit(start, i - start);
        run = i;
      }
      flush(text.size());
      return;
    }
  }
}

namespace {

struct PreName {
  const char* name;
  PreTokenizer pre;
  bool ignore_merges;
};
// llama.cpp's names for the pre-tokenizers tern implements ("" = the key is absent).
constexpr PreName kPreNames[] = {
    {"", PreTokenizer::Gpt2, false},           {"default", PreTokenizer::Gpt2, false},
    {"gpt-2", PreTokenizer::Gpt2, false},      {"phi-2", PreTokenizer::Gpt2, false},
    {"mpt", PreTokenizer::Gpt2, false},        {"olmo", PreTokenizer::Gpt2, false},
    {"jais", PreTokenizer::Gpt2, false},       {"roberta-bpe", PreTokenizer::Gpt2, false},
    {"starcoder", PreTokenizer::DigitsGpt2, false}, {"refact", PreTokenizer::DigitsGpt2, false},
    {"command-r", PreTokenizer::DigitsGpt2, false}, {"smollm", PreTokenizer::DigitsGpt2, false},
    {"codeshell", PreTokenizer::DigitsGpt2, false}, {"exaone", PreTokenizer::DigitsGpt2, false},
    {"minerva-7b", PreTokenizer::DigitsGpt2, false},
    {"llama3", PreTokenizer::Llama3, true},    {"llama-v3", PreTokenizer::Llama3, true},
    {"llama-bpe", PreTokenizer::Llama3, true}, {"falcon3", PreTokenizer::Llama3, true},
    {"dbrx", PreTokenizer::Llama3, false},     {"smaug-bpe", PreTokenizer::Llama3, false},
    {"qwen2", PreTokenizer::Qwen2, false},     {"deepseek-r1-qwen", PreTokenizer::Qwen2, false},
    {"stablelm2", PreTokenizer::Qwen2, false}, {"megrez", PreTokenizer::Qwen2, false},
};

}  // namespace

std::optional<PreTokenizer> pretokenizer_from_name(std::string_view name, bool& ignore_merges) {
  for (const PreName& p : kPreNames)
    if (name == p.name) {
      ignore_merges = p.ignore_merges;
      return p.pre;
    }
  return std::nullopt;
}

const char* supported_pretokenizer_names() {
  static const std::string names = [] {
    std::string s;
    for (const PreName& p : kPreNames) {
      if (!*p.name) continue;
      if (!s.empty()) s += ", ";
      s += p.name;
    }
    return s;
  }();
  return names.c_str();
}

BpeTokenizer::BpeTokenizer(VocabData d)
    // (pre and ignore_merges are plain values: the move into the base leaves them as they are)
    : VocabTokenizer(std::move(d)), pre_(d.pre), ignore_merges_(d.ignore_merges) {
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
  pretokenize(pre_, text, [&](size_t off, size_t len) {
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
  if (ignore_merges_) {
    const int32_t id = text_piece_id(mapped);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }

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
