// The server's prompt compressor (prompt_compressor.h).
#include "server/prompt_compressor.h"

#include "core/error.h"
#include "core/stats.h"
#include "gguf/gguf.h"
#include "prompt/prompt_tokens.h"
#include "prompt/session_scorer.h"
#include "runtime/session.h"
#include "server/api_error.h"
#include "server/backend.h"
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

namespace {
[[noreturn]] void bad_compression(const std::string& msg) {
  throw ApiError(400, "invalid_request_error", "prompt_compression", "invalid_value", msg);
}
}  // namespace

CompressedIds compress_prompt(prompt::TokenScorer& scorer, const Tokenizer& tok, int64_t scorer_ctx,
                              const std::vector<int32_t>& prompt, const std::string& text, bool parse_special,
                              const prompt::CompressOptions& opts, const prompt::PromptOptions& popts, int64_t t0_ns) {
  CompressedIds out;
  try {
    prompt::PromptOptions po = popts;
    po.parse_special = parse_special;
    const prompt::PromptTokens p =
        text.empty() ? prompt::prompt_from_ids(tok, prompt, po) : prompt::tokenize_prompt(tok, {"", text, ""}, po);
    if (p.size() > scorer_ctx)
      bad_compression(str_cat("the prompt has ", p.size(), " tokens, more than the scorer's context of ", scorer_ctx, "."));
    const prompt::CompressResult r = prompt::compress(p, scorer, opts);
    out.ids = prompt::kept_ids(p, r.keep);
    out.text = prompt::kept_text(tok, p, r.keep);
    const double ms = double(now_ns() - t0_ns) / 1e6;
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
  } catch (const EngineOverloaded&) {
    throw;  // the engine's "not now" stays a 503
  } catch (const Error& e) {
    bad_compression(str_cat("prompt compression: ", e.what()));
  }
  return out;
}

CompressedIds compress_on_backend(Backend& backend, const BackendScorerOptions& scorer_opts,
                                  const std::vector<int32_t>& prompt, const std::string& text, bool parse_special,
                                  const prompt::CompressOptions& opts, const prompt::PromptOptions& popts) {
  const int64_t t0 = now_ns();
  BackendScorer scorer(backend, scorer_opts);
  return compress_prompt(scorer, backend.tokenizer(), backend.n_ctx(), prompt, text, parse_special, opts, popts, t0);
}

CompressedIds PromptCompressor::compress(const Tokenizer& target, const std::string& model,
                                         const std::vector<int32_t>& prompt, const std::string& text, bool parse_special,
                                         const prompt::CompressOptions& opts, const prompt::PromptOptions& popts) {
  if (target.tokens() != tok_->tokens() || target.model_kind() != tok_->model_kind())
    bad_compression(str_cat("the server's scorer ", path_, " has another vocabulary than the model '", model,
                            "': prompt compression needs a scorer of the model's vocabulary."));
  const int64_t t0 = now_ns();
  std::lock_guard<std::mutex> lock(mu_);
  session_->reset();
  prompt::SessionScorer scorer(*session_);
  return compress_prompt(scorer, *tok_, session_->n_ctx(), prompt, text, parse_special, opts, popts, t0);
}

}  // namespace tern::server
