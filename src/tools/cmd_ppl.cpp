// tern ppl: perplexity the way llama.cpp's llama-perplexity computes it, so figures are
// comparable across engines: tokenize the whole text (BOS as the model asks), split it into
// non-overlapping chunks of n_ctx tokens, replace each chunk's first token by BOS, evaluate
// each chunk from an empty cache, and score only the second half of each chunk
// (logits at positions n_ctx/2 .. n_ctx-2 predicting the next token). PPL = exp(mean NLL).
//
// --long N scores one sequence instead: the text's first N tokens from BOS, every token after
// the first, fed --batch tokens a step (default 1, so each token sees exactly the cache a KV
// policy leaves), with the perplexity of each --ctx-sized segment beside the total. With
// --kv-policy the cache holds the policy's capacity and N may be many contexts long (the
// StreamingLLM experiment); without one, the cache holds all N.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/output_file.h"
#include "core/read_file.h"
#include "core/stats.h"
#include "models/model.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/kl_divergence.h"
#include "tools/model_args.h"
#include "tools/progress.h"

namespace tern {

namespace {

// log p(next) from one row of logits (double accumulation); tern::Error for non-finite logits.
double log_prob(const float* row, int64_t V, int32_t next, const std::string& model, int64_t at) {
  float mx = row[0];
  for (int64_t v = 1; v < V; ++v) mx = std::max(mx, row[v]);
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v] - mx));
  const double lp = double(row[next] - mx) - std::log(sum);
  if (!std::isfinite(lp))
    fail(model, " gave non-finite logits (NaN or Inf) at position ", at, ": its weights or activations overflow");
  return lp;
}

// --kl-divergence-base FILE [--kl-divergence]: each scored position's log-probabilities are
// written to FILE, or (with --kl-divergence) compared with FILE's (kl_divergence.h).
struct KlOptions {
  std::string base;      // "" none
  bool compare = false;  // read `base` instead of writing it
};

class KlRun {
 public:
  KlRun(const KlOptions& o, int64_t n_vocab, int64_t n_positions, std::string model)
      : model_(std::move(model)), n_vocab_(n_vocab), lp_(size_t(n_vocab)) {
    if (o.compare) reader_ = std::make_unique<LogProbReader>(o.base, n_vocab);
    else writer_ = std::make_unique<LogProbWriter>(o.base, n_vocab, n_positions);
  }
  // One scored position: its row of logits and the token that came.
  void add(const float* logits, int32_t next, int64_t at) {
    log_softmax_row(logits, n_vocab_, lp_.data(), model_, at);
    if (writer_) writer_->add(next, lp_.data());
    else stats_.add(reader_->next(next), lp_.data(), n_vocab_, next);
  }
  // Commits the written file, or checks the base was read to its end; adds the comparison to
  // `j` and prints it unless json.
  void finish(nlohmann::json& j, bool json) {
    if (writer_) {
      writer_->commit();
      return;
    }
    reader_->expect_end();
    j["kl_divergence"] = stats_.json();
    if (!json) std::printf("%s", stats_.summary().c_str());
  }

 private:
  std::string model_;
  int64_t n_vocab_;
  std::vector<float> lp_;
  std::unique_ptr<LogProbWriter> writer_;
  std::unique_ptr<LogProbReader> reader_;
  KlStats stats_;
};

