#pragma once
// What every recurrent stack's forward does around its layers (models/mamba.cpp, mamba2.cpp,
// rwkv7.cpp): check that each sequence has a state slot and continues where its state stands,
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

}  // namespace tern
