// Throughput of train/gemm on the products one training step runs, for the scalar reference
// and each SIMD variant this CPU can run, on 1 thread and on a pool of --threads (default 2):
//   fwd     Y = X W^T     M = tokens,   N = out features, K = in features, trans_a = false
//   dX      dX = dY W     M = tokens,   N = in features,  K = out features
//   dW      dW += dY^T X  M = features, N = features,     K = tokens,       trans_a = true
// GFLOP/s counts 2 M N K over the fastest run. The reference is slow (a naive loop), so it
// runs on the first shape only unless --ref is given; --shape M,N,K,T measures one product
// (T: 1 for trans_a) instead of the list.
// Usage: bench_train_gemm [--threads N] [--seconds 0.3] [--ref] [--cpu] [--json] [--shape M,N,K,T]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "train/gemm.h"
#include "train/gemm_kernels.h"

using namespace tern;

namespace {

// --cpu: the calling thread's CPU time instead of the wall clock, for a single-thread figure
// on a machine others are using (time spent preempted is not counted).
bool g_cpu_time = false;

double now_s() {
  if (g_cpu_time) {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The fastest of the runs: on a shared machine the slower ones measure the neighbours.
template <class Fn>
double best_seconds(Fn&& fn, double budget, int min_runs) {
  fn();  // warm-up: caches, page faults, the pool's threads
  std::vector<double> t;
  const double start = now_s();
  while (int(t.size()) < min_runs || (now_s() - start < budget && t.size() < 1000)) {
    const double t0 = now_s();
    fn();
    t.push_back(now_s() - t0);
  }
  return *std::min_element(t.begin(), t.end());
}

struct Shape {
  const char* name;
  int64_t M, N, K;
  bool trans_a;
};

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  double seconds = 0.3;
  bool json = false, all_ref = false, have_custom = false;
  Shape custom{};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::max(1, std::atoi(argv[++i]));
    else if (a == "--seconds" && i + 1 < argc) seconds = std::atof(argv[++i]);
    else if (a == "--json") json = true;
    else if (a == "--ref") all_ref = true;
    else if (a == "--cpu") g_cpu_time = true;
    else if (a == "--shape" && i + 1 < argc) {
      long long m, n, k;
      int t;
      if (std::sscanf(argv[++i], "%lld,%lld,%lld,%d", &m, &n, &k, &t) != 4) {
        std::fprintf(stderr, "--shape wants M,N,K,T\n");
        return 2;
      }
      custom = {"custom", m, n, k, t != 0};
      have_custom = true;
    }
    else {
      std::fprintf(stderr, "usage: bench_train_gemm [--threads N] [--seconds S] [--ref] [--cpu] [--json] [--shape M,N,K,T]\n");
      return 2;
    }
  }
  const std::vector<Shape> listed = {
      {"fwd", 512, 512, 512, false},     {"fwd", 2048, 1376, 512, false}, {"dX", 2048, 512, 1376, false},
      {"dW", 512, 1376, 2048, true},     {"dW", 1376, 512, 2048, true},   {"fwd odd", 1000, 172, 688, false},
      {"dW odd", 172, 688, 1000, true},
  };
  const std::vector<Shape> shapes = have_custom ? std::vector<Shape>{custom} : listed;
  ThreadPool one(1), many(threads);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);

  if (json) std::printf("[\n");
  else
    std::printf("%-8s %5s %5s %5s %-5s %-7s %12s %12s\n", "shape", "M", "N", "K", "tr_a", "isa", "GF/s 1t",
                ("GF/s " + std::to_string(threads) + "t").c_str());
  bool first_row = true;
  for (size_t s = 0; s < shapes.size(); ++s) {
    const Shape& sh = shapes[s];
    const int64_t a_rows = sh.trans_a ? sh.K : sh.M, a_cols = sh.trans_a ? sh.M : sh.K;
    std::vector<float> a(size_t(a_rows * a_cols)), b(size_t(sh.K * sh.N)), c(size_t(sh.M * sh.N));
    for (float& x : a) x = u(rng);
    for (float& x : b) x = u(rng);
    const double flops = 2.0 * double(sh.M) * double(sh.N) * double(sh.K);
    for (Isa isa : {Isa::Ref, Isa::Avx2, Isa::Avx512}) {
      if (!isa_supported(isa) || (isa == Isa::Ref && s > 0 && !all_ref)) continue;
      double gflops[2];
      ThreadPool* pools[2] = {&one, &many};
      for (int p = 0; p < 2; ++p) {
        auto run = [&] {
          train::detail::gemm_isa(isa, pools[p], sh.trans_a, sh.M, sh.N, sh.K, a.data(), a_cols, b.data(), sh.N,
                                  c.data(), sh.N, false);
        };
        const bool slow = isa == Isa::Ref;
        gflops[p] = flops / best_seconds(run, slow ? 0.0 : seconds, slow ? 1 : 3) * 1e-9;
      }
      if (json) {
        std::printf("%s  {\"shape\": \"%s\", \"M\": %lld, \"N\": %lld, \"K\": %lld, \"trans_a\": %s, \"isa\": \"%s\", "
                    "\"gflops_1t\": %.2f, \"threads\": %d, \"gflops_nt\": %.2f}",
                    first_row ? "" : ",\n", sh.name, (long long)sh.M, (long long)sh.N, (long long)sh.K,
                    sh.trans_a ? "true" : "false", isa_name(isa), gflops[0], threads, gflops[1]);
      } else {
        std::printf("%-8s %5lld %5lld %5lld %-5s %-7s %12.1f %12.1f\n", sh.name, (long long)sh.M, (long long)sh.N,
                    (long long)sh.K, sh.trans_a ? "yes" : "no", isa_name(isa), gflops[0], gflops[1]);
      }
      first_row = false;
      std::fflush(stdout);
    }
  }
  if (json) std::printf("\n]\n");
  return 0;
}
