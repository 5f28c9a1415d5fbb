#include "models/model.h"

#include <cstring>

#include "core/error.h"
#include "ops/ops.h"

namespace tern {

KvStore::KvStore(const HParams& hp, int64_t n_slots, KvType type)
    : type_(type), n_slots_(n_slots), row_(hp.n_embd_kv()),
      elem_bytes_(type == KvType::F16 ? 2 : 4), layer_bytes_(n_slots * hp.n_embd_kv() * elem_bytes_) {
  TERN_ASSERT(type == KvType::F32 || type == KvType::F16);
  data_.assign(size_t(2 * hp.n_layer * layer_bytes_), 0);
}

void KvStore::store(int64_t il, int64_t slot, int64_t c0, const float* k, const float* v, int64_t n) {
  const int64_t at = (slot * row_ + c0) * elem_bytes_;
  uint8_t* kd = data_.data() + (2 * il) * layer_bytes_ + at;
  uint8_t* vd = kd + layer_bytes_;
  if (type_ == KvType::F16) {
    convert_f32_to_f16(k, reinterpret_cast<uint16_t*>(kd), n);
    convert_f32_to_f16(v, reinterpret_cast<uint16_t*>(vd), n);
  } else {
    std::memcpy(kd, k, size_t(n) * sizeof(float));
    std::memcpy(vd, v, size_t(n) * sizeof(float));
  }
}

void KvStore::copy_slots(int64_t src, int64_t dst, int64_t n) {
  const int64_t rb = row_ * elem_bytes_;
  for (int64_t kv = 0; kv < int64_t(data_.size()) / layer_bytes_; ++kv) {
    uint8_t* base = data_.data() + kv * layer_bytes_;
    std::memmove(base + dst * rb, base + src * rb, size_t(n * rb));
  }
}

int64_t KvStore::bytes_per_token(const HParams& hp, KvType type) {
  return 2 * hp.n_layer * hp.n_embd_kv() * (type == KvType::F16 ? 2 : 4);
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

HParams read_hparams(const GgufFile& f) {
  HParams hp;
  hp.arch = f.get_string("general.architecture");
  const std::string a = hp.arch + ".";
  hp.n_embd = int64_t(f.get_uint(a + "embedding_length"));
  hp.n_layer = int64_t(f.get_uint(a + "block_count"));
  hp.n_head = int64_t(f.get_uint(a + "attention.head_count"));
  hp.n_head_kv = int64_t(f.get_uint(a + "attention.head_count_kv", uint64_t(hp.n_head)));
  hp.n_ff = int64_t(f.get_uint(a + "feed_forward_length"));
  hp.n_ctx_train = int64_t(f.get_uint(a + "context_length", 2048));
  hp.rope_freq_base = float(f.get_float(a + "rope.freq_base", 10000.0));
  hp.rms_eps = float(f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5));
  const std::string& p = f.path();
  if (hp.n_embd <= 0 || hp.n_embd > (1 << 20)) fail(p, ": bad ", a, "embedding_length ", hp.n_embd);
  if (hp.n_layer <= 0 || hp.n_layer > 4096) fail(p, ": bad ", a, "block_count ", hp.n_layer);
  if (hp.n_head <= 0 || hp.n_embd % hp.n_head != 0)
    fail(p, ": ", a, "attention.head_count ", hp.n_head, " does not divide embedding_length ", hp.n_embd);
  if (hp.n_head_kv <= 0 || hp.n_head % hp.n_head_kv != 0)
    fail(p, ": ", a, "attention.head_count_kv ", hp.n_head_kv, " does not divide head_count ", hp.n_head);
  if (hp.n_ff <= 0 || hp.n_ff > (1 << 22)) fail(p, ": bad ", a, "feed_forward_length ", hp.n_ff);
  if (hp.n_ctx_train <= 0) fail(p, ": bad ", a, "context_length ", hp.n_ctx_train);
  if (!(hp.rms_eps > 0.0f) || !(hp.rope_freq_base > 0.0f)) fail(p, ": bad rms epsilon or rope base");
  hp.head_dim = hp.n_embd / hp.n_head;
  hp.n_rot = int64_t(f.get_uint(a + "rope.dimension_count", uint64_t(hp.head_dim)));
  if (hp.n_rot <= 0 || hp.n_rot > hp.head_dim || hp.n_rot % 2 != 0)
    fail(p, ": ", a, "rope.dimension_count ", hp.n_rot, " must be even and <= head_dim ", hp.head_dim);
  // n_vocab comes from the embedding tensor (the tokenizer may be absent or larger).
  const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb) fail(p, ": missing tensor token_embd.weight");
  if (emb->ne.size() != 2) fail(p, ": token_embd.weight must be 2-D, has ", emb->ne.size(), " dimensions");
  hp.n_vocab = emb->ne[1];
  return hp;
}

}  // namespace tern
