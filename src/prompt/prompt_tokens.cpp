// Tokenizing a prompt for compression: keep markers, parts, forced tokens, atoms, words and
// sentences (prompt_tokens.h).
#include "prompt/prompt_tokens.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace tern::prompt {

namespace {

constexpr std::string_view kOpen = "<keep>";
constexpr std::string_view kClose = "</keep>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
bool is_utf8_continuation(char c) { return (uint8_t(c) & 0xC0) == 0x80; }
// ASCII punctuation that ends a word or stands alone (an apostrophe stays inside a word).
bool is_punct(char c) { return std::ispunct(uint8_t(c)) && c != '\'' && c != '-' && c != '_'; }

// Whether a sentence ends after a piece: its last non-space character ends one, or it holds a
// line break.
bool ends_sentence(std::string_view piece) {
  if (piece.find('\n') != std::string_view::npos) return true;
  size_t e = piece.size();
  while (e > 0 && is_space(piece[e - 1])) --e;
  if (e == 0) return false;
  const char c = piece[e - 1];
  return c == '.' || c == '!' || c == '?';
}

}  // namespace

const char* part_name(Part p) {
  switch (p) {
    case Part::Instruction: return "instruction";
    case Part::Context: return "context";
    case Part::Question: return "question";
  }
  return "?";
}

int64_t PromptTokens::n_forced() const {
  int64_t n = 0;
  for (int64_t i = first; i < size(); ++i) n += forced[size_t(i)];
  return n;
}

std::string strip_keep_markers(std::string_view text, std::vector<std::pair<size_t, size_t>>& spans,
                               std::string_view what) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  bool open = false;
  size_t open_at = 0, open_src = 0;
  while (pos < text.size()) {
    const bool at_open = text.substr(pos, kOpen.size()) == kOpen;
    const bool at_close = text.substr(pos, kClose.size()) == kClose;
    if (at_open) {
      if (open)
        fail(what, ": <keep> at byte ", pos, " inside the <keep> opened at byte ", open_src, " (spans do not nest)");
      open = true;
      open_at = out.size();
      open_src = pos;
      pos += kOpen.size();
    } else if (at_close) {
      if (!open) fail(what, ": </keep> at byte ", pos, " without a <keep> before it");
      open = false;
      if (out.size() > open_at) spans.emplace_back(open_at, out.size());
      pos += kClose.size();
    } else {
      out += text[pos++];
    }
  }
  if (open) fail(what, ": the <keep> at byte ", open_src, " is never closed (</keep>)");
  return out;
}

namespace {

// Parts, forced tokens, atoms, words and sentences of p (ids and pieces set), given each token's
// byte range in `full` (the prompt text the pieces spell), the parts' ends in it, and the keep
// spans.
void mark_units(const Tokenizer& tok, PromptTokens& p, const std::string& full, const std::vector<size_t>& start,
                size_t shift, const size_t (&part_end)[3], const std::vector<std::pair<size_t, size_t>>& spans,
                const PromptOptions& opts);

}  // namespace

PromptTokens prompt_from_ids(const Tokenizer& tok, std::span<const int32_t> ids, const PromptOptions& opts) {
  PromptTokens p;
  p.ids.assign(ids.begin(), ids.end());
  const int64_t n = p.size();
  p.first = (n > 0 && ids[0] == tok.bos_id() && tok.bos_id() >= 0) ? 1 : 0;
  p.pieces.resize(size_t(n));
  std::string concat;
  std::vector<size_t> start(size_t(n) + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = p.ids[size_t(i)];
    if (id < 0 || id >= tok.n_vocab()) fail("prompt compression: token id ", id, " is outside the vocabulary of ", tok.n_vocab());
    if (i >= p.first) p.pieces[size_t(i)] = tok.token_to_piece(id, true);
    start[size_t(i)] = concat.size();
    concat += p.pieces[size_t(i)];
  }
  start[size_t(n)] = concat.size();
  const size_t part_end[3] = {0, concat.size(), concat.size()};
  mark_units(tok, p, concat, start, 0, part_end, {}, opts);
  return p;
}

std::vector<int32_t> kept_ids(const PromptTokens& p, const std::vector<uint8_t>& keep) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < p.size(); ++i)
    if (i < p.first || keep[size_t(i)]) out.push_back(p.ids[size_t(i)]);
  return out;
}

PromptTokens tokenize_prompt(const Tokenizer& tok, const PromptParts& parts, const PromptOptions& opts) {
  // The three parts joined, with their keep spans in the joined text's bytes.
  std::vector<std::pair<size_t, size_t>> spans;
  std::string full;
  size_t part_end[3];
  const std::string* texts[3] = {&parts.instruction, &parts.context, &parts.question};
  for (int k = 0; k < 3; ++k) {
    std::vector<std::pair<size_t, size_t>> s;
    const std::string clean = strip_keep_markers(*texts[k], s, str_cat("the ", part_name(Part(k))));
    for (auto [b, e] : s) spans.emplace_back(full.size() + b, full.size() + e);
    full += clean;
    part_end[k] = full.size();
  }

  PromptTokens p;
  p.ids = tok.encode(full, tok.add_bos_default(), opts.parse_special);
  const int64_t n = p.size();
  p.first = (n > 0 && tok.add_bos_default() && p.ids[0] == tok.bos_id()) ? 1 : 0;
  p.pieces.resize(size_t(n));
  std::string concat;
  std::vector<size_t> start(size_t(n) + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    if (i >= p.first) p.pieces[size_t(i)] = tok.token_to_piece(p.ids[size_t(i)], true);
    start[size_t(i)] = concat.size();
    concat += p.pieces[size_t(i)];
  }
  start[size_t(n)] = concat.size();
  // The pieces spell the text, or the text after one space the tokenizer prefixed.
  size_t shift = 0;
  if (concat != full) {
    if (concat.size() == full.size() + 1 && concat[0] == ' ' && std::string_view(concat).substr(1) == full) {
      shift = 1;
      p.leading_space = true;
    } else {
      fail("prompt compression: the scorer's tokens do not spell the prompt back (", concat.size(),
           " bytes decoded against ", full.size(), "): its tokenizer normalizes the text");
    }
  }
  mark_units(tok, p, full, start, shift, part_end, spans, opts);
  return p;
}

