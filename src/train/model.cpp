#include "train/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "quant/quant_traits.h"
#include "train/rng.h"

namespace tern::train {

void ModelShape::validate(const std::string& what) const {
  auto need = [&](int64_t v, const char* name) {
    if (v <= 0) fail(what, ": ", name, " must be positive (got ", v, ")");
  };
  need(n_vocab, "n_vocab");
  need(n_embd, "n_embd");
  need(n_layer, "n_layer");
  need(n_head, "n_head");
  need(n_head_kv, "n_head_kv");
  need(n_ff, "n_ff");
  if (n_embd % n_head != 0) fail(what, ": n_embd ", n_embd, " is not a multiple of n_head ", n_head);
  if (n_head % n_head_kv != 0) fail(what, ": n_head ", n_head, " is not a multiple of n_head_kv ", n_head_kv);
  if (head_dim() % 2 != 0) fail(what, ": head_dim ", head_dim(), " (n_embd / n_head) must be even for RoPE");
  if (!(rms_eps > 0.0f)) fail(what, ": rms_eps must be positive");
  if (!(rope_freq_base > 0.0f)) fail(what, ": rope freq_base must be positive");
}

std::string ModelShape::describe() const {
  return str_cat("n_vocab ", n_vocab, ", n_embd ", n_embd, ", n_layer ", n_layer, ", n_head ", n_head,
                 ", n_head_kv ", n_head_kv, ", n_ff ", n_ff, tied_output ? ", tied output" : "");
}

bool ModelShape::same_architecture(const ModelShape& o) const {
  return n_vocab == o.n_vocab && n_embd == o.n_embd && n_layer == o.n_layer && n_head == o.n_head &&
         n_head_kv == o.n_head_kv && n_ff == o.n_ff && rms_eps == o.rms_eps &&
         rope_freq_base == o.rope_freq_base && tied_output == o.tied_output;
}

const ParamInfo* TrainModel::find(const std::string& name) const {
  for (const auto& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

namespace {

// The parameter table of a shape; a tensor for which `encoded` says so gets the next slot of
// m.encoded (a negative offset, filled in by the caller) instead of room in data.
template <class Encoded>
TrainModel layout(const ModelShape& s, Encoded&& encoded) {
  s.validate("model shape");
  TrainModel m;
  m.shape = s;
  int64_t off = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> ne, bool decay) {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    int64_t at = off;
    if (encoded(name)) {
      m.encoded.emplace_back();
      at = -int64_t(m.encoded.size());
    } else {
      off += n;
    }
    m.params.push_back({name, std::move(ne), at, n, decay});
    return at;
  };
  const int64_t E = s.n_embd, hd = s.head_dim(), q_w = s.n_head * hd, kv_w = s.n_head_kv * hd;
  m.tok_embd = add("token_embd.weight", {E, s.n_vocab}, true);
  for (int64_t il = 0; il < s.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    LayerOffsets l{};
    l.attn_norm = add(p + "attn_norm.weight", {E}, false);
    l.wq = add(p + "attn_q.weight", {E, q_w}, true);
    l.wk = add(p + "attn_k.weight", {E, kv_w}, true);
    l.wv = add(p + "attn_v.weight", {E, kv_w}, true);
    l.wo = add(p + "attn_output.weight", {q_w, E}, true);
    l.ffn_norm = add(p + "ffn_norm.weight", {E}, false);
    l.w_gate = add(p + "ffn_gate.weight", {E, s.n_ff}, true);
    l.w_up = add(p + "ffn_up.weight", {E, s.n_ff}, true);
    l.w_down = add(p + "ffn_down.weight", {s.n_ff, E}, true);
    m.layers.push_back(l);
  }
  m.output_norm = add("output_norm.weight", {E}, false);
  m.output = s.tied_output ? m.tok_embd : add("output.weight", {E, s.n_vocab}, true);
  m.data.assign(size_t(off), 0.0f);
  return m;
}

}  // namespace

TrainModel make_model(const ModelShape& s) {
  return layout(s, [](const std::string&) { return false; });
}

int64_t TrainModel::n_elements() const {
  int64_t n = 0;
  for (const auto& p : params) n += p.size;
  return n;
}

int64_t TrainModel::bytes_in_memory() const {
  int64_t b = int64_t(data.size() * sizeof(float));
  for (const auto& e : encoded) b += e.rows * e.row_bytes;
  return b;
}

TrainModel init_model(const ModelShape& s, uint64_t seed) {
  TrainModel m = make_model(s);
  Rng rng(mix_seed(seed, 1, 0));
  const float residual_scale = float(1.0 / std::sqrt(2.0 * double(s.n_layer)));
  for (const auto& p : m.params) {
    float* d = m.data.data() + p.offset;
    if (p.ne.size() == 1) {
      for (int64_t i = 0; i < p.size; ++i) d[i] = 1.0f;
      continue;
    }
    const bool residual = p.name.find("attn_output") != std::string::npos || p.name.find("ffn_down") != std::string::npos;
    const float stddev = 0.02f * (residual ? residual_scale : 1.0f);
    for (int64_t i = 0; i < p.size; ++i) d[i] = float(rng.normal()) * stddev;
  }
  return m;
}

ModelShape shape_of(const GgufFile& f) {
  const std::string arch = f.get_string("general.architecture", "");
  if (arch != "llama")
    fail(f.path(), ": tern train trains the llama architecture; this file is '", arch.empty() ? "(none)" : arch, "'");
  const std::string a = "llama.";
  ModelShape s;
  s.n_embd = int64_t(f.get_uint(a + "embedding_length"));
  s.n_layer = int64_t(f.get_uint(a + "block_count"));
  s.n_head = int64_t(f.get_uint(a + "attention.head_count"));
  s.n_head_kv = int64_t(f.get_uint(a + "attention.head_count_kv", uint64_t(s.n_head)));
  s.n_ff = int64_t(f.get_uint(a + "feed_forward_length"));
  s.n_ctx_train = int64_t(f.get_uint(a + "context_length", 2048));
  s.rms_eps = float(f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5));
  s.rope_freq_base = float(f.get_float(a + "rope.freq_base", 10000.0));
  if (const GgufValue* t = f.find("tokenizer.ggml.tokens")) s.n_vocab = int64_t(t->as_array("tokenizer.ggml.tokens").items.size());
  const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
  if (emb == nullptr) fail(f.path(), ": missing tensor token_embd.weight");
  if (emb->ne.size() != 2) fail(f.path(), ": token_embd.weight has shape ", emb->shape_string(), ", expected 2-D");
  if (s.n_vocab == 0) s.n_vocab = emb->ne[1];
  s.tied_output = f.find_tensor("output.weight") == nullptr;
  if (s.n_head > 0) {
    const int64_t hd = s.n_embd / s.n_head;
    const uint64_t key_len = f.get_uint(a + "attention.key_length", uint64_t(hd));
    const uint64_t n_rot = f.get_uint(a + "rope.dimension_count", uint64_t(hd));
    if (int64_t(key_len) != hd) fail(f.path(), ": attention.key_length ", key_len, " != n_embd / n_head ", hd, " (tern train does not train that layout)");
    if (int64_t(n_rot) != hd) fail(f.path(), ": rope.dimension_count ", n_rot, " != head_dim ", hd, " (partial RoPE is not trained)");
  }
  if (f.find_tensor("rope_freqs.weight") != nullptr)
    fail(f.path(), ": rope_freqs.weight (Llama 3.x RoPE scaling) is not supported by tern train");
  s.validate(f.path());
  return s;
}

namespace {

// The file's tensor for p, checked: every tensor of the file has a place in the model, p is
// there with p's shape, a type tern decodes, and all its bytes.
const GgufTensorInfo& checked_tensor(const GgufFile& f, const ParamInfo& p) {
  const GgufTensorInfo* t = f.find_tensor(p.name);
  if (t == nullptr) fail(f.path(), ": missing tensor ", p.name);
  if (t->ne != p.ne) {
    std::string want;
    for (size_t i = 0; i < p.ne.size(); ++i) want += (i ? " x " : "") + std::to_string(p.ne[i]);
    fail(f.path(), ": tensor ", p.name, " has shape ", t->shape_string(), ", expected ", want);
  }
  require_quant_traits(t->type, p.name.c_str());
  const int64_t row = p.ne[0], rows = p.size / row;
  const int64_t rb = dtype_row_bytes(t->type, row);
  if (rb <= 0 || int64_t(t->n_bytes) < rb * rows) fail(f.path(), ": tensor ", p.name, " is truncated");
  return *t;
}

void check_names(const GgufFile& f, const TrainModel& m) {
  for (const auto& t : f.tensors()) {
    if (m.find(t.name) == nullptr)
      fail(f.path(), ": tensor ", t.name, " (", t.shape_string(), ") has no place in the trained llama model");
  }
}

// Row r of t into dst (row_len floats), refusing non-finite values.
void decode_row(const GgufFile& f, const ParamInfo& p, const GgufTensorInfo& t, int64_t r, float* dst) {
  const int64_t row = p.ne[0];
  require_quant_traits(t.type, p.name.c_str()).to_float(t.data + r * dtype_row_bytes(t.type, row), dst, row);
  for (int64_t i = 0; i < row; ++i)
    if (!std::isfinite(dst[i])) fail(f.path(), ": tensor ", p.name, " holds a non-finite value at element ", r * row + i);
}

}  // namespace

TrainModel load_model(const GgufFile& f) {
  TrainModel m = make_model(shape_of(f));
  check_names(f, m);
  for (const auto& p : m.params) {
    const GgufTensorInfo& t = checked_tensor(f, p);
    float* dst = m.data.data() + p.offset;
    const int64_t row = p.ne[0], rows = p.size / row;
    for (int64_t r = 0; r < rows; ++r) decode_row(f, p, t, r, dst + r * row);
  }
  return m;
}

TrainModel load_frozen_base(const GgufFile& f) {
  // Matrices not stored as f32 stay encoded; the norms (1-D, a few KB) always go to data.
  auto keep_encoded = [&](const std::string& name) {
    const GgufTensorInfo* t = f.find_tensor(name);
    return t != nullptr && t->ne.size() == 2 && t->type != DType::F32;
  };
  TrainModel m = layout(shape_of(f), keep_encoded);
  check_names(f, m);
  std::vector<float> row_buf;
  for (const auto& p : m.params) {
    const GgufTensorInfo& t = checked_tensor(f, p);
    const int64_t row = p.ne[0], rows = p.size / row;
    if (!TrainModel::is_encoded(p.offset)) {
      float* dst = m.data.data() + p.offset;
      for (int64_t r = 0; r < rows; ++r) decode_row(f, p, t, r, dst + r * row);
      continue;
    }
    EncodedTensor& e = m.encoded[size_t(-1 - p.offset)];
    e.type = t.type;
    e.bytes = t.data;
    e.rows = rows;
    e.cols = row;
    e.row_bytes = dtype_row_bytes(t.type, row);
    row_buf.resize(size_t(row));
    for (int64_t r = 0; r < rows; ++r) decode_row(f, p, t, r, row_buf.data());
  }
  return m;
}

std::string describe_base_memory(const TrainModel& m) {
  std::vector<std::pair<DType, int>> counts;
  int64_t enc_bytes = 0;
  for (const auto& e : m.encoded) {
    enc_bytes += e.rows * e.row_bytes;
    auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == e.type; });
    if (it == counts.end()) counts.emplace_back(e.type, 1);
    else ++it->second;
  }
  auto mb = [](int64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MB", double(b) / 1e6);
    return std::string(buf);
  };
  const std::string f32 = mb(int64_t(m.data.size() * sizeof(float))) + " f32";
  if (counts.empty()) return "f32: " + f32;
  std::string s;
  for (const auto& [type, n] : counts) s += str_cat(s.empty() ? "" : ", ", dtype_name(type), " x ", n);
  return s + ": " + mb(enc_bytes) + " kept encoded, " + f32;
}

