// Prompt compression's options, vocabulary check and session run (prompt_compression.h).
#include "tools/prompt_compression.h"

#include <cmath>

#include "core/error.h"
#include "core/stats.h"
#include "prompt/session_scorer.h"
#include "runtime/session.h"
#include "tokenizer/tokenizer.h"

namespace tern {

void PromptCompressArgs::add_to(CLI::App& app, const std::string& method_flag) {
  if (!method_flag.empty())
    app.add_option(method_flag, method, "prompt compression method: " + prompt::method_names() + " (default llmlingua)");
  app.add_option("--compress-unit", unit, "the unit dropped whole (selective-context; llmlingua's token level): token, word or sentence (default word)");
  app.add_option("--coarse-factor", coarse_factor,
                 "llmlingua: sentences kept up to this many times the context's token budget before "
                 "token-level compression (default 2)");
  app.add_option("--compress-segment", segment, "llmlingua: tokens per iterative segment (default 32)");
  app.add_option("--compress-seed", seed, "random: the seed of the subset (default 1)");
  app.add_flag("--keep-numbers", keep_numbers, "never drop a word that holds a digit");
  app.add_flag("--keep-names", keep_names, "never drop a capitalized word inside a sentence");
}

void PromptCompressArgs::add_command_options(CLI::App& app, const std::string& ratio_help, const std::string& scorer_help) {
  app.add_option("--compress-prompt", ratio, ratio_help + " (docs/data-level.md)");
  app.add_option("--scorer", scorer, "the scorer model of prompt compression, of the target's vocabulary (" + scorer_help + ")");
  add_to(app, "--compress-method");
}

bool PromptCompressArgs::given(const CLI::App& app) const {
  const bool on = app.count("--compress-prompt") > 0;
  if (!on && !scorer.empty()) fail("--scorer goes with --compress-prompt R");
  return on;
}

prompt::CompressOptions PromptCompressArgs::options(double ratio) const {
  prompt::CompressOptions o;
  (void)prompt::token_budget(1, ratio);
  o.ratio = ratio;
  const auto m = prompt::method_from_name(method);
  if (!m) fail("unknown prompt compression method '", method, "' (known: ", prompt::method_names(), ")");
  o.method = *m;
  const auto u = prompt::unit_from_name(unit);
  if (!u) fail("--compress-unit: '", unit, "' is not token, word or sentence");
  o.unit = *u;
  if (!std::isfinite(coarse_factor) || coarse_factor < 1.0)
    fail("--coarse-factor must be a finite number >= 1, not ", coarse_factor);
  o.coarse_factor = coarse_factor;
  if (segment < 1) fail("--compress-segment must be at least 1, not ", segment);
  o.segment = segment;
  o.seed = seed;
  return o;
}

void check_same_vocabulary(const Tokenizer& scorer, const std::string& scorer_path, const Tokenizer& target,
                           const std::string& target_path) {
  const auto& a = scorer.tokens();
  const auto& b = target.tokens();
  if (a.size() != b.size())
    fail("the scorer ", scorer_path, " has a vocabulary of ", a.size(), " tokens and the target ", target_path,
         " one of ", b.size(), ": prompt compression needs a scorer with the target's vocabulary");
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i])
      fail("the scorer ", scorer_path, " and the target ", target_path, " have different vocabularies: token ", i,
           " is '", a[i], "' in one and '", b[i], "' in the other");
  if (scorer.model_kind() != target.model_kind())
    fail("the scorer ", scorer_path, " (", scorer.model_kind(), ") and the target ", target_path, " (",
         target.model_kind(), ") tokenize differently");
}

nlohmann::json CompressedPrompt::report(const prompt::CompressOptions& opts) const {
  const prompt::CompressResult& r = result;
  return {{"method", prompt::method_name(opts.method)},
          {"ratio", opts.ratio},
          {"ratio_achieved", r.n_kept > 0 ? double(r.n_tokens) / double(r.n_kept) : 0.0},
          {"tokens", r.n_tokens},
          {"kept_tokens", r.n_kept},
          {"tokens_saved", r.n_tokens - r.n_kept},
          {"budget", r.budget},
          {"forced_tokens", r.n_forced},
          {"scorer_tokens", r.scorer_tokens},
          {"scorer_ms", scorer_ms}};
}

std::string CompressedPrompt::summary(const prompt::CompressOptions& opts) const {
  const prompt::CompressResult& r = result;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s %gx: %lld -> %lld tokens (%.2fx, %lld saved, %lld must stay); scorer ran %lld tokens in %.1f ms",
                prompt::method_name(opts.method), opts.ratio, (long long)r.n_tokens, (long long)r.n_kept,
                r.n_kept > 0 ? double(r.n_tokens) / double(r.n_kept) : 0.0, (long long)(r.n_tokens - r.n_kept),
                (long long)r.n_forced, (long long)r.scorer_tokens, scorer_ms);
  return buf;
}

CompressedPrompt compress_with_session(Session& session, const Tokenizer& tok, const prompt::PromptParts& parts,
                                       const prompt::CompressOptions& opts, const prompt::PromptOptions& popts) {
  CompressedPrompt out;
  const int64_t t0 = now_ns();
  const prompt::PromptTokens p = prompt::tokenize_prompt(tok, parts, popts);
  session.reset();
  prompt::SessionScorer scorer(session);
  out.result = prompt::compress(p, scorer, opts);
  out.text = prompt::kept_text(tok, p, out.result.keep);
  out.scorer_ms = double(now_ns() - t0) / 1e6;
  return out;
}

}  // namespace tern
