// Microbenchmark of the matmul kernels on a TinyLlama FFN weight (n_in 2048 x n_out 5632) in
// every weight type, for the reference and each ISA variant this CPU runs:
//   GEMV (decode, 1 token): median time per call and effective bandwidth = weight bytes / time. The
//     weight is cycled through enough copies (> 256 MB) that it streams from DRAM as a real
//     model's layers do, instead of sitting in L3.
//   GEMM (prefill, 128 tokens): GFLOP/s (2 * n_in * n_out * n_tokens / time) and the time per
//     token relative to the GEMV.
//   --sweep N_LAYERS: instead, decode's whole weight stream (TinyLlama's layers, see below) per
//     variant, alternating, against plain sums of the same bytes (--isa sum,avx512,avx512i).
// Usage: bench_matmul [--threads N] [--types q4_0,q8_0,...] [--isa ref,avx2,avx2i,avx512,avx512i]
//                     [--tokens 128] [--seconds 0.5] [--sweep 22] [--shape N_IN,N_OUT]
// --shape: the GEMV / GEMM matrix instead of TinyLlama's FFN (e.g. 896,4864 for Qwen2.5-0.5B's).
// avx2i / avx512i: the AVX2 / AVX-512 kernels on weights interleaved by 16 rows, as models load
// them (kernels/matmul.h; the types that variant reads so: Q4_0, Q8_0, Q4_1, Q5_0, Q5_1, Q4_K,
// Q5_K, MXFP4, the float types, Q6_K for avx2i, Q2_K, Q3_K, TQ1_0, TQ2_0 for avx512i; others are
// skipped).
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "quant/quant_traits.h"