int ppl_long(ModelArgs margs, std::shared_ptr<const GgufFile> file, const std::string& text, int64_t seg,
             int64_t n_long, bool batch_given, bool json, const KlOptions& kl_opts) {
  const KvPolicy policy = margs.kv_policy_config();
  margs.ctx = policy.evicts() ? seg : n_long;
  if (!batch_given) margs.batch = 1;
  LoadedSession ls = open_session(margs, std::move(file));
  Session& session = *ls.session;
  const Tokenizer& tok = *ls.tokenizer;
  std::vector<int32_t> tokens = tok.encode(text, tok.add_bos_default());
  if (int64_t(tokens.size()) < n_long)
    fail("the text has ", tokens.size(), " tokens, fewer than --long ", n_long, " (give a longer text)");
  tokens.resize(size_t(n_long));
  const int64_t V = session.hparams().n_vocab;
  const int64_t n_seg = (n_long - 1 + seg - 1) / seg;
  std::vector<double> seg_nll(size_t(n_seg), 0.0);
  std::vector<int64_t> seg_count(size_t(n_seg), 0);
  double nll = 0;
  int64_t peak_resident = 0;
  std::unique_ptr<KlRun> kl;
  if (!kl_opts.base.empty()) kl = std::make_unique<KlRun>(kl_opts, V, n_long - 1, margs.model);
  Progress progress("ppl", n_long, !json);
  const int64_t t0 = now_ns();
  for (int64_t i = 0; i + 1 < n_long; i += margs.batch) {
    const int64_t m = std::min(margs.batch, n_long - 1 - i);  // tokens i .. i+m-1 predict i+1 .. i+m
    const float* logits = session.eval(std::span<const int32_t>(tokens).subspan(size_t(i), size_t(m)), true);
    peak_resident = std::max(peak_resident, session.n_resident());
    for (int64_t j = 0; j < m; ++j) {
      const double lp = log_prob(logits + j * V, V, tokens[size_t(i + j + 1)], margs.model, i + j);
      if (kl) kl->add(logits + j * V, tokens[size_t(i + j + 1)], i + j);
      nll -= lp;
      seg_nll[size_t((i + j) / seg)] -= lp;
      ++seg_count[size_t((i + j) / seg)];
    }
    progress.update(i + m + 1, str_cat("ppl ", std::exp(nll / double(i + m))));
  }
  progress.finish();
  const double seconds = double(now_ns() - t0) / 1e9;
  const double ppl = std::exp(nll / double(n_long - 1));
  nlohmann::json segs = nlohmann::json::array();
  for (int64_t k = 0; k < n_seg; ++k)
    segs.push_back({{"first", k * seg + 1},
                    {"last", k * seg + seg_count[size_t(k)]},
                    {"ppl", std::exp(seg_nll[size_t(k)] / double(seg_count[size_t(k)]))}});
  nlohmann::json kl_json = nlohmann::json::object();
  if (kl) kl->finish(kl_json, json);
  if (json) {
    nlohmann::json j = {{"ppl", ppl},
                        {"n_tokens", n_long},
                        {"segment", seg},
                        {"segments", segs},
                        {"kv_policy", policy.describe()},
                        {"kv_type", kv_type_name(session.kv_type())},
                        {"kv_capacity", session.kv_capacity()},
                        {"kv_bytes", session.kv_bytes()},
                        {"peak_resident", peak_resident},
                        {"n_evicted", session.n_evicted()},
                        {"seconds", seconds},
                        {"peak_rss_bytes", peak_rss_bytes()}};
    j.update(kl_json);
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("ppl %.4f  (%lld tokens as one sequence, kv %s, policy %s, at most %lld resident, %lld evicted, %.1f s)\n",
              ppl, static_cast<long long>(n_long), kv_type_name(session.kv_type()), policy.describe().c_str(),
              static_cast<long long>(peak_resident), static_cast<long long>(session.n_evicted()), seconds);
  std::printf("%-16s %10s\n", "tokens", "ppl");
  for (const auto& sg : segs)
    std::printf("%-16s %10.4f\n", str_cat(sg["first"].get<int64_t>(), "-", sg["last"].get<int64_t>()).c_str(),
                sg["ppl"].get<double>());
  return 0;
}

}  // namespace

