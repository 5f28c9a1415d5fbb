#pragma once
// Skeleton-of-Thought behind /v1/chat/completions ("organize": "skeleton", docs/server.md): the
// run's options from the request, its start, and the OpenAI shapes of its answer. The waiting
// loops (deadline, disconnect, shutdown, accounting) are the server's (server.cpp); what is here
// is pure of the HTTP layer.
//
// A stream sends, after the role chunk:
//   - when the skeleton is known: a chunk with an empty delta and "skeleton": {"points": [...]};
//   - as each point finishes (in finishing order): a chunk whose choice carries
//     "point": {"index": i, "content": "<i+1>. <heading><expansion>"};
//   - the answer in order as delta.content (point i once points 0..i-1 went out, joined with
//     "\n"), so a client that only joins content gets exactly SotResult::answer();
//   - on fallback: a chunk with "skeleton": {"fallback": true, "reason": "..."}, then the plain
//     answer as delta.content, as it comes;
//   - the finish chunk, the usage chunk (stream_options.include_usage) and [DONE].
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/model_provider.h"
#include "server/openai_format.h"
#include "server/skeleton_of_thought.h"

namespace tern::server {

// The run's options: the request's organize object, its sampling (a random seed when it set
// none, as a normal request gets), stop, ignore_eos, priority, speculative, kv_policy and the
// model's LoRA set. max_tokens, when given, caps the fallback's answer and each point.
SkeletonOptions skeleton_options(const OpenAiRequest& r, const ServedModel& m);

// Builds the prompts with the model's chat template and starts the run. Throws ApiError: 400
// (no chat template, a conversation that does not end with a user's question, a prompt over the
// context, what the engine refuses), 429 (the queue is full), 503 (the queue-time limit).
std::unique_ptr<SkeletonOfThought> start_skeleton(const OpenAiRequest& r, const ServedModel& m);

// Usage summed over every request of the run.
Usage skeleton_usage(const SotResult& r);

// How a run that failed answers: 503 when the engine aborted a request (shutdown), else 500.
struct SkeletonFailure {
  int status = 500;
  std::string message;
};
SkeletonFailure skeleton_failure(const SotResult& r);

// The response's "skeleton" object: {"points", "fallback", "fallback_reason", "points_given",
// "skeleton_tokens", "point_tokens", "skeleton_ms", "first_point_ms", "e2e_ms"}.
nlohmann::json skeleton_extension(const SotResult& r);

// The whole (not streamed) chat.completion of a finished run: message.content = answer(),
// finish_reason, usage, and the "skeleton" object.
nlohmann::json skeleton_response(const ResponseMeta& meta, const SotResult& r, const Tokenizer& tok);

// A stream's SSE events, in the order above.
class SkeletonStream {
 public:
  SkeletonStream(ResponseMeta meta, bool include_usage) : meta_(std::move(meta)), include_usage_(include_usage) {}

  // Right after start(): the role chunk, and the skeleton when the points were given.
  std::string begin(const SotResult& r);
  // What one poll() reported (r: the run after it).
  std::string render(const std::vector<SotEvent>& events, const SotResult& r);
  // After a run that ended without error: the finish chunk, usage (when asked for) and [DONE].
  std::string finish(const SotResult& r) const;

 private:
  nlohmann::json chunk_with_empty_delta() const;
  std::string content(const std::string& text) const;
  std::string skeleton_points(const SotResult& r) const;
  // The ordered answer's text that may go out now.
  std::string release(const SotResult& r);

  ResponseMeta meta_;
  bool include_usage_ = false;
  size_t next_point_ = 0;    // the first point not wholly sent
  bool heading_sent_ = false;  // of next_point_
  size_t text_sent_ = 0;     // bytes of next_point_'s expansion sent
};

}  // namespace tern::server
