#pragma once
// The largest single operator-new request since the last reset (alloc_watch.cpp replaces the
// global operator new of the test binary). Lets tests assert that a corrupt count never turns
// into a huge up-front allocation.
#include <cstddef>

namespace tern::test {
void reset_largest_alloc();
size_t largest_alloc();
}  // namespace tern::test
