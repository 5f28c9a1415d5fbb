#pragma once
// Speculative decoding's shared pieces (docs/speculative.md): what to draft with, how many
// tokens to draft, and the verification of a sequence's drafted tokens against the target
// model's logits. The engine (batched, paged KV) and runtime/generate (one sequence) both run
// the same verification, so their outputs follow the same rule:
//
//   target step over [last, d1 .. dk] -> rows r0 .. rk (row i predicts the token after d_i)
//   for i = 1 .. k: verify d_i against r_{i-1}: accepted -> emit d_i, go on;
//                   rejected -> emit the replacement drawn from the residual, stop
//   all k accepted -> emit a token drawn from r_k (the bonus)
//
// so a step emits 1 .. k + 1 tokens whose distribution is exactly plain sampling's (Leviathan
// et al. 2023, Chen et al. 2023); greedy emits exactly greedy decoding's tokens.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "sampling/constraint.h"
#include "sampling/sampler.h"
#include "spec/ngram.h"

namespace tern {

enum class DraftSource { None, Lookup, DraftModel };
const char* draft_source_name(DraftSource s);  // "none", "lookup", "draft"

struct SpecConfig {
  DraftSource source = DraftSource::None;
  int n_draft_max = 8;      // most tokens drafted for one sequence in one step (1 .. 32)
  int n_draft_min = 0;      // the fewest the adaptive length goes down to (0 .. n_draft_max; 0:
                            // it may stop drafting where drafts do not pay)
  bool adaptive = true;     // the length follows the sequence's acceptance rate (DraftLength)
  NgramParams ngram;        // DraftSource::Lookup
  std::string draft_path;   // DraftSource::DraftModel: a GGUF with the target's vocabulary
  // DraftSource::DraftModel: the draft already opened, instead of draft_path (self-speculation:
  // the target's own weights requantized in memory, tools/spec_args.h self_draft_file).
  std::shared_ptr<const GgufFile> draft_file;
  // DraftSource::DraftModel: self-speculation, the target's own weights requantized to this type
  // ("q4_0") as the draft; the tool that loads the target makes draft_file from it.
  std::string self_draft;

  // Throws tern::Error naming the flag for a value out of range (a draft length of 0, above 32).
  void validate() const;
};

// How many tokens to draft next for one sequence: the k that maximises the expected tokens of a
// step, 1 + a + a^2 + ... + a^k for acceptance rate a, per its cost, 1 + c k for what one more
// token adds to a step (marginal_cost c, relative to a one-token step: small while decode is
// memory-bound, large for a tiny model whose step is mostly fixed costs). The rate is a running
// average over the sequence's verified drafts, started at an optimistic 0.8 so a new sequence
// drafts long until it learns otherwise. When no draft pays (k = 0), one token is still drafted
// every 16th step so the rate can recover.
class DraftLength {
 public:
  explicit DraftLength(const SpecConfig& cfg);
  int next(double marginal_cost = 0.1);
  void observe(int n_drafted, int n_accepted);
  double acceptance_rate() const { return rate_; }

 private:
  int min_, max_;
  bool adaptive_;
  double rate_ = 0.8;
  int skipped_ = 0;  // steps in a row without drafts
};

// The outcome of verifying one sequence's drafts.
struct VerifyResult {
  std::vector<int32_t> tokens;  // emitted, in order: accepted drafts, then one drawn token
  int n_accepted = 0;           // drafts accepted (tokens.size() - 1)
};

// Verifies drafts[0 .. k) against rows [k + 1, n_vocab] (row i predicts the token after
// `history` + drafts[0 .. i)). `history` is every token before drafts[0] (the penalties' window).
// q: the drafter's distributions (q[i] for drafts[i]), or empty for a deterministic drafter.
// constraint (may be null): applied to each row before it is used and advanced past every
// emitted token, as plain constrained sampling does. `masked` is scratch ([n_vocab]).
void verify_drafts(Sampler& sampler, const float* rows, int32_t n_vocab, std::span<const int32_t> history,
                   std::span<const int32_t> drafts, std::span<const TokenDistribution> q, TokenConstraint* constraint,
                   std::vector<float>& masked, VerifyResult& out);

}  // namespace tern
