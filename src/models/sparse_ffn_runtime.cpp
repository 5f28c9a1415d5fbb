#include "models/sparse_ffn_runtime.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "core/error.h"
#include "core/fp16.h"
#include "kernels/matmul.h"
#include "models/ffn_bundle_format.h"
#include "models/hparams.h"
#include "models/tensor_names.h"

namespace tern {

namespace {

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

// A float's bits as an unsigned key in the floats' order (-0 taken as +0, so that equal floats
// have equal keys; NaN does not occur: the scores come from finite weights and inputs).
inline uint32_t order_key(float v) {
  uint32_t b;
  v += 0.0f;  // -0 -> +0
  std::memcpy(&b, &v, 4);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

}  // namespace

void select_top_k(const float* score, int64_t n, int64_t k, std::vector<int32_t>& out, TopKScratch& scratch) {
  out.clear();
  k = std::clamp<int64_t>(k, 0, n);
  if (k == 0) return;
  // The k-th largest key by one radix step: a histogram of the keys' top kBits, the bin where the
  // count from the top reaches k, then an nth_element over that bin's keys alone (tens to
  // hundreds for n_ff in the thousands, against a partition of all n: 2-3x faster here).
  constexpr int kBits = 11, kShift = 32 - kBits;
  std::vector<uint32_t>& keys = scratch.keys;
  keys.resize(size_t(n));
  // Two histograms, even and odd j: consecutive increments of one bin would wait on each other.
  scratch.hist.assign(size_t(2) << kBits, 0);
  int32_t* h0 = scratch.hist.data();
  int32_t* h1 = h0 + (1 << kBits);
  int64_t j = 0;
  for (; j + 1 < n; j += 2) {
    const uint32_t a = order_key(score[j]), b = order_key(score[j + 1]);
    keys[size_t(j)] = a;
    keys[size_t(j + 1)] = b;
    ++h0[a >> kShift];
    ++h1[b >> kShift];
  }
  if (j < n) ++h0[(keys[size_t(j)] = order_key(score[j])) >> kShift];
  int64_t above = 0;  // keys in the bins above `bin`
  uint32_t bin = (1u << kBits) - 1;
  while (above + h0[bin] + h1[bin] < k) {
    above += h0[bin] + h1[bin];
    --bin;
  }
  std::vector<uint32_t>& cand = scratch.cand;
  cand.clear();
  for (const uint32_t c : keys)
    if ((c >> kShift) == bin) cand.push_back(c);
  const int64_t need = k - above;  // 1..(the bin's count): the need-th largest there is the k-th
  std::nth_element(cand.begin(), cand.begin() + (need - 1), cand.end(), std::greater<uint32_t>());
  const uint32_t kth = cand[size_t(need - 1)];
  int64_t equal = 0;
  for (const uint32_t c : cand) {
    above += c > kth;
    equal += c == kth;
  }
  // Keys above the k-th, and of those equal to it the lowest indices: one pass in index order,
  // so the selection comes out ascending (the gathers walk the rows forward) without a sort.
  // Branch-free (a quarter of the keys taken at random is a branch predictor's worst case), and
  // a plain >= where every key equal to the k-th is taken (distinct scores: always).
  int64_t ties = k - above;
  out.resize(size_t(n) + 1);
  int32_t* o = out.data();
  int64_t m = 0;
  if (ties == equal) {
    for (int64_t i = 0; i < n; ++i) {
      o[m] = int32_t(i);
      m += keys[size_t(i)] >= kth;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t c = keys[size_t(i)];
      const int64_t tie = c == kth && ties > 0;
      ties -= tie;
      o[m] = int32_t(i);
      m += int64_t(c > kth) | tie;
    }
  }
  TERN_ASSERT(m == k);
  out.resize(size_t(k));
}

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
    // The predictor in F16, laid out as the float matmul tiles read it (interleave16 where
    // this CPU's kernels want it).
    const auto to_f16 = [](const float* x, int64_t n_in, int64_t n_out, std::vector<uint16_t>& h, WeightView& view) {
      h.resize(static_cast<size_t>(n_in * n_out));
      for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_fp16(x[i]);
      view = WeightView{DType::F16, n_in, n_out, h.data()};
      if (want_interleave16(view)) {
        std::vector<uint16_t> packed(h.size());
        interleave16(view, reinterpret_cast<uint8_t*>(packed.data()));
        h.swap(packed);
        view.data = h.data();
        view.interleaved16 = true;
      }
    };
    to_f16(pred_.layers[size_t(il)].a, E, pred_.rank, L.pred_a, L.pred_a_w);
    to_f16(pred_.layers[size_t(il)].b, pred_.rank, F, L.pred_b, L.pred_b_w);
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
  // h = A xn, score = B h: the float matmul's FMA chains (the same bits on every ISA, thread
  // count and row split, kernels/matmul.h), vectors across the rows: a row of B is only `rank`
  // long, so per-row dots would spend more on their sums than on the bytes.
  matmul(L.pred_a_w, xn, E, 1, h_.data(), R, pool);
  matmul(L.pred_b_w, h_.data(), R, 1, score_.data(), F, pool);
  if (cfg_.density > 0.0) {
    const int64_t k = std::min<int64_t>(F, int64_t(std::ceil(cfg_.density * double(F))));
    select_top_k(score_.data(), F, k, out, topk_scratch_);
    return;
  }
  out.resize(size_t(F) + 1);
  int64_t m = 0;
  for (int64_t j = 0; j < F; ++j) {
    out[size_t(m)] = int32_t(j);
    m += score_[size_t(j)] > L.threshold;
  }
  out.resize(size_t(m));
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
