// tern compare --prompt-compression: quality and TTFT of prompt compression over stories
// (prompt_compare.h).
#include "tools/prompt_compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/output_file.h"
#include "core/read_file.h"
#include "core/stats.h"
#include "core/svg_util.h"
#include "models/model.h"
#include "prompt/session_scorer.h"
#include "runtime/session.h"
#include "tokenizer/tokenizer.h"
#include "tools/progress.h"

namespace tern {

namespace {

constexpr const char* kDefaultMethods[] = {"selective-context", "llmlingua", "random", "tail"};
constexpr double kPromptShare = 0.7;     // the prompt ends at the first sentence boundary past this share
constexpr int64_t kMinContinuation = 8;  // tokens

// One story: the prompt (as compression sees it) and the continuation's token ids.
struct Story {
  prompt::PromptTokens prompt;
  std::vector<int32_t> continuation;
};

std::vector<std::string> paragraphs(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find("\n\n", pos);
    if (end == std::string::npos) end = text.size();
    std::string p = text.substr(pos, end - pos);
    const size_t b = p.find_first_not_of(" \n\t\r"), e = p.find_last_not_of(" \n\t\r");
    if (b != std::string::npos) out.push_back(p.substr(b, e - b + 1));
    pos = end + 2;
  }
  return out;
}

// The stories of the text: paragraphs of at least min_tokens tokens, led by as many of the
// paragraphs before them as fit in lead_tokens (the story so far: who is in it), split at the
// first sentence boundary past kPromptShare of the paragraph, where the prompt alone tokenizes to
// the same ids (so the continuation follows the very tokens the uncompressed row sees). At most
// max_tokens in all (the scorer's and the target's context).
std::vector<Story> make_stories(const Tokenizer& tok, const std::string& text, int64_t min_tokens, int64_t max_tokens,
                                int64_t max_stories, int64_t lead_tokens, double max_ratio, int64_t* skipped,
                                int64_t* with_question) {
  std::vector<Story> out;
  *skipped = 0;
  *with_question = 0;
  const std::vector<std::string> paras = paragraphs(text);
  for (size_t k = 0; k < paras.size(); ++k) {
    const std::string& para = paras[k];
    if (int64_t(out.size()) >= max_stories) break;
    const int64_t n_para = int64_t(tok.encode(para, false).size());
    if (n_para < min_tokens) continue;
    // The paragraphs before it, as many as fit in lead_tokens, lead into it.
    std::string lead;
    for (size_t j = k; j-- > 0;) {
      const std::string more = paras[j] + "\n\n" + lead;
      if (int64_t(tok.encode(more, false).size()) > lead_tokens) break;
      lead = more;
    }
    const prompt::PromptTokens whole = prompt::tokenize_prompt(tok, {"", lead + para, ""}, {false, false, false});
    const int64_t n = whole.size();
    if (n > max_tokens) continue;
    int64_t split = -1;
    for (int64_t i = std::max<int64_t>(2, n - n_para + int64_t(kPromptShare * double(n_para))); i < n; ++i)
      if (whole.sentence[size_t(i)] != whole.sentence[size_t(i - 1)]) {
        split = i;
        break;
      }
    if (split < 0 || n - split < kMinContinuation) {
      ++*skipped;
      continue;
    }
    // The prompt's last sentence is its question: the sentence the continuation follows, which
    // every method keeps whole (LLMLingua's budget controller); the sentences before it are the
    // context compression works on. A last sentence longer than the smallest budget cannot stay
    // whole: then the whole prompt is context.
    int64_t last = whole.first;
    for (int64_t i = whole.first + 1; i < split; ++i)
      if (whole.sentence[size_t(i)] != whole.sentence[size_t(i - 1)]) last = i;
    if (split - last > prompt::token_budget(split - whole.first, max_ratio)) last = split;
    *with_question += last < split;
    std::string context, question;
    for (int64_t i = whole.first; i < split; ++i) (i < last ? context : question) += whole.pieces[size_t(i)];
    std::string& head = context.empty() ? question : context;
    if (whole.leading_space && !head.empty() && head[0] == ' ') head.erase(0, 1);
    while (!question.empty() && (question.back() == ' ' || question.back() == '\n')) question.pop_back();
    Story s;
    s.prompt = prompt::tokenize_prompt(tok, {"", context, question}, {false, false, false});
    if (s.prompt.size() > split ||
        !std::equal(s.prompt.ids.begin(), s.prompt.ids.end(), whole.ids.begin())) {
      ++*skipped;
      continue;
    }
    s.continuation.assign(whole.ids.begin() + s.prompt.size(), whole.ids.end());
    out.push_back(std::move(s));
  }
  return out;
}

double log_softmax_at(const float* row, int64_t V, int32_t id) {
  float mx = row[0];
  for (int64_t v = 1; v < V; ++v) mx = std::max(mx, row[v]);
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v] - mx));
  return double(row[id] - mx) - std::log(sum);
}

