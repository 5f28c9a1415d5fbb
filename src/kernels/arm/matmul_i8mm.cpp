// The "i8mm" kernel table: Armv8.6-A int8 matrix multiply (smmla for pairs of tokens, sdot
// otherwise), compiled with -march=armv8.2-a+dotprod+i8mm.
// The kernels are neon_kernels.h's, at level 2.
#define TERN_ARM_LEVEL 2
#include "kernels/arm/neon_kernels.h"

namespace tern::kern {
namespace {
const KernelTable kTable = {"i8mm", arm_has_kernel, act_rows_layout, arm_quantize, arm_scratch_bytes, arm_gemm};
}  // namespace

const KernelTable& table_i8mm() { return kTable; }

}  // namespace tern::kern
