#pragma once
// Prompt compression in the server (docs/data-level.md), run by the HTTP thread that prepares a
// request before the request reaches the engine. Two scorers:
//   - by default the request's own model, through its serving engine (compress_on_backend): each
//     scoring pass is a scoring request batched with the other requests' steps, sharing their
//     prefix cache, so any number of requests compress at once and nothing is loaded twice;
//   - `tern serve --scorer FILE` (PromptCompressor): another (smaller) model of the same
//     vocabulary, in a session of its own, used by one request at a time.
// A request asks with "prompt_compression": {...}; `tern serve --compress-prompt R` asks for
// every request that does not.
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "prompt/compress.h"
#include "server/backend_scorer.h"

namespace tern {
class GgufFile;
class Session;
class Tokenizer;
}  // namespace tern

namespace tern::server {

struct CompressedIds {
  std::vector<int32_t> ids;  // the prompt the model runs on (BOS as the prompt had it)
  std::string text;          // the kept tokens' text
  nlohmann::json report;     // method, ratio, tokens, kept_tokens, tokens_saved, scorer_tokens, scorer_ms
};

// Compresses `prompt` (tokens of `tok`, the target's tokenizer) scored by `scorer`, which can
// take prompts of up to `scorer_ctx` tokens. text: the prompt's text when it came as text (keep
// spans work), else "" and the ids are used. Throws ApiError 400 for what the request got wrong
// (a ratio its forced tokens exceed, a prompt longer than the scorer's context, a prompt the
// scorer refuses); the report's scorer_ms counts from `t0_ns` (now_ns()).
CompressedIds compress_prompt(prompt::TokenScorer& scorer, const Tokenizer& tok, int64_t scorer_ctx,
                              const std::vector<int32_t>& prompt, const std::string& text, bool parse_special,
                              const prompt::CompressOptions& opts, const prompt::PromptOptions& popts, int64_t t0_ns);

// Compression scored by the served model itself, through `backend` (BackendScorer).
CompressedIds compress_on_backend(Backend& backend, const BackendScorerOptions& scorer_opts,
                                  const std::vector<int32_t>& prompt, const std::string& text, bool parse_special,
                                  const prompt::CompressOptions& opts, const prompt::PromptOptions& popts);

class PromptCompressor {
 public:
  // The scorer at `path` with a context of n_ctx tokens (the longest prompt it can score).
  PromptCompressor(std::shared_ptr<const GgufFile> file, std::string path, int n_threads, int64_t n_ctx);
  ~PromptCompressor();

  const std::string& path() const { return path_; }
  // Compresses `prompt` (a target of tokenizer `target`, named `model`). text: the prompt's text
  // when it came as text (keep spans work), else "" and the ids are used. Throws ApiError 400 for
  // what the request got wrong (a scorer of another vocabulary, a ratio its forced tokens exceed,
  // a prompt longer than the scorer's context).
  CompressedIds compress(const Tokenizer& target, const std::string& model, const std::vector<int32_t>& prompt,
                         const std::string& text, bool parse_special, const prompt::CompressOptions& opts,
                         const prompt::PromptOptions& popts);

 private:
  std::string path_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<Session> session_;
  std::mutex mu_;  // one scoring at a time
};

}  // namespace tern::server
