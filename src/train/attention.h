#pragma once
// Causal grouped-query attention for training, flash-style: the forward keeps only the output
// and each query row's log-sum-exp; the backward recomputes the scores tile by tile instead of
// storing the T x T probability matrix (FlashAttention-2's backward).
//
// Layouts (row-major, one row per token, sequences back to back):
//   q, o, dq, do  [n_seq * n_ctx][n_head    * head_dim]
//   k, v, dk, dv  [n_seq * n_ctx][n_head_kv * head_dim]
//   lse           [n_seq * n_ctx][n_head]      natural-log sum of exp(scale * q.k) over keys <= query
// Query head h reads key/value head h / (n_head / n_head_kv). Token t of a sequence attends to
// tokens 0..t of the same sequence.
//
// Determinism: the work is split by (sequence, kv head); each unit writes only its own rows of
// dk/dv (and its heads' dq/o), so results do not depend on the thread count.
#include <cstdint>

namespace tern {
class ThreadPool;
}

namespace tern::train {

struct AttentionShape {
  int64_t n_seq = 0, n_ctx = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 0.0f;  // usually 1 / sqrt(head_dim)
};

// Scalar references: the textbook computation (scores, softmax, weighted sum; the backward
// recomputes each row's probabilities with its own softmax, so it does not read lse, and uses
// D = rowsum(dO * O) from the given o), f32 in and out with double accumulators. The oracle for
// the tiled kernels and the finite-difference tests.
void attention_forward_ref(const AttentionShape& s, const float* q, const float* k, const float* v, float* o,
                           float* lse);
// Writes (not accumulates) dq, dk, dv.
void attention_backward_ref(const AttentionShape& s, const float* q, const float* k, const float* v,
                            const float* o, const float* lse, const float* d_o, float* dq, float* dk, float* dv);

// The tiled kernels (SIMD for the selected ISA, kernels' selected_isa(): TERN_FORCE_ISA
// honoured), over `pool` (nullptr: the calling thread). Scratch is allocated per call: about
// 4 * n_ctx * head_dim floats per thread (n_ctx rounded up to the key block).
void attention_forward(ThreadPool* pool, const AttentionShape& s, const float* q, const float* k, const float* v,
                       float* o, float* lse);
void attention_backward(ThreadPool* pool, const AttentionShape& s, const float* q, const float* k, const float* v,
                        const float* o, const float* lse, const float* d_o, float* dq, float* dk, float* dv);

}  // namespace tern::train