int cmd_ppl(int argc, char** argv) {
  CLI::App app{"Perplexity of a text file, computed as llama.cpp's llama-perplexity does."};
  ModelArgs margs;
  margs.add_to(app, /*with_ctx=*/false);
  margs.add_kv_policy_to(app);
  margs.add_parallel_to(app);
  margs.add_sparse_ffn_to(app, /*all_steps=*/true);
  std::string text_file;
  int64_t n_ctx = 512;
  int64_t max_chunks = -1;
  int64_t n_long = 0;
  bool json = false;
  app.add_option("--long", n_long,
                 "score the first N tokens as one sequence (segments of --ctx reported), e.g. past the training "
                 "context with --kv-policy streaming")
      ->check(CLI::Range(int64_t(2), int64_t(1) << 24));
  app.add_option("-f,--file", text_file, "text file to score")->required();
  app.add_option("-c,--ctx", n_ctx, "tokens per chunk (default 512, or the model's training context when shorter)")
      ->check(CLI::Range(int64_t(8), int64_t(1) << 20));
  app.add_option("--chunks", max_chunks, "score at most this many chunks (-1: all)");
  app.add_flag("--json", json, "print one JSON object");
  KlOptions kl_opts;
  app.add_option("--kl-divergence-base", kl_opts.base,
                 "write every scored position's log-probabilities to FILE (the base of a later --kl-divergence run; "
                 "4 x n_vocab bytes a position)");
  app.add_flag("--kl-divergence", kl_opts.compare,
               "compare this run's distributions with --kl-divergence-base FILE's: KL divergence, same top token, "
               "change in the next token's probability (the same text, --ctx, --chunks / --long)");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  if (kl_opts.compare && kl_opts.base.empty()) {
    std::fprintf(stderr, "tern ppl: --kl-divergence compares with a base: give --kl-divergence-base FILE (written "
                         "by a run without --kl-divergence)\n");
    return 2;
  }
  if (!kl_opts.base.empty() && !kl_opts.compare) {  // before the slow part, and never over an input
    check_output_path(kl_opts.base);
    check_output_not_input(kl_opts.base, {margs.model, text_file, margs.tokenizer_bin});
  }
  if (max_chunks == 0 || max_chunks < -1) {  // 0 chunks score nothing: the figure would be NaN
    std::fprintf(stderr, "tern ppl: --chunks must be -1 (every chunk) or at least 1, got %lld\n",
                 static_cast<long long>(max_chunks));
    return 2;
  }
  const std::string text = read_file_text(text_file, "text file");

  // Past the positions it was trained on a model's predictions say nothing about it, so its
  // perplexity there is no figure to report. Checked before the session sizes its cache.
  std::shared_ptr<const GgufFile> file = open_model_file(margs.model, margs.tokenizer_bin);
  const int64_t n_ctx_train = read_hparams(*file).n_ctx_train;
  if (app.count("--ctx") == 0) n_ctx = std::max<int64_t>(8, std::min(n_ctx, n_ctx_train));
  if (n_long > 0)
    return ppl_long(margs, std::move(file), text, n_ctx, n_long, app.count("--batch") > 0, json, kl_opts);
  if (margs.kv_policy_config().evicts())
    fail("--kv-policy evicts tokens of a sequence, which a chunk of --ctx tokens never outgrows: use --long N");
  if (n_ctx > n_ctx_train)
    fail("--ctx ", n_ctx, " is longer than ", margs.model, "'s training context of ", n_ctx_train,
         " tokens, where perplexity means nothing: pass --ctx ", n_ctx_train, " or less");

  margs.ctx = n_ctx;
  margs.batch = std::max<int64_t>(margs.batch, n_ctx);  // one forward pass per chunk
  LoadedSession ls = open_session(margs, std::move(file));
  const Tokenizer& tok = *ls.tokenizer;
  const bool add_bos = tok.add_bos_default();
  const int64_t t_tok0 = now_ns();
  const std::vector<int32_t> tokens = tok.encode(text, add_bos);
  const double tokenize_s = double(now_ns() - t_tok0) / 1e9;
  int64_t n_chunks = int64_t(tokens.size()) / n_ctx;
  if (n_chunks == 0)
    fail(text_file, " is too short: ", tokens.size(), tokens.size() == 1 ? " token" : " tokens", ", one chunk of --ctx ",
         n_ctx, " needs ", n_ctx, " (give a longer text or a smaller --ctx)");
  if (max_chunks >= 0) n_chunks = std::min(n_chunks, max_chunks);
  if (!json)
    std::fprintf(stderr, "tern ppl: %zu tokens (%.2f s to tokenize), %lld chunks of %lld\n", tokens.size(),
                 tokenize_s, static_cast<long long>(n_chunks), static_cast<long long>(n_ctx));

  const int64_t V = ls.session->hparams().n_vocab;
  const int64_t first = n_ctx / 2;
  double nll = 0, nll2 = 0;
  int64_t count = 0;
  std::unique_ptr<KlRun> kl;
  if (!kl_opts.base.empty()) kl = std::make_unique<KlRun>(kl_opts, V, n_chunks * ppl_scored_per_chunk(n_ctx), margs.model);
  std::vector<int32_t> chunk(static_cast<size_t>(n_ctx));
  Progress progress("ppl", n_chunks, !json);
  const int64_t t0 = now_ns();
  for (int64_t c = 0; c < n_chunks; ++c) {
    std::copy_n(tokens.begin() + c * n_ctx, n_ctx, chunk.begin());
    if (add_bos) chunk[0] = tok.bos_id();
    ls.session->reset();
    const float* logits = ls.session->eval(chunk, /*all_logits=*/true);
    for (int64_t j = first; j < n_ctx - 1; ++j) {
      const float* row = logits + j * V;
      float mx = row[0];
      for (int64_t v = 1; v < V; ++v) mx = std::max(mx, row[v]);
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v] - mx));
      const double lp = double(row[chunk[size_t(j + 1)]] - mx) - std::log(sum);
      if (!std::isfinite(lp))
        fail(margs.model, " gave non-finite logits (NaN or Inf) in chunk ", c + 1, " at position ", j,
             ": its weights or activations overflow");
      if (kl) kl->add(row, chunk[size_t(j + 1)], c * n_ctx + j);
      nll -= lp;
      nll2 += lp * lp;
      ++count;
    }
    const double cur = std::exp(nll / double(count));
    progress.update(c + 1, str_cat("ppl ", cur));
  }
  progress.finish();
  const double seconds = double(now_ns() - t0) / 1e9;
  const double mean_nll = nll / double(count);
  const double ppl = std::exp(mean_nll);
  const double var = nll2 / double(count) - mean_nll * mean_nll;
  const double ppl_err = count > 1 ? ppl * std::sqrt(std::max(0.0, var) / double(count - 1)) : 0.0;
  const double tok_s = double(n_chunks * n_ctx) / seconds;
  nlohmann::json kl_json = nlohmann::json::object();
  if (kl && json) kl->finish(kl_json, json);
  if (json) {
    nlohmann::json j = {{"ppl", ppl},         {"ppl_stderr", ppl_err}, {"n_chunks", n_chunks},
                        {"n_ctx", n_ctx},     {"n_scored", count},     {"n_tokens", tokens.size()},
                        {"seconds", seconds}, {"tok_s", tok_s},        {"peak_rss_bytes", peak_rss_bytes()}};
    if (const SparseFfn* sp = ls.session->model().sparse_ffn()) j["sparse_ffn"] = sparse_ffn_json(*sp);
    j.update(kl_json);
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("ppl %.4f +/- %.5f  (%lld chunks of %lld tokens, %lld scored, %.1f s, %.0f tok/s)\n", ppl, ppl_err,
                static_cast<long long>(n_chunks), static_cast<long long>(n_ctx), static_cast<long long>(count),
                seconds, tok_s);
    if (const SparseFfn* sp = ls.session->model().sparse_ffn()) std::printf("%s\n", sparse_ffn_summary(*sp).c_str());
    if (kl) kl->finish(kl_json, json);
  }
  return 0;
}

}  // namespace tern
