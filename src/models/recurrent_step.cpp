#include "models/recurrent_step.h"

#include <algorithm>
#include <cmath>

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

void rwkv_layer_norm(const float* x, const float* w, const float* b, float* out, int64_t n_rows, int64_t n, float eps,
                     ThreadPool& pool) {
  pool.parallel_for(n_rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * n;
      float* o = out + r * n;
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) sum += double(xr[i]);
      const float mean = float(sum / double(n));
      double var = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const float d = xr[i] - mean;
        var += double(d * d);
      }
      const float scale = 1.0f / std::sqrt(float(var / double(n)) + eps);
      for (int64_t i = 0; i < n; ++i) o[i] = (xr[i] - mean) * scale;
      if (w)
        for (int64_t i = 0; i < n; ++i) o[i] = o[i] * w[i] + b[i];
    }
  });
}

void rwkv_group_norm_head(float* y, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double(y[i]);
  const float mean = float(sum / double(n));
  double var = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float d = y[i] - mean;
    var += double(d * d);
  }
  const float scale = 1.0f / std::sqrt(float(var / double(n)) + 64e-5f);
  for (int64_t i = 0; i < n; ++i) y[i] = (y[i] - mean) * scale;
}

void rwkv_token_shift(std::span<const SeqBatch> seqs, KvStore& kv, int64_t il, int64_t shift_off, int64_t n_embd,
                      const float* xn, const float* mixes, int64_t n_mix, float* out, int64_t T, float* sx,
                      ThreadPool& pool) {
  const int64_t E = n_embd;
  int64_t t0 = 0;
  for (const auto& sq : seqs) {
    const int64_t n = int64_t(sq.tokens.size());
    float* shift = kv.state(il, sq.state_slot) + shift_off;
    pool.parallel_for(n, [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t t = t0 + i;
        const float* prev = i == 0 ? shift : xn + (t - 1) * E;
        const float* cur = xn + t * E;
        for (int64_t m = 0; m < n_mix; ++m) {
          const float* mix = mixes + m * E;
          float* o = out + (m * T + t) * E;
          for (int64_t c = 0; c < E; ++c) o[c] = (prev[c] - cur[c]) * mix[c] + cur[c];
        }
        if (sx)
          for (int64_t c = 0; c < E; ++c) sx[t * E + c] = prev[c] - cur[c];
      }
    });
    if (n > 0) std::copy_n(xn + (t0 + n - 1) * E, E, shift);
    t0 += n;
  }
}

}  // namespace tern
