#pragma once
// The seam every linear layer of every architecture goes through: a weight (a matrix, or a
// row range of one: a fused q/k/v or gate/up matrix's part, one expert of a 3-D tensor, later a
// tensor-parallel shard), an optional bias, and the name observers and adapters key on. The
// calibration observer sees each layer's input here, once.
#include <cstdint>
#include <span>
#include <string>

#include "kernels/matmul.h"
#include "models/lora_step.h"
#include "models/model.h"

namespace tern {

struct Linear {
  std::string name;             // GGUF tensor the weight comes from ("blk.3.attn_q.weight")
  WeightView w;                 // [n_in -> n_out]
  const float* bias = nullptr;  // [n_out] or nullptr
  bool observed = true;         // shown to a ForwardObserver (not: the parts of a fused tensor after its first)
  int64_t row0 = 0;             // first row of `name` this linear computes (fused tensors' parts)
  int64_t col0 = 0;             // first column of `name` it reads (a tensor-parallel rank's share of a row-split matrix)
  int32_t lora_id = -1;         // its LoraTarget id (LoraStep), -1: adapters never apply
  // A low-rank factored weight (`tern lowrank`, docs/lowrank.md): y = B (A x), with w.data null
  // and w's n_in / n_out still the layer's shape (what the callers size their buffers by).
  WeightView lr_a = {};         // [n_in -> rank]
  WeightView lr_b = {};         // [rank -> n_out]
  bool factored() const { return lr_a.data != nullptr; }
  bool present() const { return w.data != nullptr || factored(); }
};

// What watches or changes a step's linear layers besides the weights: the calibration observer
// and the step's LoRA adapters (nullptr when no token of the step runs one).
struct LinearHooks {
  ForwardObserver* observer = nullptr;
  LoraStep* lora = nullptr;
};

// y = x W^T (+ the step's LoRA updates) (+ bias); a factored weight: y = (x A^T) B^T.
//   x: [n_tokens][ldx] (n_in used), y: [n_tokens][ldy] (n_out written)
void apply_linear(const Linear& l, const float* x, int64_t ldx, int64_t n_tokens, float* y, int64_t ldy,
                  ThreadPool& pool, const LinearHooks& hooks);
// Several linears over one input (matmul_shared_input: the input quantized once, one pool region,
// with its fused RMSNorm prologue and row epilogue); biases are for the epilogue to add. The
// observer sees the (normalised) input once per observed linear, after the call. LoRA updates
// are added to each chunk of rows before `done` sees it (so before biases, RoPE, SwiGLU); with
// adapters the norm runs before the matmul instead of in its prologue (the same bits). When one
// of them is factored, each runs through apply_linear after the norm, then `done` sees all rows.
void apply_linears_shared(std::span<const Linear* const> ls, std::span<float* const> ys, std::span<const int64_t> ldys,
                          const float* x, int64_t ldx, int64_t n_tokens, ThreadPool& pool, const RowsDone& done,
                          const InputRmsNorm& norm, const LinearHooks& hooks);

}  // namespace tern
