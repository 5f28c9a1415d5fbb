#pragma once
// The K/V arena every forward pass reads and writes, and its element types.
//
// Layer il holds [n_slots, row(il)] elements for K and for V, row(il) = n_head_kv(il) * head_dim.
// Sized once; slots are handed out by whoever owns the cache (runtime::Session for one
// contiguous sequence, KvCacheManager's block tables in the engine, the draft model's regions).
// New rows are written through store(), which converts to the arena's type; the attention
// kernels read the layer arenas k(il) / v(il) with kv_type = type() (ops/attention_iface.h).
//
// Element types are rows of a traits table whose sizes and quantizer are the quant traits
// table's (DType), so q8_0 / q4_0 K/V are llama.cpp's blocks byte for byte. kivi2 (KIVI's
// 2-bit cache, attention_iface.h's KiviLayer) has no DType: keys are quantized per channel over
// groups of 32 slots, so the store seals a group's 32 rows together when its last slot is
// written; until then the group's rows are fp16 (the full-precision recent window).
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/attention_iface.h"

namespace tern {

struct KvTypeTraits {
  KvType type;
  const char* name;  // --kv-type spelling
  DType dtype;       // storage format: sizes and quantizer from the quant traits table
  // Row length the type needs: a multiple of block elements (1 for f32/f16), and head slices in
  // whole 8-element pieces that never cross a block (what the attention tiles dequantize).
  int64_t row_multiple;
  int64_t head_dim_multiple;
  // kivi2: bytes of K (and of V) per 32 elements of a slot, averaged over a sealed group; 0: the
  // dtype's row bytes.
  int64_t own_block_bytes = 0;
};
const KvTypeTraits& kv_type_traits(KvType type);
std::span<const KvTypeTraits> kv_types();

// "f32" / "f16" / "q8_0" / "q4_0" / "kivi2"; kv_type_from_name throws tern::Error naming the accepted values.
const char* kv_type_name(KvType type);
KvType kv_type_from_name(const std::string& name);
// Bytes of `n` elements of the type (n a multiple of its block).
int64_t kv_row_bytes(KvType type, int64_t n);
// Throws tern::Error naming `what` (the model) and its shape when K/V rows of these sizes cannot
// be stored as `type` (q8_0 / q4_0: rows of whole 32-element blocks, head_dim a multiple of 8).
void check_kv_type(KvType type, std::span<const int64_t> rows, int64_t head_dim, const std::string& what);

class KvStore {
 public:
  // rows: [n_layer] elements per slot and layer (n_head_kv(il) * head_dim). check_kv_type first.
  // k_only (multi-head latent attention, models/deepseek2.cpp): one row per slot that serves as
  // both K and V (the latent is the values); v(il) is k(il), and store() ignores v.
  KvStore(std::vector<int64_t> rows, int64_t n_slots, KvType type = KvType::F32, bool k_only = false);
  bool k_only() const { return k_only_; }
  KvType type() const { return type_; }
  // Layer il's arenas: n_slots rows of row(il) elements of type(). kivi2: both are the layer's
  // KiviLayer (the kernels' view; valid across later stores, which refresh it).
  const void* k(int64_t il) const {
    if (type_ == KvType::Kivi2) return kivi_view(il);
    return data_.data() + layer_offset_[size_t(il)];
  }
  const void* v(int64_t il) const {
    if (type_ == KvType::Kivi2) return kivi_view(il);
    return data_.data() + layer_offset_[size_t(il)] + (k_only_ ? 0 : layer_bytes(il));
  }
  // K and V of one slot, columns [c0, c0 + n) of its row, in layer il, from f32. Quantized
  // types: c0 and n whole blocks. kivi2: into the slot's group's fp16 stage (reopening a sealed
  // group: its rows dequantized, then requantized when it seals again); a store that ends the
  // row of a group's last slot makes the group due, and seal_due(il) seals it. Not safe from
  // two threads at once.
  void store(int64_t il, int64_t slot, int64_t c0, const float* k, const float* v, int64_t n);
  // The K row of one slot in layer il as f32 (row(il) floats; a half widened, a block
  // dequantized), and its replacement from f32 (V untouched): re-rotating a stored key.
  void load_k(int64_t il, int64_t slot, float* dst) const;
  void store_k(int64_t il, int64_t slot, const float* k);
  // Keys kept aside by slot (StreamingLLM's sinks that follow the window, runtime/evicting_seq.h,
  // rotated from these copies so that rounding never accumulates): pin_keys copies the slot's K
  // rows of every layer as f32 (load_k), layer after layer (row(il) floats each, none for a layer
  // of row 0), replacing an earlier copy; pinned_keys gives them (empty when none); unpin_keys
  // forgets them.
  void pin_keys(int64_t slot);
  std::span<const float> pinned_keys(int64_t slot) const;
  void unpin_keys(int64_t slot) { pinned_k_.erase(slot); }
  int64_t n_pinned() const { return int64_t(pinned_k_.size()); }
  // Copies n slots starting at src to dst, every layer (copy-on-write of a shared block).
  // kivi2: as dequantized rows stored at dst.
  void copy_slots(int64_t src, int64_t dst, int64_t n);
  // kivi2: quantizes the groups of layer il whose last slot was written. A forward calls it
  // after the layer's attention, so that a step's tokens attend to each other in full precision
  // (KIVI's prefill) and to earlier steps' sealed groups. Without the call groups stay fp16.
  void seal_due(int64_t il);
  // kivi2: drops the stages of the open groups that lie wholly in slots [slot0, slot0 + n)
  // (slots nobody will read again: a finished sequence's unfilled block); they read as whatever
  // their group last sealed until written again.
  void discard_open(int64_t slot0, int64_t n);
  // kivi2: the K (is_v false) or V row of a slot in layer il as f32, what the kernels read.
  void load_row(int64_t il, int64_t slot, bool is_v, float* dst) const;
  // kivi2: groups open now (their stages hold fp16 rows), counted over every layer, and the
  // groups open in layer 0 (every forward writes a slot in all layers).
  int64_t n_open_groups() const;
  std::vector<int64_t> open_groups() const;
  int64_t n_groups() const { return (n_slots_ + kKiviGroup - 1) / kKiviGroup; }
  int64_t n_slots() const { return n_slots_; }
  int64_t row(int64_t il = 0) const { return rows_[size_t(il)]; }
  // The arena, the recurrent states and (kivi2) the open groups' stages.
  int64_t bytes() const;

