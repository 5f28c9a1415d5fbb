#pragma once
// Shape-checked building blocks of decoder-only transformers, on f32 activations.
// The matmuls themselves are kernels/matmul.h; these are the elementwise / row-wise ops and
// attention between them. All run on the caller's ThreadPool.
#include <cstdint>
#include <span>

#include "core/thread_pool.h"

namespace tern {

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight           x, out: [n_tokens, n]
void rms_norm(const float* x, const float* weight, float* out, int64_t n_tokens, int64_t n,
              float eps, ThreadPool& pool);

// RoPE, "normal" layout (llama.cpp's LLAMA_ROPE_TYPE_NORM): within each head, the pairs
// (2i, 2i+1) for 2i < n_rot are rotated by pos * freq_base^(-2i/n_rot); the rest are left.
//   x: [n_tokens, n_heads * head_dim], positions: [n_tokens]
void rope_norm(float* x, const int32_t* positions, int64_t n_tokens, int64_t n_heads,
               int64_t head_dim, int64_t n_rot, float freq_base);

// out = silu(gate) * up, elementwise over [n_tokens, n_ff] (SwiGLU).
void swiglu(const float* gate, const float* up, float* out, int64_t n, ThreadPool& pool);

// x += y elementwise.
void add_inplace(float* x, const float* y, int64_t n);

// Causal attention of one sequence's new tokens over its KV cache, online softmax
// (flash-style: running max and sum per query row, no n x n score matrix).
//
//   q:   [n_tokens, n_head * head_dim]     (rows ldq floats apart)
//   out: [n_tokens, n_head * head_dim]     (rows ldo floats apart)
//   K/V of position p live at k_base + slots[p] * kv_row (same for v), kv_row = n_head_kv*head_dim
//   new token i sits at position n_past + i and sees positions 0 .. n_past + i.
//   GQA: query head h reads KV head h / (n_head / n_head_kv); K/V are never copied per head.
struct AttentionArgs {
  const float* q;
  int64_t ldq;
  float* out;
  int64_t ldo;
  const float* k_base;
  const float* v_base;
  int64_t kv_row;
  const int32_t* slots;  // [n_past + n_tokens]
  int64_t n_past;
  int64_t n_tokens;
  int64_t n_head;
  int64_t n_head_kv;
  int64_t head_dim;
  float scale;  // 1/sqrt(head_dim)
};
// Runs every (sequence, head, token) item of `seqs` on the pool.
void attention(std::span<const AttentionArgs> seqs, ThreadPool& pool);

}  // namespace tern
