#include "kv/kv_store.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "ops/ops.h"
#include "quant/quant_traits.h"

namespace tern {

namespace {
constexpr KvTypeTraits kKvTypes[] = {
    {KvType::F32, "f32", DType::F32, 1, 1},
    {KvType::F16, "f16", DType::F16, 1, 1},
    {KvType::Q8_0, "q8_0", DType::Q8_0, kKvQuantBlock, 8},
    {KvType::Q4_0, "q4_0", DType::Q4_0, kKvQuantBlock, 8},
};
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
  const int64_t b = dtype_row_bytes(kv_type_traits(type).dtype, n);
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
  data_.assign(size_t(offset), 0);
}

void KvStore::store(int64_t il, int64_t slot, int64_t c0, const float* k, const float* v, int64_t n) {
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
  const uint8_t* kd = data_.data() + layer_offset_[size_t(il)] + slot * row_bytes_[size_t(il)];
  const int64_t n = rows_[size_t(il)];
  if (type_ == KvType::F32) {
    std::memcpy(dst, kd, size_t(n) * sizeof(float));
    return;
  }
  require_quant_traits(kv_type_traits(type_).dtype, "KV cache").to_float(kd, dst, n);
}

void KvStore::store_k(int64_t il, int64_t slot, const float* k) {
  uint8_t* kd = data_.data() + layer_offset_[size_t(il)] + slot * row_bytes_[size_t(il)];
  const int64_t n = rows_[size_t(il)];
  switch (type_) {
    case KvType::F32: std::memcpy(kd, k, size_t(n) * sizeof(float)); break;
    case KvType::F16: convert_f32_to_f16(k, reinterpret_cast<uint16_t*>(kd), n); break;
    default: require_quant_traits(kv_type_traits(type_).dtype, "KV cache").from_float(k, kd, n);
  }
}

void KvStore::copy_slots(int64_t src, int64_t dst, int64_t n) {
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
