// The kernel variants: what this CPU can run (cpuid on x86-64, the hwcaps on ARM64), which one
// runs (the best, or TERN_FORCE_ISA's), their names and kernel tables.
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "kernels/dispatch_internal.h"
#include "kernels/kernel_iface.h"
#include "kernels/matmul.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace tern {

using kern::KernelTable;
using kern::table_of;

namespace {

bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

// ARM64 features from the kernel's hwcaps (the bits of <asm/hwcap.h>, spelled out so that the
// build does not depend on how recent the installed headers are): AdvSIMD is part of every ARM64
// CPU; sdot is HWCAP_ASIMDDP (bit 20 of AT_HWCAP), smmla HWCAP2_I8MM (bit 13 of AT_HWCAP2).
bool cpu_has_arm_dotprod() {
#if defined(__aarch64__) && defined(__linux__)
  return (getauxval(AT_HWCAP) >> 20) & 1;
#else
  return false;
#endif
}
bool cpu_has_arm_i8mm() {
#if defined(__aarch64__) && defined(__linux__)
  return cpu_has_arm_dotprod() && ((getauxval(AT_HWCAP2) >> 13) & 1);
#else
  return false;
#endif
}

}  // namespace

const KernelTable& kern::table_of(Isa isa) {
  switch (isa) {
    case Isa::Avx2: return kern::table_avx2();
    case Isa::Avx512: return kern::table_avx512();
    case Isa::Neon: return kern::table_neon();
    case Isa::Dotprod: return kern::table_dotprod();
    case Isa::I8mm: return kern::table_i8mm();
    default: return kern::table_ref();
  }
}

namespace {

// What a variant needs of the CPU, for the refusal of a forced one.
const char* isa_requirement(Isa isa) {
  switch (isa) {
    case Isa::Avx2: return "needs AVX2, FMA and F16C";
    case Isa::Avx512: return "needs AVX-512 F, BW, VL, DQ and VNNI";
    case Isa::Neon: return "needs an ARM64 CPU";
    case Isa::Dotprod: return "needs an ARM64 CPU with the dot product instructions (asimddp)";
    case Isa::I8mm: return "needs an ARM64 CPU with the int8 matrix multiply instructions (i8mm)";
    default: return "";
  }
}

Isa resolve_isa() {
  // TERN_BF16_DOT is read where a BF16 matmul first asks (kern::bf16_dot_enabled); a value it
  // does not know is refused here, where the kernel variant is chosen, at start-up.
  if (const char* dot = std::getenv("TERN_BF16_DOT"); dot && *dot) {
    const std::string v = dot;
    if (v != "0" && v != "1")
      fail("TERN_BF16_DOT=", v, ": expected 0 (BF16 weights by the FMA tiles) or 1 (by vdpbf16ps where the CPU has it)");
  }
  Isa best = Isa::Ref;  // the last supported in each family's order of preference
  for (Isa i : {Isa::Avx2, Isa::Avx512, Isa::Neon, Isa::Dotprod, Isa::I8mm})
    if (isa_supported(i)) best = i;
  const char* env = std::getenv("TERN_FORCE_ISA");
  if (!env || !*env) return best;
  const std::string v = env;
  Isa forced = Isa::Ref;
  bool known = false;
  for (Isa i : kAllIsas)
    if (v == isa_name(i)) {
      forced = i;
      known = true;
    }
  if (!known)
    fail("TERN_FORCE_ISA=", v, ": unknown kernel variant (expected ref, avx2, avx512, neon, dotprod or i8mm)");
  if (!isa_supported(forced))
    fail("TERN_FORCE_ISA=", v, ": this CPU cannot run the ", v, " kernels (", isa_requirement(forced),
         "; best available: ", isa_name(best), ")");
  return forced;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Neon: return "neon";
    case Isa::Dotprod: return "dotprod";
    case Isa::I8mm: return "i8mm";
    default: return "ref";
  }
}

bool isa_supported(Isa isa) {
  static const bool avx2 = cpu_has_avx2();
  static const bool avx512 = cpu_has_avx512();
  static const bool dotprod = cpu_has_arm_dotprod();
  static const bool i8mm = cpu_has_arm_i8mm();
  switch (isa) {
    case Isa::Avx2: return avx2;
    case Isa::Avx512: return avx512;
#if defined(__aarch64__)
    case Isa::Neon: return true;
#else
    case Isa::Neon: return false;
#endif
    case Isa::Dotprod: return dotprod;
    case Isa::I8mm: return i8mm;
    default: return true;
  }
}

Isa selected_isa() {
  static const Isa isa = resolve_isa();  // a throw leaves it unset: the next call re-reads
  return isa;
}

const char* active_isa() { return isa_name(selected_isa()); }

bool isa_bf16_dot(Isa isa, DType type, int64_t n_in) {
  return isa == Isa::Avx512 && type == DType::BF16 && n_in % 2 == 0 && isa_supported(Isa::Avx512) &&
         kern::bf16_dot_enabled();
}

namespace kern {
bool bf16_dot_enabled() {
  static const bool on = [] {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) return false;
    const char* e = std::getenv("TERN_BF16_DOT");
    if (e && std::string(e) == "0") return false;
    if (e && std::string(e) == "1") return true;
    // By default where it is the faster: `tern bench --roofline` measured vdpbf16ps at twice
    // the FMA's flops on AMD Zen 5 (818-857 against 428-435 GFLOP/s, 2 threads; TinyLlama BF16
    // pp128 271 tok/s against 144 by the FMA tiles) and at half of them on an Intel Xeon with
    // AVX512-FP16 (170-180 against 333-366; pp128 69-77 against 100-114 by the FMA tiles).
    return !__builtin_cpu_is("intel");
#else
    return false;
#endif
  }();
  return on;
}
}  // namespace kern

bool isa_has_kernel(Isa isa, DType type) { return table_of(isa).has_kernel(type); }

}  // namespace tern
