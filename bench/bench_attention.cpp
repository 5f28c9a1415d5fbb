// Microbenchmark of the attention kernels on a TinyLlama shape (32 query heads, 4 KV heads,
// head_dim 64) for the scalar reference and each tiled ISA variant this CPU runs, with K/V
// stored as f32, as f16 (IEEE half, widened as loaded) and as q8_0 blocks (dequantized as loaded):
//   prefill: n new tokens over an empty cache (causal), GFLOP/s counting 4 * head_dim flops
//            per (query row, visible key) pair (QK^T and PV);
//   decode:  1 token over a cache of n positions, microseconds per call.
// Usage: bench_attention [--threads N] [--tokens 512] [--head-dim 64] [--heads 32] [--kv-heads 4]
//                        [--seconds 0.5]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "ops/ops.h"
#include "quant/quant_traits.h"

using namespace tern;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <class Fn>
double median_seconds(Fn&& fn, double budget) {
  fn();  // warm-up
  std::vector<double> t;
  const double start = now_s();
  while (t.size() < 3 || (now_s() - start < budget && t.size() < 1000)) {
    const double t0 = now_s();
    fn();
    t.push_back(now_s() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = default_thread_count();
  int64_t n = 512, hd = 64, n_head = 32, n_head_kv = 4;
  double seconds = 0.5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--threads") threads = std::atoi(v);
    else if (a == "--tokens") n = std::atoll(v);
    else if (a == "--head-dim") hd = std::atoll(v);
    else if (a == "--heads") n_head = std::atoll(v);
    else if (a == "--kv-heads") n_head_kv = std::atoll(v);
    else if (a == "--seconds") seconds = std::atof(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (n < 1 || hd < 1 || n_head_kv < 1 || n_head % n_head_kv != 0) {
    std::fprintf(stderr, "bad shape\n");
    return 2;
  }
  ThreadPool pool(threads);
  const int64_t E = n_head * hd, Ekv = n_head_kv * hd;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> q(size_t(n * E)), out(size_t(n * E)), k(size_t(n * Ekv)), v(size_t(n * Ekv));
  for (auto* b : {&q, &k, &v})
    for (auto& x : *b) x = dist(rng);
  std::vector<uint16_t> k16(k.size()), v16(v.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k16[i] = f32_to_fp16(k[i]);
    v16[i] = f32_to_fp16(v[i]);
  }
  // q8_0 rows: llama.cpp's block_q8_0, the K/V arena's layout (ops/attention_iface.h).
  const QuantTraits& q8 = *quant_traits(DType::Q8_0);
  const int64_t q8_row = Ekv / 32 * q8.block_bytes;
  std::vector<uint8_t> k8, v8;
  if (Ekv % 32 == 0) {
    k8.resize(size_t(n * q8_row));
    v8.resize(size_t(n * q8_row));
    for (int64_t p = 0; p < n; ++p) {
      q8.from_float(k.data() + p * Ekv, k8.data() + p * q8_row, Ekv);
      q8.from_float(v.data() + p * Ekv, v8.data() + p * q8_row, Ekv);
    }
  }
  std::vector<int32_t> slots(static_cast<size_t>(n));
  for (int64_t p = 0; p < n; ++p) slots[size_t(p)] = int32_t(p);
  const float scale = 1.0f / std::sqrt(float(hd));

  std::printf("attention, %lld heads / %lld KV heads, head_dim %lld, %d threads\n", (long long)n_head,
              (long long)n_head_kv, (long long)hd, threads);
  std::printf("| variant | K/V | prefill %lld ms | prefill GFLOP/s | decode @%lld us |\n", (long long)n, (long long)n);
  std::printf("|---|---|--:|--:|--:|\n");
  const double flops = 4.0 * double(hd) * double(n_head) * double(n) * double(n + 1) / 2.0;
  for (Isa isa : {Isa::Ref, Isa::Avx2, Isa::Avx512}) {
    if (!isa_supported(isa)) continue;
    for (KvType kt : {KvType::F32, KvType::F16, KvType::Q8_0}) {
      if (kt == KvType::Q8_0 && (k8.empty() || hd % 8 != 0)) continue;  // (rows of whole blocks, 8-element pieces)
      const bool h = kt == KvType::F16;
      const void* kb = kt == KvType::Q8_0 ? static_cast<const void*>(k8.data()) : h ? static_cast<const void*>(k16.data()) : k.data();
      const void* vb = kt == KvType::Q8_0 ? static_cast<const void*>(v8.data()) : h ? static_cast<const void*>(v16.data()) : v.data();
      std::vector<AttentionArgs> pre{AttentionArgs{q.data(), E, out.data(), E, kb, vb, Ekv, slots.data(), 0, n,
                                                   n_head, n_head_kv, hd, scale, kt}};
      const double tp = median_seconds([&] { attention_isa(isa, pre, pool); }, seconds);
      std::vector<AttentionArgs> dec{AttentionArgs{q.data(), E, out.data(), E, kb, vb, Ekv, slots.data(), n - 1, 1,
                                                   n_head, n_head_kv, hd, scale, kt}};
      const double td = median_seconds([&] { attention_isa(isa, dec, pool); }, seconds);
      std::printf("| %s | %s | %.2f | %.1f | %.1f |\n", isa_name(isa), kt == KvType::Q8_0 ? "q8_0" : h ? "f16" : "f32", tp * 1e3,
                  flops / tp * 1e-9, td * 1e6);
    }
  }
  return 0;
}
