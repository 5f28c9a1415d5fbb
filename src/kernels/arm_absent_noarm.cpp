// The ARM64 variants' entry points where they are not built (a target other than ARM64: CMake
// leaves out every *_neon.cpp / *_dotprod.cpp / *_i8mm.cpp there and compiles the *_noarm.cpp
// files instead). The dispatch names them in its tables, but isa_supported() says no to the ARM
// variants on such a CPU, so none of these is ever reached; each fails loudly if one were.
#include "core/error.h"
#include "kernels/kernel_iface.h"
#include "kernels/tern_int.h"

namespace tern::kern {

const KernelTable& table_neon() { fail("the NEON kernels are not built into this binary (not an ARM64 build)"); }
const KernelTable& table_dotprod() { fail("the dotprod kernels are not built into this binary (not an ARM64 build)"); }
const KernelTable& table_i8mm() { fail("the i8mm kernels are not built into this binary (not an ARM64 build)"); }
const TernIntRows& tern_int_rows_neon() {
  fail("the NEON tern-int kernels are not built into this binary (not an ARM64 build)");
}

}  // namespace tern::kern
