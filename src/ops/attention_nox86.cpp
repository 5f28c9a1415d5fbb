// The x86 attention variants' entry points where they are not built (see
// kernels/x86_absent_nox86.cpp): never reached, as isa_supported() refuses those variants.
#include "core/error.h"
#include "ops/attention_iface.h"

namespace tern::attn {

namespace {
[[noreturn]] void absent(const char* what) { fail(what, " is not built into this binary (a non-x86 build)"); }
}  // namespace

void attention_tile_avx2(const AttentionArgs&, int64_t, int64_t, int64_t, float*) { absent("attention_tile_avx2"); }
void attention_tile_avx512(const AttentionArgs&, int64_t, int64_t, int64_t, float*) { absent("attention_tile_avx512"); }
void silu_mul_avx2(const float*, const float*, float*, int64_t) { absent("silu_mul_avx2"); }
void silu_mul_avx512(const float*, const float*, float*, int64_t) { absent("silu_mul_avx512"); }
void f32_to_f16_avx2(const float*, uint16_t*, int64_t) { absent("f32_to_f16_avx2"); }
void f32_to_f16_avx512(const float*, uint16_t*, int64_t) { absent("f32_to_f16_avx512"); }
void ssm_scan_avx2(const SsmScanArgs&, int64_t, int64_t) { absent("ssm_scan_avx2"); }
void ssm_scan_avx512(const SsmScanArgs&, int64_t, int64_t) { absent("ssm_scan_avx512"); }
void ssm2_scan_avx2(const Ssm2ScanArgs&, int64_t, int64_t) { absent("ssm2_scan_avx2"); }
void ssm2_scan_avx512(const Ssm2ScanArgs&, int64_t, int64_t) { absent("ssm2_scan_avx512"); }
void ssm2_scan_chunked_avx2(const Ssm2ScanArgs&, int64_t, int64_t, int64_t, float*) {
  absent("ssm2_scan_chunked_avx2");
}
void ssm2_scan_chunked_avx512(const Ssm2ScanArgs&, int64_t, int64_t, int64_t, float*) {
  absent("ssm2_scan_chunked_avx512");
}
void wkv7_avx2(const Wkv7Args&, int64_t, int64_t) { absent("wkv7_avx2"); }
void wkv7_avx512(const Wkv7Args&, int64_t, int64_t) { absent("wkv7_avx512"); }
void gated_delta_avx2(const GatedDeltaArgs&, int64_t, int64_t) { absent("gated_delta_avx2"); }
void gated_delta_avx512(const GatedDeltaArgs&, int64_t, int64_t) { absent("gated_delta_avx512"); }
void wkv6_avx2(const Wkv6Args&, int64_t, int64_t) { absent("wkv6_avx2"); }
void wkv6_avx512(const Wkv6Args&, int64_t, int64_t) { absent("wkv6_avx512"); }

}  // namespace tern::attn
