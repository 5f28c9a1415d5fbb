#pragma once
// What the AVX2 and AVX-512 sparse FFN kernels share (sparse_ffn_avx2.cpp, sparse_ffn_avx512.cpp):
// the row formats' block sizes and the prefetch of gathered rows. SSE only: each file includes
// it whatever its own ISA flags.
//
// Gathered rows defeat the hardware prefetcher at each jump, so the row kPrefetchAhead indices
// on (the axpy: row group) is requested into L2 while this one is read, a line or so per step
// of the loop (issued all at once, a row's 18-34 prefetches wait for fill buffers: measured
// slower on the AVX-512 variant). Prefetches never fault.
#include <cstdint>

#include "core/dtype.h"
#include "kernels/x86/simd.h"  // <immintrin.h>, with GCC 12's false uninitialized warnings off

namespace tern::kern::sparse_ffn_rows {

constexpr int64_t kQ8Bytes = 34, kQ4Bytes = 18;
constexpr int64_t kPrefetchAhead = 2;
inline void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1); }
inline void prefetch_row(const uint8_t* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) prefetch(p + o);
}

// The bytes of a row the kernels read (row_bytes may hold padding past them).
inline int64_t used_bytes(DType t, int64_t n) {
  switch (t) {
    case DType::F32: return 4 * n;
    case DType::F16: return 2 * n;
    case DType::Q8_0: return n / 32 * kQ8Bytes;
    default: return n / 32 * kQ4Bytes;
  }
}

}  // namespace tern::kern::sparse_ffn_rows
