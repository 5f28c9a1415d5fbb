#pragma once
// What rank 0 tells the other ranks about each step (the step plan: every sequence's tokens,
// positions and KV slots, its LoRA adapters, and which K/V arena they go to), and how a step is
// cut into the
// micro-batches that flow through the pipeline stages. Pure logic: tested without MPI.
#include <cstdint>
#include <span>
#include <vector>

#include "models/lora.h"
#include "models/model.h"

namespace tern::dist {

// An adapter a sequence runs with, as the plan names it: rank 0's LoraAdapter::uid() (every rank
// keeps the adapters rank 0 sent it under that id: dist/parallel_model.cpp) and its scale.
struct LoraRef {
  uint64_t uid = 0;
  float scale = 1.0f;
  int32_t pad = 0;
};

// A decoded plan: owns the tokens and slots its SeqBatch views point into.
struct StepPlan {
  uint64_t kv_id = 0;       // which of rank 0's K/V arenas (each rank keeps its own per id)
  int64_t kv_slots = 0;     // that arena's size and element type
  KvType kv_type = KvType::F32;
  std::vector<SeqBatch> seqs;
  std::vector<int32_t> tokens, slots;
  std::vector<std::vector<LoraRef>> lora;  // [seqs] each sequence's adapters (SeqBatch::lora unset)
  std::vector<bool> key_mass;              // [seqs] it wants key masses (H2O; SeqBatch::key_mass unset)
  int64_t n_tokens() const { return int64_t(tokens.size()); }
};

// Serialises a step (only what a forward pass reads: tokens, slots, n_past, pos, all_logits,
// whether it wants key masses, and each sequence's adapters by uid and scale).
std::vector<uint8_t> encode_step(std::span<const SeqBatch> seqs, uint64_t kv_id, int64_t kv_slots, KvType kv_type);
// Throws tern::Error on a malformed or truncated message.
StepPlan decode_step(std::span<const uint8_t> bytes);

// One micro-batch: whole sequences and pieces of sequences (a prompt cut at a token boundary:
// the later piece's n_past counts the earlier piece's tokens, whose keys the stage has stored
// by then). logit_rows[i]: the step's logits row of the micro-batch's i-th logits row, or -1 for
// a row nobody asked for (the last token of a piece that is not its sequence's last).
struct MicroBatch {
  std::vector<SeqBatch> seqs;
  int64_t n_tokens = 0;
  std::vector<int64_t> logit_rows;
};

// Cuts a step into at most `m` micro-batches of about equal token counts (fewer when the step
// has fewer tokens), in order: running them one after another is the same computation as the
// step (every token attends to the same keys, with the same positions).
std::vector<MicroBatch> split_micro_batches(std::span<const SeqBatch> seqs, int m);

}  // namespace tern::dist
