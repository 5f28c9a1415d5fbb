#include "models/lora_step.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "models/model.h"

namespace tern {
namespace {

// Adapters resolved at once; more are re-resolved when they come back (a few microseconds).
constexpr size_t kCacheSize = 64;
// Tokens per shrink chunk (a long prompt's group is split across threads).
constexpr int64_t kShrinkTokens = 32;

}  // namespace

const LoraStep::Resolved& LoraStep::resolve(const LoraAdapter& adapter) {
  for (size_t i = 0; i < cache_.size(); ++i)
    if (cache_[i].uid == adapter.uid()) {
      if (i + 1 != cache_.size()) std::rotate(cache_.begin() + i, cache_.begin() + i + 1, cache_.end());
      return cache_.back();
    }
  if (cache_.size() >= kCacheSize) cache_.erase(cache_.begin());
  Resolved r;
  r.uid = adapter.uid();
  r.by_id.assign(targets_.size(), nullptr);
  for (size_t id = 0; id < targets_.size(); ++id) {
    const LoraTarget& t = targets_[id];
    const LoraPair* p = adapter.find(t.name);
    if (!p || p->embedding() != (t.name == "token_embd.weight")) continue;
    // Model::check_lora checked the adapter against the model before it was used.
    TERN_ASSERT_MSG(t.col0 + t.n_in <= p->n_in && t.row0 + t.n_out <= p->n_out, "LoRA pair does not fit its linear");
    r.by_id[id] = p;
  }
  cache_.push_back(std::move(r));
  return cache_.back();
}

bool LoraStep::begin(std::span<const SeqBatch> seqs) {
  active_ = false;
  for (const SeqBatch& s : seqs)
    if (s.lora && !s.lora->empty() && !s.tokens.empty()) active_ = true;
  if (!active_) return false;
  groups_.resize(targets_.size());
  for (auto& g : groups_) g.clear();
  int64_t t0 = 0;
  for (const SeqBatch& s : seqs) {
    const int64_t n = int64_t(s.tokens.size());
    if (s.lora && n > 0)
      for (const LoraUse& use : *s.lora) {
        const Resolved& r = resolve(*use.adapter);
        for (size_t id = 0; id < targets_.size(); ++id)
          if (const LoraPair* p = r.by_id[id]) {
            // Neighbouring sequences with the same pair and scale share a group.
            std::vector<LoraGroup>& gs = groups_[id];
            const float scale = use.adapter->scale_of(*p, use.scale);
            if (!gs.empty() && gs.back().pair == p && gs.back().scale == scale && gs.back().t0 + gs.back().n == t0)
              gs.back().n += n;
            else
              gs.push_back(LoraGroup{p, scale, t0, n, targets_[id].col0, targets_[id].n_in});
          }
      }
    t0 += n;
  }
  if (logit_rows_target_ >= 0) {
    // Groups are whole sequences: renumber their tokens as logit rows (n_logit_rows's order).
    std::vector<int64_t> token_start, row_start;
    int64_t t = 0, r = 0;
    for (const SeqBatch& s : seqs) {
      token_start.push_back(t);
      row_start.push_back(r);
      t += int64_t(s.tokens.size());
      r += s.tokens.empty() ? 0 : (s.all_logits ? int64_t(s.tokens.size()) : 1);
    }
    token_start.push_back(t);
    row_start.push_back(r);
    const auto row_of = [&](int64_t token) {  // the first row of the sequence starting at `token`
      const size_t i = size_t(std::lower_bound(token_start.begin(), token_start.end(), token) - token_start.begin());
      TERN_ASSERT(i < token_start.size() && token_start[i] == token);
      return row_start[i];
    };
    for (LoraGroup& g : groups_[size_t(logit_rows_target_)]) {
      const int64_t r0 = row_of(g.t0), r1 = row_of(g.t0 + g.n);
      g.t0 = r0;
      g.n = r1 - r0;
    }
  }
  return true;
}

std::vector<std::string> LoraStep::unapplied(const LoraAdapter& adapter) const {
  std::vector<std::string> out;
  for (const LoraPair& p : adapter.pairs()) {
    bool applied = false;
    for (const LoraTarget& t : targets_)
      if (t.name == p.target) applied = true;
    if (!applied) out.push_back(p.target);
  }
  return out;
}

int64_t lora_shrink_size(std::span<const LoraGroup> groups, std::vector<int64_t>& offsets) {
  offsets.resize(groups.size());
  int64_t total = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    offsets[g] = total;
    total += groups[g].n * groups[g].pair->rank;
  }
  return total;
}

