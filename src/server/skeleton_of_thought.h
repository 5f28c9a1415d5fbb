#pragma once
// Skeleton-of-Thought (Ning et al., 2023): output organization for parallel decoding.
//
//   1. skeleton stage: one request asks for a numbered list of short points (the assistant's
//      turn is opened with "1." so the list starts at once);
//   2. router (SoT-R's idea): a skeleton of fewer than min_points points, or one that does not
//      parse, falls back to plain decoding of the original conversation;
//   3. point stage: every point is expanded at once, one sibling request per point. Their
//      prompts are the same up to the last line (the question, the skeleton, then "write point
//      i"): the first point is submitted alone and its siblings once its prompt is computed, so
//      they find the shared part in the prefix cache, and the engine decodes the points in one
//      batch: decode is memory-bound, B sequences cost little more than one;
//   4. the answer is the points in order, each "i. <point><expansion>".
//
// `points` given (tern sot --skeleton FILE, a request's "organize": {"points": [...]}) skip
// stage 1: the expansion can then be measured on models too small to write a skeleton.
//
// Each point's expansion is a plain engine request: with greedy sampling it gives exactly the
// tokens its prompt gives alone (the engine's batch invariance; tested).
//
// The driver is single-threaded and polled: start() submits the first stage; poll() applies
// the outputs the engine's callbacks left (from any thread), submits the next stage when one
// ends, and returns what happened. The owner either runs the engine on its own thread
// (Engine::start, the server) or calls Engine::step() between polls (tern sot, bench-serve).
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "server/backend.h"
#include "server/chat_template.h"
#include "server/mailbox.h"
#include "server/openai_request.h"

namespace tern::server {

// The points of a skeleton: lines "1. text", "2) text" (markdown "- ", "**" or "#" around the
// number allowed), numbered 1, 2, 3, ... in order. Text before the first point is ignored
// (a model's preamble); the list ends at the first line that breaks the numbering, at a blank
// line after a point, or at max_points. A point's text is trimmed of spaces and markdown bold.
// error says why nothing was found ("" when points is not empty).
struct SkeletonParse {
  std::vector<std::string> points;
  std::string error;
};
SkeletonParse parse_skeleton(std::string_view text, int max_points = 10);

// The three prompts of one conversation, rendered with the model's chat template. The last
// message must be the user's question; earlier messages (a system prompt, previous turns)
// stay in every prompt. Throws ApiError 400 (param "organize") when the template is not the
// model's own (ChatTemplate::declared: a model without one) or the conversation does not end
// with a user message.
class SkeletonPrompts {
 public:
  SkeletonPrompts(const ChatTemplate& tmpl, const Tokenizer& tok, std::vector<ChatMessage> messages);

  // The skeleton request: the question in the planner's instructions, the answer opened with "1.".
  std::vector<int32_t> skeleton_ids() const;
  // Point i (0-based) of `points`: the question and the whole skeleton, "write point i+1 only",
  // the answer opened with "<i+1>. <points[i]>".
  std::vector<int32_t> point_ids(const std::vector<std::string>& points, size_t i) const;
  // Plain decoding of the original conversation (the router's fallback).
  std::vector<int32_t> plain_ids() const;

  // The text the skeleton request's output continues ("1.") and a point's heading.
  static constexpr const char* kSkeletonOpening = "1.";
  static std::string point_heading(const std::vector<std::string>& points, size_t i);

 private:
  std::vector<int32_t> render(const std::string& user_text, const std::string& answer_opening) const;

