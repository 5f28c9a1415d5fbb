#include "models/sparse_ffn_runtime.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/error.h"
#include "core/fp16.h"
#include "models/ffn_bundle_format.h"
#include "models/hparams.h"
#include "models/tensor_names.h"

namespace tern {

namespace {

// Predictor GEMVs below this many multiply-adds run on the calling thread (a pool region costs
// more than the work on small models).
constexpr int64_t kPredictorPoolMinWork = int64_t(1) << 18;

// --ram-budget: the cache slots of a layer (a selection runs in pieces of at most this many
// missing neurons); every other slot the budget pays for holds a hot neuron. Hot beat cache slots
// on the ReLU-fied tern-stories model, 200 greedy tokens: with 16-slot pieces, the same store
// split 492 hot + 96 cache hit 31.0% of lookups, 444 + 144 28.7%, 294 + 294 23.5% (a selection
// is about a quarter of a layer, so an LRU of less than that is swept every token).
constexpr int64_t kCacheSlots = 64;

// "12.3 MiB", "45.6 KiB": one decimal.
std::string mib(int64_t bytes) {
  const bool kib = bytes < (int64_t(1) << 20);
  const double v = double(bytes) / (kib ? 1024.0 : 1048576.0);
  return str_cat(double(int64_t(v * 10 + 0.5)) / 10, kib ? " KiB" : " MiB");
}

// The rows of `name` in `model` as the row kernels read them: plain rows of a type they read.
const void* plain_rows(const GgufFile& model, const std::string& name, int64_t n_in, int64_t n_out, DType& type) {
  const GgufTensorInfo* t = model.find_tensor(name);
  if (!t) fail(model.path(), ": --sparse-ffn: ", name, " is missing");
  if (t->ne.size() != 2 || t->ne[0] != n_in || t->ne[1] != n_out)
    fail(model.path(), ": --sparse-ffn: ", name, " is ", t->shape_string(), ", expected ", n_in, " x ", n_out);
  if (!is_sparse_ffn_type(t->type))
    fail(model.path(), ": --sparse-ffn: ", name, " is ", dtype_name(t->type),
         "; the sparse FFN reads F32, F16, Q8_0 or Q4_0 rows (tern quantize --type q4_0 or q8_0)");
  type = t->type;
  return t->data;
}

}  // namespace

SparseFfn::SparseFfn(std::shared_ptr<const GgufFile> model, const SparseFfnConfig& cfg,
                     const std::vector<int64_t>& layers)
    : model_(std::move(model)), predictor_file_(cfg.predictor ? cfg.predictor : model_), cfg_(cfg) {
  if (!(cfg.density >= 0.0 && cfg.density <= 1.0))
    fail("--sparse-density ", cfg.density, " is outside [0, 1] (0: the predictor's thresholds)");
  if (cfg.readahead && cfg.ram_budget <= 0) fail("--ram-readahead applies to --ram-budget: add it");
  if (!(cfg.dense_above > 0.0 && cfg.dense_above <= 1.0))
    fail("--sparse-dense-above ", cfg.dense_above, " is outside (0, 1]");
  if (!has_ffn_predictor(*predictor_file_))
    fail(predictor_file_->path(), ": --sparse-ffn needs a sparsity predictor and this file has none (",
         kFfnPredictorRankKey, " missing): train one with `tern predictor train -m MODEL --calib TEXT -o OUT`");
  const bool budget = cfg.ram_budget > 0;
  pred_ = read_ffn_predictor(*predictor_file_, *model_, /*release_pages=*/budget);
  const HParams hp = read_hparams(*model_);
  layers_.resize(size_t(hp.n_layer));
  int64_t max_ff = 0;
  for (const int64_t il : layers) {
    const int64_t E = hp.n_embd, F = hp.ff_length(il);
    if (!pred_.has_layer(il))
      fail(predictor_file_->path(), ": the predictor has no tensors for layer ", il, " (", ffn_pred_a_name(il), ")");
    Layer& L = layers_[size_t(il)];
    L.w.n_embd = E;
    L.w.n_ff = F;
    DType up_type = DType::F32;
    L.w.gate = plain_rows(*model_, tensor_name(Tensor::FfnGate, il), E, F, L.w.type);
    L.w.up = plain_rows(*model_, tensor_name(Tensor::FfnUp, il), E, F, up_type);
    if (up_type != L.w.type)
      fail(model_->path(), ": --sparse-ffn: ", tensor_name(Tensor::FfnUp, il), " is ", dtype_name(up_type), " but ",
           tensor_name(Tensor::FfnGate, il), " is ", dtype_name(L.w.type), "; the sparse FFN needs them in one type");
    WeightView down;
    down.n_in = F;
    down.n_out = E;
    down.data = plain_rows(*model_, tensor_name(Tensor::FfnDown, il), F, E, down.type);
    if (budget) {
      // The rows come from the bundles (open_store): nothing of gate, up or down is read here.
      L.w.gate = L.w.up = nullptr;
      L.w.down_t_type = DType::F32;
    }
    const DType dt = cfg.down_t_type ? *cfg.down_t_type : default_down_t_type(down.type);
    if (!budget && !is_sparse_ffn_type(dt))
      fail("--sparse-down-type ", dtype_name(dt), ": the sparse FFN reads F32, F16, Q8_0 or Q4_0 rows");
    if (!budget && (dt == DType::Q8_0 || dt == DType::Q4_0) && E % 32 != 0)
      fail(model_->path(), ": --sparse-ffn: n_embd ", E, " is not a multiple of 32, which ffn_down's transposed ",
           dtype_name(dt), " rows need");
    if (!budget) {
      L.w.down_t_type = dt;
      L.down_t = build_down_t(down, dt);
      L.w.down_t = L.down_t.data();
    }
    const auto to_f16 = [](const float* x, int64_t n) {
      std::vector<uint16_t> h(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) h[size_t(i)] = f32_to_fp16(x[i]);
      return h;
    };
    L.pred_a = to_f16(pred_.layers[size_t(il)].a, pred_.rank * E);
    L.pred_b = to_f16(pred_.layers[size_t(il)].b, F * pred_.rank);
    L.threshold = pred_.threshold[size_t(il)];
    max_ff = std::max(max_ff, F);
    if (budget) {
      // The f32 predictor stays in the file: its pages would count against the budget.
      predictor_file_->release_pages_around(pred_.layers[size_t(il)].a, size_t(pred_.rank * E) * sizeof(float));
      predictor_file_->release_pages_around(pred_.layers[size_t(il)].b, size_t(F * pred_.rank) * sizeof(float));
    }
  }
  if (budget) open_store(layers);
  h_.assign(size_t(pred_.rank), 0.0f);
  score_.assign(size_t(max_ff), 0.0f);
  idx_.reserve(size_t(max_ff));
  iota_.resize(size_t(std::max(max_ff, pred_.rank)));
  for (size_t i = 0; i < iota_.size(); ++i) iota_[i] = int32_t(i);
}

void SparseFfn::open_store(const std::vector<int64_t>& layers) {
  const GgufFile& m = *model_;
  if (!has_ffn_bundles(m))
    fail(m.path(), ": --ram-budget reads cold neurons from the model file's neuron bundles and it has none (",
         kFfnBundleDownTypeKey, " missing): write them with `tern predictor bundle -m ", m.path(), " -o OUT`");
  const std::string bundled_for = m.get_string(kFfnBundleModelKey);
  if (bundled_for != pred_.fingerprint)
    fail(m.path(), ": its neuron bundles were made from another model (", kFfnBundleModelKey, " ", bundled_for,
         ", the file's FFN gates are ", pred_.fingerprint, "): write them again with tern predictor bundle");
  BudgetBytes& b = budget_;
  b.budget = cfg_.ram_budget;
  b.model = model_weight_bytes(m);
  int64_t ffn_file_bytes = 0, n_ff_total = 0;
  std::vector<NeuronStoreLayer> specs;
  for (const int64_t il : layers) {
    for (const Tensor t : {Tensor::FfnGate, Tensor::FfnUp, Tensor::FfnDown})
      ffn_file_bytes += int64_t(m.find_tensor(tensor_name(t, il))->n_bytes);
    NeuronStoreLayer& sp = specs.emplace_back();
    sp.il = il;
    sp.bundles = read_ffn_bundle(m, il);
    const Layer& L = layers_[size_t(il)];
    if (sp.bundles.layout.type != L.w.type || sp.bundles.layout.n_embd != L.w.n_embd ||
        sp.bundles.layout.n_ff != L.w.n_ff)
      fail(m.path(), ": ", ffn_bundle_name(il), " does not match the layer's ffn_gate");
    sp.freq = pred_.layers[size_t(il)].freq;
    if (!sp.freq)
      fail(predictor_file_->path(), ": --ram-budget keeps each layer's most frequently active neurons in memory and "
           "this predictor has no activation frequencies (", ffn_act_freq_name(il),
           "): train it again with tern predictor train, which writes them");
    n_ff_total += L.w.n_ff;
  }
  b.other_weights = b.model - ffn_file_bytes;
  b.predictor = extra_bytes();
  int64_t min_store = 0;
  for (const NeuronStoreLayer& sp : specs)
    min_store += std::min(kCacheSlots, sp.bundles.layout.n_ff) * sp.bundles.layout.bundle_bytes();
  b.minimum = b.other_weights + b.predictor + min_store;
  if (b.budget < b.minimum)
    fail("--ram-budget ", mib(b.budget), " is below the resident minimum of ", mib(b.minimum), " (", b.minimum,
         " bytes) for ", m.path(), ": ",
         mib(b.other_weights), " of weights besides the sparse FFNs (attention, embeddings, output), ", mib(b.predictor),
         " of predictor and ", mib(min_store), " for ", kCacheSlots, " neurons a layer");
  // The store's share, split over the layers by neurons: the same fraction of each layer resident.
  const double share = double(b.budget - b.other_weights - b.predictor) / double(n_ff_total);
  for (NeuronStoreLayer& sp : specs) {
    const FfnBundleLayout& lay = sp.bundles.layout;
    const int64_t cache = std::min(kCacheSlots, lay.n_ff);
    sp.slots = std::clamp<int64_t>(int64_t(share * double(lay.n_ff) / double(lay.bundle_bytes())), cache, lay.n_ff);
    sp.cache_slots = sp.slots == lay.n_ff ? 0 : cache;
  }
  next_layer_.assign(layers_.size(), -1);
  for (size_t k = 0; k + 1 < layers.size(); ++k) next_layer_[size_t(layers[k])] = layers[k + 1];
  store_ = std::make_unique<NeuronStore>(m.path(), std::move(specs));
  b.store = store_->resident_bytes();
  // Nothing reads the mappings from now on (the model copied what it keeps, the store reads with
  // preadv): every page the load and these checks read goes back.
  m.release_pages();
  if (predictor_file_ != model_) predictor_file_->release_pages();
}

void SparseFfn::set_enabled(bool on) {
  if (!on && store_)
    fail("--ram-budget: the sparse FFN cannot be switched off (the dense FFN's weights are not in memory)");
  enabled_ = on;
}

int64_t SparseFfn::extra_bytes() const {
  int64_t n = 0;
  for (const Layer& L : layers_)
    n += int64_t(L.down_t.size() + (L.pred_a.size() + L.pred_b.size()) * sizeof(uint16_t));
  return n;
}

void SparseFfn::select(const Layer& L, const float* xn, ThreadPool& pool, std::vector<int32_t>& out) {
  const int64_t E = L.w.n_embd, F = L.w.n_ff, R = pred_.rank;
  // h = A xn, score = B h: the F16 row kernel's dots (one summation order for every ISA and
  // thread count, kernels/sparse_ffn.h).
  const int64_t a_bytes = E * int64_t(sizeof(uint16_t)), b_bytes = R * int64_t(sizeof(uint16_t));
  // Each of the pool's threads takes whole rows (a row's dot is the same bits on any thread).
  const auto rows_dot = [&](const uint16_t* rows, int64_t row_bytes, int64_t n_rows, int64_t n_in, const float* x,
                            float* out) {
    if (n_rows * n_in >= kPredictorPoolMinWork && pool.size() > 1) {
      pool.parallel_for(n_rows, [&](int64_t r0, int64_t r1, int) {
        sparse_rows_dot(DType::F16, rows, row_bytes, n_rows, n_in, iota_.data() + r0, r1 - r0, x, out + r0);
      });
    } else {
      sparse_rows_dot(DType::F16, rows, row_bytes, n_rows, n_in, iota_.data(), n_rows, x, out);
    }
  };
  rows_dot(L.pred_a.data(), a_bytes, R, E, xn, h_.data());
  rows_dot(L.pred_b.data(), b_bytes, F, R, h_.data(), score_.data());
  out.clear();
  if (cfg_.density > 0.0) {
    // The top k = ceil(density * n_ff) scores, ties to the lower index: the k-th largest score
    // (nth_element over a copy of the floats), then one pass in index order, so the selection
    // comes out ascending (the gathers walk the rows forward) without a sort.
    const int64_t k = std::min<int64_t>(F, int64_t(std::ceil(cfg_.density * double(F))));
    if (k == 0) return;
    kth_.assign(score_.begin(), score_.begin() + F);
    std::nth_element(kth_.begin(), kth_.begin() + (k - 1), kth_.end(), std::greater<float>());
    const float kth = kth_[size_t(k - 1)];
    int64_t above = 0;
    for (int64_t j = 0; j < F; ++j) above += score_[size_t(j)] > kth;
    int64_t ties = k - above;  // scores equal to the k-th taken, lowest index first
    for (int64_t j = 0; j < F; ++j) {
      const float s = score_[size_t(j)];
      if (s > kth || (s == kth && ties-- > 0)) out.push_back(int32_t(j));
    }
    return;
  }
  for (int64_t j = 0; j < F; ++j)
    if (score_[size_t(j)] > L.threshold) out.push_back(int32_t(j));
}

bool SparseFfn::run(int64_t il, const float* xn, float* y, ThreadPool& pool) {
  TERN_ASSERT(has_layer(il));
  const Layer& L = layers_[size_t(il)];
  select(L, xn, pool, idx_);
  ++stats_.visits;
  if (store_) {
    // Every selection runs, from the store's slots (no dense FFN to fall back on).
    ++stats_.sparse_visits;
    stats_.neurons += L.w.n_ff;
    stats_.selected += int64_t(idx_.size());
    if (idx_.empty()) std::fill(y, y + L.w.n_embd, 0.0f);
    if (cfg_.readahead && next_layer_[size_t(il)] >= 0) {
      const int64_t next = next_layer_[size_t(il)];
      select(layers_[size_t(next)], xn, pool, ahead_);
      store_->advise(next, ahead_.data(), int64_t(ahead_.size()));
    }
    const FfnBundleLayout& lay = store_->layout(il);
    store_->visit(il, idx_.data(), int64_t(idx_.size()),
                  [&](const uint8_t* base, int64_t n_slots, const int32_t* slot_idx, int64_t n, bool first) {
                    SparseFfnWeights w = L.w;
                    w.gate = base;
                    w.up = base + lay.up_offset();
                    w.down_t_type = lay.down_t_type;
                    w.down_t = base + lay.down_t_offset();
                    w.n_rows = n_slots;
                    w.gate_up_stride = w.down_t_stride = lay.bundle_bytes();
                    sparse_ffn_reglu(w, xn, slot_idx, n, y, pool, /*accumulate=*/!first);
                  },
                  &pool);
    return true;
  }
  if (double(idx_.size()) > cfg_.dense_above * double(L.w.n_ff)) {
    ++stats_.dense_fallbacks;
    return false;
  }
  ++stats_.sparse_visits;
  stats_.neurons += L.w.n_ff;
  stats_.selected += int64_t(idx_.size());
  sparse_ffn_reglu(L.w, xn, idx_.data(), int64_t(idx_.size()), y, pool);
  return true;
}

}  // namespace tern
