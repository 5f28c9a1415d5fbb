#pragma once
// Helpers of the quantized-format tests (tests/kernels, tests/compress): random weights and
// activations, BILLM rows decoded, and the kernel variants this CPU runs. Header-only, so that
// the kernel tests, which link only the lower layers, can use it too.
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/matmul.h"
#include "quant/quant_billm.h"

namespace tern::testing {

// n samples of N(0, scale^2), reproducible from seed.
inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Laplace-like heavy tails (a normal times two exponentials): where BiLLM's split and salient
// columns help, and its encoders pick salient columns.
inline std::vector<float> heavy(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::exponential_distribution<float> ed(1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng) * ed(rng) * ed(rng);
  return v;
}

// n_out rows of a BILLM_G* weight (row after row) decoded to floats [n_out, n_in].
inline std::vector<float> billm_decode_rows(DType t, const std::vector<uint8_t>& bytes, int64_t n_out, int64_t n_in) {
  std::vector<float> v(size_t(n_out * n_in));
  const int64_t rb = dtype_row_bytes(t, n_in);
  for (int64_t o = 0; o < n_out; ++o) billm_decode(billm_format(t), bytes.data() + o * rb, v.data() + o * n_in, n_in);
  return v;
}

// The kernel variants (kAllIsas) this CPU supports, the reference first.
inline std::vector<Isa> supported_isas() {
  std::vector<Isa> v;
  for (Isa isa : kAllIsas)
    if (isa_supported(isa)) v.push_back(isa);
  return v;
}

}  // namespace tern::testing
