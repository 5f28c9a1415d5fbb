// The prompt-compression methods (compress.h): what each keeps, given a scorer.
#include "prompt/compress.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.h"

namespace tern::prompt {

namespace {

struct MethodRow {
  Method method;
  const char* name;
};
constexpr MethodRow kMethods[] = {
    {Method::SelectiveContext, "selective-context"}, {Method::LlmLingua, "llmlingua"},
    {Method::LongLlmLingua, "longllmlingua"},        {Method::Random, "random"},
    {Method::Tail, "tail"},
};

// A droppable group of tokens (an atom, word or sentence's non-forced tokens) and its score.
struct Candidate {
  std::vector<int64_t> tokens;
  double score = 0;
};

// Groups the tokens in [begin, end) that `eligible` admits by `group` (atom, word or sentence
// ids), in order; each group's score is the mean of `value` over its tokens.
std::vector<Candidate> group_tokens(const std::vector<int32_t>& group, const std::vector<int64_t>& tokens,
                                    const std::vector<double>& value) {
  std::vector<Candidate> out;
  for (size_t k = 0; k < tokens.size(); ++k) {
    const int64_t i = tokens[k];
    if (out.empty() || group[size_t(out.back().tokens.back())] != group[size_t(i)]) out.push_back({});
    out.back().tokens.push_back(i);
    out.back().score += value[k];
  }
  for (Candidate& c : out) c.score /= double(c.tokens.size());
  return out;
}

// Keeps candidates best score first (ties: earlier first) while they fit in `room` tokens; a
// candidate too large for what is left is skipped and smaller ones after it still fill the room.
// Returns the tokens kept.
int64_t fill_best_first(std::vector<Candidate> cands, int64_t room, std::vector<uint8_t>& keep) {
  std::stable_sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) { return a.score > b.score; });
  int64_t kept = 0;
  for (const Candidate& c : cands) {
    const int64_t n = int64_t(c.tokens.size());
    if (n > room - kept) continue;
    for (int64_t i : c.tokens) keep[size_t(i)] = 1;
    kept += n;
    if (kept == room) break;
  }
  return kept;
}

std::vector<int32_t> ids_of(const PromptTokens& p, const std::vector<int64_t>& tokens) {
  std::vector<int32_t> out;
  out.reserve(tokens.size());
  for (int64_t i : tokens) out.push_back(p.ids[size_t(i)]);
  return out;
}

class Compressor {
 public:
  Compressor(const PromptTokens& p, TokenScorer& scorer, const CompressOptions& opts)
      : p_(p), scorer_(scorer), opts_(opts), keep_(size_t(p.size()), 0) {
    // The head the scorer conditions everything on: BOS, or the first token when there is none
    // (which then stays: nothing can score it).
    head_ = std::max<int64_t>(p.first, std::min<int64_t>(1, p.size()));
    for (int64_t i = 0; i < head_; ++i) keep_[size_t(i)] = 1;
    forced_ = p.forced;
    for (int64_t i = 0; i < head_; ++i) forced_[size_t(i)] = 1;
    // The budget controller: every method compresses the context only.
    for (int64_t i = head_; i < p.size(); ++i)
      if (p.part[size_t(i)] != Part::Context) forced_[size_t(i)] = 1;
  }

  CompressResult run() {
    CompressResult r;
    r.n_tokens = p_.size() - p_.first;
    r.budget = token_budget(r.n_tokens, opts_.ratio);
    int64_t n_forced = 0;
    for (int64_t i = p_.first; i < p_.size(); ++i) n_forced += forced_[size_t(i)];
    if (n_forced > r.budget) {
      fail("the prompt's tokens that must stay (instruction, question, keep spans, control tokens) number ", n_forced, ", more than the budget of ", r.budget, " = ceil(",
           r.n_tokens, " / ", opts_.ratio, "): lower --ratio or keep less");
    }
    if (opts_.method == Method::LongLlmLingua && !has_part(Part::Question))
      fail("longllmlingua ranks the context by the question: give one (--question)");
    for (int64_t i = 0; i < p_.size(); ++i)
      if (forced_[size_t(i)]) keep_[size_t(i)] = 1;
    const int64_t room = r.budget - n_forced;
    const int64_t before = scorer_.tokens_evaluated();
    switch (opts_.method) {
      case Method::SelectiveContext: selective_context(room); break;
      case Method::LlmLingua:
      case Method::LongLlmLingua: lingua(room); break;
      case Method::Random: random(room); break;
      case Method::Tail: tail(room); break;
    }
    r.scorer_tokens = scorer_.tokens_evaluated() - before;
    r.n_forced = n_forced;
    for (int64_t i = p_.first; i < p_.size(); ++i) r.n_kept += keep_[size_t(i)];
    r.keep = std::move(keep_);
    return r;
  }

