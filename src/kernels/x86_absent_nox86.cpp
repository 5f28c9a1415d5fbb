// The x86 variants' entry points where they are not built (a non-x86 target: CMake leaves out
// every *_avx2.cpp / *_avx512.cpp there and compiles the *_nox86.cpp files instead). The
// dispatch names them in its tables, but isa_supported() says no to Avx2 / Avx512 on such a
// CPU, so none of these is ever reached; each fails loudly if one were.
#include "core/error.h"
#include "kernels/kernel_iface.h"
#include "kernels/tern_int.h"

namespace tern::kern {

const KernelTable& table_avx2() { fail("the AVX2 kernels are not built into this binary (a non-x86 build)"); }
const KernelTable& table_avx512() { fail("the AVX-512 kernels are not built into this binary (a non-x86 build)"); }
const TernIntRows& tern_int_rows_avx2() {
  fail("the AVX2 tern-int kernels are not built into this binary (a non-x86 build)");
}
const TernIntRows& tern_int_rows_avx512() {
  fail("the AVX-512 tern-int kernels are not built into this binary (a non-x86 build)");
}

}  // namespace tern::kern
