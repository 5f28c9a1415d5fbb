#include "models/linear.h"

#include <vector>

#include "core/error.h"
#include "ops/ops.h"

namespace tern {

void apply_linear(const Linear& l, const float* x, int64_t ldx, int64_t n_tokens, float* y, int64_t ldy,
                  ThreadPool& pool, ForwardObserver* observer) {
  if (observer && l.observed) observer->on_linear_input(l.name, x, n_tokens, l.w.n_in);
  matmul(l.w, x, ldx, n_tokens, y, ldy, pool);
  if (l.bias) add_bias_cols(y, ldy, l.bias, n_tokens, 0, l.w.n_out);
}

void apply_linears_shared(std::span<const Linear* const> ls, std::span<float* const> ys, std::span<const int64_t> ldys,
                          const float* x, int64_t ldx, int64_t n_tokens, ThreadPool& pool, const RowsDone& done,
                          const InputRmsNorm& norm, ForwardObserver* observer) {
  TERN_ASSERT(ls.size() == ys.size() && ls.size() == ldys.size() && ls.size() <= 4);
  MatmulTarget targets[4];
  for (size_t i = 0; i < ls.size(); ++i) targets[i] = MatmulTarget{ls[i]->w, ys[i], ldys[i]};
  matmul_shared_input(std::span<const MatmulTarget>(targets, ls.size()), x, ldx, n_tokens, pool, done, norm);
  if (observer) {
    const float* seen = norm.weight ? norm.out_rows : x;
    for (const Linear* l : ls)
      if (l->observed) observer->on_linear_input(l->name, seen, n_tokens, l->w.n_in);
  }
}

}  // namespace tern
