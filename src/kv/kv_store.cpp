#include "kv/kv_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "ops/ops.h"
#include "quant/quant_traits.h"

namespace tern {

namespace {
constexpr KvTypeTraits kKvTypes[] = {
    {KvType::F32, "f32", DType::F32, 1, 1},
    {KvType::F16, "f16", DType::F16, 1, 1},
    {KvType::Q8_0, "q8_0", DType::Q8_0, kKvQuantBlock, 8},
    {KvType::Q4_0, "q4_0", DType::Q4_0, kKvQuantBlock, 8},
    // 2-bit codes (8 bytes per 32) and, per 32 elements, two fp16: K's per channel for the
    // group's 32 slots, V's per block of the slot's row.
    {KvType::Kivi2, "kivi2", DType::F32, kKvQuantBlock, 8, 12},
};

// The fp16 step and minimum of 2-bit codes over values [lo, hi], and the code of x under them:
// steps of (hi - lo) / 3 from lo, codes rounded to nearest and clamped to 0..3 (the step and
// minimum as the decoder reads them: rounded to fp16 first).
struct Q2Range {
  uint16_t step_h, min_h;
  float step, mn;
  Q2Range(float lo, float hi)
      : step_h(f32_to_fp16((hi - lo) / 3.0f)), min_h(f32_to_fp16(lo)), step(fp16_to_f32(step_h)), mn(fp16_to_f32(min_h)) {}
  uint32_t code(float x) const {
    if (!(step > 0.0f)) return 0;
    const float q = std::nearbyint((x - mn) / step);
    return q >= 3.0f ? 3u : q >= 0.0f ? uint32_t(q) : 0u;  // NaN: 0
  }
};
// Code q of element j into a 32-element chunk of 8 bytes (attention_iface.h's layout).
void put_code(uint8_t* chunk, int64_t j, uint32_t q) { chunk[j % 8] = uint8_t(chunk[j % 8] | (q << (2 * (j / 8)))); }
}  // namespace

std::span<const KvTypeTraits> kv_types() { return kKvTypes; }

const KvTypeTraits& kv_type_traits(KvType type) {
  for (const KvTypeTraits& t : kKvTypes)
    if (t.type == type) return t;
  fail("unknown KV cache type ", int(type));
}

const char* kv_type_name(KvType type) { return kv_type_traits(type).name; }

KvType kv_type_from_name(const std::string& name) {
  std::string names;
  for (const KvTypeTraits& t : kKvTypes) {
    if (name == t.name) return t.type;
    names += names.empty() ? t.name : std::string(", ") + t.name;
  }
  fail("unknown KV cache type '", name, "' (use one of ", names, ")");
}

int64_t kv_row_bytes(KvType type, int64_t n) {
  const KvTypeTraits& t = kv_type_traits(type);
  const int64_t b = t.own_block_bytes == 0 ? dtype_row_bytes(t.dtype, n)
                    : n % t.row_multiple == 0 ? n / t.row_multiple * t.own_block_bytes
                                              : -1;
  if (b < 0) fail("a K/V row of ", n, " elements is not whole ", kv_type_name(type), " blocks (use f16 or f32)");
  return b;
}

void check_kv_type(KvType type, std::span<const int64_t> rows, int64_t head_dim, const std::string& what) {
  const KvTypeTraits& t = kv_type_traits(type);
  if (head_dim % t.head_dim_multiple != 0)
    fail(what, ": --kv-type ", t.name, " needs a head size that is a multiple of ", t.head_dim_multiple,
         " (the attention kernels dequantize 8-element pieces inside one block of ", kKvQuantBlock,
         "); head_dim is ", head_dim, " (use f16 or f32)");
  for (size_t il = 0; il < rows.size(); ++il)
    if (rows[il] % t.row_multiple != 0)
      fail(what, ": --kv-type ", t.name, " stores K/V rows in blocks of ", t.row_multiple, " but layer ", il,
           "'s row (n_head_kv * head_dim) is ", rows[il], " elements (use f16 or f32)");
}

KvStore::KvStore(std::vector<int64_t> rows, int64_t n_slots, KvType type, bool k_only)
    : type_(type), k_only_(k_only), n_slots_(n_slots), rows_(std::move(rows)) {
  int64_t offset = 0;
  for (size_t il = 0; il < rows_.size(); ++il) {
    row_bytes_.push_back(kv_row_bytes(type_, rows_[il]));
    layer_offset_.push_back(offset);
    offset += (k_only_ ? 1 : 2) * layer_bytes(int64_t(il));
  }
  if (type_ != KvType::Kivi2) {
    data_.assign(size_t(offset), 0);
    return;
  }
  if (k_only_)
    fail("--kv-type kivi2 quantizes keys per channel and values per token, but this model caches one latent row "
         "that serves as both (multi-head latent attention): use f16, q8_0 or q4_0");
  // Every group starts sealed with zero codes, steps and minima: it reads as zeros.
  const int64_t n_groups = this->n_groups(), n_rows = n_groups * kKiviGroup;
  kivi_.resize(rows_.size());
  for (size_t il = 0; il < rows_.size(); ++il) {
    KiviArena& A = kivi_[il];
    const int64_t row = rows_[il];
    A.k_codes.assign(size_t(n_rows * row / 4), 0);
    A.k_step.assign(size_t(n_groups * row), 0);
    A.k_min.assign(size_t(n_groups * row), 0);
    A.v_blocks.assign(size_t(n_rows * (row / 32) * kKiviVBlockBytes), 0);
    A.stage_of.assign(size_t(n_groups), -1);
  }
}

int64_t KvStore::bytes() const {
  int64_t n = int64_t(data_.size()) + int64_t(state_.size() * sizeof(float));
  for (size_t il = 0; il < kivi_.size(); ++il) {
    const KiviArena& A = kivi_[il];
    const int64_t stage_bytes = 2 * kKiviGroup * rows_[il] * int64_t(sizeof(uint16_t));  // K and V
    n += int64_t(A.k_codes.size() + A.v_blocks.size()) + 2 * int64_t(A.k_step.size() + A.k_min.size()) +
         4 * int64_t(A.stage_of.size());
    for (const auto& st : A.stages) n += st ? stage_bytes : 0;
  }
  for (const auto& [row, buf] : spare_) n += 2 * kKiviGroup * row * int64_t(sizeof(uint16_t));
  return n;
}

const KiviLayer* KvStore::kivi_view(int64_t il) const {
  KiviArena& A = kivi_[size_t(il)];
  A.view = KiviLayer{A.k_codes.data(), A.k_step.data(), A.k_min.data(), A.v_blocks.data(),
                     A.stage_of.data(), A.stage_ptrs.data()};
  return &A.view;
}

int64_t KvStore::n_open_groups() const {
  int64_t n = 0;
  for (const KiviArena& A : kivi_)
    for (int32_t s : A.stage_of) n += s >= 0;
  return n;
}

std::vector<int64_t> KvStore::open_groups() const {
  std::vector<int64_t> out;
  if (kivi_.empty()) return out;
  for (size_t g = 0; g < kivi_[0].stage_of.size(); ++g)
    if (kivi_[0].stage_of[g] >= 0) out.push_back(int64_t(g));
  return out;
}

void KvStore::load_row(int64_t il, int64_t slot, bool is_v, float* dst) const {
  TERN_ASSERT(type_ == KvType::Kivi2 && slot >= 0 && slot < n_slots_);
  kivi_row_to_f32(*kivi_view(il), rows_[size_t(il)], slot, is_v, 0, rows_[size_t(il)], dst);
}

// The stage of `group` in layer il, opening the group if it is sealed: a free stage (or a new
// one) gets the group's 32 rows dequantized, as fp16.
int32_t KvStore::kivi_open(int64_t il, int64_t group) {
  KiviArena& A = kivi_[size_t(il)];
  if (A.stage_of[size_t(group)] >= 0) return A.stage_of[size_t(group)];
  const int64_t row = rows_[size_t(il)], stage_elems = kKiviGroup * row;
  int32_t stage;
  if (!A.free_stages.empty()) {
    stage = A.free_stages.back();
    A.free_stages.pop_back();
  } else {
    stage = int32_t(A.stages.size());
    A.stages.emplace_back();
    A.stage_ptrs.push_back(nullptr);
  }
  // A spare buffer of this row length, or a new one.
  auto spare = std::find_if(spare_.rbegin(), spare_.rend(), [&](const auto& s) { return s.first == row; });
  if (spare != spare_.rend()) {
    A.stages[size_t(stage)] = std::move(spare->second);
    spare_.erase(std::next(spare).base());
  } else {
    A.stages[size_t(stage)] = std::make_unique<uint16_t[]>(size_t(2 * stage_elems));
  }
  A.stage_ptrs[size_t(stage)] = A.stages[size_t(stage)].get();
  std::vector<float> f(static_cast<size_t>(row));
  const KiviLayer& sealed = *kivi_view(il);  // stage_of[group] is still -1: the sealed arrays
  for (int64_t j = 0; j < kKiviGroup; ++j) {
    const int64_t slot = group * kKiviGroup + j;
    for (int kv = 0; kv < 2; ++kv) {
      kivi_row_to_f32(sealed, row, slot, kv == 1, 0, row, f.data());
      convert_f32_to_f16(f.data(), A.stages[size_t(stage)].get() + (kv * kKiviGroup + j) * row, row);
    }
  }
  A.stage_of[size_t(group)] = stage;
  kivi_view(il);
  return stage;
}

// Quantizes an open group's stage into its sealed arrays and frees the stage: K per channel
// over the 32 slots, V per slot in blocks of 32 elements.
void KvStore::kivi_seal(int64_t il, int64_t group) {
  KiviArena& A = kivi_[size_t(il)];
  const int32_t stage = A.stage_of[size_t(group)];
  TERN_ASSERT(stage >= 0);
  const int64_t row = rows_[size_t(il)];
  const uint16_t* sk = A.stages[size_t(stage)].get();  // [32][row], then V's
  const uint16_t* sv = sk + kKiviGroup * row;
  const int64_t slot0 = group * kKiviGroup;
  uint8_t* codes = A.k_codes.data() + slot0 * (row / 4);
  std::fill_n(codes, kKiviGroup * (row / 4), uint8_t(0));
  for (int64_t e = 0; e < row; ++e) {
    float lo = fp16_to_f32(sk[e]), hi = lo;
    for (int64_t j = 1; j < kKiviGroup; ++j) {
      const float x = fp16_to_f32(sk[j * row + e]);
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    const Q2Range r(lo, hi);
    A.k_step[size_t(group * row + e)] = r.step_h;
    A.k_min[size_t(group * row + e)] = r.min_h;
    for (int64_t j = 0; j < kKiviGroup; ++j)
      put_code(codes + j * (row / 4) + e / 32 * 8, e % 32, r.code(fp16_to_f32(sk[j * row + e])));
  }
  for (int64_t j = 0; j < kKiviGroup; ++j) {
    const uint16_t* src = sv + j * row;
    uint8_t* blocks = A.v_blocks.data() + (slot0 + j) * (row / 32) * kKiviVBlockBytes;
    for (int64_t b = 0; b < row / 32; ++b) {
      uint8_t* blk = blocks + b * kKiviVBlockBytes;
      float lo = fp16_to_f32(src[b * 32]), hi = lo;
      for (int64_t i = 1; i < 32; ++i) {
        lo = std::min(lo, fp16_to_f32(src[b * 32 + i]));
        hi = std::max(hi, fp16_to_f32(src[b * 32 + i]));
      }
      const Q2Range r(lo, hi);
      std::memcpy(blk, &r.step_h, 2);
      std::memcpy(blk + 2, &r.min_h, 2);
      std::fill_n(blk + 4, 8, uint8_t(0));
      for (int64_t i = 0; i < 32; ++i) put_code(blk + 4, i, r.code(fp16_to_f32(src[b * 32 + i])));
    }
  }
  kivi_release(il, group);
}

void KvStore::kivi_release(int64_t il, int64_t group) {
  KiviArena& A = kivi_[size_t(il)];
  const int32_t stage = A.stage_of[size_t(group)];
  spare_.emplace_back(rows_[size_t(il)], std::move(A.stages[size_t(stage)]));
  A.stage_ptrs[size_t(stage)] = nullptr;
  A.free_stages.push_back(stage);
  A.stage_of[size_t(group)] = -1;
}

void KvStore::seal_due(int64_t il) {
  if (type_ != KvType::Kivi2) return;
  KiviArena& A = kivi_[size_t(il)];
  for (int64_t group : A.due)
    if (A.stage_of[size_t(group)] >= 0) kivi_seal(il, group);
  A.due.clear();
}

void KvStore::discard_open(int64_t slot0, int64_t n) {
  if (type_ != KvType::Kivi2) return;
  for (size_t il = 0; il < kivi_.size(); ++il)
    for (int64_t g = (slot0 + kKiviGroup - 1) / kKiviGroup; (g + 1) * kKiviGroup <= slot0 + n; ++g)
      if (kivi_[il].stage_of[size_t(g)] >= 0) kivi_release(int64_t(il), g);
}

void KvStore::store(int64_t il, int64_t slot, int64_t c0, const float* k, const float* v, int64_t n) {
  if (type_ == KvType::Kivi2) {
    TERN_ASSERT(slot >= 0 && slot < n_slots_ && c0 >= 0 && c0 + n <= rows_[size_t(il)]);
    const int64_t row = rows_[size_t(il)], group = slot / kKiviGroup;
    uint16_t* dst = kivi_[size_t(il)].stages[size_t(kivi_open(il, group))].get() + slot % kKiviGroup * row + c0;
    KiviArena& A = kivi_[size_t(il)];
    convert_f32_to_f16(k, dst, n);
    convert_f32_to_f16(v, dst + kKiviGroup * row, n);
    if (slot % kKiviGroup == kKiviGroup - 1 && c0 + n == row) A.due.push_back(group);
    return;
  }
  const int64_t at = slot * row_bytes_[size_t(il)] + kv_row_bytes(type_, c0);
  uint8_t* kd = data_.data() + layer_offset_[size_t(il)] + at;
  uint8_t* vd = kd + layer_bytes(il);
  switch (type_) {
    case KvType::F32:
      std::memcpy(kd, k, size_t(n) * sizeof(float));
      if (!k_only_) std::memcpy(vd, v, size_t(n) * sizeof(float));
      break;
    case KvType::F16:
      convert_f32_to_f16(k, reinterpret_cast<uint16_t*>(kd), n);
      if (!k_only_) convert_f32_to_f16(v, reinterpret_cast<uint16_t*>(vd), n);
      break;
    default: {
      // llama.cpp's reference quantizer (quant traits' from_float): the same blocks as its
      // cache holds for these rows.
      const QuantTraits& q = require_quant_traits(kv_type_traits(type_).dtype, "KV cache");
      TERN_ASSERT(c0 % q.block_size == 0 && n % q.block_size == 0);
      q.from_float(k, kd, n);
      if (!k_only_) q.from_float(v, vd, n);
    }
  }
}

void KvStore::load_k(int64_t il, int64_t slot, float* dst) const {
  if (type_ == KvType::Kivi2) {
    load_row(il, slot, false, dst);
    return;
  }
  const uint8_t* kd = data_.data() + layer_offset_[size_t(il)] + slot * row_bytes_[size_t(il)];
  const int64_t n = rows_[size_t(il)];
  if (type_ == KvType::F32) {
    std::memcpy(dst, kd, size_t(n) * sizeof(float));
    return;
  }
  require_quant_traits(kv_type_traits(type_).dtype, "KV cache").to_float(kd, dst, n);
}

void KvStore::store_k(int64_t il, int64_t slot, const float* k) {
  if (type_ == KvType::Kivi2) {  // V untouched; a sealed group seals again
    const int64_t row = rows_[size_t(il)], group = slot / kKiviGroup;
    const bool was_sealed = kivi_[size_t(il)].stage_of[size_t(group)] < 0;
    uint16_t* dst = kivi_[size_t(il)].stages[size_t(kivi_open(il, group))].get() + slot % kKiviGroup * row;
    convert_f32_to_f16(k, dst, row);
    if (was_sealed) kivi_seal(il, group);
    return;
  }
  uint8_t* kd = data_.data() + layer_offset_[size_t(il)] + slot * row_bytes_[size_t(il)];
  const int64_t n = rows_[size_t(il)];
  switch (type_) {
    case KvType::F32: std::memcpy(kd, k, size_t(n) * sizeof(float)); break;
    case KvType::F16: convert_f32_to_f16(k, reinterpret_cast<uint16_t*>(kd), n); break;
    default: require_quant_traits(kv_type_traits(type_).dtype, "KV cache").from_float(k, kd, n);
  }
}

void KvStore::pin_keys(int64_t slot) {
  TERN_ASSERT(slot >= 0 && slot < n_slots_);
  std::vector<float>& keys = pinned_k_[slot];
  keys.clear();
  for (size_t il = 0; il < rows_.size(); ++il) {
    const size_t at = keys.size();
    keys.resize(at + size_t(rows_[il]));
    if (rows_[il] > 0) load_k(int64_t(il), slot, keys.data() + at);
  }
}

std::span<const float> KvStore::pinned_keys(int64_t slot) const {
  const auto it = pinned_k_.find(slot);
  if (it == pinned_k_.end()) return {};
  return it->second;
}

void KvStore::copy_slots(int64_t src, int64_t dst, int64_t n) {
  if (type_ == KvType::Kivi2) {
    // Slot by slot through f32 (in the direction that never reads a slot already overwritten).
    for (size_t il = 0; il < rows_.size(); ++il) {
      std::vector<float> k(size_t(rows_[il])), v(size_t(rows_[il]));
      for (int64_t c = 0; c < n; ++c) {
        const int64_t i = dst > src ? n - 1 - c : c;
        load_row(int64_t(il), src + i, false, k.data());
        load_row(int64_t(il), src + i, true, v.data());
        store(int64_t(il), dst + i, 0, k.data(), v.data(), rows_[il]);
      }
      seal_due(int64_t(il));
    }
    return;
  }
  for (size_t il = 0; il < rows_.size(); ++il) {
    const int64_t rb = row_bytes_[il];
    for (int kv = 0; kv < (k_only_ ? 1 : 2); ++kv) {
      uint8_t* base = data_.data() + layer_offset_[il] + kv * layer_bytes(int64_t(il));
      std::memmove(base + dst * rb, base + src * rb, size_t(n * rb));
    }
  }
}

void KvStore::set_state_rows(std::vector<int64_t> state_rows, int64_t n_state_slots) {
  TERN_ASSERT(state_rows.size() == rows_.size() && n_state_slots >= 0);
  state_rows_ = std::move(state_rows);
  n_state_slots_ = n_state_slots;
  state_offset_.clear();
  int64_t offset = 0;
  for (int64_t r : state_rows_) {
    state_offset_.push_back(offset);
    offset += r * n_state_slots;
  }
  state_.assign(size_t(offset), 0.0f);
}

void KvStore::clear_state(int64_t slot) {
  TERN_ASSERT(slot >= 0 && slot < n_state_slots_);
  for (size_t il = 0; il < state_rows_.size(); ++il) std::fill_n(state(int64_t(il), slot), state_rows_[il], 0.0f);
}

void KvStore::copy_state(int64_t src, int64_t dst) {
  TERN_ASSERT(src >= 0 && src < n_state_slots_ && dst >= 0 && dst < n_state_slots_);
  for (size_t il = 0; il < state_rows_.size(); ++il)
    std::copy_n(state(int64_t(il), src), state_rows_[il], state(int64_t(il), dst));
}

int64_t KvStore::state_bytes_per_slot() const {
  int64_t n = 0;
  for (int64_t r : state_rows_) n += r;
  return n * int64_t(sizeof(float));
}

int64_t KvStore::bytes_per_token(std::span<const int64_t> rows, KvType type, bool k_only) {
  int64_t bytes = 0;
  for (int64_t r : rows) bytes += (k_only ? 1 : 2) * kv_row_bytes(type, r);
  return bytes;
}

}  // namespace tern
