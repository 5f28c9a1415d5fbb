// The server's prompt compressor (prompt_compressor.h).
#include "server/prompt_compressor.h"

#include "core/error.h"
#include "core/stats.h"
#include "gguf/gguf.h"
#include "prompt/prompt_tokens.h"
#include "prompt/session_scorer.h"
#include "runtime/session.h"
#include "server/api_error.h"
#include "tokenizer/tokenizer.h"

namespace tern::server {

PromptCompressor::PromptCompressor(std::shared_ptr<const GgufFile> file, std::string path, int n_threads, int64_t n_ctx)
    : path_(std::move(path)), tok_(Tokenizer::from_gguf(*file)) {
  SessionConfig cfg;
  cfg.n_ctx = n_ctx;
  cfg.n_threads = n_threads;
  session_ = std::make_unique<Session>(std::move(file), cfg);
}

PromptCompressor::~PromptCompressor() = default;

CompressedIds PromptCompressor::compress(const Tokenizer& target, const std::string& model,
                                         const std::vector<int32_t>& prompt, const std::string& text, bool parse_special,
                                         const prompt::CompressOptions& opts, const prompt::PromptOptions& popts) {
  const auto bad = [](const std::string& msg) {
    throw ApiError(400, "invalid_request_error", "prompt_compression", "invalid_value", msg);
  };
  if (target.tokens() != tok_->tokens() || target.model_kind() != tok_->model_kind())
    bad(str_cat("the server's scorer ", path_, " has another vocabulary than the model '", model,
                "': prompt compression needs a scorer of the model's vocabulary."));
  const int64_t t0 = now_ns();
  CompressedIds out;
  try {
    prompt::PromptOptions po = popts;
    po.parse_special = parse_special;
    const prompt::PromptTokens p =
        text.empty() ? prompt::prompt_from_ids(*tok_, prompt, po) : prompt::tokenize_prompt(*tok_, {"", text, ""}, po);
    if (p.size() > session_->n_ctx())
      bad(str_cat("the prompt has ", p.size(), " tokens, more than the scorer's context of ", session_->n_ctx(), "."));
    std::lock_guard<std::mutex> lock(mu_);
    session_->reset();
    prompt::SessionScorer scorer(*session_);
    const prompt::CompressResult r = prompt::compress(p, scorer, opts);
    out.ids = prompt::kept_ids(p, r.keep);
    out.text = prompt::kept_text(*tok_, p, r.keep);
    const double ms = double(now_ns() - t0) / 1e6;
    out.report = {{"method", prompt::method_name(opts.method)},
                  {"ratio", opts.ratio},
                  {"tokens", r.n_tokens},
                  {"kept_tokens", r.n_kept},
                  {"tokens_saved", r.n_tokens - r.n_kept},
                  {"ratio_achieved", r.n_kept > 0 ? double(r.n_tokens) / double(r.n_kept) : 0.0},
                  {"scorer_tokens", r.scorer_tokens},
                  {"scorer_ms", ms}};
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    bad(str_cat("prompt compression: ", e.what()));
  }
  return out;
}

}  // namespace tern::server
