#include "models/ffn_predictor_format.h"

#include <cstdio>

#include "core/error.h"
#include "models/hparams.h"

namespace tern {

namespace {

constexpr uint64_t kFnvOffset = 14695981039346656037ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

void fnv_word(uint64_t& h, uint64_t w) {
  h ^= w;
  h *= kFnvPrime;
}

void fnv_bytes(uint64_t& h, const uint8_t* p, uint64_t n) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = 0;
    for (int k = 0; k < 8; ++k) w |= uint64_t(p[i + uint64_t(k)]) << (8 * k);  // little-endian on any host
    fnv_word(h, w);
  }
  for (; i < n; ++i) fnv_word(h, p[i]);
}

std::string gate_name(int64_t il) { return str_cat("blk.", il, ".ffn_gate.weight"); }

// The f32 array `key` of f, n entries.
std::vector<float> read_f32_array(const GgufFile& f, const char* key, int64_t n) {
  const GgufArray& arr = f.get(key).as_array(key);
  if (arr.elem_type != GgufType::F32)
    fail(f.path(), ": ", key, " is an array of ", gguf_type_name(arr.elem_type), ", expected f32");
  if (int64_t(arr.items.size()) != n)
    fail(f.path(), ": ", key, " has ", arr.items.size(), " entries, the model has ", n, " layers");
  std::vector<float> v;
  v.reserve(arr.items.size());
  for (const GgufValue& x : arr.items) v.push_back(float(x.as_float(key)));
  return v;
}

const float* checked_tensor(const GgufFile& f, const std::string& name, int64_t ne0, int64_t ne1) {
  const GgufTensorInfo* t = f.find_tensor(name);
  if (!t) fail(f.path(), ": missing predictor tensor ", name, " (expected f32 ", ne0, " x ", ne1, ")");
  if (t->type != DType::F32 || t->ne.size() != 2 || t->ne[0] != ne0 || t->ne[1] != ne1)
    fail(f.path(), ": predictor tensor ", name, " is ", dtype_name(t->type), " ", t->shape_string(), ", expected f32 ",
         ne0, " x ", ne1);
  return reinterpret_cast<const float*>(t->data);
}

}  // namespace

std::string ffn_pred_a_name(int64_t il) { return str_cat("blk.", il, ".ffn_pred_a.weight"); }
std::string ffn_pred_b_name(int64_t il) { return str_cat("blk.", il, ".ffn_pred_b.weight"); }

std::string ffn_act_freq_name(int64_t il) { return str_cat("blk.", il, ".ffn_act_freq"); }

bool is_ffn_predictor_tensor(const std::string& name) {
  return name.find(".ffn_pred_a.") != std::string::npos || name.find(".ffn_pred_b.") != std::string::npos ||
         (name.size() > 13 && name.compare(name.size() - 13, 13, ".ffn_act_freq") == 0);
}

std::string ffn_gate_fingerprint(const GgufFile& model, bool release_pages) {
  const int64_t n_layer = read_hparams(model).n_layer;
  uint64_t h = kFnvOffset;
  for (int64_t il = 0; il < n_layer; ++il) {
    const GgufTensorInfo* t = model.find_tensor(gate_name(il));
    if (!t) continue;
    fnv_word(h, uint64_t(il));
    fnv_word(h, uint64_t(t->type));
    fnv_word(h, uint64_t(t->ne.size()));
    for (int64_t d : t->ne) fnv_word(h, uint64_t(d));
    fnv_bytes(h, t->data, t->n_bytes);
    if (release_pages) model.release_pages_around(t->data, t->n_bytes);
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

bool has_ffn_predictor(const GgufFile& f) { return f.has(kFfnPredictorRankKey); }

FfnPredictor read_ffn_predictor(const GgufFile& f, const GgufFile& model, bool release_pages) {
  const HParams hp = read_hparams(model);
  FfnPredictor p;
  p.n_embd = hp.n_embd;
  if (!f.has(kFfnPredictorRankKey)) fail(f.path(), ": no sparsity predictor (", kFfnPredictorRankKey, " missing)");
  const uint64_t rank = f.get_uint(kFfnPredictorRankKey);
  if (rank < 1 || int64_t(rank) > hp.n_embd)
    fail(f.path(), ": ", kFfnPredictorRankKey, " is ", rank, ", outside 1 .. n_embd ", hp.n_embd);
  p.rank = int64_t(rank);
  p.fingerprint = f.get_string(kFfnPredictorModelKey);
  const std::string want = ffn_gate_fingerprint(model, release_pages);
  if (p.fingerprint != want)
    fail(f.path(), ": a predictor made for another model: its ", kFfnPredictorModelKey, " is ", p.fingerprint, ", ",
         model.path(), "'s FFN gate fingerprint is ", want);
  p.threshold = read_f32_array(f, kFfnPredictorThresholdKey, hp.n_layer);
  p.recall = read_f32_array(f, kFfnPredictorRecallKey, hp.n_layer);
  p.layers.resize(size_t(hp.n_layer));
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    if (!model.find_tensor(gate_name(il))) {
      if (f.find_tensor(ffn_pred_a_name(il)) || f.find_tensor(ffn_pred_b_name(il)))
        fail(f.path(), ": predictor tensors for layer ", il, ", which has no dense FFN in ", model.path());
      continue;
    }
    FfnPredictorLayer& l = p.layers[size_t(il)];
    l.n_ff = hp.ff_length(il);
    l.a = checked_tensor(f, ffn_pred_a_name(il), hp.n_embd, p.rank);
    l.b = checked_tensor(f, ffn_pred_b_name(il), p.rank, l.n_ff);
    if (const GgufTensorInfo* t = f.find_tensor(ffn_act_freq_name(il))) {
      if (t->type != DType::F32 || t->ne.size() != 1 || t->ne[0] != l.n_ff)
        fail(f.path(), ": ", t->name, " is ", dtype_name(t->type), " ", t->shape_string(), ", expected f32 ", l.n_ff);
      l.freq = reinterpret_cast<const float*>(t->data);
    }
  }
  return p;
}

}  // namespace tern
