#pragma once
// OpenAI response objects and Server-Sent Events, as OpenAI's API reference spells them:
//   /v1/completions       -> "text_completion" (stream chunks have the same object name)
//   /v1/chat/completions  -> "chat.completion" / "chat.completion.chunk"
// Pure functions of their inputs (and the tokenizer, for logprob token texts).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/api_error.h"
#include "server/openai_request.h"

namespace tern::server {

struct ResponseMeta {
  ApiKind kind = ApiKind::Completion;
  std::string id;       // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
  // OpenAI's system_fingerprint: names the serving configuration (tern's build, the model
  // file, the K/V type), so a client can tell when the same seed may give another answer.
  std::string system_fingerprint;
  bool timings = true;  // llama.cpp's "timings" object on responses and final stream chunks
  // The report of the (first) prompt's compression, on responses and final stream chunks; null
  // when the prompt was not compressed.
  nlohmann::json prompt_compression = nullptr;
  // Prompt scores asked for: echo with logprobs (completions: the choice's logprobs begin with
  // the prompt's tokens, this many alternatives each; -1 not asked) and vLLM's prompt_logprobs
  // (this many alternatives; -1 not asked).
  int echo_logprobs = -1;
  int prompt_logprobs = -1;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the prefix cache
};

// One choice as it accumulates (non-streaming responses).
struct ChoiceResult {
  int index = 0;
  std::string text;
  std::vector<GeneratedToken> tokens;  // kept only when logprobs were asked for
  // Chat with tools: the calls parsed out of the answer (text then holds the content outside
  // them); non-empty makes the finish reason "tool_calls".
  std::vector<ToolCall> tool_calls;
  // The prompt's scores (ResponseMeta::echo_logprobs, prompt_logprobs): its first token, which
  // nothing scores, and every later token (RequestOutput::prompt_logprobs). Empty when not asked.
  int32_t prompt_first = -1;
  std::vector<GeneratedToken> prompt_scores;
  int64_t n_tokens = 0;
  bool finished = false;
  FinishReason finish = FinishReason::None;
  std::string error;
  RequestMetrics metrics;
};

// "stop" or "length"; an abort reads as "stop" (the caller reports errors separately).
const char* openai_finish_reason(FinishReason r);
// "cmpl-" / "chatcmpl-" followed by 24 random hex digits.
std::string new_response_id(ApiKind kind);

nlohmann::json usage_json(const Usage& u);

// llama.cpp's server "timings" object for one completion: prompt_n (prompt tokens computed,
// the cached ones excluded), cache_n, prompt_ms, predicted_n, predicted_ms and the
// per-token / per-second rates of both.
nlohmann::json timings_json(const RequestMetrics& m);
// "fp_" + 16 hex digits of a hash of the configuration text.
std::string system_fingerprint_of(const std::string& configuration);

// Logprobs of `tokens` in the endpoint's shape: completions
// {tokens, token_logprobs, top_logprobs, text_offset}, chat {content: [{token, logprob, bytes,
// top_logprobs}], refusal: null}. text_offset starts at `offset` (completions only).
nlohmann::json logprobs_json(ApiKind kind, const std::vector<GeneratedToken>& tokens, const Tokenizer& tok,
                             int64_t offset = 0);

// Completions logprobs of an echoed prompt and what followed it: the prompt's first token (its
// token_logprob and top_logprobs null: nothing scores it, as OpenAI answered), its scored
// tokens, then `tokens`; `top` alternatives at most per prompt token. text_offset counts the
// token strings from 0.
nlohmann::json echo_logprobs_json(int32_t prompt_first, const std::vector<GeneratedToken>& prompt_scores,
                                  const std::vector<GeneratedToken>& tokens, int top, const Tokenizer& tok);
// vLLM's prompt_logprobs: null for the first token, then per token {"<id>": {"logprob", "rank",
// "decoded_token"}} of the token itself and its `top` alternatives (rank 1 = most likely; the
// token's own rank is null when it is not among the alternatives the engine returned).
nlohmann::json prompt_logprobs_json(const std::vector<GeneratedToken>& prompt_scores, int top, const Tokenizer& tok);
// A stream's chunk of a choice's prompt scores (the first of a choice that asked): the echoed
// text (completions) with its logprobs, and "prompt_logprobs" (completions: in the choice; chat:
// beside the choices, as vLLM's).
nlohmann::json prompt_scores_chunk(const ResponseMeta& meta, int index, const std::string& echo,
                                   const ChoiceResult& c, const Tokenizer& tok, bool include_usage);

// The whole (non-streaming) response.
nlohmann::json completion_response(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                                   const Usage& usage, bool with_logprobs, const Tokenizer& tok);

// Stream chunks. `include_usage` adds "usage": null to every chunk, as OpenAI does when
// stream_options.include_usage is set; the last chunk then carries the usage (usage_chunk).
nlohmann::json role_chunk(const ResponseMeta& meta, int index, bool include_usage);  // chat only
nlohmann::json text_chunk(const ResponseMeta& meta, int index, const std::string& text,
                          const nlohmann::json& logprobs, bool include_usage);
// `metrics` (optional) adds the completion's timings when meta.timings is set; `tool_calls`
// makes the finish reason "tool_calls" (the answer called tools).
nlohmann::json finish_chunk(const ResponseMeta& meta, int index, FinishReason reason, bool include_usage,
                            const RequestMetrics* metrics = nullptr, bool tool_calls = false);
// A streamed tool call, as OpenAI streams them: the call's first delta carries its id, type
// and function name (arguments ""), later deltas fragments of its arguments (id and name
// absent); clients join the fragments by `call_index`.
nlohmann::json tool_call_start_chunk(const ResponseMeta& meta, int index, int call_index, const std::string& id,
                                     const std::string& name, bool include_usage);
nlohmann::json tool_call_arguments_chunk(const ResponseMeta& meta, int index, int call_index,
                                         const std::string& fragment, bool include_usage);
// {"id", "type": "function", "function": {"name", "arguments"}} of a message's tool_calls.
nlohmann::json tool_call_json(const ToolCall& call);
nlohmann::json usage_chunk(const ResponseMeta& meta, const Usage& usage);

// "data: {json}\n\n"; invalid UTF-8 (never produced by the decoder, but cheap to guard)
// becomes U+FFFD instead of throwing.
std::string sse_event(const nlohmann::json& j);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// {"error": {"message", "type", "param", "code"}}.
nlohmann::json error_json(const std::string& message, const std::string& type, const std::string& param = "",
                          const std::string& code = "");
nlohmann::json error_json(const ApiError& e);
// JSON text for a response body (same UTF-8 guard as sse_event).
std::string dump_json(const nlohmann::json& j);

}  // namespace tern::server
