#include "models/linear.h"

#include <vector>

#include "core/error.h"
#include "ops/ops.h"

namespace tern {
namespace {

constexpr int kMaxShared = 4;

// The matmul's row epilogue with adapters: each finished chunk of rows gets its groups' LoRA
// updates, then the caller's epilogue runs on it.
struct LoraEpilogue {
  RowsDone inner;
  int n_targets = 0;
  std::span<const LoraGroup> groups[kMaxShared];
  const std::vector<int64_t>* offsets[kMaxShared] = {};
  const float* u[kMaxShared] = {};
  int64_t row0[kMaxShared] = {};
  float* y[kMaxShared] = {};
  int64_t ldy[kMaxShared] = {};
};

void lora_rows_done(const void* ctx, int target, int64_t n_tokens, int64_t r0, int64_t r1) {
  const LoraEpilogue& e = *static_cast<const LoraEpilogue*>(ctx);
  const auto expand = [&](int i) {
    if (!e.groups[i].empty())
      lora_expand_rows(e.groups[i], e.u[i], *e.offsets[i], e.row0[i], e.y[i], e.ldy[i], r0, r1);
  };
  if (target < 0) {
    for (int i = 0; i < e.n_targets; ++i) expand(i);
  } else {
    expand(target);
  }
  if (e.inner.fn) e.inner.fn(e.inner.ctx, target, n_tokens, r0, r1);
}

// apply_linear less the bias (apply_linears_shared's epilogues add theirs).
void apply_linear_unbiased(const Linear& l, const float* x, int64_t ldx, int64_t n_tokens, float* y, int64_t ldy,
                           ThreadPool& pool, const LinearHooks& hooks) {
  if (hooks.observer && l.observed) hooks.observer->on_linear_input(l.name, x, n_tokens, l.w.n_in);
  if (l.factored()) {
    // Two matmuls through a scratch of the rank's width (grown, never shrunk: no allocation once
    // the largest step has run). The workers read it through the pointer.
    thread_local std::vector<float> mid;  // [n_tokens, rank]
    const int64_t rank = l.lr_a.n_out;
    if (mid.size() < size_t(n_tokens * rank)) mid.resize(size_t(n_tokens * rank));
    matmul(l.lr_a, x, ldx, n_tokens, mid.data(), rank, pool);
    matmul(l.lr_b, mid.data(), rank, n_tokens, y, ldy, pool);
  } else {
    matmul(l.w, x, ldx, n_tokens, y, ldy, pool);
  }
  const std::span<const LoraGroup> groups = hooks.lora ? hooks.lora->groups(l.lora_id) : std::span<const LoraGroup>{};
  if (!groups.empty()) {
    thread_local std::vector<float> u;
    thread_local std::vector<int64_t> offsets;
    u.resize(size_t(lora_shrink_size(groups, offsets)));
    lora_shrink(groups, x, ldx, u.data(), offsets, pool);
    // The expansion by row blocks of 64 across the pool (multiples of the kernels' 4-row tile).
    // (The workers read this thread's buffers: names of thread_locals would be their own.)
    constexpr int64_t kRows = 64;
    const int64_t n_out = l.w.n_out;
    const float* u_rows = u.data();
    const std::span<const int64_t> u_offsets = offsets;
    pool.for_chunks((n_out + kRows - 1) / kRows, [&](int64_t c, int) {
      const int64_t r0 = c * kRows, r1 = std::min(n_out, r0 + kRows);
      lora_expand_rows(groups, u_rows, u_offsets, l.row0, y, ldy, r0, r1);
    });
  }
}

}  // namespace

void apply_linear(const Linear& l, const float* x, int64_t ldx, int64_t n_tokens, float* y, int64_t ldy,
                  ThreadPool& pool, const LinearHooks& hooks) {
  apply_linear_unbiased(l, x, ldx, n_tokens, y, ldy, pool, hooks);
  if (l.bias) add_bias_cols(y, ldy, l.bias, n_tokens, 0, l.w.n_out);
}

void apply_linears_shared(std::span<const Linear* const> ls, std::span<float* const> ys, std::span<const int64_t> ldys,
                          const float* x, int64_t ldx, int64_t n_tokens, ThreadPool& pool, const RowsDone& done,
                          const InputRmsNorm& norm, const LinearHooks& hooks) {
  TERN_ASSERT(ls.size() == ys.size() && ls.size() == ldys.size() && ls.size() <= size_t(kMaxShared));
  TERN_ASSERT_MSG(done.joint_group == 0, "apply_linears_shared: joint groups are matmul_shared_input's only");
  bool any_factored = false;
  for (const Linear* l : ls) any_factored = any_factored || l->factored();
  if (any_factored) {
    // The plain path: normalise (rms_norm is the prologue's rms_norm_row), each linear on its
    // own (observer and LoRA included), then the epilogue over every row at once.
    const float* xin = x;
    if (norm.weight) {
      rms_norm(x, norm.weight, norm.out_rows, n_tokens, ls[0]->w.n_in, norm.eps, pool);
      xin = norm.out_rows;
    }
    for (size_t i = 0; i < ls.size(); ++i)
      apply_linear_unbiased(*ls[i], xin, ldx, n_tokens, ys[i], ldys[i], pool, hooks);
    if (done.fn) {
      if (done.joint_rows) {
        done.fn(done.ctx, -1, n_tokens, 0, ls[0]->w.n_out);
      } else {
        for (size_t i = 0; i < ls.size(); ++i) done.fn(done.ctx, int(i), n_tokens, 0, ls[i]->w.n_out);
      }
    }
    return;
  }
  MatmulTarget targets[kMaxShared];
  for (size_t i = 0; i < ls.size(); ++i) targets[i] = MatmulTarget{ls[i]->w, ys[i], ldys[i]};
  const std::span<const MatmulTarget> tspan(targets, ls.size());
  bool adapted = false;
  if (hooks.lora)
    for (const Linear* l : ls) adapted = adapted || !hooks.lora->groups(l->lora_id).empty();
  if (!adapted) {
    matmul_shared_input(tspan, x, ldx, n_tokens, pool, done, norm);
  } else {
    // The shrink needs the normalised input before the matmul: normalise first (rms_norm is
    // the prologue's rms_norm_row, so the bits are the fused call's), shrink every target's
    // groups, then the matmul with the updates in its epilogue.
    const float* xin = x;
    if (norm.weight) {
      rms_norm(x, norm.weight, norm.out_rows, n_tokens, ls[0]->w.n_in, norm.eps, pool);
      xin = norm.out_rows;
    }
    thread_local std::vector<float> u[kMaxShared];
    thread_local std::vector<int64_t> offsets[kMaxShared];
    LoraEpilogue e;
    e.inner = done;
    e.n_targets = int(ls.size());
    for (size_t i = 0; i < ls.size(); ++i) {
      e.groups[i] = hooks.lora->groups(ls[i]->lora_id);
      u[i].resize(size_t(lora_shrink_size(e.groups[i], offsets[i])));
      if (!e.groups[i].empty()) lora_shrink(e.groups[i], xin, ldx, u[i].data(), offsets[i], pool);
      e.offsets[i] = &offsets[i];
      e.u[i] = u[i].data();
      e.row0[i] = ls[i]->row0;
      e.y[i] = ys[i];
      e.ldy[i] = ldys[i];
    }
    matmul_shared_input(tspan, xin, ldx, n_tokens, pool, RowsDone{lora_rows_done, &e, done.joint_rows});
  }
  if (hooks.observer) {
    const float* seen = norm.weight ? norm.out_rows : x;
    for (const Linear* l : ls)
      if (l->observed) hooks.observer->on_linear_input(l->name, seen, n_tokens, l->w.n_in);
  }
}

}  // namespace tern
