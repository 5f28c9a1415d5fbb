#include "runtime/generate.h"

#include <algorithm>

#include "core/error.h"
#include "core/stats.h"

namespace tern {

GenerateResult generate(Session& session, const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
                        const GenerateOptions& opts,
                        const std::function<void(const std::string&)>& on_text) {
  if (prompt_ids.empty()) fail("the prompt has no tokens (the model adds no BOS): give a prompt");
  if (int64_t(prompt_ids.size()) >= session.n_ctx())
    fail("the prompt has ", prompt_ids.size(), " tokens but the context holds ", session.n_ctx(),
         " (raise --ctx or shorten the prompt)");
  opts.sampling.validate();
  GenerateResult r;
  r.prompt_ids = prompt_ids;
  r.finish_reason = "length";
  const int64_t V = session.hparams().n_vocab;
  Sampler sampler(opts.sampling, int32_t(V));
  StreamDecoder decoder(tok);
  std::vector<int32_t> history = prompt_ids;
  std::unique_ptr<TokenConstraint> constraint = opts.constraint ? opts.constraint->clone() : nullptr;
  std::vector<float> masked(constraint ? size_t(V) : 0);  // [n_vocab] the logits row, constrained
  std::string full;     // all generated text so far (before stop trimming)
  size_t emitted = 0;   // bytes of `full` already given to on_text

  const int64_t t0 = now_ns();
  const float* logits = session.eval(prompt_ids);
  const int64_t t_prefill = now_ns();
  r.metrics.n_prompt = int64_t(prompt_ids.size());
  r.metrics.prefill_ms = double(t_prefill - t0) / 1e6;

  int64_t t_last = 0;
  const int64_t limit = opts.n_predict < 0 ? session.n_ctx() : opts.n_predict;
  for (int64_t n = 0; n < limit; ++n) {
    if (opts.interrupt && opts.interrupt->load(std::memory_order_relaxed)) {
      r.finish_reason = "interrupted";
      break;
    }
    int32_t id;
    if (constraint) {
      const int64_t tc = now_ns();
      std::copy(logits, logits + V, masked.begin());
      constraint->apply(masked.data(), int32_t(V));
      r.metrics.constraint_ms += double(now_ns() - tc) / 1e6;
      id = sampler.sample(masked.data(), history);
      const int64_t ta = now_ns();
      constraint->accept(id);
      r.metrics.constraint_ms += double(now_ns() - ta) / 1e6;
    } else {
      id = sampler.sample(logits, history);
    }
    const int64_t t_tok = now_ns();
    if (n == 0) {
      r.metrics.ttft_ms = double(t_tok - t0) / 1e6;
    } else {
      r.metrics.tbt_ms.push_back(double(t_tok - t_last) / 1e6);
    }
    t_last = t_tok;
    r.ids.push_back(id);
    history.push_back(id);
    if ((!opts.ignore_eos || constraint) && tok.is_eog(id)) {
      r.finish_reason = "stop";
      break;
    }
    full += decoder.push(id);
    const size_t stop_at = find_stop(full, opts.stop);
    if (stop_at != std::string::npos) {
      full.resize(stop_at);
      if (on_text && full.size() > emitted) on_text(full.substr(emitted));
      emitted = full.size();
      r.finish_reason = "stop";
      break;
    }
    const size_t safe = full.size() - stop_holdback(full, opts.stop);
    if (on_text && safe > emitted) {
      on_text(full.substr(emitted, safe - emitted));
      emitted = safe;
    }
    if (constraint && constraint->is_dead()) {
      // The grammar is complete and nothing may follow: flush the held text and stop.
      full += decoder.flush();
      if (on_text && full.size() > emitted) on_text(full.substr(emitted));
      emitted = full.size();
      r.finish_reason = "stop";
      break;
    }
    if (n + 1 == limit) break;
    if (session.n_past() + 1 > session.n_ctx()) break;  // context full: finish as "length"
    logits = session.eval(std::span<const int32_t>(&id, 1));
  }
  if (r.finish_reason != "stop" || emitted < full.size()) {
    // Flush held bytes (an incomplete character at the end, or a stop-string prefix that
    // never completed).
    if (r.finish_reason != "stop") full += decoder.flush();
    if (on_text && full.size() > emitted) on_text(full.substr(emitted));
  }
  r.text = full;
  r.metrics.n_generated = int64_t(r.ids.size());
  r.metrics.latency_ms = t_last ? double(t_last - t0) / 1e6 : r.metrics.prefill_ms;
  r.metrics.prefill_tok_s = r.metrics.prefill_ms > 0 ? double(r.metrics.n_prompt) / (r.metrics.prefill_ms / 1e3) : 0;
  double tbt_sum = 0;
  for (double x : r.metrics.tbt_ms) tbt_sum += x;
  r.metrics.decode_tok_s = tbt_sum > 0 ? double(r.metrics.tbt_ms.size()) / (tbt_sum / 1e3) : 0;
  return r;
}

}  // namespace tern
