#pragma once
// A prompt as prompt compression sees it: the scorer's tokens, each with the text it covers, the
// part of the prompt it belongs to (instruction, context, question: LLMLingua's budget
// controller keeps them at different rates), whether it must survive, and the word and sentence
// it is in (the units Selective Context and LLMLingua's coarse step drop whole).
//
// Spans that must survive:
//   - text between <keep> and </keep> (the markers themselves are removed from the prompt);
//   - control tokens (a chat template's <|im_start|> and the like, with parse_special);
//   - with keep_numbers, every word that holds a digit; with keep_names, every word that starts
//     with a capital letter and does not start a sentence (a cheap proper-noun rule).
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tern {
class Tokenizer;
}

namespace tern::prompt {

enum class Part : uint8_t { Instruction = 0, Context = 1, Question = 2 };
const char* part_name(Part p);

struct PromptOptions {
  bool keep_numbers = false;
  bool keep_names = false;
  bool parse_special = true;  // control-token texts in the prompt become control tokens (kept)
};

struct PromptTokens {
  // [n] the prompt's tokens; ids[0] is BOS when the tokenizer adds one (then always kept).
  std::vector<int32_t> ids;
  std::vector<std::string> pieces;  // [n] each token's text (control tokens rendered)
  std::vector<Part> part;           // [n]
  std::vector<uint8_t> forced;      // [n] 1: never dropped
  // [n] the smallest droppable unit: a token, or the byte tokens of one UTF-8 character together
  // (dropping part of a character would leave invalid text). Non-decreasing.
  std::vector<int32_t> atom;
  std::vector<int32_t> word;        // [n] word index, non-decreasing
  std::vector<int32_t> sentence;    // [n] sentence index (within the whole prompt), non-decreasing
  int64_t first = 0;                // 1 when ids[0] is BOS: the tokens compression may touch start here
  bool leading_space = false;       // the tokenizer prefixed a space (SPM's dummy prefix)

  int64_t size() const { return int64_t(ids.size()); }
  int64_t n_forced() const;  // forced tokens past `first`
};

// The three parts' texts, each with its <keep> markers. Throws tern::Error for an unbalanced or
// nested marker (naming the part and byte offset).
struct PromptParts {
  std::string instruction, context, question;
};

// Tokenizes the parts as one text (instruction, context, question joined as written: put any
// separator you want into the parts themselves), so the token ids are exactly those the target
// sees for the uncompressed prompt.
PromptTokens tokenize_prompt(const Tokenizer& tok, const PromptParts& parts, const PromptOptions& opts);

// A prompt given as token ids (a chat template's rendering, a client's token prompt): all of it
// context; control tokens forced, units from the pieces as tokenize_prompt finds them. No keep
// spans (the markers are text).
PromptTokens prompt_from_ids(const Tokenizer& tok, std::span<const int32_t> ids, const PromptOptions& opts);

// The ids of the tokens whose keep[i] is set, BOS included: what a target of the same vocabulary
// runs on without tokenizing the text again.
std::vector<int32_t> kept_ids(const PromptTokens& p, const std::vector<uint8_t>& keep);

// The text of the tokens whose keep[i] is set (BOS and control tokens as the tokenizer decodes
// them: control tokens rendered, so that a compressed chat prompt keeps its template).
std::string kept_text(const Tokenizer& tok, const PromptTokens& p, const std::vector<uint8_t>& keep);

// Removes <keep>...</keep> markers from text; spans receives [begin, end) byte ranges of the kept
// text in the result. `what` names the text in errors.
std::string strip_keep_markers(std::string_view text, std::vector<std::pair<size_t, size_t>>& spans,
                               std::string_view what);

}  // namespace tern::prompt
