// The "dotprod" kernel table: Armv8.2-A dot product (sdot), compiled with -march=armv8.2-a+dotprod.
// The kernels are neon_kernels.h's, at level 1.
#define TERN_ARM_LEVEL 1
#include "kernels/arm/neon_kernels.h"

namespace tern::kern {
namespace {
const KernelTable kTable = {"dotprod", arm_has_kernel, act_rows_layout, arm_quantize, arm_scratch_bytes, arm_gemm};
}  // namespace

const KernelTable& table_dotprod() { return kTable; }

}  // namespace tern::kern
