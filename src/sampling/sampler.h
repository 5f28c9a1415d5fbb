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

  // log-softmax of the (unpenalised, untempered) logits for `id`, plus the top n alternatives;
  // what OpenAI's logprobs report.
  static float logprob_of(const float* logits, int32_t n_vocab, int32_t id);
  static std::vector<TokenLogprob> top_logprobs(const float* logits, int32_t n_vocab, int n);

  const SamplingParams& params() const { return params_; }

 private:
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
