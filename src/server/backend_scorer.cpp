// BackendScorer: prompt compression's log-probabilities from the serving engine
// (backend_scorer.h).
#include "server/backend_scorer.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>

#include "core/error.h"
#include "server/api_error.h"
#include "server/backend.h"
#include "server/mailbox.h"

namespace tern::server {

namespace {
// How often the waiting thread looks at its deadline and its cancel flag between outputs.
constexpr auto kScorerPollInterval = std::chrono::milliseconds(50);
}  // namespace

BackendScorer::BackendScorer(Backend& backend, BackendScorerOptions options)
    : backend_(backend), opts_(std::move(options)) {}

std::vector<double> BackendScorer::logprobs(std::span<const int32_t> context, std::span<const int32_t> tokens) {
  if (context.empty())
    fail("prompt compression: the scorer needs at least one token of context before the tokens it scores (BOS or "
         "the prompt's first token)");
  if (tokens.empty()) return {};
  RequestParams params;
  params.prompt_ids.assign(context.begin(), context.end());
  params.prompt_ids.insert(params.prompt_ids.end(), tokens.begin(), tokens.end());
  params.max_tokens = 0;  // with prompt_logprobs: a pure scoring request
  params.prompt_logprobs = 0;
  params.prompt_logprobs_from = int64_t(context.size());
  params.priority = opts_.priority;
  params.lora = opts_.lora;
  params.speculative = false;
  // Scores need every token attended to: a server-wide evicting policy (--kv-policy) would make
  // the engine refuse the request, and compression does not depend on how answers are decoded.
  params.kv_policy = KvPolicy{};
  params.sampling.temperature = 0;

  // Shared with the callback, which may still fire after this call gave up (an abort's final
  // output): it must have somewhere to write.
  auto mailbox = std::make_shared<Mailbox<RequestOutput>>();
  std::weak_ptr<Mailbox<RequestOutput>> weak = mailbox;
  uint64_t id = 0;
  try {
    id = backend_.add_request(std::move(params), [weak](const RequestOutput& out) {
      if (auto mb = weak.lock()) mb->push(out);
    });
  } catch (const EngineOverloaded&) {
    throw;  // "not now" (the server answers 503), not a bad prompt
  } catch (const Error& e) {
    fail("prompt compression: the model's engine refused to score the prompt (", context.size(), " tokens of context, ",
         tokens.size(), " scored): ", e.what());
  }
  if (id == 0)
    throw ApiError(429, "rate_limit_error", "", "queue_full",
                   "The server's request queue is full (prompt compression's scoring). Please retry after a short wait.");

  std::vector<GeneratedToken> scores;
  std::deque<RequestOutput> outputs;
  while (true) {
    mailbox->take(outputs, kScorerPollInterval);
    for (RequestOutput& out : outputs) {
      if (!out.prompt_logprobs.empty()) scores = std::move(out.prompt_logprobs);
      if (!out.finished) continue;
      if (out.finish_reason == FinishReason::Error) fail("prompt compression: scoring failed: ", out.error);
      if (out.finish_reason == FinishReason::Abort) fail("prompt compression: the scoring request was aborted");
      evaluated_ += out.metrics.n_prompt - out.metrics.n_cached_prompt;
      if (scores.size() != tokens.size())
        fail("prompt compression: the engine scored ", scores.size(), " of the ", tokens.size(), " tokens");
      std::vector<double> lp(tokens.size());
      for (size_t k = 0; k < tokens.size(); ++k) {
        if (scores[k].id != tokens[k])
          fail("prompt compression: the engine scored token ", scores[k].id, " where ", tokens[k], " was sent");
        lp[k] = double(scores[k].logprob);
        if (!std::isfinite(lp[k])) fail("prompt compression: the scorer gave a non-finite logprob at token ", k);
      }
      return lp;
    }
    outputs.clear();
    const bool cancelled = opts_.cancelled && opts_.cancelled();
    if (cancelled || std::chrono::steady_clock::now() > opts_.deadline) {
      backend_.abort(id);
      fail(cancelled ? "prompt compression: cancelled (the server is shutting down)"
                     : "prompt compression: scoring ran past the request's time limit");
    }
  }
}

}  // namespace tern::server