namespace {

void mark_units(const Tokenizer& tok, PromptTokens& p, const std::string& full, const std::vector<size_t>& start,
                size_t shift, const size_t (&part_end)[3], const std::vector<std::pair<size_t, size_t>>& spans,
                const PromptOptions& opts) {
  const int64_t n = p.size();
  const auto text_pos = [&](size_t at) { return at >= shift ? at - shift : 0; };

  p.part.assign(size_t(n), Part::Context);
  p.forced.assign(size_t(n), 0);
  p.atom.assign(size_t(n), 0);
  p.word.assign(size_t(n), 0);
  p.sentence.assign(size_t(n), 0);
  const std::vector<int32_t>& types = tok.token_types();
  int32_t atom = 0, word = 0, sentence = 0;
  Part prev_part = Part::Instruction;
  bool prev_ends_sentence = false, prev_ends_word = false;
  for (int64_t i = 0; i < n; ++i) {
    const size_t s = text_pos(start[size_t(i)]), e = text_pos(start[size_t(i) + 1]);
    const std::string& piece = p.pieces[size_t(i)];
    const Part part = s < part_end[0] ? Part::Instruction : s < part_end[1] ? Part::Context : Part::Question;
    p.part[size_t(i)] = part;
    const int32_t id = p.ids[size_t(i)];
    const bool control = id >= 0 && size_t(id) < types.size() &&
                         (types[size_t(id)] == int32_t(TokenType::Control) ||
                          types[size_t(id)] == int32_t(TokenType::UserDefined));
    bool forced = i < p.first || control;
    for (auto [b, en] : spans)
      if (s < en && e > b) forced = true;
    p.forced[size_t(i)] = forced;
    if (i > p.first) {
      const bool new_part = part != prev_part;
      const bool char_start = piece.empty() || full.size() <= s || !is_utf8_continuation(full[s]) || e == s;
      if (char_start || new_part) ++atom;
      const bool starts_word = !piece.empty() && (is_space(piece[0]) || is_punct(piece[0]));
      if (new_part || control || prev_ends_word || starts_word) ++word;
      // Whitespace after a sentence's end (the line break after "!") stays with that sentence.
      const bool blank = piece.find_first_not_of(" \t\n\r") == std::string::npos;
      if (new_part || (prev_ends_sentence && !blank)) ++sentence;
    }
    p.atom[size_t(i)] = atom;
    p.word[size_t(i)] = word;
    p.sentence[size_t(i)] = sentence;
    prev_part = part;
    const bool blank_piece = piece.find_first_not_of(" \t\n\r") == std::string::npos;
    prev_ends_sentence = ends_sentence(piece) || control || (prev_ends_sentence && blank_piece && i > p.first);
    prev_ends_word = control || (!piece.empty() && (is_space(piece.back()) || is_punct(piece.back())));
  }

  // Words that must survive whole: numbers and (mid-sentence) capitalized names, when asked.
  if (opts.keep_numbers || opts.keep_names) {
    for (int64_t i = p.first; i < n;) {
      int64_t j = i;
      bool digit = false;
      while (j < n && p.word[size_t(j)] == p.word[size_t(i)]) {
        for (char c : p.pieces[size_t(j)]) digit |= std::isdigit(uint8_t(c)) != 0;
        ++j;
      }
      const std::string& head = p.pieces[size_t(i)];
      const size_t k = head.find_first_not_of(" \t\n\r");
      const bool capital = k != std::string::npos && std::isupper(uint8_t(head[k]));
      const bool sentence_start = i == p.first || p.sentence[size_t(i - 1)] != p.sentence[size_t(i)];
      if ((opts.keep_numbers && digit) || (opts.keep_names && capital && !sentence_start))
        for (int64_t t = i; t < j; ++t) p.forced[size_t(t)] = 1;
      i = j;
    }
  }
  // An atom is kept or dropped whole: one forced token forces its atom.
  for (int64_t i = p.first; i < n;) {
    int64_t j = i;
    bool any = false;
    while (j < n && p.atom[size_t(j)] == p.atom[size_t(i)]) any |= p.forced[size_t(j++)] != 0;
    if (any)
      for (int64_t t = i; t < j; ++t) p.forced[size_t(t)] = 1;
    i = j;
  }
}

}  // namespace

std::string kept_text(const Tokenizer&, const PromptTokens& p, const std::vector<uint8_t>& keep) {
  std::string out;
  bool first_piece = true;
  for (int64_t i = p.first; i < p.size(); ++i) {
    if (!keep[size_t(i)]) continue;
    std::string_view piece = p.pieces[size_t(i)];
    // The tokenizer will prefix its space again when the text is encoded.
    if (first_piece && p.leading_space && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
    out += piece;
    first_piece = false;
  }
  return out;
}

}  // namespace tern::prompt
