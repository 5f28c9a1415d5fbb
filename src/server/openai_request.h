#pragma once
// The OpenAI request parser and validator: JSON body -> OpenAiRequest, or an ApiError (400)
// that names the offending parameter. Pure (no model, no I/O) so it can be unit-tested and
// fuzzed on its own; checks that need the model (token ids in range, prompt + max_tokens
// within the context, the model name) happen in the server once the prompt is tokenized.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kv/kv_policy.h"
#include "sampling/sampler.h"

namespace tern::server {

enum class ApiKind { Completion, Chat };

// One function call: of an assistant message in the history, or of a generated answer
// (server/tool_calls.h).
struct ToolCall {
  std::string id;         // "call_..." (as the client sent it, in history)
  std::string name;       // the function's name
  std::string arguments;  // JSON text of an object (the arguments)
};

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "tool" ("developer" is read as "system")
  std::string content;  // text parts joined with "\n"
  // Assistant messages: the calls it made. Their `content` may then be null or absent
  // (content_null is true and content ""; templates get "", as llama.cpp gives them).
  // (Default member initializers throughout: {role, content} stays a warning-free aggregate.)
  std::vector<ToolCall> tool_calls{};
  bool content_null = false;
  // Role "tool": the id of the call this is the result of (required, as OpenAI does), and the
  // function's name (optional; the older "function" role's field).
  std::string tool_call_id{};
  std::string name{};
};

// A function the model may call: "tools": [{"type": "function", "function": {...}}].
struct ToolDef {
  std::string name;         // ^[a-zA-Z0-9_-]{1,64}$, unique within the request
  std::string description;  // "" when absent
  // JSON schema of the arguments: an object; {"type":"object","properties":{}} when absent.
  // Keys in the order the client sent them (templates print it with tojson).
  nlohmann::ordered_json parameters;
  bool strict = false;
};

// "tool_choice": "auto" | "none" | "required" | {"type": "function", "function": {"name": N}}.
// Default: Auto when tools are given, None otherwise.
enum class ToolChoiceMode { None, Auto, Required, Named };
struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::None;
  std::string name;  // Named: the function (one of the request's tools)
};

// "response_format": {"type": "text" | "json_object" | "json_schema", "json_schema": {...}}.
enum class ResponseFormatKind { Text, JsonObject, JsonSchema };
struct ResponseFormat {
  ResponseFormatKind kind = ResponseFormatKind::Text;
  std::string name;               // json_schema.name ("" when absent)
  nlohmann::ordered_json schema;  // json_schema.schema (an object; {} when absent)
  bool strict = false;            // json_schema.strict
};

// "prompt_compression": what a request asks of prompt compression (validated: a ratio >= 1,
// a known method and unit).
struct PromptCompressionRequest {
  double ratio = 2.0;
  std::string method = "llmlingua";
  std::string unit = "word";
  bool keep_numbers = false;
  bool keep_names = false;
};

// "organize": "skeleton" (or an object) asks a chat for Skeleton-of-Thought
// (server/skeleton_of_thought.h, docs/server.md): a skeleton of points first, then every point
// expanded at once. Validated: 1..32 non-empty given points, 2 <= max_points <= 32,
// 1 <= min_points <= max_points, token budgets >= 1. "none" (the default) leaves the field unset.
struct OrganizeRequest {
  std::vector<std::string> points;    // given: no skeleton stage
  int max_points = 10;                // a longer skeleton is cut here
  int min_points = 2;                 // a shorter one falls back to plain decoding
  int64_t point_max_tokens = 128;     // each point's expansion (also capped by max_tokens)
  int64_t skeleton_max_tokens = 200;  // the skeleton stage
};

// One prompt of /v1/completions: text, or token ids given directly.
struct Prompt {
  bool is_tokens = false;
  std::string text;
  std::vector<int64_t> tokens;  // range-checked against the vocabulary by the server
};

