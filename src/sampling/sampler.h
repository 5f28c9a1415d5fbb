#pragma once
// Token sampling over one row of logits. Pure logic (no model), one Sampler per request.
//
// Order of the chain (llama.cpp's default order): penalties (repetition, frequency, presence
// over the last `penalty_last_n` tokens) -> top-k -> top-p -> min-p -> temperature -> draw.
// temperature <= 0 means greedy (argmax after penalties; ties -> lowest id).
// A given seed makes every draw reproducible run to run and machine to machine (the RNG is
// std::mt19937_64 and the uniform draw is computed by hand, not by a library distribution).
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace tern {

struct SamplingParams {
  float temperature = 0.8f;
  int32_t top_k = 40;          // <= 0: off
  float top_p = 0.95f;         // >= 1: off
  float min_p = 0.05f;         // <= 0: off
  float repeat_penalty = 1.0f; // 1: off (llama.cpp's rule: divide positive logits, multiply negative)
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  int32_t penalty_last_n = 64; // window of previous tokens the penalties look at; -1 = all
  uint64_t seed = 0xC0FFEE;
  // Added to a token's logit before the penalties and the filters (OpenAI's logit_bias), in
  // [-100, 100]; -100 bans the token outright, +100 all but forces it.
  std::vector<std::pair<int32_t, float>> logit_bias;

  // Throws tern::Error naming the field when a value is out of range (e.g. top_p < 0).
  void validate() const;
};

// A next-token distribution as the sampler draws from it (after penalties, the filters and
// temperature): the candidates in ascending id order and their probabilities (summing to 1).
// Greedy sampling is the argmax alone with probability 1.
struct TokenDistribution {
  std::vector<int32_t> ids;
  std::vector<float> probs;
  float prob_of(int32_t id) const;  // 0 for an id outside the support
};

struct TokenLogprob {
  int32_t id;
  float logprob;
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, int32_t n_vocab);

  // Picks the next token. `logits` has n_vocab entries; `history` is every token so far
  // (prompt and generated) for the penalties. Allocation-free after the first call.
  int32_t sample(const float* logits, std::span<const int32_t> history);

  // The distribution sample() draws from for these logits and history (no draw is made).
  void distribution(const float* logits, std::span<const int32_t> history, TokenDistribution& out);
  // One draw from `d` with this sampler's RNG (a drafter sampling its proposal from q).
  int32_t draw(const TokenDistribution& d);
  // Speculative verification (spec/speculative.h): `draft` was proposed for the position
  // these logits predict, drawn from the drafter's distribution q (null: a deterministic
  // proposal, a point mass on `draft`). With p this sampler's distribution, the draft is
  // accepted with probability min(1, p(draft) / q(draft)) and returned (accepted = true); else
  // a token drawn from norm(max(0, p - q)) is returned (accepted = false). Either way the token
  // returned is distributed exactly as sample() would draw it. Greedy: accepted when the draft
  // is the argmax, which is returned; no random draw is made.
  int32_t verify(const float* logits, std::span<const int32_t> history, int32_t draft, const TokenDistribution* q,
                 bool& accepted);
  // A uniform draw in [0, 1) from this sampler's RNG.
  double uniform();

  // log-softmax of the (unpenalised, untempered) logits for `id`, plus the top n alternatives;
  // what OpenAI's logprobs report.
  static float logprob_of(const float* logits, int32_t n_vocab, int32_t id);
  static std::vector<TokenLogprob> top_logprobs(const float* logits, int32_t n_vocab, int n);

  const SamplingParams& params() const { return params_; }

 private:
  // Penalties, the filters and temperature: the candidates in candidates_[0, n) (ascending id)
  // with unnormalised weights probs_[0, n) summing to `sum`; sum = 0 when the choice is
  // certain (greedy, or every logit masked): candidates_[0] then, drawn without the RNG.
  size_t filter(const float* logits, std::span<const int32_t> history, double& sum);
  int32_t draw_weighted(const int32_t* ids, const float* w, size_t n, double sum);
  // Applies repetition/frequency/presence penalties to work_ for the tokens in the window.
  void apply_penalties(std::span<const int32_t> history);

  SamplingParams params_;
  int32_t n_vocab_;
  std::mt19937_64 rng_;
  std::vector<float> work_;         // [n_vocab] penalised logits
  std::vector<int32_t> candidates_; // [n_vocab] candidate ids
  std::vector<float> probs_;        // [n_vocab]
};

// Finds the earliest occurrence of any stop string in `text`; npos when none. Used to stop
// generation and to trim the stop string from the returned text.
size_t find_stop(const std::string& text, const std::vector<std::string>& stops);
// Length of the longest suffix of `text` that is a proper prefix of some stop string: that
// many bytes must be held back from a stream until it is known not to start a stop string.
size_t stop_holdback(const std::string& text, const std::vector<std::string>& stops);

}  // namespace tern
