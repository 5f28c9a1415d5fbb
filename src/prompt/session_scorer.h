#pragma once
// The scorer of prompt compression over a Session (compress.h's TokenScorer): log-probabilities
// of tokens after a context, reusing the cached prefix the previous call shares with this one
// (LLMLingua's segments each extend the compressed text: only the new tokens run forward). Each
// call is one batched forward pass over the tokens not cached.
#include <cstdint>

#include "prompt/compress.h"

namespace tern {
class Session;
}

namespace tern::prompt {

class SessionScorer final : public TokenScorer {
 public:
  explicit SessionScorer(Session& session) : session_(session) {}
  // Throws tern::Error when context + tokens exceed the session's context (naming both).
  std::vector<double> logprobs(std::span<const int32_t> context, std::span<const int32_t> tokens) override;
  int64_t tokens_evaluated() const override { return evaluated_; }

 private:
  Session& session_;
  int64_t evaluated_ = 0;
};

}  // namespace tern::prompt
