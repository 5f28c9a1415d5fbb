#pragma once
// Ollama's API (https://github.com/ollama/ollama/blob/main/docs/api.md) on tern's request
// machinery: requests are translated into the equivalent OpenAI body (parse_openai_json does
// every check the OpenAI routes do), answers are rendered with Ollama's field names, NDJSON
// lines when streamed, durations in nanoseconds, errors as {"error": "..."}.
//
//   POST /api/chat      {model, messages, tools, format, options, stream (default true), keep_alive, think}
//   POST /api/generate  {model, prompt, system, raw, context, format, options, stream, keep_alive}
//   POST /api/embed     {model, input: str | [str], truncate (default true), dimensions, keep_alive}
//   POST /api/embeddings {model, prompt}  (the older single-vector form)
//   GET  /api/tags, GET /api/ps, POST /api/show {model}, GET /api/version
//
// Pure (no model, no I/O): unit-tested on its own. The server (server.cpp) tokenizes, runs
// and streams.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/model_catalog.h"
#include "server/openai_request.h"

namespace tern::server::ollama {

// {"error": message}: every Ollama error answer.
nlohmann::json error_body(const std::string& message);

// What every generation request says about the server's side rather than the generation.
struct RequestCommon {
  std::string model;                   // required: 400 "model is required"
  bool stream = true;                  // Ollama streams unless told "stream": false
  std::optional<double> keep_alive_s;  // absent: the model's or server's default; < 0 forever; 0 unload after
};

struct ChatRequest {
  RequestCommon common;
  // Validated and already in OpenAI's form (tool_calls arguments as JSON text, ids given to
  // calls and matched to the tool messages that answer them).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;        // null or OpenAI-shaped array
  nlohmann::ordered_json format;       // null, "json", or a JSON schema object
  nlohmann::ordered_json options = nlohmann::ordered_json::object();
  bool load_only = false;              // no messages: load the model, answer done_reason "load"
  bool unload_only = false;            // no messages and keep_alive 0: unload, done_reason "unload"
  bool has_system = false;             // a system message is present (else a model default may be added)
};

struct GenerateRequest {
  RequestCommon common;
  std::string prompt;
  std::string system;                  // "" none
  bool raw = false;                    // the prompt as is, no template
  std::vector<int64_t> context;        // token ids of an earlier answer's "context"
  nlohmann::ordered_json format;
  nlohmann::ordered_json options = nlohmann::ordered_json::object();
  bool load_only = false;              // empty prompt and no context: load, done_reason "load"
  bool unload_only = false;            // ... and keep_alive 0: unload, done_reason "unload"
};

struct EmbedRequest {
  RequestCommon common;                // stream unused
  std::vector<std::string> inputs;     // at least one (the old form: the one prompt)
  bool truncate = true;                // Ollama's default: cut inputs to the context
  std::optional<int64_t> dimensions;
  bool legacy = false;                 // /api/embeddings: answer {"embedding": [...]}
};

// Parsers: throw ApiError(400) with an Ollama-style message naming the field ("model is
// required", "invalid option \"temperature\": must be a number", "images are not supported:
// this server runs text models", "template is not supported: tern renders the model's chat
// template") for invalid JSON, wrong types and unsupported features.
ChatRequest parse_chat(std::string_view body, int max_json_depth = 64);
GenerateRequest parse_generate(std::string_view body, int max_json_depth = 64);
EmbedRequest parse_embed(std::string_view body, bool legacy, int max_json_depth = 64);
// POST /api/show and DELETE-like bodies: {"model": NAME} (or the older "name").
std::string parse_model_name(std::string_view body, int max_json_depth = 64);

// The OpenAI chat body of a chat request. `default_options` (models.json "options", Ollama
// names) apply where the request sets none; then Ollama's own defaults (temperature 0.8,
// top_k 40, top_p 0.9) where neither does. A default system prompt is put first when the
// request has no system message and `default_system` is not empty.
nlohmann::ordered_json chat_to_openai(const ChatRequest& r, const nlohmann::json& default_options,
                                      const std::string& default_system);
// The OpenAI completions body of a generate request whose prompt the server has tokenized
// ("prompt": ids), with the same option rules.
nlohmann::ordered_json generate_to_openai(const GenerateRequest& r, const std::vector<int32_t>& prompt_ids,
                                          const nlohmann::json& default_options);
// The option part alone: Ollama options -> OpenAI fields written into `body` (temperature,
// top_p, top_k, min_p, seed, num_predict -> max_tokens (negative: none), stop,
// repeat_penalty -> repetition_penalty, presence_penalty, frequency_penalty, tern's own
// speculative (a boolean: false opts out of speculative decoding); format -> response_format). Known options tern has no use for (num_ctx, num_thread, num_gpu, mirostat,
// ...) are accepted and ignored, as are unknown ones (Ollama only warns). Throws ApiError(400)
// for a known option of the wrong type.
void apply_options(const nlohmann::ordered_json& options, const nlohmann::json& default_options,
                   const nlohmann::ordered_json& format, nlohmann::ordered_json& body);

// Durations of one answer, in nanoseconds, as Ollama reports them.
struct Durations {
  int64_t total_ns = 0;
  int64_t load_ns = 0;
  int64_t prompt_eval_count = 0;
  int64_t prompt_eval_ns = 0;
  int64_t eval_count = 0;
  int64_t eval_ns = 0;
};

// RFC 3339 in UTC with nanoseconds, as Go prints time.Time: "2024-05-01T12:34:56.123456789Z".
std::string rfc3339(std::chrono::system_clock::time_point t);

// A streamed piece of a chat answer (done false): {"model", "created_at", "message":
// {"role": "assistant", "content", "tool_calls"?}, "done": false, "done_reason": "", and the
// durations so far}. tool_calls' arguments are JSON objects (parsed from the call's text; text
// that is not an object is kept as a string). Ollama itself leaves done_reason and the
// durations out until the last line; the ollama client's ChatResponse declares them on every
// line, so they are sent, with the running figures (`so_far`).
nlohmann::json chat_chunk(const std::string& model, const std::string& created_at, const std::string& content,
                          const std::vector<ToolCall>& calls = {}, const Durations& so_far = {});
// The last object of a chat answer: done true, done_reason ("stop", "length", "load",
// "unload"), the durations; `content` and `calls` are the whole answer when not streamed.
nlohmann::json chat_final(const std::string& model, const std::string& created_at, const std::string& content,
                          const std::vector<ToolCall>& calls, const std::string& done_reason, const Durations& d);
// A streamed piece of a generate answer: as chat_chunk, with "response" and an empty "context"
// (the whole context comes with the last line).
nlohmann::json generate_chunk(const std::string& model, const std::string& created_at, const std::string& response,
                              const Durations& so_far = {});
// "context": the prompt's and the answer's token ids (a client sends them back to continue).
nlohmann::json generate_final(const std::string& model, const std::string& created_at, const std::string& response,
                              const std::string& done_reason, const Durations& d, const std::vector<int32_t>& context);
// One vector of /api/embed as Ollama gives it: L2-normalized, then, when `dimensions` is below
// its length, cut to that many values and normalized again (Matryoshka truncation; a larger
// `dimensions` leaves it whole). Throws ApiError(500) for a NaN or infinite value. (The older
// /api/embeddings answers the engine's vector unnormalized, as Ollama does.)
std::vector<float> embedding_vector(std::vector<float> v, std::optional<int64_t> dimensions);
// {"model", "embeddings": [[...]], "total_duration", "load_duration", "prompt_eval_count"}
nlohmann::json embed_response(const std::string& model, const std::vector<std::vector<float>>& vectors,
                              const Durations& d);
// The older /api/embeddings answer: {"embedding": [...]}.
nlohmann::json legacy_embedding_response(const std::vector<float>& vector);

// "details" of a model as /api/tags, /api/ps and /api/show give it: {"parent_model": "",
// "format": "gguf", "family", "families", "parameter_size", "quantization_level"}.
nlohmann::json model_details(const ModelEntry& e);
// One loaded model as /api/ps shows it.
struct LoadedRow {
  const ModelEntry* entry = nullptr;
  int64_t size_bytes = 0;                                       // weights + KV + buffers
  std::optional<std::chrono::system_clock::time_point> expires;  // nullopt: never (keep_alive < 0)
  int64_t context_length = 0;                                   // the context it was loaded with
};

// GET /api/tags: every usable model {"name", "model", "modified_at", "size", "digest",
// "details", "expires_at", "size_vram": 0} (name and model are "NAME:latest"-free: tern names
// are the file stems). expires_at is a loaded model's (from `loaded`), else Go's zero time.
nlohmann::json tags_response(const std::vector<ModelEntry>& entries, const std::vector<LoadedRow>& loaded = {});

// {"models": [{"name", "model", "size", "digest", "details", "expires_at", "size_vram": 0,
// "modified_at", "context_length"}]}; a model kept forever expires in the far future, as
// Ollama shows it.
nlohmann::json ps_response(const std::vector<LoadedRow>& rows);

// POST /api/show: {"modelfile", "parameters", "template", "details", "model_info",
// "capabilities", "modified_at", "license" (the header's general.license), "system",
// "messages": []}. model_info holds general.* and ARCH.* header keys as Ollama
// names them ("general.architecture", "llama.context_length", ...), from `metadata` (scalar
// keys of the file; arrays left out as Ollama does unless verbose).
nlohmann::json show_response(const ModelEntry& e, const std::string& chat_template_text,
                             const nlohmann::json& metadata, const std::vector<std::string>& capabilities);

// GET /api/version.
nlohmann::json version_response(const std::string& version);

}  // namespace tern::server::ollama
