#pragma once
// POST /v1/embeddings (OpenAI's embeddings API) over the serving engine's embedding requests
// (engine/engine.h, EmbeddingParams): parsing and validation, the inputs' tokens, the wait for
// the engine's vectors and the response, float or base64.
//
//   {"input": "text" | ["text", ...] | [id, ...] | [[id, ...], ...], "model": "...",
//    "encoding_format": "float" | "base64", "dimensions": n_embd, "user": ...,
//    "truncate_prompt_tokens": N (vLLM: keep the last N tokens; -1: the last n_ctx)}
//   -> {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...] | "base64"}],
//       "model": ..., "usage": {"prompt_tokens": N, "total_tokens": N}}
//
// Parsing and formatting are pure (unit-tested without a model); serve_embeddings() is what the
// server's router calls.
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/backend.h"

namespace tern::server {

enum class EmbeddingEncoding { Float, Base64 };

// One input: text, or token ids given directly.
struct EmbeddingInput {
  bool is_tokens = false;
  std::string text;
  std::vector<int64_t> tokens;  // range-checked against the vocabulary by serve_embeddings
};

struct EmbeddingsRequest {
  std::string model;                                // "" when absent
  std::vector<EmbeddingInput> inputs;               // at least one
  EmbeddingEncoding encoding = EmbeddingEncoding::Float;
  std::optional<int64_t> dimensions;                // must equal n_embd (no truncation of vectors)
  std::optional<int64_t> truncate_prompt_tokens;    // -1 or >= 1 (vLLM's meaning)
  std::string user;                                 // accepted, not used
};

struct EmbeddingsLimits {
  size_t max_inputs = 2048;   // OpenAI's limit; each input is one engine request (see --max-waiting)
  int max_json_depth = 64;
};

// Parses and validates a request body. Throws ApiError(400) naming the parameter for invalid
// JSON, wrong types, empty inputs, more than max_inputs, unknown encoding_format.
EmbeddingsRequest parse_embeddings_request(std::string_view body, const EmbeddingsLimits& limits = {});

// The token ids of a text input: the tokenizer's default BOS and special-token texts parsed,
// as /v1/completions and llama.cpp's /v1/embeddings tokenize. `tern embed` uses the same rule.
std::vector<int32_t> embedding_tokens(const Tokenizer& tok, std::string_view text);

// Little-endian float32 bytes in standard base64 with padding (what OpenAI's clients decode
// for encoding_format "base64").
std::string embedding_base64(std::span<const float> v);

// The response object for these vectors (in input order).
nlohmann::json embeddings_response(const std::vector<std::vector<float>>& vectors, EmbeddingEncoding encoding,
                                   const std::string& model, int64_t prompt_tokens);

struct EmbeddingsOptions {
  std::string model_name = "tern";  // the response's "model"
  int64_t n_embd = 0;               // the model's; 0: `dimensions` is checked against the vectors
  EmbeddingsLimits limits;
  std::chrono::milliseconds timeout{600000};  // inputs still running after this are aborted: 503
  // The request's "model" (may be ""): throws ApiError (404 model_not_found) when the server
  // does not serve it. Unset: any name.
  std::function<void(const std::string&)> check_model;
  // Polled while waiting (every 50 ms): nullptr to go on, or why to stop: "disconnected"
  // (result 499, nobody reads it) or anything else, e.g. "shutdown" (503).
  std::function<const char*()> interrupted;
  LoraSet lora;  // the adapters the inputs run with (a LoRA adapter named as the model)
};

struct EmbeddingsResult {
  int status = 200;
  std::string body;           // JSON: the response, or an OpenAI error object
  int64_t prompt_tokens = 0;  // tokens computed (for the server's token counters)
};

// Serves one /v1/embeddings request: parses `body`, tokenizes and checks every input (an input
// over the context is a 400 naming its index, unless truncate_prompt_tokens is given), submits
// all inputs to `backend` at once (so they are batched in the same engine steps), waits for all
// of them and returns the response. 429 when the engine's queue is full (nothing is left
// running), 500 when an input failed, 503 on timeout or when `interrupted` says so (the rest are
// aborted). Bad requests are thrown as ApiError (400 / 404), as the other handlers' parsers do.
// Blocks the calling (handler) thread; thread-safe.
EmbeddingsResult serve_embeddings(std::string_view body, Backend& backend, const EmbeddingsOptions& options);

}  // namespace tern::server
