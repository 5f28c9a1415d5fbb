#include "models/model.h"

#include <cstring>

#include "core/error.h"
#include "ops/ops.h"

namespace tern {

std::vector<int64_t> kv_rows(const HParams& hp) {
  std::vector<int64_t> rows;
  for (int64_t il = 0; il < hp.n_layer; ++il) rows.push_back(hp.n_embd_kv(il));
  return rows;
}

KvStore make_kv_store(const HParams& hp, int64_t n_slots, KvType type, int64_t n_state_slots) {
  std::vector<int64_t> rows = kv_rows(hp);
  check_kv_type(type, rows, hp.head_dim, "model '" + hp.arch + "' (" + std::to_string(hp.n_head_kv) + " KV heads of " +
                                             std::to_string(hp.head_dim) + ")");
  KvStore kv(std::move(rows), n_slots, type, hp.kv_k_only());
  if (hp.recurrent()) {
    std::vector<int64_t> state_rows;  // [n_layer] (a hybrid's attention layers keep none)
    for (int64_t il = 0; il < hp.n_layer; ++il) state_rows.push_back(hp.state_floats(il));
    kv.set_state_rows(std::move(state_rows), n_state_slots);
  }
  return kv;
}

int64_t kv_bytes_per_token(const HParams& hp, KvType type) {
  return KvStore::bytes_per_token(kv_rows(hp), type, hp.kv_k_only());
}

int64_t n_logit_rows(std::span<const SeqBatch> seqs) {
  int64_t n = 0;
  for (const auto& s : seqs) n += s.all_logits ? int64_t(s.tokens.size()) : 1;
  return n;
}

void Model::place_sink_keys(KvStore& kv, int32_t slot, int64_t shift) const {
  const std::span<const float> keys = kv.pinned_keys(slot);
  TERN_ASSERT_MSG(!keys.empty(), "place_sink_keys: the slot's keys were not kept");
  std::vector<float> k;
  size_t at = 0;
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    const size_t row = size_t(kv.row(il));
    if (row == 0) continue;  // (a layer of another pipeline stage)
    k.assign(keys.begin() + ptrdiff_t(at), keys.begin() + ptrdiff_t(at + row));
    rotate_keys(il, k.data(), 1, shift);
    kv.store_k(il, slot, k.data());
    at += row;
  }
}

void Model::enable_sparse_ffn(const SparseFfnConfig&) {
  fail(hp_.arch, ": --sparse-ffn runs on decoders whose FFNs are dense ReGLU (a ReLU-fied model: tern sparsify "
       "--relufy); this architecture's stack has no sparse FFN");
}

}  // namespace tern
