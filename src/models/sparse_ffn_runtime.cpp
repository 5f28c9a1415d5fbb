#include "models/sparse_ffn_runtime.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/error.h"
#include "core/fp16.h"
#include "models/hparams.h"
#include "models/tensor_names.h"

namespace tern {

namespace {

// Predictor GEMVs below this many multiply-adds run on the calling thread (a pool region costs
// more than the work on small models).
constexpr int64_t kPredictorPoolMinWork = int64_t(1) << 18;

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
  if (!(cfg.dense_above > 0.0 && cfg.dense_above <= 1.0))
    fail("--sparse-dense-above ", cfg.dense_above, " is outside (0, 1]");
  if (!has_ffn_predictor(*predictor_file_))
    fail(predictor_file_->path(), ": --sparse-ffn needs a sparsity predictor and this file has none (",
         kFfnPredictorRankKey, " missing): train one with `tern predictor train -m MODEL --calib TEXT -o OUT`");
  pred_ = read_ffn_predictor(*predictor_file_, *model_);
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
    const DType dt = cfg.down_t_type ? *cfg.down_t_type : down.type == DType::Q4_0 ? DType::Q8_0 : down.type;
    if (!is_sparse_ffn_type(dt))
      fail("--sparse-down-type ", dtype_name(dt), ": the sparse FFN reads F32, F16, Q8_0 or Q4_0 rows");
    if ((dt == DType::Q8_0 || dt == DType::Q4_0) && E % 32 != 0)
      fail(model_->path(), ": --sparse-ffn: n_embd ", E, " is not a multiple of 32, which ffn_down's transposed ",
           dtype_name(dt), " rows need");
    L.w.down_t_type = dt;
    L.down_t = build_down_t(down, dt);
    L.w.down_t = L.down_t.data();
    const auto to_f16 = [](const float* x, int64_t n) {
      std::vector<uint16_t> h(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) h[size_t(i)] = f32_to_fp16(x[i]);
      return h;
    };
    L.pred_a = to_f16(pred_.layers[size_t(il)].a, pred_.rank * E);
    L.pred_b = to_f16(pred_.layers[size_t(il)].b, F * pred_.rank);
    L.threshold = pred_.threshold[size_t(il)];
    max_ff = std::max(max_ff, F);
  }
  h_.assign(size_t(pred_.rank), 0.0f);
  score_.assign(size_t(max_ff), 0.0f);
  idx_.reserve(size_t(max_ff));
  iota_.resize(size_t(std::max(max_ff, pred_.rank)));
  for (size_t i = 0; i < iota_.size(); ++i) iota_[i] = int32_t(i);
}

int64_t SparseFfn::extra_bytes() const {
  int64_t n = 0;
  for (const Layer& L : layers_)
    n += int64_t(L.down_t.size() + (L.pred_a.size() + L.pred_b.size()) * sizeof(uint16_t));
  return n;
}

void SparseFfn::select(const Layer& L, const float* xn, ThreadPool& pool) {
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
  idx_.clear();
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
      if (s > kth || (s == kth && ties-- > 0)) idx_.push_back(int32_t(j));
    }
    return;
  }
  for (int64_t j = 0; j < F; ++j)
    if (score_[size_t(j)] > L.threshold) idx_.push_back(int32_t(j));
}

bool SparseFfn::run(int64_t il, const float* xn, float* y, ThreadPool& pool) {
  TERN_ASSERT(has_layer(il));
  const Layer& L = layers_[size_t(il)];
  select(L, xn, pool);
  ++stats_.visits;
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
