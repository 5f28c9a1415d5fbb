#pragma once
// A constraint on which token may come next (a grammar, a JSON schema, a forced tool call):
// the seam between constrained decoding (grammar/) and the loops that sample (the engine,
// runtime/generate). Pure logic, no model.
//
// A constraint object is the state of one sequence. A request carries a fresh one as its
// prototype; each of its n completions samples with its own clone(), so the prototype is never
// advanced.
#include <cstdint>
#include <memory>

namespace tern {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;

  // Sets logits[id] = -inf for every token that may not come next (logits has n_vocab entries).
  // End-of-generation tokens are allowed exactly when the constrained text may end here; at least
  // one token is always left allowed while !is_dead().
  virtual void apply(float* logits, int32_t n_vocab) = 0;
  // Advances past `id`. Throws tern::Error when `id` was not allowed by apply().
  virtual void accept(int32_t id) = 0;
  // True when the text so far is a complete match (end-of-generation is allowed now).
  virtual bool is_complete() const = 0;
  // True when nothing at all may follow (the match is complete and cannot be extended).
  virtual bool is_dead() const = 0;
  virtual std::unique_ptr<TokenConstraint> clone() const = 0;
};

}  // namespace tern
