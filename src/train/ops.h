#pragma once
// The pointwise and row-wise operations of the Llama-family training forward, each with its
// backward: token embedding, RMSNorm, RoPE (adjacent pairs, llama.cpp's "norm" mode, which is
// what GGUF Llama files use), SwiGLU, and softmax cross-entropy. The matrix products are
// train/gemm.h, attention is train/attention.h.
//
// Every function is a template instantiated for float (training) and double (the
// finite-difference tests differentiate the double instantiation; the float one is checked
// against it). Rows are independent; `pool` splits them over threads (nullptr: the calling
// thread). Reductions over rows (the norm weight's gradient, the embedding's) run per column,
// in row order, so results are bit-identical for any thread count.
//
// Layouts: row-major, one row per token; n rows.
#include <cstdint>

namespace tern {
class ThreadPool;
}

namespace tern::train {

// y[i] = table[ids[i]]   table [n_vocab][width], y [n][width]
template <class T>
void embedding_forward(ThreadPool* pool, int64_t n, int64_t width, const int32_t* ids, const T* table, T* y);
// d_table[ids[i]] += dy[i] (accumulates; rows of the same id summed in order of i)
template <class T>
void embedding_backward(ThreadPool* pool, int64_t n, int64_t width, int64_t n_vocab, const int32_t* ids,
                        const T* dy, T* d_table);

// y = x / sqrt(mean(x^2) + eps) * w;  rstd[i] = 1 / sqrt(mean(x_i^2) + eps) is kept for the backward.
template <class T>
void rmsnorm_forward(ThreadPool* pool, int64_t n, int64_t width, const T* x, const T* w, T eps, T* y, T* rstd);
// dx = (or +=, when accumulate) the input gradient; dw += sum over rows of dy * x * rstd.
template <class T>
void rmsnorm_backward(ThreadPool* pool, int64_t n, int64_t width, const T* x, const T* w, const T* rstd,
                      const T* dy, T* dx, T* dw, bool accumulate);

// In place, rows of n_head heads of head_dim (even) values; the token of row i is at
// position i % n_ctx (sequences of n_ctx tokens back to back). Pair (2j, 2j+1) of a head turns
// by pos * freq_base^(-2j / head_dim). inverse = true turns back: the backward of the forward
// rotation (its transpose) is the rotation by the opposite angle.
template <class T>
void rope_rotate(ThreadPool* pool, int64_t n, int64_t n_ctx, int64_t n_head, int64_t head_dim, float freq_base,
                 T* x, bool inverse);

// s = silu(a) * b, elementwise over count values; sig = sigmoid(a) is kept for the backward (it
// then needs no exp).
template <class T>
void swiglu_forward(ThreadPool* pool, int64_t count, const T* a, const T* b, T* s, T* sig);
// da = ds * b * silu'(a), db = ds * silu(a), from the forward's sig.
template <class T>
void swiglu_backward(ThreadPool* pool, int64_t count, const T* a, const T* b, const T* sig, const T* ds, T* da, T* db);

// ReGLU: s = max(a, 0) * b; mask = 1 where a > 0, else 0 (kept for the backward).
template <class T>
void reglu_forward(ThreadPool* pool, int64_t count, const T* a, const T* b, T* s, T* mask);
// da = ds * b * mask, db = ds * max(a, 0). (At a = 0 the subgradient 0: the neuron is off.)
template <class T>
void reglu_backward(ThreadPool* pool, int64_t count, const T* a, const T* b, const T* mask, const T* ds, T* da, T* db);

// Softmax cross-entropy, forward and backward fused: logits [n][n_vocab] are replaced by
// d(loss)/d(logits) = (softmax - onehot(target)) * grad_scale; returns sum over rows of
// -log softmax(logits)[target] (double). Rows whose target is negative are ignored (gradient 0).
template <class T>
double cross_entropy_fused(ThreadPool* pool, int64_t n, int64_t n_vocab, T* logits, const int32_t* targets,
                           T grad_scale);
// The loss alone (logits untouched): sum over rows of -log softmax[target].
template <class T>
double cross_entropy_loss(ThreadPool* pool, int64_t n, int64_t n_vocab, const T* logits, const int32_t* targets);

}  // namespace tern::train
