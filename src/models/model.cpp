#include "models/model.h"

#include "core/error.h"

namespace tern {

KvStore::KvStore(const HParams& hp, int64_t n_slots)
    : n_slots_(n_slots), row_(hp.n_embd_kv()), layer_stride_(n_slots * hp.n_embd_kv()) {
  k_.assign(size_t(hp.n_layer * layer_stride_), 0.0f);
  v_.assign(size_t(hp.n_layer * layer_stride_), 0.0f);
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