void save_model(const TrainModel& m, const GgufFile& vocab, const std::string& path,
                const std::vector<std::pair<std::string, GgufValue>>& extra) {
  const ModelShape& s = m.shape;
  const std::string a = "llama.";
  GgufWriter w(3);
  w.set("general.architecture", GgufValue::string("llama"));
  w.set("general.name", GgufValue::string("tern-trained"));
  w.set("general.file_type", GgufValue::u32(0));  // LLAMA_FTYPE_ALL_F32
  w.set(a + "vocab_size", GgufValue::u32(uint32_t(s.n_vocab)));
  w.set(a + "context_length", GgufValue::u32(uint32_t(s.n_ctx_train)));
  w.set(a + "embedding_length", GgufValue::u32(uint32_t(s.n_embd)));
  w.set(a + "feed_forward_length", GgufValue::u32(uint32_t(s.n_ff)));
  w.set(a + "block_count", GgufValue::u32(uint32_t(s.n_layer)));
  w.set(a + "attention.head_count", GgufValue::u32(uint32_t(s.n_head)));
  w.set(a + "attention.head_count_kv", GgufValue::u32(uint32_t(s.n_head_kv)));
  w.set(a + "rope.dimension_count", GgufValue::u32(uint32_t(s.head_dim())));
  w.set(a + "rope.freq_base", GgufValue::f32(s.rope_freq_base));
  w.set(a + "attention.layer_norm_rms_epsilon", GgufValue::f32(s.rms_eps));
  for (const auto& [k, v] : vocab.metadata())
    if (k.rfind("tokenizer.", 0) == 0) w.set(k, v);
  for (const auto& [k, v] : extra) w.set(k, v);
  for (const auto& p : m.params)
    w.add_tensor(p.name, DType::F32, p.ne, m.data.data() + p.offset, uint64_t(p.size) * sizeof(float));
  w.write(path);
}

}  // namespace tern::train
