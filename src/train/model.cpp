#include "train/model.h"
#include "models/hparams.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "quant/quant_traits.h"
#include "train/rng.h"

namespace tern::train {

bool ModelShape::uniform_layers() const {
  for (int64_t il = 1; il < n_layer; ++il)
    if (head_count(il) != head_count(0) || head_count_kv(il) != head_count_kv(0) || ff_length(il) != ff_length(0))
      return false;
  return true;
}

void ModelShape::set_per_layer(std::vector<int64_t> nh, std::vector<int64_t> nkv, std::vector<int64_t> nff) {
  auto fill = [&](std::vector<int64_t>& v, int64_t scalar) {
    if (v.empty()) v.assign(size_t(std::max<int64_t>(n_layer, 0)), scalar);
  };
  fill(nh, n_head);
  fill(nkv, n_head_kv);
  fill(nff, n_ff);
  n_head_l = std::move(nh);
  n_head_kv_l = std::move(nkv);
  n_ff_l = std::move(nff);
  auto largest = [](const std::vector<int64_t>& v, int64_t fallback) {
    return v.empty() ? fallback : *std::max_element(v.begin(), v.end());
  };
  n_head = largest(n_head_l, n_head);
  n_head_kv = largest(n_head_kv_l, n_head_kv);
  n_ff = largest(n_ff_l, n_ff);
  if (uniform_layers()) {
    // Keep head_dim: it was n_embd / head_count(0) (or explicit) and stays so.
    n_head_l.clear();
    n_head_kv_l.clear();
    n_ff_l.clear();
  }
}

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
  auto per_layer = [&](const std::vector<int64_t>& v, const char* name) {
    if (!v.empty() && int64_t(v.size()) != n_layer)
      fail(what, ": ", v.size(), " values of ", name, " for ", n_layer, " layers");
  };
  per_layer(n_head_l, "n_head");
  per_layer(n_head_kv_l, "n_head_kv");
  per_layer(n_ff_l, "n_ff");
  for (const auto* flags : {&attn_out_bias_l, &ffn_down_bias_l})
    if (!flags->empty() && int64_t(flags->size()) != n_layer)
      fail(what, ": ", flags->size(), " bias flags for ", n_layer, " layers");
  for (int64_t il = 0; il < n_layer; ++il) {
    const int64_t nh = head_count(il), nkv = head_count_kv(il), nff = ff_length(il);
    if (nh <= 0 || nkv <= 0 || nff <= 0)
      fail(what, ": layer ", il, " has n_head ", nh, ", n_head_kv ", nkv, ", n_ff ", nff, " (each must be positive)");
    if (nh % nkv != 0) fail(what, ": layer ", il, ": n_head ", nh, " is not a multiple of n_head_kv ", nkv);
  }
  if (n_embd_head < 0) fail(what, ": head_dim (key_length) must be positive (got ", n_embd_head, ")");
  if (n_embd_head == 0 && n_embd % head_count(0) != 0)
    fail(what, ": n_embd ", n_embd, " is not a multiple of n_head ", head_count(0));
  if (head_dim() % 2 != 0) fail(what, ": head_dim ", head_dim(), " (n_embd / n_head) must be even for RoPE");
  if (!(rms_eps > 0.0f)) fail(what, ": rms_eps must be positive");
  if (!(rope_freq_base > 0.0f)) fail(what, ": rope freq_base must be positive");
}

namespace {

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}

int64_t count_set(const std::vector<uint8_t>& v) { return std::count_if(v.begin(), v.end(), [](uint8_t b) { return b != 0; }); }

}  // namespace

