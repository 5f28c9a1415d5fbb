#include "core/stats.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace tern {
namespace {

int64_t read_status_kb(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  int64_t kb = 0;
  const size_t klen = std::strlen(key);
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, key, klen) == 0) {
      long long v = 0;
      if (std::sscanf(line + klen, " %lld", &v) == 1) kb = v;
      break;
    }
  }
  std::fclose(f);
  return kb * 1024;
}

}  // namespace

int64_t peak_rss_bytes() { return read_status_kb("VmHWM:"); }
int64_t current_rss_bytes() { return read_status_kb("VmRSS:"); }

double percentile(std::vector<double> v, double pct) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double rank = pct / 100.0 * double(v.size() - 1);
  const size_t lo = static_cast<size_t>(rank);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  const double frac = rank - double(lo);
  return v[lo] + (v[hi] - v[lo]) * frac;
}

double mean(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  double s = 0;
  for (double x : v) s += x;
  return s / double(v.size());
}

}  // namespace tern
