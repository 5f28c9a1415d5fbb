#pragma once
// Prompt compression in the server (docs/data-level.md): one scorer model, in a session of its
// own, used by one request at a time (the HTTP thread that prepares a request runs it before the
// request reaches the engine). A request asks with "prompt_compression": {...}; `tern serve
// --compress-prompt R` asks for every request that does not.
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "prompt/compress.h"

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
