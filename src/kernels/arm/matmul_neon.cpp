// The "neon" kernel table: Armv8-A NEON (every ARM64 CPU): widening multiplies for the integer sums.
// The kernels are neon_kernels.h's, at level 0.
#define TERN_ARM_LEVEL 0
#include "kernels/arm/neon_kernels.h"

namespace tern::kern {
namespace {
const KernelTable kTable = {"neon", arm_has_kernel, act_rows_layout, arm_quantize, arm_scratch_bytes, arm_gemm};
}  // namespace

const KernelTable& table_neon() { return kTable; }

}  // namespace tern::kern
