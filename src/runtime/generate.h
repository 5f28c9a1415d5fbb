#pragma once
// Prompt -> prefill -> decode loop for one sequence, with the field's latency metrics.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/session.h"
#include "sampling/constraint.h"
#include "sampling/sampler.h"
#include "spec/speculative.h"
#include "tokenizer/tokenizer.h"

namespace tern {

class DraftModel;

struct GenerateOptions {
  int64_t n_predict = 128;          // tokens to generate (-1: until EOS or the context is full)
  SamplingParams sampling;
  std::vector<std::string> stop;    // stop strings (trimmed from the text)
  bool ignore_eos = false;
  // When set and true, generation stops before the next token with finish_reason
  // "interrupted" (tern run's Ctrl-C: a signal handler sets it).
  const std::atomic<bool>* interrupt = nullptr;
  // When set, every token is sampled from the logits this constraint allows (a grammar or a
  // JSON schema, grammar/grammar_constraint.h). generate() advances its own clone(), so the
  // prototype is never modified and may serve several runs. Generation ends with "stop" on an
  // end-of-generation token or once the constraint is_dead() (nothing may follow).
  std::shared_ptr<const TokenConstraint> constraint;
  // Speculative decoding (spec/speculative.h): with a source other than None, each step drafts
  // up to n_draft_max tokens, the target evaluates them in one forward pass, and verification
  // keeps the longest acceptable prefix plus one token of its own. The output follows plain
  // sampling's distribution; greedy output is plain greedy's, token for token.
  SpecConfig spec;
  // DraftSource::DraftModel: the draft model (owned by the caller, checked against the target
  // with check_draft_vocab; one region suffices). generate() drafts under key 0 and leaves that
  // region cached, so a later call with a common prefix reuses it.
  DraftModel* draft = nullptr;
};

struct GenerateMetrics {
  int64_t n_prompt = 0;
  int64_t n_generated = 0;
  double ttft_ms = 0;               // start -> first generated token (prefill + first sample)
  std::vector<double> tbt_ms;       // gap between consecutive generated tokens
  double latency_ms = 0;            // start -> last generated token
  double prefill_ms = 0;
  double prefill_tok_s = 0;
  double decode_tok_s = 0;          // (n_generated - 1) / sum(tbt)
  double constraint_ms = 0;         // time in the constraint's apply() + accept(), all tokens
  // Speculative decoding (0 without it, but n_target_steps and accepted_per_step). A step's tokens become
  // available together: each gets an equal share of the step's time in tbt_ms, so the TBT
  // mean and decode_tok_s stay the time per generated token.
  int64_t n_drafted = 0;            // drafts the target verified
  int64_t n_accepted = 0;           // of them accepted
  int64_t n_target_steps = 0;       // target forward passes after the prompt (verify or plain)
  double acceptance_rate = 0;       // n_accepted / n_drafted
  double accepted_per_step = 0;     // tokens per target step: (n_generated - 1) / n_target_steps
                                    // (the first token comes from the prompt's pass); 1 when plain
  double draft_ms = 0;              // time spent drafting (n-gram lookup or the draft model)
};

struct GenerateResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> ids;         // generated ids (a stop string's tokens included)
  std::string text;                 // generated text, stop string trimmed
  std::string finish_reason;        // "stop" (EOS or stop string), "length" or "interrupted"
  GenerateMetrics metrics;
};

// Runs the prompt, then samples until n_predict, EOS, a stop string or the end of the
// context. on_text receives text as soon as it is final (valid UTF-8, never part of a
// possible stop string). The session must be empty (n_past() == 0). With opts.spec on, each
// step verifies a run of drafts and its tokens reach on_text, the stop strings and the limits one
// by one, exactly as plain decoding's; throws tern::Error for a bad SpecConfig or a DraftModel
// source without opts.draft.
GenerateResult generate(Session& session, const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
                        const GenerateOptions& opts,
                        const std::function<void(const std::string&)>& on_text = {});

}  // namespace tern
