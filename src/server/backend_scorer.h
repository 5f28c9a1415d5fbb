#pragma once
// Prompt compression's scorer over a serving Backend (compress.h's TokenScorer): each
// logprobs() call is one pure scoring request (prompt = context + tokens, prompt_logprobs from
// the first scored token, max_tokens 0) that the engine runs beside everyone else's steps. The
// context before the scored tokens may come from the prefix cache, which LLMLingua's segments
// (each extending the compressed text before it) and other requests' shared prefixes fill.
// What it returns matches prompt::SessionScorer over the same model (both score from the same
// logits rows). The calling thread blocks until the request finishes, the deadline passes or
// `cancelled` says so (then the request is aborted and tern::Error thrown).
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/engine.h"
#include "prompt/compress.h"

namespace tern::server {

class Backend;

struct BackendScorerOptions {
  int priority = 0;  // the engine's queue order, as the request being compressed
  LoraSet lora;      // the adapters the request runs with (its prefix-cache blocks are theirs)
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::function<bool()> cancelled;  // polled while waiting (shutdown); null: never
};

class BackendScorer final : public prompt::TokenScorer {
 public:
  BackendScorer(Backend& backend, BackendScorerOptions options);
  // Throws tern::Error for an empty context (compress() always starts one with BOS or the
  // prompt's first token: nothing scores a first token), for what the engine refuses (naming
  // its reason: context + tokens longer than its context, an evicting KV policy), and when the
  // request fails, is aborted, times out or is cancelled. The engine's "not now" passes through
  // as the server answers it for any request: EngineOverloaded (503), ApiError 429 (queue full).
  std::vector<double> logprobs(std::span<const int32_t> context, std::span<const int32_t> tokens) override;
  // Prompt tokens the engine computed: those it did not take from the prefix cache.
  int64_t tokens_evaluated() const override { return evaluated_; }

 private:
  Backend& backend_;
  BackendScorerOptions opts_;
  int64_t evaluated_ = 0;
};

}  // namespace tern::server
