// Tiled attention compiled for AVX2 + FMA (see attention_tile_impl.h).
#include "ops/attention_tile_impl.h"
#include "ops/ssm2_chunked_impl.h"
#include "ops/wkv6_impl.h"
#include "ops/gated_delta_impl.h"
#include "ops/wkv7_impl.h"

namespace tern::attn {
void attention_tile_avx2(const AttentionArgs& a, int64_t kvh, int64_t i0, int64_t i1, float* scratch) {
  tile_any(a, kvh, i0, i1, scratch);
}
void silu_mul_avx2(const float* gate, const float* up, float* out, int64_t n) {
  silu_mul_impl(gate, up, out, n);
}
void f32_to_f16_avx2(const float* src, uint16_t* dst, int64_t n) { f32_to_f16_impl(src, dst, n); }
void ssm_scan_avx2(const SsmScanArgs& a, int64_t c0, int64_t c1) { ssm_scan_impl(a, c0, c1); }
void ssm2_scan_avx2(const Ssm2ScanArgs& a, int64_t h0, int64_t h1) { ssm2_scan_impl(a, h0, h1); }
void ssm2_scan_chunked_avx2(const Ssm2ScanArgs& a, int64_t h0, int64_t h1, int64_t chunk, float* scratch) {
  ssm2_chunked_impl(a, h0, h1, chunk, scratch);
}
void wkv7_avx2(const Wkv7Args& a, int64_t h0, int64_t h1) { wkv7_impl(a, h0, h1); }
void gated_delta_avx2(const GatedDeltaArgs& a, int64_t h0, int64_t h1) { gated_delta_impl(a, h0, h1); }
void wkv6_avx2(const Wkv6Args& a, int64_t h0, int64_t h1) { wkv6_impl(a, h0, h1); }
}  // namespace tern::attn