  // Recurrent models (state-space layers, models/mamba.cpp) keep a fixed-size state per
  // sequence instead of (or beside) K/V: n_state_slots slots, state_rows[il] f32 per slot in
  // layer il (0 for a layer without one). A sequence's state slot is SeqBatch::state_slot.
  void set_state_rows(std::vector<int64_t> state_rows, int64_t n_state_slots);
  float* state(int64_t il, int64_t slot) {
    return state_.data() + state_offset_[size_t(il)] + slot * state_rows_[size_t(il)];
  }
  void clear_state(int64_t slot);            // every layer's state of the slot to 0
  void copy_state(int64_t src, int64_t dst);  // every layer's state of src into dst
  int64_t n_state_slots() const { return n_state_slots_; }
  int64_t state_bytes_per_slot() const;
  // Bytes one token takes: K and V (k_only: the one row), every layer.
  static int64_t bytes_per_token(std::span<const int64_t> rows, KvType type, bool k_only = false);

 private:
  int64_t layer_bytes(int64_t il) const { return n_slots_ * row_bytes_[size_t(il)]; }
  KvType type_;
  bool k_only_ = false;
  int64_t n_slots_;
  std::vector<int64_t> rows_;          // [n_layer] elements per slot and layer
  std::vector<int64_t> row_bytes_;     // [n_layer] bytes per slot and layer
  std::vector<int64_t> layer_offset_;  // [n_layer] byte offset of the layer's K arena (V follows)
  std::vector<uint8_t> data_;  // per layer: [K, V][n_slots][row_bytes(il)]
  int64_t n_state_slots_ = 0;
  std::vector<int64_t> state_rows_;    // [n_layer] floats per state slot and layer
  std::vector<int64_t> state_offset_;  // [n_layer] float offset of the layer's states
  std::vector<float> state_;           // per layer: [n_state_slots][state_rows(il)]
  std::map<int64_t, std::vector<float>> pinned_k_;  // pin_keys: slot -> its K rows, every layer

  // kivi2, per layer: the sealed arrays, the open groups' stages and the view the kernels read,
  // refreshed when a layer's stage table grows. A sealed group's stage buffer goes to spare_,
  // shared by the layers, so that the groups one step completes (sealed layer by layer, after
  // each layer's attention) need one layer's stages at a time, not every layer's.
  struct KiviArena {
    std::vector<uint8_t> k_codes;    // [n_groups * 32][row / 4]
    std::vector<uint16_t> k_step;    // [n_groups][row] fp16
    std::vector<uint16_t> k_min;     // [n_groups][row] fp16
    std::vector<uint8_t> v_blocks;   // [n_groups * 32][row / 32][12]
    std::vector<int32_t> stage_of;   // [n_groups] -1: sealed
    // [stage id] fp16 [K, V][32][row], one allocation each (a new one moves none); null while
    // the id is free.
    std::vector<std::unique_ptr<uint16_t[]>> stages;
    std::vector<const uint16_t*> stage_ptrs;  // the view's table
    std::vector<int32_t> free_stages;         // free ids
    std::vector<int64_t> due;        // groups whose last slot was written since seal_due
    KiviLayer view{};
  };
  const KiviLayer* kivi_view(int64_t il) const;
  int32_t kivi_open(int64_t il, int64_t group);
  void kivi_seal(int64_t il, int64_t group);
  void kivi_release(int64_t il, int64_t group);  // the group's stage buffer to spare_
  mutable std::vector<KiviArena> kivi_;  // [n_layer] (kivi_view refreshes the views)
  // Stage buffers no layer holds, by row length (layers of one row length share them).
  std::vector<std::pair<int64_t, std::unique_ptr<uint16_t[]>>> spare_;
};

}  // namespace tern
