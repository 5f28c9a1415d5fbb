#include "runtime/generate.h"

#include <algorithm>

#include "core/error.h"
#include "core/stats.h"
#include "spec/draft_model.h"
#include "spec/ngram.h"

namespace tern {

namespace {

// XORed into the sampling seed for the draft model's sampler: its draws must not replay the
// target sampler's random stream (the acceptance test compares a draw with the target's own).
constexpr uint64_t kDraftSeedSalt = 0x9E3779B97F4A7C15ull;

// Forwards to a constraint and adds the time its apply() and accept() take to `ms`: the
// speculative path runs them inside verify_drafts, and constraint_ms must count them there too.
class TimedConstraint final : public TokenConstraint {
 public:
  TimedConstraint(std::unique_ptr<TokenConstraint> inner, double& ms) : inner_(std::move(inner)), ms_(ms) {}
  void apply(float* logits, int32_t n_vocab) override {
    const int64_t t = now_ns();
    inner_->apply(logits, n_vocab);
    ms_ += double(now_ns() - t) / 1e6;
  }
  void accept(int32_t id) override {
    const int64_t t = now_ns();
    inner_->accept(id);
    ms_ += double(now_ns() - t) / 1e6;
  }
  bool is_complete() const override { return inner_->is_complete(); }
  bool is_dead() const override { return inner_->is_dead(); }
  std::unique_ptr<TokenConstraint> clone() const override {
    return std::make_unique<TimedConstraint>(inner_->clone(), ms_);
  }

 private:
  std::unique_ptr<TokenConstraint> inner_;
  double& ms_;
};

// What happens to each generated token once it is chosen, whichever step chose it (a plain
// decode step or a verified run of drafts): it joins the output and the history, its text is
// streamed, and it may end generation (EOS, a stop string, a finished constraint, the n_predict
// limit). Plain and speculative decoding share this path so that they end at the same token
// with the same text and finish reason.
class TokenEmitter {
 public:
  TokenEmitter(const Tokenizer& tok, const GenerateOptions& opts, const TokenConstraint* constraint, int64_t limit,
               GenerateResult& r, std::vector<int32_t>& history,
               const std::function<void(const std::string&)>& on_text)
      : tok_(tok), opts_(opts), constraint_(constraint), limit_(limit), r_(r), history_(history),
        on_text_(on_text), decoder_(tok) {}

  // True when the caller asked to stop (Ctrl-C): finish_reason becomes "interrupted".
  bool interrupted() {
    if (!opts_.interrupt || !opts_.interrupt->load(std::memory_order_relaxed)) return false;
    r_.finish_reason = "interrupted";
    return true;
  }

  // Records `id` as the next generated token. False when generation ends with it
  // (finish_reason is set: "stop", or "length" at the n_predict limit). `constraint_current`:
  // the constraint has been advanced exactly past `id` (the last token of a step), so whether it
  // is dead now is its state after `id`; mid-run it has been advanced past later tokens already.
  bool emit(int32_t id, bool constraint_current) {
    r_.ids.push_back(id);
    history_.push_back(id);
    if ((!opts_.ignore_eos || constraint_) && tok_.is_eog(id)) {
      r_.finish_reason = "stop";
      return false;
    }
    full_ += decoder_.push(id);
    const size_t stop_at = find_stop(full_, opts_.stop);
    if (stop_at != std::string::npos) {
      full_.resize(stop_at);
      stream_to(full_.size());
      r_.finish_reason = "stop";
      return false;
    }
    stream_to(full_.size() - stop_holdback(full_, opts_.stop));
    if (constraint_ && constraint_current && constraint_->is_dead()) {
      // The grammar is complete and nothing may follow: flush the held text and stop.
      full_ += decoder_.flush();
      stream_to(full_.size());
      r_.finish_reason = "stop";
      return false;
    }
    return int64_t(r_.ids.size()) < limit_;
  }

  // Ends the stream: flushes held bytes (an incomplete character at the end, or a stop-string
  // prefix that never completed) and stores the text.
  void finish() {
    if (r_.finish_reason != "stop" || emitted_ < full_.size()) {
      if (r_.finish_reason != "stop") full_ += decoder_.flush();
      stream_to(full_.size());
    }
    r_.text = full_;
  }