struct OpenAiRequest {
  ApiKind kind = ApiKind::Completion;
  std::string model;                  // "" when absent: the server's model
  std::vector<Prompt> prompts;        // completions: one or more (prompt may be a batch)
  std::vector<ChatMessage> messages;  // chat
  std::optional<int64_t> max_tokens;  // absent: completions 16, chat until the context is full;
                                      // 0 only with echo and logprobs (completions)
  int n = 1;
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  std::vector<std::string> stop;
  SamplingParams sampling;            // OpenAI's defaults where a field is absent (see .cpp)
  std::optional<uint64_t> seed;
  int n_logprobs = -1;                // -1: none; else alternatives per token (0..max_logprobs)
  // Completions: prepend the prompt to the text; with logprobs, the choice's logprobs begin
  // with the prompt's tokens too (the first with null scores), and max_tokens may be 0 (score
  // the prompt only).
  bool echo = false;
  // Extension (vLLM): -1 none; 0..max_logprobs: each prompt token's logprob and rank with that
  // many alternatives ("prompt_logprobs" of a completions choice, of a chat response).
  int prompt_logprobs = -1;
  bool ignore_eos = false;            // extension (vLLM): keep going past end-of-generation
  int priority = 0;                   // extension (vLLM): lower is served first
  // Extension: false decodes this request without speculative decoding on a server started
  // with a drafter (--lookup, --draft); no effect on one without. Outputs are the same either
  // way: the switch is for latency comparisons and for requests where drafting never pays.
  bool speculative = true;
  // Extension: this request's KV eviction policy (docs/kv.md) instead of the server's
  // --kv-policy: {"type": "none" | "streaming" | "h2o", "sinks": 4, "window": N, "budget": "50%"}.
  std::optional<KvPolicy> kv_policy;
  std::string user;

  // Tool calling (chat only). tools are validated (names, unique, parameters an object);
  // tool_choice Named names one of them.
  std::vector<ToolDef> tools;
  ToolChoice tool_choice;
  bool parallel_tool_calls = true;

  // Structured output: at most one of response_format (json kinds), grammar, json_schema.
  ResponseFormat response_format;
  std::string grammar;                            // llama.cpp: GBNF text ("" none), start rule root
  std::optional<nlohmann::ordered_json> json_schema;  // llama.cpp: a JSON schema object

  // vLLM: keep only the last N prompt tokens (N >= 1); -1 keeps the last (context) tokens the
  // model can take. Absent: no truncation (too long a prompt is a 400).
  std::optional<int64_t> truncate_prompt_tokens;

  // Extension: compress the prompt before the model sees it (docs/data-level.md):
  // {"ratio": R, "method": "llmlingua", "unit": "word", "keep_numbers": false, "keep_names": false}.
  // The server needs a scorer (tern serve --scorer, or its model's own file).
  std::optional<PromptCompressionRequest> prompt_compression;

  // Extension (chat only): organize the answer as a Skeleton-of-Thought. Refused with n > 1,
  // tools, a structured-output constraint, logprobs or truncate_prompt_tokens.
  std::optional<OrganizeRequest> organize;
};

struct ParseLimits {
  int max_n = 64;            // OpenAI allows 128; each completion holds KV blocks here
  int max_prompts = 64;      // prompts in one /v1/completions batch
  int max_choices = 128;     // prompts * n
  int max_stop = 4;          // OpenAI's limit
  int max_logprobs = 20;     // the engine's limit (OpenAI: 5 for completions, 20 for chat)
  size_t max_messages = 4096;
  size_t max_tools = 128;    // OpenAI's limit
  size_t max_tool_calls = 128;  // tool_calls of one history message
  int max_json_depth = 64;   // nesting of the body; deeper is refused before parsing
};

// Parses and validates a request body. Throws ApiError(400) for invalid JSON, a body that is
// not an object, wrong types, out-of-range values, and known-but-unsupported features.
OpenAiRequest parse_openai_request(std::string_view body, ApiKind kind, const ParseLimits& limits = {});
// The body as parsed JSON. Keys keep the client's order (ordered_json): tool schemas and
// arguments reach the chat template as they were sent.
OpenAiRequest parse_openai_json(const nlohmann::ordered_json& body, ApiKind kind, const ParseLimits& limits = {});

// Parses JSON text into an object, refusing bodies nested deeper than max_depth (a cheap
// pre-scan, so a hostile "[[[[..." never reaches a recursive walk) and anything but an object.
nlohmann::ordered_json parse_json_object(std::string_view body, int max_depth = 64);

// POST /tokenize: {"prompt" | "content": str} or {"messages": [...]}, "add_special_tokens"
// (or "add_special", default true), "with_pieces".
struct TokenizeRequest {
  std::string model;
  bool has_messages = false;
  std::string text;
  std::vector<ChatMessage> messages;
  bool add_special = true;
  bool with_pieces = false;
};
TokenizeRequest parse_tokenize_request(std::string_view body, const ParseLimits& limits = {});

// POST /detokenize: {"tokens": [ids]}.
struct DetokenizeRequest {
  std::string model;
  std::vector<int64_t> tokens;
};
DetokenizeRequest parse_detokenize_request(std::string_view body, const ParseLimits& limits = {});

// The messages array of a chat request (shared by /v1/chat/completions and /tokenize).
std::vector<ChatMessage> parse_messages(const nlohmann::ordered_json& messages, const ParseLimits& limits);

// The name rule of OpenAI's tools: ^[a-zA-Z0-9_-]{1,64}$.
bool valid_tool_name(std::string_view name);

}  // namespace tern::server
