#pragma once
// Clocks and process memory figures used by every report (metrics are part of the product).
#include <chrono>
#include <cstdint>
#include <vector>

namespace tern {

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Peak resident set size of this process so far (VmHWM), in bytes; 0 if unknown.
int64_t peak_rss_bytes();
// Current resident set size (VmRSS), in bytes; 0 if unknown.
int64_t current_rss_bytes();

// Percentile by linear interpolation between closest ranks (numpy's default); 0 when empty.
double percentile(std::vector<double> values, double pct);
double mean(const std::vector<double>& values);

}  // namespace tern
