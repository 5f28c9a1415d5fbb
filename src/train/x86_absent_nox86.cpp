// The training engine's x86 variants where they are not built (see
// kernels/x86_absent_nox86.cpp): never reached, as isa_supported() refuses those variants.
#include "core/error.h"
#include "train/attention_kernels.h"
#include "train/gemm_kernels.h"

namespace tern::train::detail {

namespace {
[[noreturn]] void absent(const char* what) { fail(what, " is not built into this binary (a non-x86 build)"); }
}  // namespace

int64_t attention_unit_scratch_floats_avx512(const AttentionShape&) { absent("attention_unit_scratch_floats_avx512"); }
int64_t attention_unit_scratch_floats_avx2(const AttentionShape&) { absent("attention_unit_scratch_floats_avx2"); }
void attention_forward_unit_avx512(const AttentionForwardArgs&, int64_t, int64_t, float*) { absent("attention_forward_unit_avx512"); }
void attention_forward_unit_avx2(const AttentionForwardArgs&, int64_t, int64_t, float*) { absent("attention_forward_unit_avx2"); }
void attention_backward_unit_avx512(const AttentionBackwardArgs&, int64_t, int64_t, float*) { absent("attention_backward_unit_avx512"); }
void attention_backward_unit_avx2(const AttentionBackwardArgs&, int64_t, int64_t, float*) { absent("attention_backward_unit_avx2"); }
void gemm_block_avx512(bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, bool,
                       float*) {
  absent("gemm_block_avx512");
}
void gemm_block_avx2(bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, bool,
                     float*) {
  absent("gemm_block_avx2");
}

}  // namespace tern::train::detail
