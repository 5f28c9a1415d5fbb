#include "models/model.h"

#include <cstring>

#include "core/error.h"
#include "ops/ops.h"

namespace tern {

KvStore::KvStore(const HParams& hp, int64_t n_slots, KvType type)
    : type_(type), n_slots_(n_slots), elem_bytes_(type == KvType::F16 ? 2 : 4) {
  TERN_ASSERT(type == KvType::F32 || type == KvType::F16);
  int64_t offset = 0;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    rows_.push_back(hp.n_embd_kv(il));
    layer_offset_.push_back(offset);
    offset += 2 * layer_bytes(il);
  }
  data_.assign(size_t(offset), 0);
}

void KvStore::store(int64_t il, int64_t slot, int64_t c0, const float* k, const float* v, int64_t n) {
  const int64_t at = (slot * rows_[size_t(il)] + c0) * elem_bytes_;
  uint8_t* kd = data_.data() + layer_offset_[size_t(il)] + at;
  uint8_t* vd = kd + layer_bytes(il);
  if (type_ == KvType::F16) {
    convert_f32_to_f16(k, reinterpret_cast<uint16_t*>(kd), n);
    convert_f32_to_f16(v, reinterpret_cast<uint16_t*>(vd), n);
  } else {
    std::memcpy(kd, k, size_t(n) * sizeof(float));
    std::memcpy(vd, v, size_t(n) * sizeof(float));
  }
}

void KvStore::copy_slots(int64_t src, int64_t dst, int64_t n) {
  for (size_t il = 0; il < rows_.size(); ++il) {
    const int64_t rb = rows_[il] * elem_bytes_;
    for (int kv = 0; kv < 2; ++kv) {
      uint8_t* base = data_.data() + layer_offset_[il] + kv * layer_bytes(int64_t(il));
      std::memmove(base + dst * rb, base + src * rb, size_t(n * rb));
    }
  }
}

int64_t KvStore::bytes_per_token(const HParams& hp, KvType type) {
  int64_t elems = 0;
  for (int64_t il = 0; il < hp.n_layer; ++il) elems += 2 * hp.n_embd_kv(il);
  return elems * (type == KvType::F16 ? 2 : 4);
}

const char* kv_type_name(KvType type) { return type == KvType::F16 ? "f16" : "f32"; }

KvType kv_type_from_name(const std::string& name) {
  if (name == "f32") return KvType::F32;
  if (name == "f16") return KvType::F16;
  fail("unknown KV cache type '", name, "' (use f32 or f16)");
}

int64_t n_logit_rows(std::span<const SeqBatch> seqs) {
  int64_t n = 0;
  for (const auto& s : seqs) n += s.all_logits ? int64_t(s.tokens.size()) : 1;
  return n;
}

}  // namespace tern
