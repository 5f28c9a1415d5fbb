// Causal GQA attention for training: the scalar references, the baseline build of the tiles
// (the Ref variant) and the dispatch of (sequence, kv head) units over the thread pool.
#include "train/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "train/attention_kernels.h"

// The baseline x86-64 build of the tiles (4-lane SSE2 vectors), in this file's own unnamed
// namespace like the ISA builds in theirs.
#include "train/attention_tile_impl.h"

namespace tern::train {

namespace detail {

int64_t attention_unit_scratch_floats_baseline(const AttentionShape& s) { return unit_scratch_floats(s); }

void attention_forward_unit_baseline(const AttentionForwardArgs& a, int64_t seq, int64_t kvh, float* scratch) {
  forward_unit_impl(a, seq, kvh, scratch);
}

void attention_backward_unit_baseline(const AttentionBackwardArgs& a, int64_t seq, int64_t kvh, float* scratch) {
  backward_unit_impl(a, seq, kvh, scratch);
}

}  // namespace detail

namespace {

// Broken shapes are caller bugs (kernels never throw): abort with the condition. The unit
// code relies on these for every index it forms; it also keeps positions in int32 lanes.
void check_shape(const AttentionShape& s) {
  TERN_ASSERT_MSG(s.n_seq >= 0 && s.n_ctx >= 0 && s.n_head >= 0, "attention: negative size");
  TERN_ASSERT_MSG(s.n_head_kv > 0 && s.n_head % s.n_head_kv == 0, "attention: n_head must be a multiple of n_head_kv");
  TERN_ASSERT_MSG(s.head_dim > 0, "attention: head_dim must be positive");
  TERN_ASSERT_MSG(s.n_ctx < (int64_t(1) << 30), "attention: n_ctx too large");
}

bool is_empty(const AttentionShape& s) { return s.n_seq == 0 || s.n_ctx == 0 || s.n_head == 0; }

// Per-row softmax of the scaled scores of query row (seq, t, h) over keys 0..t, in double:
// fills p[0..t] and returns the log-sum-exp.
double reference_row_softmax(const AttentionShape& s, const float* q, const float* k, int64_t seq, int64_t t,
                             int64_t h, std::vector<double>& p) {
  const int64_t hd = s.head_dim, g = s.n_head / s.n_head_kv, kvh = h / g;
  const float* qr = q + ((seq * s.n_ctx + t) * s.n_head + h) * hd;
  double mx = -INFINITY;
  for (int64_t j = 0; j <= t; ++j) {
    const float* kr = k + ((seq * s.n_ctx + j) * s.n_head_kv + kvh) * hd;
    double dot = 0.0;
    for (int64_t d = 0; d < hd; ++d) dot += double(qr[d]) * double(kr[d]);
    p[size_t(j)] = double(s.scale) * dot;
    mx = std::max(mx, p[size_t(j)]);
  }
  double sum = 0.0;
  for (int64_t j = 0; j <= t; ++j) {
    p[size_t(j)] = std::exp(p[size_t(j)] - mx);
    sum += p[size_t(j)];
  }
  for (int64_t j = 0; j <= t; ++j) p[size_t(j)] /= sum;
  return mx + std::log(sum);
}

using ScratchFloats = int64_t (*)(const AttentionShape&);
using ForwardUnit = void (*)(const detail::AttentionForwardArgs&, int64_t, int64_t, float*);
using BackwardUnit = void (*)(const detail::AttentionBackwardArgs&, int64_t, int64_t, float*);

struct Variant {
  ScratchFloats scratch_floats;
  ForwardUnit forward;
  BackwardUnit backward;
};

Variant variant_for(Isa isa) {
  if (!isa_supported(isa)) fail("training attention variant ", isa_name(isa), " is not supported by this CPU");
  switch (isa) {
    case Isa::Avx512:
      return {detail::attention_unit_scratch_floats_avx512, detail::attention_forward_unit_avx512,
              detail::attention_backward_unit_avx512};
    case Isa::Avx2:
      return {detail::attention_unit_scratch_floats_avx2, detail::attention_forward_unit_avx2,
              detail::attention_backward_unit_avx2};
    default: break;  // the reference, and the ARM variants: the baseline build of the tiles
  }
  return {detail::attention_unit_scratch_floats_baseline, detail::attention_forward_unit_baseline,
          detail::attention_backward_unit_baseline};
}

// Runs unit(seq, kvh, scratch) for every (sequence, kv head), each on one thread with that
// thread's 64-byte aligned scratch.
template <class Unit>
void run_units(ThreadPool* pool, const AttentionShape& s, int64_t scratch_floats, Unit&& unit) {
  const int64_t n_units = s.n_seq * s.n_head_kv;
  const int n_threads = pool != nullptr && n_units > 1 ? pool->size() : 1;
  constexpr int64_t kAlignFloats = 16;
  const int64_t stride = (scratch_floats + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  // Uninitialised on purpose: the units initialise every scratch float they read.
  std::unique_ptr<float[]> buffer(new float[size_t(stride * n_threads + kAlignFloats)]);
  float* base = buffer.get();
  while (reinterpret_cast<uintptr_t>(base) % (kAlignFloats * sizeof(float)) != 0) ++base;
  if (n_threads == 1) {
    for (int64_t c = 0; c < n_units; ++c) unit(c / s.n_head_kv, c % s.n_head_kv, base);
    return;
  }
  pool->for_chunks(n_units, [&](int64_t c, int thread) {
    unit(c / s.n_head_kv, c % s.n_head_kv, base + stride * thread);
  });
}

}  // namespace

// --- references ------------------------------------------------------------------------

void attention_forward_ref(const AttentionShape& s, const float* q, const float* k, const float* v, float* o,
                           float* lse) {
  check_shape(s);
  if (is_empty(s)) return;
  const int64_t hd = s.head_dim, g = s.n_head / s.n_head_kv;
  std::vector<double> p(static_cast<size_t>(s.n_ctx));
  for (int64_t seq = 0; seq < s.n_seq; ++seq)
    for (int64_t t = 0; t < s.n_ctx; ++t)
      for (int64_t h = 0; h < s.n_head; ++h) {
        const double row_lse = reference_row_softmax(s, q, k, seq, t, h, p);
        float* orow = o + ((seq * s.n_ctx + t) * s.n_head + h) * hd;
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0.0;
          for (int64_t j = 0; j <= t; ++j) acc += p[size_t(j)] * double(v[((seq * s.n_ctx + j) * s.n_head_kv + h / g) * hd + d]);
          orow[d] = float(acc);
        }
        lse[(seq * s.n_ctx + t) * s.n_head + h] = float(row_lse);
      }
}

// An empty shape still writes dk/dv: with n_head == 0 (or no queries) nothing reaches them.
static void zero_kv_gradients(const AttentionShape& s, float* dk, float* dv) {
  const size_t kv_elems = size_t(s.n_seq * s.n_ctx * s.n_head_kv * s.head_dim);
  if (kv_elems > 0) {
    std::memset(dk, 0, kv_elems * sizeof(float));
    std::memset(dv, 0, kv_elems * sizeof(float));
  }
}

// The textbook backward: each row's probabilities from its own softmax (lse is not needed),
// dP = dO V^T, dS = P (dP - rowsum(dO * O)), dq = scale dS K, dk = scale dS^T q, dv = P^T dO,
// with dk / dv summed over the group's query heads; double accumulators throughout.
void attention_backward_ref(const AttentionShape& s, const float* q, const float* k, const float* v,
                            const float* o, const float* /*lse*/, const float* d_o, float* dq, float* dk,
                            float* dv) {
  check_shape(s);
  if (is_empty(s)) {
    zero_kv_gradients(s, dk, dv);
    return;
  }
  const int64_t hd = s.head_dim, g = s.n_head / s.n_head_kv, T = s.n_ctx;
  const double scale = s.scale;
  std::vector<double> p(static_cast<size_t>(T)), ds(static_cast<size_t>(T));
  std::vector<double> dk_acc(static_cast<size_t>(T * hd)), dv_acc(static_cast<size_t>(T * hd));
  for (int64_t seq = 0; seq < s.n_seq; ++seq)
    for (int64_t kvh = 0; kvh < s.n_head_kv; ++kvh) {
      std::fill(dk_acc.begin(), dk_acc.end(), 0.0);
      std::fill(dv_acc.begin(), dv_acc.end(), 0.0);
      auto k_row = [&](int64_t j) { return k + ((seq * T + j) * s.n_head_kv + kvh) * hd; };
      auto v_row = [&](int64_t j) { return v + ((seq * T + j) * s.n_head_kv + kvh) * hd; };
      for (int64_t h = kvh * g; h < (kvh + 1) * g; ++h)
        for (int64_t t = 0; t < T; ++t) {
          reference_row_softmax(s, q, k, seq, t, h, p);
          const int64_t row = ((seq * T + t) * s.n_head + h) * hd;
          double delta = 0.0;
          for (int64_t d = 0; d < hd; ++d) delta += double(d_o[row + d]) * double(o[row + d]);
          for (int64_t j = 0; j <= t; ++j) {
            double dp = 0.0;
            for (int64_t d = 0; d < hd; ++d) dp += double(d_o[row + d]) * double(v_row(j)[d]);
            ds[size_t(j)] = p[size_t(j)] * (dp - delta);
          }
          for (int64_t d = 0; d < hd; ++d) {
            double acc = 0.0;
            for (int64_t j = 0; j <= t; ++j) acc += ds[size_t(j)] * double(k_row(j)[d]);
            dq[row + d] = float(scale * acc);
          }
          for (int64_t j = 0; j <= t; ++j)
            for (int64_t d = 0; d < hd; ++d) {
              dk_acc[size_t(j * hd + d)] += scale * ds[size_t(j)] * double(q[row + d]);
              dv_acc[size_t(j * hd + d)] += p[size_t(j)] * double(d_o[row + d]);
            }
        }
      for (int64_t j = 0; j < T; ++j)
        for (int64_t d = 0; d < hd; ++d) {
          const int64_t at = ((seq * T + j) * s.n_head_kv + kvh) * hd + d;
          dk[at] = float(dk_acc[size_t(j * hd + d)]);
          dv[at] = float(dv_acc[size_t(j * hd + d)]);
        }
    }
}

// --- tiled kernels ---------------------------------------------------------------------

namespace detail {

void attention_forward_isa(Isa isa, ThreadPool* pool, const AttentionShape& s, const float* q, const float* k,
                           const float* v, float* o, float* lse) {
  check_shape(s);
  const Variant var = variant_for(isa);
  if (is_empty(s)) return;
  const AttentionForwardArgs args{s, q, k, v, o, lse};
  run_units(pool, s, var.scratch_floats(s),
            [&](int64_t seq, int64_t kvh, float* scratch) { var.forward(args, seq, kvh, scratch); });
}

void attention_backward_isa(Isa isa, ThreadPool* pool, const AttentionShape& s, const float* q, const float* k,
                            const float* v, const float* o, const float* lse, const float* d_o, float* dq,
                            float* dk, float* dv) {
  check_shape(s);
  const Variant var = variant_for(isa);
  if (is_empty(s)) {
    zero_kv_gradients(s, dk, dv);
    return;
  }
  const AttentionBackwardArgs args{s, q, k, v, o, lse, d_o, dq, dk, dv};
  run_units(pool, s, var.scratch_floats(s),
            [&](int64_t seq, int64_t kvh, float* scratch) { var.backward(args, seq, kvh, scratch); });
}

}  // namespace detail

void attention_forward(ThreadPool* pool, const AttentionShape& s, const float* q, const float* k, const float* v,
                       float* o, float* lse) {
  detail::attention_forward_isa(selected_isa(), pool, s, q, k, v, o, lse);
}

void attention_backward(ThreadPool* pool, const AttentionShape& s, const float* q, const float* k, const float* v,
                        const float* o, const float* lse, const float* d_o, float* dq, float* dk, float* dv) {
  detail::attention_backward_isa(selected_isa(), pool, s, q, k, v, o, lse, d_o, dq, dk, dv);
}

}  // namespace tern::train
