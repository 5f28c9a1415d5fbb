#pragma once
// What every recurrent stack's forward does around its layers (models/mamba.cpp, mamba2.cpp,
// rwkv6.cpp, rwkv7.cpp): check that each sequence has a state slot and continues where its state stands,
// zero the state of a sequence that starts, gather the step's token embeddings; after the
// layers, pick the rows that need logits. One ragged step over SeqBatch entries, as the decoder's.
#include <cstdint>
#include <functional>
#include <span>

#include "kernels/matmul.h"
#include "kv/kv_store.h"
#include "models/model.h"

namespace tern {

// Token embeddings of every sequence's new tokens, back to back, into x [T][n_embd]; returns T.
// Zeroes the state of each sequence that starts at position 0. T must fit max_tokens (reserve()).
int64_t begin_recurrent_step(std::span<const SeqBatch> seqs, KvStore& kv, const WeightView& tok_embd,
                             int64_t n_vocab, int64_t n_embd, int64_t max_tokens, float* x);

// The rows of x [T][n_embd] that need logits (every token of an all_logits sequence, else each
// sequence's last) copied to out_rows, in batch order; returns their count. A sequence asking
// for its hidden states gets its rows through `norm(in, out, n_rows)` (the output norm) into
// SeqBatch::hidden.
int64_t gather_logit_rows(std::span<const SeqBatch> seqs, const float* x, int64_t n_embd, float* out_rows,
                          const std::function<void(const float*, float*, int64_t)>& norm);

// RWKV-6 and RWKV-7 (models/rwkv6.cpp, rwkv7.cpp) share these pieces, in llama.cpp's arithmetic:
//
// LayerNorm of n_rows rows of n (ggml_norm: the mean, then the variance of the centred row, sums
// in double), times w plus b when w is given; out may be x.
void rwkv_layer_norm(const float* x, const float* w, const float* b, float* out, int64_t n_rows, int64_t n, float eps,
                     ThreadPool& pool);
// One head's group norm (ggml_norm over the head's n channels, eps 64e-5), in place.
void rwkv_group_norm_head(float* y, int64_t n);
// The token shift of a step's rows xn [T][n_embd]: prev(t) is the previous token's row or, for a
// sequence's first token of the step, its state (kv.state(il, slot) + shift_off, n_embd floats);
// out[m][t] = (prev(t) - xn[t]) * mixes[m] + xn[t] for m < n_mix (out [n_mix][T][n_embd], mixes
// [n_mix][n_embd]), and sx[t] = prev(t) - xn[t] when sx is given. Then each sequence's state
// holds its last row of xn.
void rwkv_token_shift(std::span<const SeqBatch> seqs, KvStore& kv, int64_t il, int64_t shift_off, int64_t n_embd,
                      const float* xn, const float* mixes, int64_t n_mix, float* out, int64_t T, float* sx,
                      ThreadPool& pool);

}  // namespace tern
