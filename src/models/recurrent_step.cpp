#include "models/recurrent_step.h"

#include <algorithm>

#include "core/error.h"

namespace tern {

int64_t begin_recurrent_step(std::span<const SeqBatch> seqs, KvStore& kv, const WeightView& tok_embd,
                             int64_t n_vocab, int64_t n_embd, int64_t max_tokens, float* x) {
  int64_t n_tokens = 0;
  for (const auto& s : seqs) {
    TERN_ASSERT_MSG(s.state_slot >= 0 && s.state_slot < kv.n_state_slots(), "a recurrent model needs a state slot");
    TERN_ASSERT_MSG(s.pos < 0 || s.pos == s.n_past, "a recurrent state cannot skip positions");
    n_tokens += int64_t(s.tokens.size());
  }
  TERN_ASSERT_MSG(n_tokens <= max_tokens, "step larger than reserve()");
  int64_t t = 0;
  for (const auto& s : seqs) {
    if (s.n_past == 0 && !s.tokens.empty()) kv.clear_state(s.state_slot);  // a sequence starts from zero
    for (int32_t id : s.tokens) {
      TERN_ASSERT_MSG(id >= 0 && id < n_vocab, "token id out of range");
      dequantize_row(tok_embd, id, x + t * n_embd);
      ++t;
    }
  }
  return n_tokens;
}

int64_t gather_logit_rows(std::span<const SeqBatch> seqs, const float* x, int64_t n_embd, float* out_rows,
                          const std::function<void(const float*, float*, int64_t)>& norm) {
  int64_t rows = 0, t = 0;
  for (const auto& s : seqs) {
    const int64_t n = int64_t(s.tokens.size());
    if (s.hidden && n > 0) norm(x + t * n_embd, s.hidden, n);
    const int64_t first = s.all_logits ? t : t + n - 1;
    for (int64_t r = first; r < t + n; ++r) std::copy_n(x + r * n_embd, n_embd, out_rows + (rows++) * n_embd);
    t += n;
  }
  return rows;
}

}  // namespace tern