std::string ModelShape::describe() const {
  if (uniform_layers() && n_embd_head == 0 && count_set(attn_out_bias_l) + count_set(ffn_down_bias_l) == 0)
    return str_cat("n_vocab ", n_vocab, ", n_embd ", n_embd, ", n_layer ", n_layer, ", n_head ", n_head,
                   ", n_head_kv ", n_head_kv, ", n_ff ", n_ff, tied_output ? ", tied output" : "");
  // Per-layer values as lists, layer 0 first.
  auto list = [&](int64_t (ModelShape::*get)(int64_t) const) {
    std::vector<int64_t> v;
    for (int64_t il = 0; il < n_layer; ++il) v.push_back((this->*get)(il));
    std::string out = "[";
    out += join(v);
    out += ']';
    return out;
  };
  std::string s = str_cat("n_vocab ", n_vocab, ", n_embd ", n_embd, ", n_layer ", n_layer, ", n_head ",
                          list(&ModelShape::head_count), ", n_head_kv ", list(&ModelShape::head_count_kv), ", n_ff ",
                          list(&ModelShape::ff_length), ", head_dim ", head_dim());
  const int64_t nbo = count_set(attn_out_bias_l), nbd = count_set(ffn_down_bias_l);
  if (nbo + nbd > 0) s += str_cat(", output biases: attn ", nbo, ", ffn ", nbd);
  return s + (tied_output ? ", tied output" : "") + (ffn_relu ? ", ReGLU FFN" : "");
}

bool ModelShape::same_architecture(const ModelShape& o) const {
  if (!(n_vocab == o.n_vocab && n_embd == o.n_embd && n_layer == o.n_layer && head_dim() == o.head_dim() &&
        rms_eps == o.rms_eps && rope_freq_base == o.rope_freq_base && tied_output == o.tied_output &&
        ffn_relu == o.ffn_relu))
    return false;
  for (int64_t il = 0; il < n_layer; ++il)
    if (head_count(il) != o.head_count(il) || head_count_kv(il) != o.head_count_kv(il) ||
        ff_length(il) != o.ff_length(il) || has_attn_out_bias(il) != o.has_attn_out_bias(il) ||
        has_ffn_down_bias(il) != o.has_ffn_down_bias(il))
      return false;
  return true;
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
  const int64_t E = s.n_embd;
  m.tok_embd = add("token_embd.weight", {E, s.n_vocab}, true);
  for (int64_t il = 0; il < s.n_layer; ++il) {
    // Each layer's own widths (a pruned model's layers differ).
    const int64_t q_w = s.q_width(il), kv_w = s.kv_width(il), n_ff = s.ff_length(il);
    const std::string p = "blk." + std::to_string(il) + ".";
    LayerOffsets l{};
    l.attn_norm = add(p + "attn_norm.weight", {E}, false);
    l.wq = add(p + "attn_q.weight", {E, q_w}, true);
    l.wk = add(p + "attn_k.weight", {E, kv_w}, true);
    l.wv = add(p + "attn_v.weight", {E, kv_w}, true);
    l.wo = add(p + "attn_output.weight", {q_w, E}, true);
    // Biases: no weight decay (like the norms; they are offsets, not magnitudes to shrink).
    if (s.has_attn_out_bias(il)) l.bo = add(p + "attn_output.bias", {E}, false);
    l.ffn_norm = add(p + "ffn_norm.weight", {E}, false);
    l.w_gate = add(p + "ffn_gate.weight", {E, n_ff}, true);
    l.w_up = add(p + "ffn_up.weight", {E, n_ff}, true);
    l.w_down = add(p + "ffn_down.weight", {n_ff, E}, true);
    if (s.has_ffn_down_bias(il)) l.b_down = add(p + "ffn_down.bias", {E}, false);
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
      const bool bias = p.name.size() > 5 && p.name.compare(p.name.size() - 5, 5, ".bias") == 0;
      for (int64_t i = 0; i < p.size; ++i) d[i] = bias ? 0.0f : 1.0f;  // norms 1, biases 0
      continue;
    }
    const bool residual = p.name.find("attn_output") != std::string::npos || p.name.find("ffn_down") != std::string::npos;
    const float stddev = 0.02f * (residual ? residual_scale : 1.0f);
    for (int64_t i = 0; i < p.size; ++i) d[i] = float(rng.normal()) * stddev;
  }
  return m;
}