// The two kernels: plain loops whose inner loop runs over 16 lanes of the input (shrink) or
// the output rows (expand), without reductions, so the compiler vectorizes them; on x86-64
// built for x86-64-v4 (AVX-512), v3 (AVX2, F16C: half operands convert in registers) and the
// baseline, the loader choosing by the CPU (target_clones). Every clone does the same
// operations in the same order, a multiply then an add (no contraction into FMA, which the
// baseline lacks), so they agree to the bit by construction (not tested across CPUs: the
// tests compare within float noise). W is the operands' type: float or IEEE half.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define TERN_LORA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TERN_LORA_CLONES
#endif
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

// u [n][rank] = x [n][n_in] A^T: u[t][k] = A[k] . x[t], as 16 lane sums (lane l takes the
// elements i = l mod 16, in i order) added lane 0 to 15, then the n_in mod 16 tail in order.
// A's rows are lda apart (>= n_in: a column share reads n_in of each).
template <class W>
TERN_LORA_CLONES void shrink_kernel(const float* x, int64_t ldx, int64_t n, const W* a, int64_t lda, int64_t n_in,
                                    int64_t rank, float* u) {
  constexpr int64_t L = 16;
  const int64_t body = n_in - n_in % L;
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * ldx;
    for (int64_t k = 0; k < rank; ++k) {
      const W* ak = a + k * lda;
      float lanes[L] = {};
      for (int64_t i = 0; i < body; i += L)
        for (int64_t l = 0; l < L; ++l) lanes[l] += float(ak[i + l]) * xt[i + l];
      float sum = 0.0f;
      for (int64_t l = 0; l < L; ++l) sum += lanes[l];
      for (int64_t i = body; i < n_in; ++i) sum += float(ak[i]) * xt[i];
      u[t * rank + k] = sum;
    }
  }
}

// y[t][0 .. w) += scale * u[t] B^T[:, 0 .. w), B^T rows ld_bt apart: per rank component k,
// y += (scale * u_k) * B^T[k].
template <class W>
TERN_LORA_CLONES void expand_kernel(const float* u, int64_t n, int64_t rank, const W* bt, int64_t ld_bt, int64_t w,
                                    float scale, float* y, int64_t ldy) {
  for (int64_t t = 0; t < n; ++t) {
    float* yt = y + t * ldy;
    const float* ut = u + t * rank;
    for (int64_t k = 0; k < rank; ++k) {
      const float c = scale * ut[k];
      const W* b = bt + k * ld_bt;
      for (int64_t j = 0; j < w; ++j) yt[j] += c * float(b[j]);
    }
  }
}

#pragma GCC pop_options

// IEEE half as the generic kernels read it: ARM64's __fp16 (converted by fcvt), elsewhere the
// bits converted by core/fp16.h (x86 CPUs with F16C take the kernels below instead).
#if defined(__aarch64__)
using Half = __fp16;
#else
struct Half {
  uint16_t bits;
  explicit operator float() const { return fp16_to_f32(bits); }
};
#endif
static_assert(sizeof(Half) == sizeof(uint16_t));

// The half kernels with F16C conversions, where the CPU has AVX2 and F16C (the compiler turns
// the generic kernels' half-to-float conversions into calls, one per element). The same
// operations in the same order as the generic kernels: lane l of the shrink's 16 is element l
// of (acc0, acc1); each output of the expand is y + c * b (tests: models_lora_forced_ref runs
// the generic ones, LoraCli.HalfAdapterAgreesOnEveryKernel compares the two).
#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) static void shrink_half_f16c(const float* x, int64_t ldx, int64_t n,
                                                                   const uint16_t* a, int64_t lda, int64_t n_in,
                                                                   int64_t rank, float* u) {
  constexpr int64_t L = 16;
  const int64_t body = n_in - n_in % L;
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * ldx;
    for (int64_t k = 0; k < rank; ++k) {
      const uint16_t* ak = a + k * lda;
      __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
      for (int64_t i = 0; i < body; i += L) {
        const __m256 a0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ak + i)));
        const __m256 a1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ak + i + 8)));
        acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(a0, _mm256_loadu_ps(xt + i)));
        acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(a1, _mm256_loadu_ps(xt + i + 8)));
      }
      float lanes[L];
      _mm256_storeu_ps(lanes, acc0);
      _mm256_storeu_ps(lanes + 8, acc1);
      float sum = 0.0f;
      for (int64_t l = 0; l < L; ++l) sum += lanes[l];
      for (int64_t i = body; i < n_in; ++i) sum += fp16_to_f32(ak[i]) * xt[i];
      u[t * rank + k] = sum;
    }
  }
}

