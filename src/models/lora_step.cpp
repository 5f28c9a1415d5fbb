#include "models/lora_step.h"

#include <algorithm>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "models/model.h"

namespace tern {
namespace {

// Adapters resolved at once; more are re-resolved when they come back (a few microseconds).
constexpr size_t kCacheSize = 64;
// Tokens per shrink chunk (a long prompt's group is split across threads).
constexpr int64_t kShrinkTokens = 32;

WeightView f32_rows(const float* data, int64_t n_in, int64_t n_out) {
  WeightView w;
  w.type = DType::F32;
  w.n_in = n_in;
  w.n_out = n_out;
  w.data = data;
  return w;
}

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
    TERN_ASSERT_MSG(p->n_in == t.n_in && t.row0 + t.n_out <= p->n_out, "LoRA pair does not fit its linear");
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
              gs.push_back(LoraGroup{p, scale, t0, n});
          }
      }
    t0 += n;
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

void lora_shrink(std::span<const LoraGroup> groups, const float* x, int64_t ldx, float* u,
                 std::span<const int64_t> offsets, ThreadPool& pool) {
  // Chunks: (group, up to kShrinkTokens of its tokens).
  int64_t n_chunks = 0;
  for (const LoraGroup& g : groups) n_chunks += (g.n + kShrinkTokens - 1) / kShrinkTokens;
  pool.for_chunks(n_chunks, [&](int64_t c, int) {
    size_t g = 0;
    for (;; ++g) {
      const int64_t k = (groups[g].n + kShrinkTokens - 1) / kShrinkTokens;
      if (c < k) break;
      c -= k;
    }
    const LoraGroup& gr = groups[g];
    const LoraPair& p = *gr.pair;
    const int64_t i0 = c * kShrinkTokens, n = std::min(kShrinkTokens, gr.n - i0);
    // u rows = x rows A^T: A is a [rank][n_in] f32 matrix, i.e. a weight of n_in -> rank.
    matmul_rows(f32_rows(p.a.data(), p.n_in, p.rank), x + (gr.t0 + i0) * ldx, ldx, n,
                u + offsets[g] + i0 * p.rank, p.rank, 0, p.rank);
  });
}

void lora_expand_rows(std::span<const LoraGroup> groups, const float* u, std::span<const int64_t> offsets,
                      int64_t row0, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  thread_local std::vector<float> delta;  // [n][r1 - r0]
  const int64_t w = r1 - r0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const LoraGroup& gr = groups[g];
    const LoraPair& p = *gr.pair;
    if (delta.size() < size_t(gr.n * w)) delta.resize(size_t(gr.n * w));
    // delta = u B[row0 + r0 .. row0 + r1)^T: B's rows are a weight of rank -> rows.
    matmul_rows(f32_rows(p.b.data() + (row0 + r0) * p.rank, p.rank, w), u + offsets[g], p.rank, gr.n, delta.data(),
                w, 0, w);
    for (int64_t t = 0; t < gr.n; ++t) {
      float* yt = y + (gr.t0 + t) * ldy + r0;
      const float* dt = delta.data() + t * w;
      for (int64_t j = 0; j < w; ++j) yt[j] += gr.scale * dt[j];
    }
  }
}

}  // namespace tern