namespace {

// A key that is one number for every layer or an i32/u32 array of one per layer (llama.cpp's
// get_key_or_arr; what structured pruning writes). models/hparams.cpp reads the same keys for
// inference; its helper is private to it.
std::vector<int64_t> per_layer_key(const GgufFile& f, const std::string& key, int64_t n_layer,
                                   const std::vector<int64_t>* fallback) {
  const GgufValue* v = f.find(key);
  if (v == nullptr) {
    if (fallback != nullptr) return *fallback;
    fail(f.path(), ": missing key ", key);
  }
  if (v->type != GgufType::ARRAY) return std::vector<int64_t>(size_t(n_layer), v->as_int(key));
  const GgufArray& arr = v->as_array(key);
  if (int64_t(arr.items.size()) != n_layer)
    fail(f.path(), ": ", key, " has ", arr.items.size(), " values for ", n_layer, " layers");
  std::vector<int64_t> out;
  for (const GgufValue& x : arr.items) out.push_back(x.as_int(key));
  return out;
}

}  // namespace

ModelShape shape_of(const GgufFile& f) {
  const std::string arch = f.get_string("general.architecture", "");
  if (arch != "llama" && arch != "deci")
    fail(f.path(), ": tern train trains the llama architecture (and deci, llama with per-layer shapes); this file is '",
         arch.empty() ? "(none)" : arch, "'");
  const std::string a = arch + ".";
  ModelShape s;
  s.arch = arch;
  s.n_embd = int64_t(f.get_uint(a + "embedding_length"));
  s.n_layer = int64_t(f.get_uint(a + "block_count"));
  if (s.n_layer <= 0 || s.n_layer > 4096) fail(f.path(), ": bad ", a, "block_count ", s.n_layer);
  // One value for every layer, or one per layer (a structured-pruned model).
  const std::vector<int64_t> nh = per_layer_key(f, a + "attention.head_count", s.n_layer, nullptr);
  const std::vector<int64_t> nkv = per_layer_key(f, a + "attention.head_count_kv", s.n_layer, &nh);
  const std::vector<int64_t> nff = per_layer_key(f, a + "feed_forward_length", s.n_layer, nullptr);
  s.set_per_layer(nh, nkv, nff);
  s.n_ctx_train = int64_t(f.get_uint(a + "context_length", 2048));
  s.rms_eps = float(f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5));
  s.rope_freq_base = float(f.get_float(a + "rope.freq_base", 10000.0));
  if (f.has(kFfnActivationKey)) {
    const std::string act = f.get_string(kFfnActivationKey);
    if (act != "relu" && act != "silu")
      fail(f.path(), ": ", kFfnActivationKey, " is '", act, "'; training knows \"relu\" and \"silu\"");
    s.ffn_relu = act == "relu";
  }
  if (const GgufValue* t = f.find("tokenizer.ggml.tokens")) s.n_vocab = int64_t(t->as_array("tokenizer.ggml.tokens").items.size());
  const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
  if (emb == nullptr) fail(f.path(), ": missing tensor token_embd.weight");
  if (emb->ne.size() != 2) fail(f.path(), ": token_embd.weight has shape ", emb->shape_string(), ", expected 2-D");
  if (s.n_vocab == 0) s.n_vocab = emb->ne[1];
  s.tied_output = f.find_tensor("output.weight") == nullptr;
  if (s.head_count(0) > 0) {
    // head_dim: key_length where given (pruning removes heads, not head width, so it is no
    // longer n_embd / head_count), else n_embd / head_count(0) as llama.cpp derives it.
    const int64_t derived = s.n_embd % s.head_count(0) == 0 ? s.n_embd / s.head_count(0) : 0;
    if (f.has(a + "attention.key_length")) {
      const int64_t kl = int64_t(f.get_uint(a + "attention.key_length"));
      const int64_t vl = int64_t(f.get_uint(a + "attention.value_length", uint64_t(kl)));
      if (vl != kl)
        fail(f.path(), ": attention.value_length ", vl, " != key_length ", kl, " (tern train needs equal K and V head sizes)");
      if (kl <= 0) fail(f.path(), ": bad attention.key_length ", kl);
      if (kl != derived) s.n_embd_head = kl;
    }
    const int64_t hd = s.n_embd_head > 0 ? s.n_embd_head : derived;
    const uint64_t n_rot = f.get_uint(a + "rope.dimension_count", uint64_t(hd));
    if (hd > 0 && int64_t(n_rot) != hd)
      fail(f.path(), ": rope.dimension_count ", n_rot, " != head_dim ", hd, " (partial RoPE is not trained)");
  }
  // FLaP's bias compensation: optional output-projection biases, layer by layer.
  for (int64_t il = 0; il < s.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    const bool bo = f.find_tensor(p + "attn_output.bias") != nullptr;
    const bool bd = f.find_tensor(p + "ffn_down.bias") != nullptr;
    if (bo && s.attn_out_bias_l.empty()) s.attn_out_bias_l.assign(size_t(s.n_layer), 0);
    if (bd && s.ffn_down_bias_l.empty()) s.ffn_down_bias_l.assign(size_t(s.n_layer), 0);
    if (bo) s.attn_out_bias_l[size_t(il)] = 1;
    if (bd) s.ffn_down_bias_l[size_t(il)] = 1;
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
  const std::string a = s.arch + ".";
  GgufWriter w(3);
  w.set("general.architecture", GgufValue::string(s.arch));
  w.set("general.name", GgufValue::string("tern-trained"));
  w.set("general.file_type", GgufValue::u32(0));  // LLAMA_FTYPE_ALL_F32
  w.set(a + "vocab_size", GgufValue::u32(uint32_t(s.n_vocab)));
  w.set(a + "context_length", GgufValue::u32(uint32_t(s.n_ctx_train)));
  w.set(a + "embedding_length", GgufValue::u32(uint32_t(s.n_embd)));
  // Uniform layers: the scalar keys, as always (existing checkpoints stay byte for byte the same);
  // layers that differ: i32 arrays, one value per layer, as structured pruning writes them.
  const bool uniform = s.uniform_layers();
  auto layer_key = [&](const std::string& key, int64_t scalar, int64_t (ModelShape::*get)(int64_t) const) {
    if (uniform) {
      w.set(key, GgufValue::u32(uint32_t(scalar)));
      return;
    }
    std::vector<GgufValue> v;
    for (int64_t il = 0; il < s.n_layer; ++il) v.push_back(GgufValue::i32(int32_t((s.*get)(il))));
    w.set(key, GgufValue::array(GgufType::I32, std::move(v)));
  };
  layer_key(a + "feed_forward_length", s.n_ff, &ModelShape::ff_length);
  w.set(a + "block_count", GgufValue::u32(uint32_t(s.n_layer)));
  layer_key(a + "attention.head_count", s.n_head, &ModelShape::head_count);
  layer_key(a + "attention.head_count_kv", s.n_head_kv, &ModelShape::head_count_kv);
  // A reader derives head_dim as n_embd / head_count(layer 0) unless key_length says otherwise.
  if (!uniform || s.n_embd_head > 0 || s.n_embd % s.head_count(0) != 0 || s.n_embd / s.head_count(0) != s.head_dim()) {
    w.set(a + "attention.key_length", GgufValue::u32(uint32_t(s.head_dim())));
    w.set(a + "attention.value_length", GgufValue::u32(uint32_t(s.head_dim())));
  }
  w.set(a + "rope.dimension_count", GgufValue::u32(uint32_t(s.head_dim())));
  w.set(a + "rope.freq_base", GgufValue::f32(s.rope_freq_base));
  w.set(a + "attention.layer_norm_rms_epsilon", GgufValue::f32(s.rms_eps));
  if (s.ffn_relu) w.set(kFfnActivationKey, GgufValue::string("relu"));
  for (const auto& [k, v] : vocab.metadata())
    if (k.rfind("tokenizer.", 0) == 0) w.set(k, v);
  for (const auto& [k, v] : extra) w.set(k, v);
  for (const auto& p : m.params)
    w.add_tensor(p.name, DType::F32, p.ne, m.data.data() + p.offset, uint64_t(p.size) * sizeof(float));
  w.write(path);
}

}  // namespace tern::train
