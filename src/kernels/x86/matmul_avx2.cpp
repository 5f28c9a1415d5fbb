// AVX2 + FMA + F16C kernel table: the register tiles of x86_common.h with pmaddubsw / pmaddwd
// integer dot products (4 rows x 2 tokens, 16 registers).
#include "kernels/x86/x86_common.h"

namespace tern::kern {
namespace {

struct OpsAvx2 {
  static constexpr int kMaxTokens = 2;  // 4 rows x 2 tokens: 8 accumulators of 16 registers
  // pmaddubsw saturates int16 pair sums: callers keep |u * s| pairs <= 32767.
  static __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  }
  static __m256i dot_s16(__m256i acc, __m256i a, __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
  }
};

// --- the table ---------------------------------------------------------------------------

void avx2_quantize(const ActLayout& lay, DType, const float* x, int64_t ldx, int64_t n_in,
                   int64_t, int64_t t0, int64_t t1, uint8_t* act) {
  quantize_rows(lay, x, ldx, n_in, t0, t1, act);
}

int64_t avx2_scratch_bytes(DType, int64_t) { return 0; }

void avx2_gemm(const GemmArgs& a, int64_t r0, int64_t r1, uint8_t*) {
  switch (a.type) {
    case DType::F32: gemm_float<LoadF32, OpsAvx2::kMaxTokens>(a, r0, r1); break;
    case DType::F16: gemm_float<LoadF16, OpsAvx2::kMaxTokens>(a, r0, r1); break;
    case DType::BF16: gemm_float<LoadBF16, OpsAvx2::kMaxTokens>(a, r0, r1); break;
    default: gemm_int_classic<OpsAvx2>(a, rows_view(a), r0, r1); break;
  }
}

const KernelTable kAvx2Table = {"avx2", x86_has_kernel, act_rows_layout, avx2_quantize,
                                avx2_scratch_bytes, avx2_gemm};

}  // namespace

const KernelTable& table_avx2() { return kAvx2Table; }

}  // namespace tern::kern