using namespace tern;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t p = 0;
  while (p <= s.size()) {
    const size_t q = s.find(',', p);
    out.push_back(s.substr(p, q == std::string::npos ? std::string::npos : q - p));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int n_threads = 2;
  int64_t n_tok = 128;
  double min_seconds = 0.5;
  int sweep_layers = 0;
  std::vector<std::string> types = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "mxfp4"};
  std::vector<std::string> isas = {"ref", "avx2", "avx2i", "avx512", "avx512i"};
  std::vector<std::string> shape = {"2048", "5632"};
  if (argc % 2 == 0) {
    std::fprintf(stderr, "%s needs a value\n", argv[argc - 1]);
    return 2;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") n_threads = std::atoi(argv[i + 1]);
    else if (a == "--types") types = split(argv[i + 1]);
    else if (a == "--isa") isas = split(argv[i + 1]);
    else if (a == "--tokens") n_tok = std::atoll(argv[i + 1]);
    else if (a == "--seconds") min_seconds = std::atof(argv[i + 1]);
    else if (a == "--sweep") sweep_layers = std::atoi(argv[i + 1]);
    else if (a == "--shape") shape = split(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  // A whole decimal number, or 0 (refused below).
  const auto dim = [&](size_t i) -> int64_t {
    int64_t v = 0;
    if (i >= shape.size()) return 0;
    const std::string& t = shape[i];
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    return ec == std::errc() && end == t.data() + t.size() ? v : 0;
  };
  const int64_t n_in = shape.size() == 2 ? dim(0) : 0, n_out = shape.size() == 2 ? dim(1) : 0;
  if (n_in <= 0 || n_out <= 0 || n_in % 32 != 0 || n_out % 16 != 0) {
    std::fprintf(stderr, "--shape N_IN,N_OUT: N_IN a positive multiple of 32, N_OUT of 16\n");
    return 2;
  }
  ThreadPool pool(n_threads);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> wf(size_t(n_in * n_out));
  for (auto& v : wf) v = dist(rng);
  std::vector<float> x(size_t(n_in * n_tok));
  for (auto& v : x) v = dist(rng) * 50;
  std::vector<float> y(size_t(n_out * n_tok));

  std::printf("matmul %lld x %lld (n_in x n_out), %d threads, GEMM n_tokens %lld\n",
              (long long)n_in, (long long)n_out, n_threads, (long long)n_tok);
  {
    // The GEMV ceiling: plain reads of 256 MB split over the pool, best of 5. On a shared
    // machine this moves with the neighbours' load, so it is printed next to the figures.
    const size_t n = size_t(32) << 20;  // uint64 words
    std::vector<uint64_t> buf(n, 1);
    double best = 1e30;
    uint64_t sink = 0;
    for (int rep = 0; rep < 5; ++rep) {
      std::vector<uint64_t> part(size_t(n_threads), 0);
      const double t0 = now_s();
      pool.parallel_for(int64_t(n), [&](int64_t b, int64_t e, int c) {
        uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;  // independent sums: bound by memory only
        int64_t i = b;
        for (; i + 4 <= e; i += 4) {
          a0 += buf[size_t(i)];
          a1 += buf[size_t(i + 1)];
          a2 += buf[size_t(i + 2)];
          a3 += buf[size_t(i + 3)];
        }
        for (; i < e; ++i) a0 += buf[size_t(i)];
        part[size_t(c)] = a0 + a1 + a2 + a3;
      });
      best = std::min(best, now_s() - t0);
      for (uint64_t p : part) sink += p;
    }
    std::printf("memory read bandwidth: %.1f GB/s (checksum %llu)\n", double(n * 8) / best / 1e9,
                (unsigned long long)sink);
  }
  if (sweep_layers > 0) {
    // Decode's weight stream without the rest of the forward pass: every layer's q/k/v, o,
    // gate/up and down of the TinyLlama shape, each kind in one buffer in the model's order,
    // for one token, as the model calls them (q/k/v and gate/up sharing their input). Each
    // --isa in turn, sweep after sweep, so that all share the machine's minutes: "avx512" the
    // rows as stored, "avx512i" interleaved where that ISA reads them so, "sum" plain 8-byte
    // sums over the same bytes with the same split into chunks (what the weights' stream could be).
    const int64_t E = 2048, Ekv = 256, F = 5632;
    for (const auto& tn : types) {
      const auto type = dtype_from_name(tn);
      if (!type || !quant_traits(*type)) continue;
      const QuantTraits& q = *quant_traits(*type);
      struct Variant {
        std::string name;
        Isa isa;
        bool interleaved, sum;
      };
      std::vector<Variant> variants;
      for (const auto& in : isas) {
        const bool sum = in == "sum";
        const Isa isa = sum || in.rfind("avx512", 0) == 0 ? Isa::Avx512 : in.rfind("avx2", 0) == 0 ? Isa::Avx2 : Isa::Ref;
        if (!sum && !isa_supported(isa)) continue;
        variants.push_back({in, isa, !sum && in.back() == 'i', sum});
      }
      // Offsets of every matrix in a buffer (64-byte aligned each, as the model's arena).
      std::vector<std::pair<int64_t, int64_t>> shapes;  // (n_in, n_out)
      std::vector<size_t> offsets;
      size_t total = 0;
      for (int il = 0; il < sweep_layers; ++il)
        for (auto sh : {std::pair{E, E}, {E, Ekv}, {E, Ekv}, {E, E}, {E, F}, {E, F}, {F, E}}) {
          shapes.push_back(sh);
          offsets.push_back(total);
          total += size_t(dtype_row_bytes(*type, sh.first) * sh.second + 63) / 64 * 64;
        }
      std::vector<uint8_t> src(size_t(dtype_row_bytes(*type, F) * F));
      struct Buffer {
        Isa isa;
        bool interleaved;
        uint8_t* data;
        std::vector<WeightView> ws;
      };
      std::vector<Buffer> buffers;  // one per layout (stored, interleaved for an ISA)
      const auto buffer_of = [&](const Variant& v) -> Buffer& {
        for (Buffer& b : buffers)
          if (b.interleaved == v.interleaved && (!v.interleaved || b.isa == v.isa)) return b;
        buffers.push_back({v.isa, v.interleaved, static_cast<uint8_t*>(std::aligned_alloc(4096, (total + 4095) / 4096 * 4096)), {}});
        return buffers.back();
      };
      for (const Variant& v : variants) buffer_of(v);
      for (size_t m = 0; m < shapes.size(); ++m) {
        const auto [ni, no] = shapes[m];
        const int64_t rb = dtype_row_bytes(*type, ni);
        for (int64_t o = 0; o < no; ++o) q.from_float(wf.data() + (o % 2048) * 2048, src.data() + o * rb, ni);
        const WeightView sw{*type, ni, no, src.data()};
        for (Buffer& b : buffers) {
          WeightView w{*type, ni, no, b.data + offsets[m]};
          if (b.interleaved && interleave16_for(b.isa, sw)) {
            interleave16(sw, b.data + offsets[m]);
            w.interleaved16 = true;
          } else {
            std::memcpy(b.data + offsets[m], src.data(), size_t(rb * no));
          }
          b.ws.push_back(w);
        }
      }
      std::vector<float> xs(static_cast<size_t>(F)), ya(xs.size()), yb(xs.size()), yc(xs.size());
      for (auto& v : xs) v = dist(rng);
      std::vector<uint64_t> part(size_t(n_threads) * 8, 0);
      const auto sweep = [&](const Variant& v) {
        const std::vector<WeightView>& ws = buffer_of(v).ws;
        const double t0 = now_s();
        if (v.sum) {
          for (const WeightView& w : ws) {
            const auto* p = reinterpret_cast<const uint64_t*>(w.data);
            const int64_t n_words = dtype_row_bytes(*type, w.n_in) * w.n_out / 8;
            const int64_t n_chunks = 4 * n_threads;  // as matmul splits rows
            const int64_t per = (n_words + n_chunks - 1) / n_chunks;
            pool.for_chunks(n_chunks, [&](int64_t ch, int c) {
              const int64_t b = ch * per, e = std::min(n_words, b + per);
              uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
              int64_t i = b;
              for (; i + 8 <= e; i += 8) {
                a0 += p[i]; a1 += p[i + 1]; a2 += p[i + 2]; a3 += p[i + 3];
                a4 += p[i + 4]; a5 += p[i + 5]; a6 += p[i + 6]; a7 += p[i + 7];
              }
              part[size_t(c) * 8] += a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
            });
          }
          return now_s() - t0;
        }
        for (size_t m = 0; m < ws.size(); m += 7) {
          const MatmulTarget qkv[3] = {{ws[m], ya.data(), E}, {ws[m + 1], yb.data(), Ekv}, {ws[m + 2], yc.data(), Ekv}};
          matmul_shared_input_isa(v.isa, qkv, xs.data(), E, 1, pool);
          matmul_isa(v.isa, ws[m + 3], xs.data(), E, 1, ya.data(), E, pool);
          const MatmulTarget gu[2] = {{ws[m + 4], ya.data(), F}, {ws[m + 5], yb.data(), F}};
          matmul_shared_input_isa(v.isa, gu, xs.data(), E, 1, pool);
          matmul_isa(v.isa, ws[m + 6], xs.data(), F, 1, ya.data(), E, pool);
        }
        return now_s() - t0;
      };
      for (const Variant& v : variants) sweep(v);  // warm-up: first touch, thread start
      std::vector<std::vector<double>> times(variants.size());
      const double t_start = now_s();
      do {
        for (size_t i = 0; i < variants.size(); ++i) times[i].push_back(sweep(variants[i]));
      } while (now_s() - t_start < min_seconds * double(variants.size()) * 4);
      for (size_t i = 0; i < variants.size(); ++i) {
        auto& t = times[i];
        std::sort(t.begin(), t.end());
        std::printf("sweep %-5s %-8s %d layers, %7.1f MB, %3zu sweeps: median %7.2f ms %6.2f GB/s (best %6.2f)\n",
                    tn.c_str(), variants[i].name.c_str(), sweep_layers, double(total) / 1e6, t.size(),
                    t[t.size() / 2] * 1e3, double(total) / t[t.size() / 2] / 1e9, double(total) / t[0] / 1e9);
      }
      std::fflush(stdout);
      for (Buffer& b : buffers) std::free(b.data);
    }
    return 0;
  }
  std::printf("%-6s %-7s %10s %9s %10s %10s %12s\n", "type", "isa", "gemv_us", "GB/s",
              "gemm_ms", "GFLOP/s", "gemm/tok vs gemv");
  for (const auto& tn : types) {
    const auto type = dtype_from_name(tn);
    if (!type || !quant_traits(*type)) {
      std::fprintf(stderr, "unknown type %s\n", tn.c_str());
      continue;
    }
    const QuantTraits& q = *quant_traits(*type);
    if (n_in % q.block_size != 0) {
      std::fprintf(stderr, "%s skipped: its blocks of %lld do not divide n_in %lld\n", tn.c_str(),
                   (long long)q.block_size, (long long)n_in);
      continue;
    }
    const int64_t rb = dtype_row_bytes(*type, n_in);
    const int64_t bytes = rb * n_out;
    const int n_copies = int(std::min<int64_t>(64, (int64_t(256) << 20) / bytes + 1));
    std::vector<std::vector<uint8_t>> copies(static_cast<size_t>(n_copies), std::vector<uint8_t>(static_cast<size_t>(bytes)));
    for (int64_t o = 0; o < n_out; ++o) q.from_float(wf.data() + o * n_in, copies[0].data() + o * rb, n_in);
    for (int c = 1; c < n_copies; ++c) copies[size_t(c)] = copies[0];

    for (const auto& in : isas) {
      Isa isa;
      if (in == "ref") isa = Isa::Ref;
      else if (in == "avx2" || in == "avx2i") isa = Isa::Avx2;
      else if (in == "avx512" || in == "avx512i") isa = Isa::Avx512;
      else continue;
      if (!isa_supported(isa)) continue;
      const bool want_i = in == "avx2i" || in == "avx512i";
      const bool interleaved = want_i && interleave16_for(isa, WeightView{*type, n_in, n_out, copies[0].data()});
      if (want_i && !interleaved) continue;
      std::vector<std::vector<uint8_t>> packed;  // the copies interleaved by 16 rows
      if (interleaved) {
        for (int c = 0; c < n_copies; ++c) {
          packed.emplace_back(size_t(bytes));
          interleave16(WeightView{*type, n_in, n_out, copies[size_t(c)].data()}, packed.back().data());
        }
      }
      auto run = [&](int c, int64_t nt) {
        WeightView w{*type, n_in, n_out, (interleaved ? packed : copies)[size_t(c)].data()};
        w.interleaved16 = interleaved;
        matmul_isa(isa, w, x.data(), n_in, nt, y.data(), n_out, pool);
      };
      run(0, 1);
      // GEMV: median of the per-call times over min_seconds (cycling copies).
      std::vector<double> times;
      double t_start = now_s();
      int c = 0;
      do {
        const double t0 = now_s();
        run(c, 1);
        times.push_back(now_s() - t0);
        c = (c + 1) % n_copies;
      } while (now_s() - t_start < min_seconds);
      std::sort(times.begin(), times.end());
      const double best = times[times.size() / 2];
      // GEMM: best of a few calls (weights reused across tokens, so no cycling needed).
      double best_mm = 1e30;
      t_start = now_s();
      int reps = 0;
      do {
        const double t0 = now_s();
        run(0, n_tok);
        best_mm = std::min(best_mm, now_s() - t0);
        ++reps;
      } while (now_s() - t_start < min_seconds && reps < 50);
      const double flops = 2.0 * double(n_in) * double(n_out) * double(n_tok);
      std::printf("%-6s %-7s %10.1f %9.2f %10.2f %10.1f %11.2fx\n", tn.c_str(), in.c_str(),
                  best * 1e6, double(bytes) / best / 1e9, best_mm * 1e3, flops / best_mm / 1e9,
                  best / (best_mm / double(n_tok)));
      std::fflush(stdout);
    }
  }
  return 0;
}