 private:
  void stream_to(size_t end) {
    if (on_text_ && end > emitted_) on_text_(full_.substr(emitted_, end - emitted_));
    emitted_ = std::max(emitted_, end);
  }

  const Tokenizer& tok_;
  const GenerateOptions& opts_;
  const TokenConstraint* constraint_;
  int64_t limit_;
  GenerateResult& r_;
  std::vector<int32_t>& history_;
  const std::function<void(const std::string&)>& on_text_;
  StreamDecoder decoder_;
  std::string full_;     // all generated text so far (before stop trimming)
  size_t emitted_ = 0;   // bytes of full_ already given to on_text
};

}  // namespace

GenerateResult generate(Session& session, const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
                        const GenerateOptions& opts,
                        const std::function<void(const std::string&)>& on_text) {
  if (prompt_ids.empty()) fail("the prompt has no tokens (the model adds no BOS): give a prompt");
  if (!session.unbounded() && int64_t(prompt_ids.size()) >= session.n_ctx())
    fail("the prompt has ", prompt_ids.size(), " tokens but the context holds ", session.n_ctx(),
         " (raise --ctx or shorten the prompt)");
  opts.sampling.validate();
  opts.spec.validate();
  const DraftSource source = opts.spec.source;
  if (source != DraftSource::None && session.kv_policy().evicts())
    fail("speculative decoding cannot run with --kv-policy ", session.kv_policy().describe(),
         ": a verified step evicts for all its drafts, and the cache cannot take back what a rejected draft evicted ",
         "(the output would differ from plain decoding's)");
  if (source == DraftSource::DraftModel && !opts.draft)
    fail("speculative decoding with a draft model: no draft model loaded");
  GenerateResult r;
  r.prompt_ids = prompt_ids;
  r.finish_reason = "length";
  const int64_t V = session.hparams().n_vocab;
  Sampler sampler(opts.sampling, int32_t(V));
  std::vector<int32_t> history = prompt_ids;  // prompt + generated: the penalties' window, the drafters' input
  std::unique_ptr<TokenConstraint> constraint;
  if (opts.constraint)
    constraint = std::make_unique<TimedConstraint>(opts.constraint->clone(), r.metrics.constraint_ms);
  std::vector<float> masked(constraint ? size_t(V) : 0);  // [n_vocab] the logits row, constrained
  const int64_t limit = opts.n_predict < 0 ? session.n_ctx() : opts.n_predict;
  TokenEmitter out(tok, opts, constraint.get(), limit, r, history, on_text);

  // One token from one row of logits, as plain decoding samples it.
  const auto sample_plain = [&](const float* logits) {
    if (!constraint) return sampler.sample(logits, history);
    std::copy(logits, logits + V, masked.begin());
    constraint->apply(masked.data(), int32_t(V));
    const int32_t id = sampler.sample(masked.data(), history);
    constraint->accept(id);
    return id;
  };

  const int64_t t0 = now_ns();
  const float* logits = session.eval(prompt_ids);
  const int64_t t_prefill = now_ns();
  r.metrics.n_prompt = int64_t(prompt_ids.size());
  r.metrics.prefill_ms = double(t_prefill - t0) / 1e6;

  // Speculative state: the drafter's proposals and (a sampled draft model's) their distributions.
  DraftLength draft_length(opts.spec);
  std::unique_ptr<Sampler> draft_sampler;
  if (source == DraftSource::DraftModel && opts.sampling.temperature > 0) {
    SamplingParams dp = opts.sampling;
    dp.seed ^= kDraftSeedSalt;
    // The draft's vocabulary may be up to 128 tokens smaller: a bias on a token it lacks is
    // dropped (verification corrects any way the draft's distribution differs from the target's).
    const int64_t draft_vocab = opts.draft->hparams().n_vocab;
    std::erase_if(dp.logit_bias, [&](const auto& b) { return b.first >= draft_vocab; });
    draft_sampler = std::make_unique<Sampler>(dp, int32_t(draft_vocab));
  }
  std::vector<int32_t> drafts, step_tokens;
  std::vector<TokenDistribution> q;
  VerifyResult verified;

  int64_t t_last = 0;  // when the last generated token became available
  if (limit > 0 && !out.interrupted()) {
    const int32_t first = sample_plain(logits);
    t_last = now_ns();
    r.metrics.ttft_ms = double(t_last - t0) / 1e6;
    bool going = out.emit(first, /*constraint_current=*/true);
    while (going && !out.interrupted()) {
      const int64_t n_past = session.n_past();
      if (!session.unbounded() && n_past + 1 > session.n_ctx()) break;  // context full: finish as "length"
      const int32_t last = r.ids.back();        // generated, its K/V not yet computed

      // Drafts: never more than the step could use (k drafts emit at most k + 1 tokens) or the
      // context could hold (the step evaluates last + k drafts).
      drafts.clear();
      q.clear();
      if (source != DraftSource::None) {
        const int64_t remaining = limit - int64_t(r.ids.size());
        const int k = int(std::min<int64_t>({draft_length.next(), remaining - 1, session.n_ctx() - n_past - 1}));
        if (k > 0) {
          const int64_t td = now_ns();
          if (source == DraftSource::Lookup) {
            ngram_propose(history, k, opts.spec.ngram, drafts);
          } else {
            DraftModel::Job job;
            job.key = 0;
            job.tokens = history;
            job.n_draft = k;
            job.vocab_limit = int32_t(V);
            job.sampler = draft_sampler.get();
            job.out = &drafts;
            job.q = draft_sampler ? &q : nullptr;
            opts.draft->propose(std::span<DraftModel::Job>(&job, 1), session.pool());
          }
          r.metrics.draft_ms += double(now_ns() - td) / 1e6;
        }
      }

      step_tokens.clear();
      if (drafts.empty()) {
        // Nothing to verify (no lookup match, the draft out of context, or plain decoding):
        // a one-token step.
        logits = session.eval(std::span<const int32_t>(&last, 1));
        step_tokens.push_back(sample_plain(logits));
      } else {
        step_tokens.reserve(drafts.size() + 1);
        step_tokens.push_back(last);
        step_tokens.insert(step_tokens.end(), drafts.begin(), drafts.end());
        const float* rows = session.eval(step_tokens, /*all_logits=*/true);
        verify_drafts(sampler, rows, int32_t(V), history, drafts, q, constraint.get(), masked, verified);
        // The cache now holds last + every draft: keep last and the accepted ones only.
        session.truncate(n_past + 1 + verified.n_accepted);
        r.metrics.n_drafted += int64_t(drafts.size());
        r.metrics.n_accepted += verified.n_accepted;
        draft_length.observe(int(drafts.size()), verified.n_accepted);
        step_tokens = verified.tokens;
      }
      ++r.metrics.n_target_steps;
      const int64_t t_step = now_ns();

      // The step's tokens one by one, as plain decoding would have produced them; generation
      // may end inside the run (EOS, a stop string, the limit, Ctrl-C).
      // verify_drafts advances the constraint past the whole run and ends the run where the
      // constraint dies, so only the run's last token can be where it allows nothing more.
      size_t n_emitted = 0;
      for (const int32_t id : step_tokens) {
        if (n_emitted > 0 && out.interrupted()) {
          going = false;
          break;
        }
        ++n_emitted;
        going = out.emit(id, /*constraint_current=*/n_emitted == step_tokens.size());
        if (!going) break;
      }
      // The step's tokens became available together: each gets an equal share of its time.
      const double share_ms = double(t_step - t_last) / 1e6 / double(n_emitted);
      r.metrics.tbt_ms.insert(r.metrics.tbt_ms.end(), n_emitted, share_ms);
      t_last = t_step;
    }
  }
  out.finish();

  GenerateMetrics& m = r.metrics;
  m.n_generated = int64_t(r.ids.size());
  m.latency_ms = t_last ? double(t_last - t0) / 1e6 : m.prefill_ms;
  m.prefill_tok_s = m.prefill_ms > 0 ? double(m.n_prompt) / (m.prefill_ms / 1e3) : 0;
  double tbt_sum = 0;
  for (double x : m.tbt_ms) tbt_sum += x;
  m.decode_tok_s = tbt_sum > 0 ? double(m.tbt_ms.size()) / (tbt_sum / 1e3) : 0;
  m.acceptance_rate = m.n_drafted > 0 ? double(m.n_accepted) / double(m.n_drafted) : 0;
  m.accepted_per_step = m.n_target_steps > 0 ? double(m.n_generated - 1) / double(m.n_target_steps) : 0;
  return r;
}

}  // namespace tern
