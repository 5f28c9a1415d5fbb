// The matmul driver, shared by every variant: activation quantization into the caller's scratch,
// and the split of output rows across the pool. The variant is chosen in isa.cpp, weights are
// interleaved in interleave.cpp; the kernels themselves are the tables in ref/, x86/ and arm/
// (see kernel_iface.h).
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/dispatch_internal.h"
#include "kernels/kernel_iface.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/sparse24.h"
#include "kernels/tern_int.h"
#include "quant/quant_traits.h"

namespace tern {
namespace {

using kern::ActKind;
using kern::ActLayout;
using kern::GemmArgs;
using kern::KernelTable;
using kern::reads_interleaved;
using kern::table_of;

// Scratch owned by the calling thread (the pool's owner), grown to the largest matmul seen and
// reused: the quantized activations and one work area per pool thread.
struct Scratch {
  struct Buf {
    std::unique_ptr<uint8_t[]> mem;
    int64_t cap = 0;
    uint8_t* data = nullptr;  // 64-byte aligned view into mem
    uint8_t* get(int64_t bytes) {
      if (bytes > cap) {
        mem.reset(new uint8_t[size_t(bytes + 64)]);
        cap = bytes;
        data = mem.get() + (64 - reinterpret_cast<uintptr_t>(mem.get()) % 64) % 64;
      }
      return data;
    }
  };
  Buf act;
  Buf rows_scratch;  // matmul_rows' gemm scratch
  std::vector<Buf> per_thread;
  std::vector<uint8_t*> per_thread_ptr;
};

Scratch& caller_scratch() {
  thread_local Scratch s;
  return s;
}

// The activation layout a weight's kernel reads: interleaved weights take Rows at any size
// (BF16's pairs for the BF16 dot either way).
ActLayout effective_layout(const KernelTable& kt, const WeightView& w, int64_t n_tokens) {
  const ActLayout l = kt.act_layout(w.type, w.n_in, n_tokens);
  if (l.kind == ActKind::BF16Pairs) return l;
  return w.interleaved16 ? kern::act_rows_layout(w.type, w.n_in, n_tokens) : l;
}

void require_interleave_kernels(Isa isa, const WeightView& w) {
  if (w.interleaved16 && !reads_interleaved(isa, w.type))
    fail("matmul: ", dtype_name(w.type), " weights interleaved by 16 rows cannot run on the ", isa_name(isa),
         " variant (set TERN_REPACK=0 to keep rows as stored)");
}

// Output rows per chunk: a multiple of the 4-row tiles, about 4 chunks per thread so that a
// thread that starts late (descheduled) costs little, but at least 16 rows to keep the claim
// overhead small next to the work. A lone token (decode) takes 2 per thread: each chunk is a
// stream of its own, and streams that start and stop cost bandwidth. bench_matmul --sweep 22
// (TinyLlama's decode weights, share of plain sums over the same bytes, 3 alternating runs of
// 4 builds in fast minutes): 8 chunks per thread Q4_0 0.80-0.87, 4: 0.875-0.88, 2: 0.91-0.92,
// 1: 0.93; Q8_0 4: 0.93-0.94, 2: 0.96-0.98, 1: 0.96. Two keep some of the slack for a thread
// that is late.
// Float weights take multiples of 32 rows: their tiles are 16-row groups (decode) and 32-row
// panels (prefill, AVX-512), which a chunk boundary inside would compute twice.
int64_t rows_per_chunk(int64_t n_out, int n_threads, int64_t n_tokens, DType type) {
  if (n_threads <= 1) return n_out;
  const int64_t chunks_per_thread = n_tokens == 1 ? 2 : 4;
  const int64_t granule = dtype_is_float(type) ? 32 : 4;
  int64_t per = (n_out + chunks_per_thread * n_threads - 1) / (chunks_per_thread * n_threads);
  per = (per + granule - 1) / granule * granule;
  return per < 16 ? 16 : per;
}

}  // namespace

void matmul(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
            int64_t ldy, ThreadPool& pool) {
  matmul_isa(selected_isa(), w, x, ldx, n_tokens, y, ldy, pool);
}

void matmul_rows(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
                 int64_t ldy, int64_t r0, int64_t r1) {
  TERN_ASSERT(0 <= r0 && r0 <= r1 && r1 <= w.n_out);
  if (r0 == r1 || n_tokens <= 0) return;
  const Isa isa = selected_isa();
  require_interleave_kernels(isa, w);
  const KernelTable& kt = table_of(isa);
  if (!w.interleaved16 && (is_tern_int_type(w.type) || is_sparse24_type(w.type) || !kt.has_kernel(w.type) ||
                           w.row_bytes() < 0)) {
    // Rows are independent and stored one after another, so rows [r0, r1) are a matrix of
    // their own; a one-thread pool runs everything on this thread (matmul_isa also reports
    // a row length that does not fit the type).
    thread_local ThreadPool serial(1);
    const WeightView sub{w.type, w.n_in, r1 - r0, static_cast<const uint8_t*>(w.data) + r0 * w.row_bytes()};
    matmul_isa(isa, sub, x, ldx, n_tokens, y + r0, ldy, serial);
    return;
  }
  // The table's kernel straight on rows [r0, r1) of the whole weight (interleaved rows are not
  // one after another, so this is the only way for them): the tiles start at r0 as they would
  // at row 0 of a sub-matrix, so the same bits. Small models' phased forward pass makes
  // hundreds of these calls per token, so none of matmul_isa's pool machinery.
  const ActLayout lay = effective_layout(kt, w, n_tokens);
  Scratch& s = caller_scratch();
  uint8_t* act = nullptr;
  if (lay.kind != ActKind::None) {
    act = s.act.get(lay.bytes);
    kt.quantize(lay, w.type, x, ldx, w.n_in, n_tokens, 0, n_tokens, act);
  }
  const GemmArgs a{w.type, static_cast<const uint8_t*>(w.data), w.row_bytes(), w.n_in, w.n_out, x, ldx, act, lay,
                   n_tokens, y, ldy, w.interleaved16};
  const int64_t scratch_bytes = kt.scratch_bytes(w.type, w.n_in);
  kt.gemm(a, r0, r1, scratch_bytes > 0 ? s.rows_scratch.get(scratch_bytes) : nullptr);
}

namespace {

// Equal layouts mean one quantized copy of x serves both weights: the tables' quantize()
// depends on the layout only, not on the weight type.
bool layouts_equal(const ActLayout& a, const ActLayout& b) {
  return a.kind == b.kind && a.stride == b.stride && a.off_d == b.off_d && a.off_sum == b.off_sum &&
         a.bytes == b.bytes && a.token_granule == b.token_granule && a.lane_tokens == b.lane_tokens &&
         a.tail_offset == b.tail_offset && a.tail_stride == b.tail_stride;
}

// The table-kernel path for weights that share one input x and one activation layout: x is
// quantized once, and the rows of all the weights are chunks of one pool region. With the
// RMSNorm prologue, the phase that quantizes also normalises (into norm.out_rows), each row
// right before it is quantized; float weights then read the normalised rows.
void gemm_shared_input(const KernelTable& kt, std::span<const MatmulTarget> ts, const ActLayout& lay,
                       const float* x, int64_t ldx, int64_t n_tokens, ThreadPool& pool, const RowsDone& done,
                       const InputRmsNorm& norm) {
  Scratch& s = caller_scratch();
  const int64_t n_in = ts[0].w.n_in;
  const DType act_type = ts[0].w.type;  // any member: they share the layout
  const bool quantized = lay.kind != ActKind::None;
  uint8_t* act = quantized ? s.act.get(lay.bytes) : nullptr;
  const float* x_in = norm.weight ? norm.out_rows : x;  // [n_tokens][ldx] what the kernels read
  if (quantized || norm.weight) {
    const int64_t g = quantized ? lay.token_granule : 1;
    // Tokens [t0, t1) (t0 a multiple of g) made ready for the gemm. The prologue goes one
    // quantizer granule at a time (a single row for the Rows layouts, 16 for the Lanes ones),
    // so the quantizer reads rows that are still in this thread's L1 (L2 for 16 rows).
    auto prepare = [&](int64_t t0, int64_t t1) {
      if (!norm.weight) {
        kt.quantize(lay, act_type, x, ldx, n_in, n_tokens, t0, t1, act);
        return;
      }
      for (int64_t a = t0; a < t1; a += g) {
        const int64_t b = std::min(t1, a + g);
        for (int64_t t = a; t < b; ++t) rms_norm_row(x + t * ldx, norm.weight, norm.out_rows + t * ldx, n_in, norm.eps);
        if (quantized) kt.quantize(lay, act_type, norm.out_rows, ldx, n_in, n_tokens, a, b, act);
      }
    };
    // Quantizing is O(n_tokens * n_in) against the matmul's O(n_tokens * n_in * n_out): only
    // worth spreading over the pool for a batch of tokens.
    const int64_t n_units = (n_tokens + g - 1) / g;
    if (n_tokens < 8 || pool.size() == 1 || n_units == 1) {
      prepare(0, n_tokens);
    } else {
      const int64_t per = (n_units + pool.size() - 1) / pool.size();
      const int64_t n_chunks = (n_units + per - 1) / per;
      pool.for_chunks(n_chunks, [&](int64_t c, int) {
        const int64_t t0 = c * per * g;
        prepare(t0, std::min(n_tokens, (c + 1) * per * g));
      });
    }
  }

  struct Chunk {
    int32_t target;
    int64_t r0, r1;
  };
  thread_local std::vector<GemmArgs> args;
  thread_local std::vector<Chunk> chunks;
  args.clear();
  chunks.clear();
  int64_t scratch_bytes = 0;
  // Joint chunks: one list over each group's common rows (one group of all the targets unless
  // joint_group says otherwise); their `target` is the group's index, -1 for the one group.
  const size_t group = done.joint_rows ? (done.joint_group > 0 ? size_t(done.joint_group) : ts.size()) : 1;
  const int64_t n_groups = int64_t(ts.size() / group);
  for (size_t k = 0; k < ts.size(); ++k) {
    const MatmulTarget& t = ts[k];
    args.push_back(GemmArgs{t.w.type, static_cast<const uint8_t*>(t.w.data), t.w.row_bytes(), t.w.n_in,
                            t.w.n_out, x_in, ldx, act, lay, n_tokens, t.y, t.ldy, t.w.interleaved16});
    scratch_bytes = std::max(scratch_bytes, kt.scratch_bytes(t.w.type, t.w.n_in));
    if (done.joint_rows && k % group != 0) continue;
    // Several groups: the region's chunk count over all of their rows, a chunk within one group.
    int64_t per = rows_per_chunk(t.w.n_out * (done.joint_rows ? n_groups : 1), pool.size(), n_tokens, t.w.type);
    if (per > t.w.n_out) per = t.w.n_out;
    const int32_t id = !done.joint_rows ? int32_t(k) : done.joint_group > 0 ? int32_t(k / group) : -1;
    for (int64_t r0 = 0; r0 < t.w.n_out; r0 += per) chunks.push_back(Chunk{id, r0, std::min(t.w.n_out, r0 + per)});
  }
  const size_t nth = size_t(pool.size());
  if (s.per_thread.size() < nth) {
    s.per_thread.resize(nth);
    s.per_thread_ptr.resize(nth);
  }
  for (size_t i = 0; i < nth; ++i)
    s.per_thread_ptr[i] = scratch_bytes > 0 ? s.per_thread[i].get(scratch_bytes) : nullptr;
  uint8_t* const* scratch = s.per_thread_ptr.data();
  // The workers reach the caller's thread_local lists through these references.
  const std::vector<GemmArgs>& args_ref = args;
  const std::vector<Chunk>& chunks_ref = chunks;
  pool.for_chunks(int64_t(chunks_ref.size()), [&](int64_t c, int thread) {
    const Chunk& ch = chunks_ref[size_t(c)];
    if (ch.target < 0) {
      for (const GemmArgs& a : args_ref) kt.gemm(a, ch.r0, ch.r1, scratch[thread]);
    } else if (group > 1) {
      for (size_t k = size_t(ch.target) * group; k < size_t(ch.target + 1) * group; ++k)
        kt.gemm(args_ref[k], ch.r0, ch.r1, scratch[thread]);
    } else {
      kt.gemm(args_ref[size_t(ch.target)], ch.r0, ch.r1, scratch[thread]);
    }
    if (done.fn) done.fn(done.ctx, ch.target, n_tokens, ch.r0, ch.r1);
  });
}

}  // namespace

void matmul_isa(Isa isa, const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens,
                float* y, int64_t ldy, ThreadPool& pool) {
  if (!isa_supported(isa)) fail("kernel variant ", isa_name(isa), " is not supported by this CPU");
  if (n_tokens <= 0 || w.n_out <= 0) return;
  // tern's integer formats carry their own kernels (per-token int8 activations, outlier
  // columns, group zero points); they do not fit the block-pair KernelTable.
  if (is_tern_int_type(w.type)) {
    tern_int_matmul(isa, w, x, ldx, n_tokens, y, ldy, pool);
    return;
  }
  // So do the 2:4 sparse ones (kernels/sparse24.h): compressed rows, shuffle-gathered activations.
  if (is_sparse24_type(w.type)) {
    sparse24_matmul(isa, w, x, ldx, n_tokens, y, ldy, pool);
    return;
  }
  if (w.row_bytes() < 0)
    fail("matmul: row length ", w.n_in, " is not a multiple of the ", dtype_name(w.type),
         " block size");
  require_interleave_kernels(isa, w);
  const KernelTable& kt = table_of(isa);
  if (!kt.has_kernel(w.type)) {
    matmul_ref(w, x, ldx, n_tokens, y, ldy, pool);
    return;
  }
  const MatmulTarget one{w, y, ldy};
  gemm_shared_input(kt, std::span<const MatmulTarget>(&one, 1), effective_layout(kt, w, n_tokens), x, ldx,
                    n_tokens, pool, RowsDone{}, InputRmsNorm{});
}

void matmul_shared_input_isa(Isa isa, std::span<const MatmulTarget> targets, const float* x, int64_t ldx,
                             int64_t n_tokens, ThreadPool& pool, const RowsDone& done, const InputRmsNorm& norm) {
  if (!isa_supported(isa)) fail("kernel variant ", isa_name(isa), " is not supported by this CPU");
  if (targets.empty() || n_tokens <= 0) return;
  TERN_ASSERT_MSG(!norm.weight || norm.out_rows, "matmul_shared_input: RMSNorm prologue without out_rows");
  for (const MatmulTarget& t : targets) require_interleave_kernels(isa, t.w);
  const KernelTable& kt = table_of(isa);
  const ActLayout lay = effective_layout(kt, targets[0].w, n_tokens);
  bool shared = true;
  for (const MatmulTarget& t : targets) {
    TERN_ASSERT_MSG(t.w.n_in == targets[0].w.n_in, "matmul_shared_input: weights of different row lengths");
    TERN_ASSERT_MSG(!done.joint_rows || t.w.n_out == targets[0].w.n_out, "matmul_shared_input: joint rows of different counts");
    TERN_ASSERT_MSG(done.joint_group >= 0 && (done.joint_group == 0 || (done.joint_rows && targets.size() % size_t(done.joint_group) == 0)),
                    "matmul_shared_input: joint groups that do not divide the targets");
    shared = shared && t.w.n_out > 0 && !is_tern_int_type(t.w.type) && !is_sparse24_type(t.w.type) &&
             t.w.row_bytes() >= 0 && kt.has_kernel(t.w.type) && layouts_equal(effective_layout(kt, t.w, n_tokens), lay);
  }
  if (!shared) {
    // The prologue as a pass of its own, then one matmul per weight; the epilogue runs over
    // whole outputs, on this thread.
    const int64_t n_in = targets[0].w.n_in;
    if (norm.weight) {
      auto rows = [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) rms_norm_row(x + t * ldx, norm.weight, norm.out_rows + t * ldx, n_in, norm.eps);
      };
      if (n_tokens < 8 || pool.size() == 1) rows(0, n_tokens);
      else pool.parallel_for(n_tokens, [&](int64_t t0, int64_t t1, int) { rows(t0, t1); });
      x = norm.out_rows;
    }
    for (size_t k = 0; k < targets.size(); ++k) {
      const MatmulTarget& t = targets[k];
      matmul_isa(isa, t.w, x, ldx, n_tokens, t.y, t.ldy, pool);
      if (done.fn && !done.joint_rows) done.fn(done.ctx, int(k), n_tokens, 0, t.w.n_out);
    }
    if (done.fn && done.joint_rows && done.joint_group == 0) done.fn(done.ctx, -1, n_tokens, 0, targets[0].w.n_out);
    if (done.fn && done.joint_group > 0)
      for (size_t g = 0; g < targets.size() / size_t(done.joint_group); ++g)
        done.fn(done.ctx, int(g), n_tokens, 0, targets[0].w.n_out);
    return;
  }
  gemm_shared_input(kt, targets, lay, x, ldx, n_tokens, pool, done, norm);
}

void matmul_shared_input(std::span<const MatmulTarget> targets, const float* x, int64_t ldx, int64_t n_tokens,
                         ThreadPool& pool, const RowsDone& done, const InputRmsNorm& norm) {
  matmul_shared_input_isa(selected_isa(), targets, x, ldx, n_tokens, pool, done, norm);
}

}  // namespace tern
