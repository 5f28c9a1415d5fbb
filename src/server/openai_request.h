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

#include "sampling/sampler.h"

namespace tern::server {

enum class ApiKind { Completion, Chat };

struct ChatMessage {
  std::string role;     // "system", "user", "assistant" ("developer" is read as "system")
  std::string content;  // text parts joined with "\n"
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
  std::optional<int64_t> max_tokens;  // absent: completions 16, chat until the context is full
  int n = 1;
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  std::vector<std::string> stop;
  SamplingParams sampling;            // OpenAI's defaults where a field is absent (see .cpp)
  std::optional<uint64_t> seed;
  int n_logprobs = -1;                // -1: none; else alternatives per token (0..max_logprobs)
  bool echo = false;                  // completions: prepend the prompt to the text
  bool ignore_eos = false;            // extension (vLLM): keep going past end-of-generation
  int priority = 0;                   // extension (vLLM): lower is served first
  std::string user;
};

struct ParseLimits {
  int max_n = 64;            // OpenAI allows 128; each completion holds KV blocks here
  int max_prompts = 64;      // prompts in one /v1/completions batch
  int max_choices = 128;     // prompts * n
  int max_stop = 4;          // OpenAI's limit
  int max_logprobs = 20;     // the engine's limit (OpenAI: 5 for completions, 20 for chat)
  size_t max_messages = 4096;
  int max_json_depth = 64;   // nesting of the body; deeper is refused before parsing
};

// Parses and validates a request body. Throws ApiError(400) for invalid JSON, a body that is
// not an object, wrong types, out-of-range values, and known-but-unsupported features.
OpenAiRequest parse_openai_request(std::string_view body, ApiKind kind, const ParseLimits& limits = {});
OpenAiRequest parse_openai_json(const nlohmann::json& body, ApiKind kind, const ParseLimits& limits = {});

// Parses JSON text into an object, refusing bodies nested deeper than max_depth (a cheap
// pre-scan, so a hostile "[[[[..." never reaches a recursive walk) and anything but an object.
nlohmann::json parse_json_object(std::string_view body, int max_depth = 64);

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
std::vector<ChatMessage> parse_messages(const nlohmann::json& messages, const ParseLimits& limits);

}  // namespace tern::server