struct Row {
  std::string method;
  double ratio = 1;
  double nll = 0;
  int64_t scored = 0, stories = 0, tokens = 0, kept = 0;
  double scorer_ms = 0, prefill_ms = 0;
  double ppl() const { return std::exp(nll / double(std::max<int64_t>(1, scored))); }
  double mean(double total) const { return total / double(std::max<int64_t>(1, stories)); }
};

std::string num(double v, const char* fmt) {
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

// Perplexity against the ratio (log scale), a line per method, the full prompt and no prompt as
// dashed references.
std::string chart_svg(const std::vector<Row>& rows, const std::string& title) {
  const double W = 640, H = 400, L = 70, R = 170, T = 40, B = 50;
  double lo = 1e300, hi = 0, rmax = 1;
  for (const Row& r : rows) {
    lo = std::min(lo, r.ppl());
    hi = std::max(hi, r.ppl());
    if (std::isfinite(r.ratio)) rmax = std::max(rmax, r.ratio);  // no prompt: a reference line, not a point
  }
  const std::vector<double> ticks = nice_ticks(lo * 0.95, hi * 1.05);
  const double y0 = ticks.front(), y1 = ticks.back();
  const auto X = [&](double ratio) { return L + (W - L - R) * std::log2(ratio) / std::max(1.0, std::log2(rmax)); };
  const auto Y = [&](double v) { return T + (H - T - B) * (1 - (v - y0) / (y1 - y0)); };
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(W, "%.0f") + "\" height=\"" + num(H, "%.0f") +
                  "\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + num((W - R + L) / 2, "%.0f") + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" + svg_escape(title) + "</text>\n";
  for (double t : ticks)
    s += "<line x1=\"" + num(L, "%.0f") + "\" x2=\"" + num(W - R, "%.0f") + "\" y1=\"" + num(Y(t), "%.1f") + "\" y2=\"" +
         num(Y(t), "%.1f") + "\" stroke=\"#ddd\"/><text x=\"" + num(L - 6, "%.0f") + "\" y=\"" + num(Y(t) + 4, "%.1f") +
         "\" text-anchor=\"end\" font-size=\"12\">" + num(t, "%g") + "</text>\n";
  for (double r = 1; r <= rmax * 1.0001; r *= 2)
    s += "<text x=\"" + num(X(r), "%.1f") + "\" y=\"" + num(H - B + 18, "%.0f") + "\" text-anchor=\"middle\" font-size=\"12\">" +
         num(r, "%g") + "x</text>\n";
  s += "<text x=\"" + num((W - R + L) / 2, "%.0f") + "\" y=\"" + num(H - 10, "%.0f") +
       "\" text-anchor=\"middle\" font-size=\"13\">compression ratio (tokens of the prompt / tokens kept)</text>\n";
  s += "<text x=\"16\" y=\"" + num((H - B + T) / 2, "%.0f") + "\" transform=\"rotate(-90 16 " + num((H - B + T) / 2, "%.0f") +
       ")\" text-anchor=\"middle\" font-size=\"13\">perplexity of the continuation (lower is better)</text>\n";
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
  std::map<std::string, std::vector<const Row*>> lines;
  std::vector<std::string> order;
  double full = 0, none = -1;
  for (const Row& r : rows) {
    if (r.method == "none") full = r.ppl();
    else if (r.method == "no-prompt") none = r.ppl();
    else {
      if (!lines.count(r.method)) order.push_back(r.method);
      lines[r.method].push_back(&r);
    }
  }
  int legend = 0;
  const auto add_legend = [&](const std::string& name, const std::string& color, bool dashed) {
    const double y = T + 10 + 20 * legend++;
    s += "<line x1=\"" + num(W - R + 12, "%.0f") + "\" x2=\"" + num(W - R + 36, "%.0f") + "\" y1=\"" + num(y, "%.0f") +
         "\" y2=\"" + num(y, "%.0f") + "\" stroke=\"" + color + "\" stroke-width=\"2\"" +
         (dashed ? " stroke-dasharray=\"5,4\"" : "") + "/><text x=\"" + num(W - R + 42, "%.0f") + "\" y=\"" + num(y + 4, "%.0f") +
         "\" font-size=\"12\">" + svg_escape(name) + "</text>\n";
  };
  for (auto [v, name] : {std::pair<double, const char*>{full, "full prompt"}, {none, "no prompt"}}) {
    if (v <= 0) continue;
    s += "<line x1=\"" + num(L, "%.0f") + "\" x2=\"" + num(W - R, "%.0f") + "\" y1=\"" + num(Y(v), "%.1f") + "\" y2=\"" +
         num(Y(v), "%.1f") + "\" stroke=\"#555\" stroke-dasharray=\"5,4\"/>\n";
    add_legend(name, "#555", true);
  }
  for (size_t k = 0; k < order.size(); ++k) {
    const std::string color = colors[k % 6];
    std::string pts = full > 0 ? num(X(1), "%.1f") + "," + num(Y(full), "%.1f") + " " : "";
    for (const Row* r : lines[order[k]]) {
      pts += num(X(r->ratio), "%.1f") + "," + num(Y(r->ppl()), "%.1f") + " ";
      s += "<circle cx=\"" + num(X(r->ratio), "%.1f") + "\" cy=\"" + num(Y(r->ppl()), "%.1f") + "\" r=\"3.5\" fill=\"" + color +
           "\"><title>" + svg_escape(order[k] + " " + num(r->ratio, "%g") + "x: " + num(r->ppl(), "%.3f")) + "</title></circle>\n";
    }
    s += "<polyline points=\"" + pts + "\" fill=\"none\" stroke=\"" + color + "\" stroke-width=\"2\"/>\n";
    add_legend(order[k], color, false);
  }
  return s + "</svg>\n";
}

}  // namespace

