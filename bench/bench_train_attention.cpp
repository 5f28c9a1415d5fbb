// Microbenchmark of training attention (train/attention.h): forward and backward, the scalar
// references against the tiled kernels on 1 and 2 threads, for the training shapes
// (stories260K's head_dim 8 with GQA, head_dim 32 and 64).
//
// GFLOP/s counts the matrix products only, over the causal pairs (query, key <= query):
// forward 2 products (S = QK^T, O = PV), backward 5 (S again, dP = dO V^T, dV, dK, dQ),
// 2 * head_dim flops per pair and product. The exps are not counted.
// Usage: bench_train_attention [--isa ref,avx2,avx512] [--seconds 0.3] [--no-ref]
//   --isa: tiled variants to time (default: the selected one; TERN_FORCE_ISA applies).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "train/attention.h"
#include "train/attention_kernels.h"

using namespace tern;
using namespace tern::train;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds per call: repeats until min_seconds have passed (at least once), best of the runs.
template <class Fn>
double time_call(double min_seconds, Fn&& fn) {
  double best = 1e30, spent = 0.0;
  do {
    const double t0 = now_s();
    fn();
    const double dt = now_s() - t0;
    best = dt < best ? dt : best;
    spent += dt;
  } while (spent < min_seconds);
  return best;
}

struct BenchShape {
  int64_t n_seq, n_ctx, n_head, n_head_kv, head_dim;
};

}  // namespace

int main(int argc, char** argv) {
  double min_seconds = 0.3;
  bool with_ref = true;
  std::vector<Isa> variants = {selected_isa()};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      min_seconds = std::atof(argv[++i]);
    } else if (a == "--no-ref") {
      with_ref = false;
    } else if (a == "--isa" && i + 1 < argc) {
      variants.clear();
      std::string list = argv[++i];
      size_t p = 0;
      while (p <= list.size()) {
        const size_t q = list.find(',', p);
        const std::string name = list.substr(p, q == std::string::npos ? std::string::npos : q - p);
        if (name == "ref") variants.push_back(Isa::Ref);
        else if (name == "avx2") variants.push_back(Isa::Avx2);
        else if (name == "avx512") variants.push_back(Isa::Avx512);
        else {
          std::fprintf(stderr, "unknown variant %s\n", name.c_str());
          return 2;
        }
        if (q == std::string::npos) break;
        p = q + 1;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--isa ref,avx2,avx512] [--seconds S] [--no-ref]\n", argv[0]);
      return 2;
    }
  }
  for (Isa isa : variants)
    if (!isa_supported(isa)) {
      std::fprintf(stderr, "this CPU cannot run the %s variant\n", isa_name(isa));
      return 2;
    }

  const BenchShape shapes[] = {{8, 256, 8, 4, 8}, {8, 256, 8, 8, 32}, {4, 512, 8, 8, 64}};
  ThreadPool pool2(2);
  std::printf("%-26s %-6s %-12s %7s %10s %9s\n", "shape", "pass", "kernel", "threads", "ms", "GFLOP/s");
  for (const BenchShape& b : shapes) {
    AttentionShape s;
    s.n_seq = b.n_seq;
    s.n_ctx = b.n_ctx;
    s.n_head = b.n_head;
    s.n_head_kv = b.n_head_kv;
    s.head_dim = b.head_dim;
    s.scale = 1.0f / std::sqrt(float(b.head_dim));
    const size_t nq = size_t(b.n_seq * b.n_ctx * b.n_head * b.head_dim);
    const size_t nkv = size_t(b.n_seq * b.n_ctx * b.n_head_kv * b.head_dim);
    const size_t nl = size_t(b.n_seq * b.n_ctx * b.n_head);
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    auto random = [&](size_t n) {
      std::vector<float> x(n);
      for (auto& e : x) e = dist(rng);
      return x;
    };
    const std::vector<float> q = random(nq), k = random(nkv), v = random(nkv), d_o = random(nq);
    std::vector<float> o(nq), lse(nl), dq(nq), dk(nkv), dv(nkv);
    attention_forward(nullptr, s, q.data(), k.data(), v.data(), o.data(), lse.data());

    const double pairs = double(b.n_seq * b.n_head) * double(b.n_ctx) * double(b.n_ctx + 1) / 2.0;
    const double fwd_flops = 2.0 * 2.0 * double(b.head_dim) * pairs;
    const double bwd_flops = 5.0 * 2.0 * double(b.head_dim) * pairs;
    char name[64];
    std::snprintf(name, sizeof name, "%lldx%lld h%lld/%lld d%lld", (long long)b.n_seq, (long long)b.n_ctx,
                  (long long)b.n_head, (long long)b.n_head_kv, (long long)b.head_dim);
    auto row = [&](const char* pass, const char* kernel, int threads, double sec, double flops) {
      std::printf("%-26s %-6s %-12s %7d %10.3f %9.2f\n", name, pass, kernel, threads, sec * 1e3, flops / sec * 1e-9);
    };

    if (with_ref) {
      // The references run once: they are scalar double loops, far slower than the tiles.
      row("fwd", "reference", 1, time_call(0.0, [&] {
            attention_forward_ref(s, q.data(), k.data(), v.data(), o.data(), lse.data());
          }), fwd_flops);
      row("bwd", "reference", 1, time_call(0.0, [&] {
            attention_backward_ref(s, q.data(), k.data(), v.data(), o.data(), lse.data(), d_o.data(), dq.data(),
                                   dk.data(), dv.data());
          }), bwd_flops);
    }
    for (Isa isa : variants) {
      char kernel[32];
      std::snprintf(kernel, sizeof kernel, "tiled/%s", isa_name(isa));
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2}) {
        const int threads = pool ? pool->size() : 1;
        row("fwd", kernel, threads, time_call(min_seconds, [&] {
              detail::attention_forward_isa(isa, pool, s, q.data(), k.data(), v.data(), o.data(), lse.data());
            }), fwd_flops);
      }
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2}) {
        const int threads = pool ? pool->size() : 1;
        row("bwd", kernel, threads, time_call(min_seconds, [&] {
              detail::attention_backward_isa(isa, pool, s, q.data(), k.data(), v.data(), o.data(), lse.data(),
                                             d_o.data(), dq.data(), dk.data(), dv.data());
            }), bwd_flops);
      }
    }
  }
  return 0;
}
