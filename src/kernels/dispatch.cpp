#include <cstdlib>
#include <cstring>

#include "kernels/matmul.h"

namespace tern {

// Placeholder dispatch: only the reference variant exists so far.
void matmul(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
            int64_t ldy, ThreadPool& pool) {
  matmul_ref(w, x, ldx, n_tokens, y, ldy, pool);
}

const char* active_isa() { return "ref"; }

}  // namespace tern
