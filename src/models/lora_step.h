#pragma once
// The adapters of one forward step, resolved per linear layer (S-LoRA / Punica style: one step
// serves sequences with different adapters, or none). Every sequence of a step may name its
// own LoraSet (SeqBatch::lora); for each linear layer the step keeps the groups of tokens that
// run an adapter pair over it, so the layer's base matmul runs once for all tokens and each
// group adds its low-rank update:
//   shrink  u = x[t0 .. t0+n) A^T          [n][rank]  (one pool region for all groups)
//   expand  y[t][r] += scale * u[t] . B[row0 + r]     (in the matmul's row epilogue, so the
//                                                      update is in before bias / RoPE / SwiGLU)
// Resolving an adapter (which pair each linear takes) is cached by LoraAdapter::uid().
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "models/lora.h"

namespace tern {

struct SeqBatch;
class ThreadPool;

// Tokens [t0, t0 + n) of the step add scale * B (A x) through `pair`. x is the linear's input,
// which is the pair's columns [col0, col0 + n_in) (all of them but on a tensor-parallel rank's
// share of a row-split matrix, where the expanded update is a partial sum like the matmul's).
struct LoraGroup {
  const LoraPair* pair = nullptr;
  float scale = 1.0f;
  int64_t t0 = 0, n = 0;
  int64_t col0 = 0, n_in = 0;
};

// What a model tells LoraStep about one of its linear layers (its id is its index).
struct LoraTarget {
  std::string name;    // the base tensor ("blk.0.attn_q.weight")
  int64_t row0 = 0;    // first row of the tensor this linear computes (fused q/k/v, gate/up)
  int64_t n_in = 0, n_out = 0;
  int64_t col0 = 0;    // first column of the tensor it reads (a tensor-parallel share; else 0)
};

class LoraStep {
 public:
  // The model's linear layers, once at load; id = index.
  // logit_rows_target: the id of the linear that runs over the rows that need logits (the
  // output projection: every token of an all_logits sequence, else its last), whose groups
  // are then in those rows' numbering; -1: none.
  void set_targets(std::vector<LoraTarget> targets, int32_t logit_rows_target = -1) {
    targets_ = std::move(targets);
    logit_rows_target_ = logit_rows_target;
  }
  const std::vector<LoraTarget>& targets() const { return targets_; }
  // Resolves the step's sequences' adapters into groups per linear. False when no token runs one.
  bool begin(std::span<const SeqBatch> seqs);
  bool active() const { return active_; }
  std::span<const LoraGroup> groups(int32_t id) const {
    if (!active_ || id < 0) return {};
    return groups_[size_t(id)];
  }
  // Targets of `adapter` that no linear of the model applies (shown by Model::check_lora).
  std::vector<std::string> unapplied(const LoraAdapter& adapter) const;

 private:
  struct Resolved {
    uint64_t uid = 0;
    std::vector<const LoraPair*> by_id;  // [targets] the pair, or nullptr
  };
  const Resolved& resolve(const LoraAdapter& adapter);

  std::vector<LoraTarget> targets_;
  std::vector<Resolved> cache_;                 // most recent last; bounded
  std::vector<std::vector<LoraGroup>> groups_;  // [targets] this step's groups
  int32_t logit_rows_target_ = -1;
  bool active_ = false;
};

// y[t][r] (r in [r0, r1), t in every group) += scale * u_g[t - t0] . B[row0 + r], u_g = the
// group's shrunk rows ([n][rank] at u + offsets[g]). Runs on the calling thread.
void lora_expand_rows(std::span<const LoraGroup> groups, const float* u, std::span<const int64_t> offsets,
                      int64_t row0, float* y, int64_t ldy, int64_t r0, int64_t r1);
// u_g = x[t0 .. t0 + n) A^T for every group, into u + offsets[g] (offsets: the prefix sums of
// n * rank, which this fills; returns the floats needed). x rows ldx apart. With u == nullptr
// only sizes. One pool region.
int64_t lora_shrink_size(std::span<const LoraGroup> groups, std::vector<int64_t>& offsets);
void lora_shrink(std::span<const LoraGroup> groups, const float* x, int64_t ldx, float* u,
                 std::span<const int64_t> offsets, ThreadPool& pool);

}  // namespace tern