 private:
  bool has_part(Part part) const {
    for (int64_t i = head_; i < p_.size(); ++i)
      if (p_.part[size_t(i)] == part) return true;
    return false;
  }
  // The tokens compression may drop, in order.
  std::vector<int64_t> droppable() const {
    std::vector<int64_t> out;
    for (int64_t i = head_; i < p_.size(); ++i)
      if (!forced_[size_t(i)]) out.push_back(i);
    return out;
  }
  // The unit ids of opts_.unit: atoms for tokens (a character's byte tokens stay together).
  const std::vector<int32_t>& unit_ids() const {
    return opts_.unit == Unit::Token ? p_.atom : opts_.unit == Unit::Word ? p_.word : p_.sentence;
  }
  std::vector<int32_t> head_ids() const { return std::vector<int32_t>(p_.ids.begin(), p_.ids.begin() + head_); }

  // Self-information of every token past the head, from one pass over the whole prompt.
  std::vector<double> information() {
    std::vector<double> info(size_t(p_.size()), 0.0);
    if (head_ >= p_.size()) return info;
    const std::vector<int32_t> head = head_ids();
    const std::vector<double> lp = scorer_.logprobs(head, std::span(p_.ids).subspan(size_t(head_)));
    for (int64_t i = head_; i < p_.size(); ++i) info[size_t(i)] = -lp[size_t(i - head_)];
    return info;
  }

  void selective_context(int64_t room) {
    const std::vector<double> info = information();
    const std::vector<int64_t> tokens = droppable();
    std::vector<double> value;
    for (int64_t i : tokens) value.push_back(info[size_t(i)]);
    fill_best_first(group_tokens(unit_ids(), tokens, value), room, keep_);
  }