  const ChatTemplate& tmpl_;
  const Tokenizer& tok_;
  std::vector<ChatMessage> history_;  // every message before the question
  std::string question_;
};

struct SkeletonOptions {
  int64_t skeleton_max_tokens = 200;  // the skeleton stage's budget
  int64_t point_max_tokens = 128;     // each point's expansion
  int64_t plain_max_tokens = 512;     // the fallback's answer
  int min_points = 2;                 // fewer: fall back to plain decoding
  int max_points = 10;                // points after this are dropped
  std::vector<std::string> points;    // given: no skeleton stage
  // What every request of the run shares: sampling (a point's seed is the base seed + its
  // index + 1), stop strings, ignore_eos, priority, LoRA set, speculative, n_logprobs. Its
  // prompt_ids, max_tokens and n are set per request (n is always 1).
  RequestParams base;
};

enum class SotStage { Skeleton, Points, Plain, Done };
const char* sot_stage_name(SotStage s);  // "skeleton", "points", "plain", "done"

// What poll() reports, in the order it happened.
struct SotEvent {
  enum class Kind {
    Text,        // new output of the stage's request: point `point` (Points), -1 otherwise
    PointDone,   // point `point` finished: its whole expansion is in result().points[point]
    Skeleton,    // the skeleton parsed (or points were given): expansion submitted
    Fallback,    // the router chose plain decoding (detail says why); plain request submitted
    Done,        // the run ended: every request finished, or one failed (result().error)
  };
  Kind kind = Kind::Text;
  SotStage stage = SotStage::Skeleton;
  int point = -1;
  std::string text;                   // Text: the new text; Fallback: the reason
  std::vector<GeneratedToken> tokens; // Text: the new tokens
};

struct SotPoint {
  std::string heading;                // the skeleton's text of the point
  std::string text;                   // its expansion (what the model wrote after the heading)
  std::vector<int32_t> ids;           // the expansion's tokens
  int64_t n_prompt = 0;
  FinishReason finish = FinishReason::None;
  RequestMetrics metrics;             // when finished
  double done_ms = 0;                 // since start()
};

struct SotResult {
  bool fallback = false;              // answered by plain decoding
  std::string fallback_reason;        // why ("" unless fallback)
  bool points_given = false;          // no skeleton stage ran
  std::string skeleton_text;          // "1." + what the skeleton request wrote
  int64_t skeleton_prompt_tokens = 0;
  std::vector<int32_t> skeleton_ids;  // the skeleton request's output tokens
  RequestMetrics skeleton_metrics;
  std::vector<SotPoint> points;       // in skeleton order
  std::string plain_text;             // the fallback's answer
  std::vector<int32_t> plain_ids;
  int64_t plain_prompt_tokens = 0;
  RequestMetrics plain_metrics;
  FinishReason plain_finish = FinishReason::None;
  std::string error;                  // a request failed or was aborted: why
  // What the error is, as HTTP says it: 500 a request failed, 503 the engine aborted one, 429
  // its queue refused a point (full), 400 a point's prompt over the context or refused, 499
  // abort() asked for it. 0 without an error.
  int error_status = 0;
  double skeleton_ms = 0;             // start() -> skeleton finished (0 when given)
  double first_point_ms = 0;          // start() -> the first point finished
  double e2e_ms = 0;                  // start() -> done
  double ttft_ms = 0;                 // start() -> the first token of the answer (points or plain)

  // The answer: the points in order, "i. heading text" one per line; or the plain answer.
  std::string answer() const;
  // Tokens of every request (prompt, cached, generated), for usage and throughput.
  int64_t prompt_tokens() const;
  int64_t cached_tokens() const;
  int64_t completion_tokens() const;
  // The finish reason the run answers with: the plain answer's, or Length when any point was
  // cut, else Stop.
  FinishReason finish_reason() const;
};

class SkeletonOfThought {
 public:
  // Neither backend nor prompts' template and tokenizer are owned; all must outlive this.
  SkeletonOfThought(Backend& backend, std::shared_ptr<const SkeletonPrompts> prompts, SkeletonOptions opt);
  ~SkeletonOfThought();  // aborts whatever still runs

  // Submits the first stage (the skeleton request, or the points when given). Throws ApiError
  // 429 when the engine's queue is full, 400 for a prompt over the context; tern::Error for
  // what the engine refuses.
  void start();
  // Applies the outputs that arrived (waiting up to `wait` for the first when none has),
  // submits the next stage when one ended, and returns the events. Never blocks past `wait`.
  // A submission the engine refuses ends the run with result().error set.
  std::vector<SotEvent> poll(std::chrono::milliseconds wait = std::chrono::milliseconds(0));
  bool done() const { return stage_ == SotStage::Done; }
  SotStage stage() const { return stage_; }
  const SotResult& result() const { return result_; }
  // Aborts what runs; the run ends (Done) at a later poll() once the engine confirms.
  void abort();

 private:
  struct Tagged {  // an engine output and the request it belongs to
    SotStage stage = SotStage::Skeleton;
    int point = -1;
    RequestOutput out;
  };
  void submit(SotStage stage, int point, std::vector<int32_t> ids, int64_t max_tokens, uint64_t seed);
  void after_skeleton(std::vector<SotEvent>& events);
  void start_points(std::vector<std::string> points);
  void submit_siblings();
  void start_plain(const std::string& why, std::vector<SotEvent>& events);
  void fail(const std::string& why, int status, std::vector<SotEvent>& events);
  double ms_since_start() const;

  Backend& backend_;
  std::shared_ptr<const SkeletonPrompts> prompts_;
  SkeletonOptions opt_;
  SotStage stage_ = SotStage::Skeleton;
  SotResult result_;
  std::chrono::steady_clock::time_point t0_;
  std::vector<uint64_t> running_;  // engine ids still unfinished
  int unfinished_ = 0;
  bool aborting_ = false;
  std::vector<std::string> points_;  // the points being expanded
  bool siblings_waiting_ = false;    // points 2.. wait for point 1's prompt to be computed
  std::shared_ptr<Mailbox<Tagged>> mailbox_ = std::make_shared<Mailbox<Tagged>>();
};

}  // namespace tern::server
