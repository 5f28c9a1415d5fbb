// The x86 compute probes where they are not built (see kernels/x86_absent_nox86.cpp): the
// probe table marks them missing on such a CPU, so none is ever run.
#include "core/error.h"
#include "tools/compute_probe.h"

namespace tern::detail {

namespace {
[[noreturn]] void absent(const char* what) { fail(what, " is not built into this binary (a non-x86 build)"); }
}  // namespace

float fma_chains_avx512(long, float) { absent("fma_chains_avx512"); }
float bf16_chains_avx512(long, float) { absent("bf16_chains_avx512"); }
float vnni_chains_avx512(long, float) { absent("vnni_chains_avx512"); }
float fma_chains_avx2(long, float) { absent("fma_chains_avx2"); }
float vnni_chains_avxvnni(long, float) { absent("vnni_chains_avxvnni"); }
float maddubs_chains_avx2(long, float) { absent("maddubs_chains_avx2"); }

}  // namespace tern::detail
