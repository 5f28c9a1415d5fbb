#pragma once
// Prompt compression (`tern compress-prompt`, `--compress-prompt R`): choose which of a prompt's
// tokens a target model sees, keeping about 1/R of them, by how much information a small scorer
// model says each carries. The methods (docs/data-level.md has the formulas and the measurements):
//
//   selective-context  Selective Context (Li et al. 2023): one scorer pass over the prompt gives
//                      each token's self-information I(x_i) = -log p(x_i | x_<i); units (words by
//                      default) are kept in order of their mean information until the budget is
//                      spent. (The paper keeps units above a percentile of their summed
//                      information; a token budget makes that a knapsack, which the density
//                      order fills greedily.)
//   llmlingua          LLMLingua (Jiang et al. 2023): a budget controller keeps the instruction
//                      and question whole and gives the context the rest; a coarse step keeps
//                      the context's sentences of highest perplexity up to coarse_factor times
//                      its budget; then iterative token-level compression: the kept text in
//                      segments of `segment` tokens, each scored conditioned on the compressed
//                      text before it (so a token the kept text already predicts is dropped), its
//                      share of the budget kept by information.
//   longllmlingua      LongLLMLingua (Jiang et al. 2023), question-aware: sentences ranked by
//                      the question's likelihood given the sentence, -mean log p(q | s); tokens
//                      by contrastive perplexity, I(x_i | x_<i) - I(x_i | q, x_<i): what the
//                      question makes predictable is what it is about.
//   random, tail       baselines: a random subset (seeded), or the last tokens, of the same size.
//
// Every method compresses the context and keeps the instruction and question whole (LLMLingua's
// budget controller; Selective Context too is evaluated on a context beside its query). The unit
// dropped whole is a word by default (--compress-unit): LLMLingua drops tokens, but in a small
// sub-word vocabulary (512 pieces) a token is a fragment of a word, and fragments read as noise;
// `token` gives the papers' rule.
//
// The logic is pure: it talks to the model through TokenScorer (prompt/session_scorer.h wraps a
// Session; tests use a fake), so every rule is tested without a model.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "prompt/prompt_tokens.h"

namespace tern::prompt {

// log p(tokens[i] | context, tokens[0..i)) for every token. `context` is never empty (it starts
// with BOS, or with the prompt's first token when the tokenizer adds none).
class TokenScorer {
 public:
  virtual ~TokenScorer() = default;
  virtual std::vector<double> logprobs(std::span<const int32_t> context, std::span<const int32_t> tokens) = 0;
  // Tokens the scorer has run forward so far (its cost; a prefix it had cached is not counted).
  virtual int64_t tokens_evaluated() const = 0;
};

enum class Method { SelectiveContext, LlmLingua, LongLlmLingua, Random, Tail };
enum class Unit { Token, Word, Sentence };  // the unit dropped whole

const char* method_name(Method m);
std::optional<Method> method_from_name(std::string_view name);  // nullopt: unknown
std::string method_names();                                     // "selective-context, llmlingua, ..."
std::optional<Unit> unit_from_name(std::string_view name);

struct CompressOptions {
  double ratio = 2.0;          // keep about n / ratio of the prompt's tokens (past BOS); >= 1
  Method method = Method::LlmLingua;
  Unit unit = Unit::Word;      // selective-context's unit; llmlingua's token-level unit
  double coarse_factor = 2.0;  // llmlingua: sentences kept up to this many times the context budget
  int64_t segment = 32;        // llmlingua: tokens per iterative segment
  uint64_t seed = 1;           // random
};

// The number of tokens (past BOS) a prompt of n such tokens keeps at `ratio`: ceil(n / ratio), at
// least 1. Throws tern::Error for a ratio below 1 or not finite.
int64_t token_budget(int64_t n, double ratio);

struct CompressResult {
  std::vector<uint8_t> keep;  // [p.size()] 1: the token stays
  int64_t n_tokens = 0;       // the prompt's tokens past BOS
  int64_t n_kept = 0;         // of them, kept
  int64_t budget = 0;         // token_budget(n_tokens, ratio)
  int64_t n_forced = 0;       // kept because they must be
  int64_t scorer_tokens = 0;  // tokens the scorer ran forward
};

// Chooses the tokens to keep. Throws tern::Error for a bad ratio, for forced tokens (keep spans,
// control tokens, the instruction and the question) that alone exceed the budget
// (naming both counts), and for longllmlingua without a question.
CompressResult compress(const PromptTokens& p, TokenScorer& scorer, const CompressOptions& opts);

}  // namespace tern::prompt
