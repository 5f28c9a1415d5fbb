// Training attention tiles compiled for AVX512 (16 lanes, 4 rows a pass; see attention_tile_impl.h).
#include "train/attention_tile_impl.h"

namespace tern::train::detail {

int64_t attention_unit_scratch_floats_avx512(const AttentionShape& s) { return unit_scratch_floats(s); }

void attention_forward_unit_avx512(const AttentionForwardArgs& a, int64_t seq, int64_t kvh, float* scratch) {
  forward_unit_impl(a, seq, kvh, scratch);
}

void attention_backward_unit_avx512(const AttentionBackwardArgs& a, int64_t seq, int64_t kvh, float* scratch) {
  backward_unit_impl(a, seq, kvh, scratch);
}

}  // namespace tern::train::detail
