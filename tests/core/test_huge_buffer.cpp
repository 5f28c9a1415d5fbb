// alloc_huge_buffer: 2 MiB-aligned, writable over its whole length, freed by its deleter
// (ASan checks the pairing in the debug preset).
#include <gtest/gtest.h>

#include <cstring>

#include "core/huge_buffer.h"

namespace tern {
namespace {

TEST(HugeBuffer, AlignedAndWritable) {
  for (size_t bytes : {size_t(1), size_t(3) << 20, (size_t(4) << 20) + 17}) {
    HugeBuffer b = alloc_huge_buffer(bytes);
    ASSERT_NE(b.get(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.get()) % (uintptr_t(2) << 20), 0u);
    std::memset(b.get(), 0xAB, bytes);
    EXPECT_EQ(b.get()[bytes - 1], 0xAB);
  }
}

}  // namespace
}  // namespace tern
