// The ARM64 attention variant's entry points where it is not built (see
// kernels/arm_absent_noarm.cpp): never reached, as isa_supported() refuses the ARM variants there.
#include "core/error.h"
#include "ops/attention_iface.h"

namespace tern::attn {

namespace {
[[noreturn]] void absent(const char* what) { fail(what, " is not built into this binary (not an ARM64 build)"); }
}  // namespace

void attention_tile_neon(const AttentionArgs&, int64_t, int64_t, int64_t, float*) { absent("attention_tile_neon"); }
void silu_mul_neon(const float*, const float*, float*, int64_t) { absent("silu_mul_neon"); }
void f32_to_f16_neon(const float*, uint16_t*, int64_t) { absent("f32_to_f16_neon"); }
void ssm_scan_neon(const SsmScanArgs&, int64_t, int64_t) { absent("ssm_scan_neon"); }
void ssm2_scan_neon(const Ssm2ScanArgs&, int64_t, int64_t) { absent("ssm2_scan_neon"); }
void ssm2_scan_chunked_neon(const Ssm2ScanArgs&, int64_t, int64_t, int64_t, float*) {
  absent("ssm2_scan_chunked_neon");
}
void wkv7_neon(const Wkv7Args&, int64_t, int64_t) { absent("wkv7_neon"); }
void gated_delta_neon(const GatedDeltaArgs&, int64_t, int64_t) { absent("gated_delta_neon"); }
void wkv6_neon(const Wkv6Args&, int64_t, int64_t) { absent("wkv6_neon"); }

}  // namespace tern::attn