  // LLMLingua's coarse step: the context sentences worth keeping, as the tokens they hold.
  std::vector<int64_t> coarse(int64_t room) {
    const std::vector<int64_t> tokens = droppable();
    const double target = opts_.coarse_factor * double(room);
    if (double(tokens.size()) <= target) return tokens;
    std::vector<Candidate> sentences;
    if (opts_.method == Method::LlmLingua) {
      const std::vector<double> info = information();
      std::vector<double> value;
      for (int64_t i : tokens) value.push_back(info[size_t(i)]);
      sentences = group_tokens(p_.sentence, tokens, value);  // mean information: log perplexity
    } else {
      // The question's mean log-likelihood after each sentence alone.
      std::vector<int64_t> question;
      for (int64_t i = head_; i < p_.size(); ++i)
        if (p_.part[size_t(i)] == Part::Question) question.push_back(i);
      const std::vector<int32_t> q = ids_of(p_, question);
      sentences = group_tokens(p_.sentence, tokens, std::vector<double>(tokens.size(), 0.0));
      for (Candidate& s : sentences) {
        std::vector<int32_t> ctx = head_ids();
        for (int64_t i : s.tokens) ctx.push_back(p_.ids[size_t(i)]);
        const std::vector<double> lp = scorer_.logprobs(ctx, q);
        s.score = std::accumulate(lp.begin(), lp.end(), 0.0) / double(std::max<size_t>(1, lp.size()));
      }
    }
    // Best sentences until the target is reached (the last one may pass it), back in order.
    std::vector<size_t> order(sentences.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return sentences[a].score > sentences[b].score; });
    std::vector<uint8_t> take(sentences.size(), 0);
    double have = 0;
    for (size_t k : order) {
      if (have >= target) break;
      take[k] = 1;
      have += double(sentences[k].tokens.size());
    }
    std::vector<int64_t> out;
    for (size_t k = 0; k < sentences.size(); ++k)
      if (take[k]) out.insert(out.end(), sentences[k].tokens.begin(), sentences[k].tokens.end());
    return out;
  }

  // LLMLingua's iterative token-level step over the coarse step's survivors: segment by segment,
  // each scored after the compressed text before it, keeping its share of what is left.
  void lingua(int64_t room) {
    const std::vector<int64_t> survivors = coarse(room);
    std::vector<uint8_t> candidate(size_t(p_.size()), 0);
    for (int64_t i : survivors) candidate[size_t(i)] = 1;
    std::vector<int32_t> question_ids;
    if (opts_.method == Method::LongLlmLingua)
      for (int64_t i = head_; i < p_.size(); ++i)
        if (p_.part[size_t(i)] == Part::Question) question_ids.push_back(p_.ids[size_t(i)]);

    std::vector<int32_t> compressed = head_ids();  // what the scorer conditions the next segment on
    int64_t left = int64_t(survivors.size()), spent = 0;
    const int64_t seg_len = std::max<int64_t>(1, opts_.segment);
    for (int64_t i = head_; i < p_.size();) {
      // The segment: the next seg_len tokens that are still in the text (forced or candidates),
      // not splitting a unit.
      const std::vector<int32_t>& unit = unit_ids();
      std::vector<int64_t> seg;
      int64_t n_cand = 0;
      while (i < p_.size() && (int64_t(seg.size()) < seg_len || (i > head_ && unit[size_t(i)] == unit[size_t(i - 1)]))) {
        if (forced_[size_t(i)] || candidate[size_t(i)]) {
          seg.push_back(i);
          n_cand += candidate[size_t(i)];
        }
        ++i;
      }
      if (seg.empty()) continue;
      if (n_cand > 0) {
        const std::vector<int32_t> seg_ids = ids_of(p_, seg);
        const std::vector<double> lp = scorer_.logprobs(compressed, seg_ids);
        std::vector<double> score(seg.size());
        for (size_t k = 0; k < seg.size(); ++k) score[k] = -lp[k];
        if (opts_.method == Method::LongLlmLingua) {
          // Contrastive: I(x | x_<) - I(x | question, x_<).
          std::vector<int32_t> with_q = head_ids();
          with_q.insert(with_q.end(), question_ids.begin(), question_ids.end());
          with_q.insert(with_q.end(), compressed.begin() + head_, compressed.end());
          const std::vector<double> lpq = scorer_.logprobs(with_q, seg_ids);
          for (size_t k = 0; k < seg.size(); ++k) score[k] = -lp[k] + lpq[k];
        }
        std::vector<int64_t> cand_tokens;
        std::vector<double> cand_score;
        for (size_t k = 0; k < seg.size(); ++k)
          if (candidate[size_t(seg[k])]) {
            cand_tokens.push_back(seg[k]);
            cand_score.push_back(score[k]);
          }
        // This segment's share of the budget still unspent (rounded, so the total comes out).
        const int64_t quota = std::min<int64_t>(
            n_cand, int64_t(std::llround(double(room - spent) * double(n_cand) / double(std::max<int64_t>(1, left)))));
        spent += fill_best_first(group_tokens(unit, cand_tokens, cand_score), quota, keep_);
        left -= n_cand;
      }
      for (int64_t t : seg)
        if (keep_[size_t(t)]) compressed.push_back(p_.ids[size_t(t)]);
    }
  }

  void random(int64_t room) {
    const std::vector<int64_t> tokens = droppable();
    std::vector<Candidate> atoms = group_tokens(p_.atom, tokens, std::vector<double>(tokens.size(), 0.0));
    // Fisher-Yates with the generator's raw output: the same subset on every platform.
    std::mt19937_64 rng(opts_.seed);
    for (size_t k = atoms.size(); k > 1; --k) std::swap(atoms[k - 1], atoms[size_t(rng() % k)]);
    for (size_t k = 0; k < atoms.size(); ++k) atoms[k].score = -double(k);
    fill_best_first(std::move(atoms), room, keep_);
  }

  void tail(int64_t room) {
    const std::vector<int64_t> tokens = droppable();
    std::vector<Candidate> atoms = group_tokens(p_.atom, tokens, std::vector<double>(tokens.size(), 0.0));
    for (size_t k = 0; k < atoms.size(); ++k) atoms[k].score = double(k);
    // Best first is last first; stop at the first atom that does not fit, so the kept text is
    // one unbroken tail.
    std::stable_sort(atoms.begin(), atoms.end(), [](const Candidate& a, const Candidate& b) { return a.score > b.score; });
    int64_t kept = 0;
    for (const Candidate& c : atoms) {
      if (int64_t(c.tokens.size()) > room - kept) break;
      for (int64_t i : c.tokens) keep_[size_t(i)] = 1;
      kept += int64_t(c.tokens.size());
    }
  }

  const PromptTokens& p_;
  TokenScorer& scorer_;
  const CompressOptions& opts_;
  std::vector<uint8_t> keep_;
  std::vector<uint8_t> forced_;
  int64_t head_ = 0;
};

}  // namespace

const char* method_name(Method m) {
  for (const MethodRow& r : kMethods)
    if (r.method == m) return r.name;
  return "?";
}

std::optional<Method> method_from_name(std::string_view name) {
  for (const MethodRow& r : kMethods)
    if (name == r.name) return r.method;
  return std::nullopt;
}

std::string method_names() {
  std::string s;
  for (const MethodRow& r : kMethods) s += (s.empty() ? "" : ", ") + std::string(r.name);
  return s;
}

std::optional<Unit> unit_from_name(std::string_view name) {
  if (name == "token") return Unit::Token;
  if (name == "word") return Unit::Word;
  if (name == "sentence") return Unit::Sentence;
  return std::nullopt;
}

int64_t token_budget(int64_t n, double ratio) {
  if (!std::isfinite(ratio) || ratio < 1.0)
    fail("the compression ratio must be a finite number >= 1 (2 keeps half the tokens), not ", ratio);
  return std::max<int64_t>(1, int64_t(std::ceil(double(n) / ratio - 1e-9)));
}

CompressResult compress(const PromptTokens& p, TokenScorer& scorer, const CompressOptions& opts) {
  (void)token_budget(1, opts.ratio);  // the ratio's error before any work
  if (opts.coarse_factor < 1.0 || !std::isfinite(opts.coarse_factor))
    fail("the coarse factor must be a finite number >= 1, not ", opts.coarse_factor);
  return Compressor(p, scorer, opts).run();
}

}  // namespace tern::prompt
