#pragma once
// A large byte buffer for weights the loader rewrites (repacked layouts), aligned to 2 MiB and
// a whole number of 2 MiB, so that it can be backed by transparent huge pages: with
// TERN_HUGEPAGES=1 it is madvise(MADV_HUGEPAGE)d (Debian's THP mode is "madvise"). Not by
// default: the kernel then compacts memory to find huge pages while the loader first writes the
// buffer (defrag "madvise"). TinyLlama Q8_0, load and one token, 8 alternating runs each after a
// 2.2 GB file was read: 1.2-4.9 s (median 2.7) with huge pages, 0.9-3.5 s (median 1.3) without;
// decode showed no gain beyond the machine's noise (tg32 medians 30.9 vs 40.5 tok/s with 4 KiB
// pages, 3 rounds; an earlier session measured +2% in 4 pairs). Not zeroed.
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