std::vector<double> parse_ratio_list(const std::string& list) {
  std::vector<double> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(pos, end - pos);
    char* stop = nullptr;
    const double v = std::strtod(item.c_str(), &stop);
    if (item.empty() || *stop != '\0' || !std::isfinite(v) || v < 1.0)
      fail("--prompt-compression: '", item, "' is not a ratio (a finite number >= 1; 1 is the uncompressed prompt)");
    out.push_back(v);
    pos = end + 1;
  }
  return out;
}

int run_prompt_compare(const PromptCompareOptions& o) {
  if (o.text_file.empty()) fail("--prompt-compression needs --ppl-file TEXT: its paragraphs are the stories");
  if (o.max_stories < 1) fail("--stories must be at least 1");
  if (o.lead_tokens < 0) fail("--lead-tokens must be 0 or more");
  std::vector<prompt::CompressOptions> methods;
  for (const std::string& m : o.methods.empty() ? std::vector<std::string>(std::begin(kDefaultMethods), std::end(kDefaultMethods))
                                                : o.methods) {
    PromptCompressArgs a = o.cargs;
    a.method = m;
    methods.push_back(a.options(2.0));
  }
  if (!o.json_out.empty()) {
    check_output_path(o.json_out);
    check_output_not_input(o.json_out, {o.target, o.scorer, o.text_file});
  }
  if (!o.chart.empty()) {
    check_output_path(o.chart);
    check_output_not_input(o.chart, {o.target, o.scorer, o.text_file});
  }
  const std::string text = read_file_text(o.text_file, "--ppl-file");
  const std::string scorer_path = o.scorer.empty() ? o.target : o.scorer;
  auto target_file = open_model_file(o.target);
  auto scorer_file = scorer_path == o.target ? target_file : open_model_file(scorer_path);
  const auto tok = Tokenizer::from_gguf(*target_file);
  const auto scorer_tok = Tokenizer::from_gguf(*scorer_file);
  check_same_vocabulary(*scorer_tok, scorer_path, *tok, o.target);

  SessionConfig tcfg;
  tcfg.n_threads = o.threads;
  tcfg.n_ctx = read_hparams(*target_file).n_ctx_train;
  SessionConfig scfg = tcfg;
  scfg.n_ctx = std::min(read_hparams(*scorer_file).n_ctx_train, tcfg.n_ctx);
  int64_t skipped = 0, with_question = 0;
  const double max_ratio = *std::max_element(o.ratios.begin(), o.ratios.end());
  const std::vector<Story> stories =
      make_stories(*tok, text, o.min_tokens, scfg.n_ctx, o.max_stories, o.lead_tokens, max_ratio, &skipped, &with_question);
  if (stories.empty())
    fail(o.text_file, " has no paragraph of ", o.min_tokens, " to ", scfg.n_ctx,
         " tokens with a sentence boundary past 70% of it: nothing to score");
  Session target(target_file, tcfg);
  Session scorer_session(scorer_file, scfg);
  prompt::SessionScorer scorer(scorer_session);
  const int64_t V = target.hparams().n_vocab;

  // Rows: the full prompt, no prompt, then each method at each ratio above 1.
  std::vector<Row> rows;
  rows.push_back({"none", 1.0});
  rows.push_back({"no-prompt", INFINITY});
  for (double r : o.ratios)
    if (r > 1.0)
      for (const prompt::CompressOptions& m : methods) rows.push_back({prompt::method_name(m.method), r});
  Progress progress("compare", int64_t(stories.size() * rows.size()), !o.json);
  int64_t done = 0;
  for (const Story& s : stories) {
    for (Row& row : rows) {
      std::vector<int32_t> ids(s.prompt.ids.begin(), s.prompt.ids.begin() + s.prompt.first);
      const int64_t n_prompt = s.prompt.size() - s.prompt.first;
      if (row.method == "none") {
        ids = s.prompt.ids;
        row.kept += n_prompt;
      } else if (row.method != "no-prompt") {
        prompt::CompressOptions opts = methods[0];
        for (const prompt::CompressOptions& m : methods)
          if (row.method == prompt::method_name(m.method)) opts = m;
        opts.ratio = row.ratio;
        // A story whose last sentence is too long to be its question has none to rank by.
        if (opts.method == prompt::Method::LongLlmLingua && s.prompt.part.back() != prompt::Part::Question)
          opts.method = prompt::Method::LlmLingua;
        const int64_t t0 = now_ns();
        scorer_session.reset();
        const prompt::CompressResult r = prompt::compress(s.prompt, scorer, opts);
        row.scorer_ms += double(now_ns() - t0) / 1e6;
        for (int64_t i = s.prompt.first; i < s.prompt.size(); ++i)
          if (r.keep[size_t(i)]) ids.push_back(s.prompt.ids[size_t(i)]);
        row.kept += r.n_kept;
      }
      if (ids.empty()) ids.push_back(s.continuation[0]);  // a tokenizer without BOS and no prompt: nothing to condition on
      row.tokens += n_prompt;
      // The prompt's prefill (timed: the target's part of TTFT), then the continuation scored.
      target.reset();
      const int64_t t0 = now_ns();
      const float* last = target.eval(ids);
      row.prefill_ms += double(now_ns() - t0) / 1e6;
      row.nll -= log_softmax_at(last, V, s.continuation[0]);
      const float* logits =
          target.eval(std::span<const int32_t>(s.continuation).first(s.continuation.size() - 1), true);
      for (size_t k = 1; k < s.continuation.size(); ++k)
        row.nll -= log_softmax_at(logits + int64_t(k - 1) * V, V, s.continuation[k]);
      row.scored += int64_t(s.continuation.size());
      ++row.stories;
      progress.update(++done);
    }
  }
  progress.finish();

  nlohmann::json out = nlohmann::json::array();
  const double full_ppl = rows[0].ppl();
  for (const Row& r : rows) {
    const double achieved = r.kept > 0 ? double(r.tokens) / double(r.kept) : INFINITY;
    nlohmann::json j = {{"method", r.method},
                        {"ratio", std::isfinite(r.ratio) ? nlohmann::json(r.ratio) : nlohmann::json(nullptr)},
                        {"ratio_achieved", std::isfinite(achieved) ? nlohmann::json(achieved) : nlohmann::json(nullptr)},
                        {"ppl", r.ppl()},
                        {"ppl_vs_full", r.ppl() / full_ppl - 1},
                        {"prompt_tokens", r.mean(double(r.tokens))},
                        {"kept_tokens", r.mean(double(r.kept))},
                        {"scorer_ms", r.mean(r.scorer_ms)},
                        {"prefill_ms", r.mean(r.prefill_ms)},
                        {"ttft_ms", r.mean(r.scorer_ms + r.prefill_ms)},
                        {"stories", r.stories},
                        {"stories_with_question", with_question},
                        {"continuation_tokens", r.scored},
                        {"target", o.target},
                        {"scorer", scorer_path}};
    out.push_back(j);
  }
  if (!o.json_out.empty()) write_output_file(o.json_out, out.dump(2) + "\n");
  if (!o.chart.empty())
    write_output_file(o.chart, chart_svg(rows, "Prompt compression: " + std::to_string(stories.size()) + " stories, target " +
                                                   o.target.substr(o.target.find_last_of('/') + 1)));
  if (o.json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("target %s, scorer %s: %zu stories of %s, %lld with their last prompt sentence kept as the question "
              "(%lld paragraphs skipped: no sentence boundary to split at)\n",
              o.target.c_str(), scorer_path.c_str(), stories.size(), o.text_file.c_str(), (long long)with_question,
              (long long)skipped);
  std::printf("| method | ratio | prompt tokens | kept | PPL | vs full | scorer ms | prefill ms | TTFT ms |\n");
  std::printf("|---|--:|--:|--:|--:|--:|--:|--:|--:|\n");
  for (const Row& r : rows) {
    const std::string ratio = std::isfinite(r.ratio) ? num(r.ratio, "%g") + "x" : "-";
    std::printf("| %s | %s | %.1f | %.1f | %.4f | %+.2f%% | %.2f | %.2f | %.2f |\n", r.method.c_str(), ratio.c_str(),
                r.mean(double(r.tokens)), r.mean(double(r.kept)), r.ppl(), 100.0 * (r.ppl() / full_ppl - 1), r.mean(r.scorer_ms),
                r.mean(r.prefill_ms), r.mean(r.scorer_ms + r.prefill_ms));
  }
  return 0;
}

}  // namespace tern
