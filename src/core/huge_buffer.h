#pragma once
// A large byte buffer for weights the loader rewrites (repacked layouts), backed by 2 MiB
// pages where the kernel allows it (transparent huge pages on request, the Debian default
// "madvise" mode). Decode streams every weight byte once per token: with 4 KiB pages that is
// a TLB miss per 4 KiB, and on a VM each miss walks two page tables. Measured on the 2-vCPU
// VM, TinyLlama Q8_0 tg32: +1 to +10% (median of 4 alternating pairs +2%); never slower
// beyond noise. Not zeroed.
#include <cstddef>
#include <cstdint>
#include <memory>

namespace tern {

struct FreeHugeBuffer {
  void operator()(uint8_t* p) const;
};
using HugeBuffer = std::unique_ptr<uint8_t, FreeHugeBuffer>;

// Throws std::bad_alloc when the memory is not there.
HugeBuffer alloc_huge_buffer(size_t bytes);

}  // namespace tern