__attribute__((target("avx2,f16c"))) static void expand_half_f16c(const float* u, int64_t n, int64_t rank,
                                                                   const uint16_t* bt, int64_t ld_bt, int64_t w,
                                                                   float scale, float* y, int64_t ldy) {
  const int64_t body = w - w % 8;
  for (int64_t t = 0; t < n; ++t) {
    float* yt = y + t * ldy;
    const float* ut = u + t * rank;
    for (int64_t k = 0; k < rank; ++k) {
      const float c = scale * ut[k];
      const __m256 cv = _mm256_set1_ps(c);
      const uint16_t* b = bt + k * ld_bt;
      for (int64_t j = 0; j < body; j += 8) {
        const __m256 bv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + j)));
        _mm256_storeu_ps(yt + j, _mm256_add_ps(_mm256_loadu_ps(yt + j), _mm256_mul_ps(cv, bv)));
      }
      for (int64_t j = body; j < w; ++j) yt[j] += c * fp16_to_f32(b[j]);
    }
  }
}

// TERN_FORCE_ISA=ref takes the generic kernels (how tests reach them on an F16C machine).
// Decided at first use, after the base matmuls have checked TERN_FORCE_ISA.
static bool have_f16c() {
  static const bool yes =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && selected_isa() != Isa::Ref;
  return yes;
}
#else
static constexpr bool have_f16c() { return false; }
#endif

void lora_shrink(std::span<const LoraGroup> groups, const float* x, int64_t ldx, float* u,
                 std::span<const int64_t> offsets, ThreadPool& pool) {
  // Chunks: (group, up to kShrinkTokens of its tokens).
  int64_t n_chunks = 0;
  for (const LoraGroup& g : groups) n_chunks += (g.n + kShrinkTokens - 1) / kShrinkTokens;
  const auto run_chunk = [&](int64_t c) {
    size_t g = 0;
    for (;; ++g) {
      const int64_t k = (groups[g].n + kShrinkTokens - 1) / kShrinkTokens;
      if (c < k) break;
      c -= k;
    }
    const LoraGroup& gr = groups[g];
    const LoraPair& p = *gr.pair;
    const int64_t i0 = c * kShrinkTokens, n = std::min(kShrinkTokens, gr.n - i0);
    float* ug = u + offsets[g] + i0 * p.rank;
    const float* xg = x + (gr.t0 + i0) * ldx;
    const int64_t c0 = gr.col0, n_in = gr.n_in;  // (the columns of A that x holds)
    if (!p.half) shrink_kernel(xg, ldx, n, p.a.data() + c0, p.n_in, n_in, p.rank, ug);
#if defined(__x86_64__)
    else if (have_f16c()) shrink_half_f16c(xg, ldx, n, p.a_half.data() + c0, p.n_in, n_in, p.rank, ug);
#endif
    else shrink_kernel(xg, ldx, n, reinterpret_cast<const Half*>(p.a_half.data()) + c0, p.n_in, n_in, p.rank, ug);
  };
  // A decode step's groups are a few tokens each: one region costs more than their work.
  if (n_chunks <= 2) {
    for (int64_t c = 0; c < n_chunks; ++c) run_chunk(c);
    return;
  }
  pool.for_chunks(n_chunks, [&](int64_t c, int) { run_chunk(c); });
}

void lora_expand_rows(std::span<const LoraGroup> groups, const float* u, std::span<const int64_t> offsets,
                      int64_t row0, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  for (size_t g = 0; g < groups.size(); ++g) {
    const LoraGroup& gr = groups[g];
    const LoraPair& p = *gr.pair;
    float* yg = y + gr.t0 * ldy + r0;
#if defined(__x86_64__)
    if (p.half && have_f16c())
      expand_half_f16c(u + offsets[g], gr.n, p.rank, p.bt_half.data() + row0 + r0, p.n_out, r1 - r0, gr.scale, yg, ldy);
    else
#endif
    if (p.half)
      expand_kernel(u + offsets[g], gr.n, p.rank, reinterpret_cast<const Half*>(p.bt_half.data()) + row0 + r0, p.n_out,
                    r1 - r0, gr.scale, yg, ldy);
    else
      expand_kernel(u + offsets[g], gr.n, p.rank, p.bt.data() + row0 + r0, p.n_out, r1 - r0, gr.scale, yg, ldy);
  }
}

}  // namespace tern
