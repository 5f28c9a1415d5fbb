#include "compress/ffn_predictor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <mutex>
#include <numeric>
#include <random>

#include "compress/linalg.h"
#include "compress/svd.h"
#include "core/error.h"
#include "core/stats.h"
#include "core/thread_pool.h"
#include "models/arch.h"
#include "models/ffn_predictor_format.h"
#include "models/hparams.h"

namespace tern {

namespace {

// Layer of "blk.N<suffix>", or -1.
int64_t layer_of(const std::string& weight, std::string_view suffix) {
  constexpr std::string_view kPrefix = "blk.";
  if (weight.size() <= kPrefix.size() + suffix.size() || weight.compare(0, kPrefix.size(), kPrefix) != 0 ||
      weight.compare(weight.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  int64_t il = 0;
  for (size_t i = kPrefix.size(); i < weight.size() - suffix.size(); ++i) {
    if (weight[i] < '0' || weight[i] > '9') return -1;
    il = il * 10 + (weight[i] - '0');
  }
  return il;
}

// One layer's calibration pairs, in token order.
struct LayerSamples {
  int64_t n_ff = 0, mask_bytes = 0;
  std::vector<float> x;       // [n_x][n_embd] the FFN's normalised input (ffn_gate's input)
  std::vector<uint8_t> mask;  // [n_mask][mask_bytes] bit j of a row: neuron j active (ffn_down's input != 0)
  int64_t n_x = 0, n_mask = 0;

  bool active(int64_t t, int64_t j) const {
    return (mask[size_t(t * mask_bytes + (j >> 3))] >> (j & 7)) & 1;
  }
};

class PairCollector final : public SequenceObserver {
 public:
  PairCollector(std::vector<LayerSamples>& layers, int64_t n_embd, int64_t total)
      : layers_(layers), n_embd_(n_embd), total_(total) {}
  void on_linear_input(const std::string& weight, const float* x, int64_t n_tokens, int64_t n_in) override {
    if (const int64_t il = layer_of(weight, ".ffn_gate.weight"); il >= 0 && il < int64_t(layers_.size())) {
      if (n_in != n_embd_) fail("predictor: ", weight, "'s input has ", n_in, " channels, n_embd is ", n_embd_);
      LayerSamples& l = layers_[size_t(il)];
      if (l.x.empty()) l.x.reserve(size_t(total_ * n_embd_));
      l.x.insert(l.x.end(), x, x + n_tokens * n_in);
      l.n_x += n_tokens;
    } else if (const int64_t jl = layer_of(weight, ".ffn_down.weight"); jl >= 0 && jl < int64_t(layers_.size())) {
      LayerSamples& l = layers_[size_t(jl)];
      if (l.n_ff == 0) {
        l.n_ff = n_in;
        l.mask_bytes = (n_in + 7) / 8;
        l.mask.reserve(size_t(total_ * l.mask_bytes));
      }
      if (l.n_ff != n_in) fail("predictor: ", weight, "'s input has ", n_in, " channels, earlier ", l.n_ff);
      for (int64_t t = 0; t < n_tokens; ++t) {
        const size_t row = l.mask.size();
        l.mask.resize(row + size_t(l.mask_bytes), 0);
        const float* a = x + t * n_in;
        for (int64_t j = 0; j < n_in; ++j)
          if (a[j] != 0.0f) l.mask[row + size_t(j >> 3)] |= uint8_t(1u << (j & 7));
      }
      l.n_mask += n_tokens;
    }
  }

 private:
  std::vector<LayerSamples>& layers_;
  int64_t n_embd_, total_;
};

// Held-out tokens: every 10th.
bool held_out(int64_t t) { return t % 10 == 9; }

// The rows of s that are (not) held out, in order.
std::vector<int64_t> token_split(int64_t n, bool eval) {
  std::vector<int64_t> v;
  for (int64_t t = 0; t < n; ++t)
    if (held_out(t) == eval) v.push_back(t);
  return v;
}

// A [rank][n_embd], B [n_ff][rank]: the best rank-r approximation of the gate rows W [n_ff][n_embd]
// in the norm of the data, || (W - B A) X ||_F over the training tokens: with C = X^T X = L L^T,
// the top left singular vectors U_r of W L give B = U_r, A = U_r^T W. Each component is then
// balanced (its row of A and column of B of equal norm) so that Adam's steps fit both.
void init_from_gate(const std::vector<float>& w, const LayerSamples& s, const std::vector<int64_t>& train, int64_t d,
                    int64_t r, ThreadPool& pool, std::vector<float>& a, std::vector<float>& b) {
  const int64_t F = s.n_ff;
  std::vector<double> c(size_t(d * d), 0.0);  // [d][d] sum x x^T
  for (int64_t t : train) {
    const float* x = s.x.data() + t * d;
    for (int64_t i = 0; i < d; ++i) {
      const double xi = x[i];
      double* row = c.data() + i * d;
      for (int64_t k = 0; k <= i; ++k) row[k] += xi * double(x[k]);
    }
  }
  double mean_diag = 0;
  for (int64_t i = 0; i < d; ++i) mean_diag += c[size_t(i * d + i)] / double(d);
  for (int64_t i = 0; i < d; ++i) {
    for (int64_t k = i + 1; k < d; ++k) c[size_t(i * d + k)] = c[size_t(k * d + i)];
    c[size_t(i * d + i)] += 1e-6 * mean_diag + 1e-12;  // inputs that never vary stay factorable
  }
  if (!cholesky_lower(c, d)) fail("predictor: the FFN inputs' Gram matrix is not positive definite");
  std::vector<double> wl(size_t(F * d), 0.0);  // [F][d] W L
  pool.parallel_for(F, [&](int64_t j0, int64_t j1, int) {
    for (int64_t j = j0; j < j1; ++j)
      for (int64_t k = 0; k < d; ++k) {
        double sum = 0;
        for (int64_t i = k; i < d; ++i) sum += double(w[size_t(j * d + i)]) * c[size_t(i * d + k)];
        wl[size_t(j * d + k)] = sum;
      }
  });
  const Svd svd = svd_thin(wl, F, d, pool);
  a.assign(size_t(r * d), 0.0f);
  b.assign(size_t(F * r), 0.0f);
  for (int64_t q = 0; q < std::min(r, svd.k); ++q) {
    std::vector<double> row(size_t(d), 0.0);  // U_q^T W
    for (int64_t j = 0; j < F; ++j) {
      const double u = svd.u[size_t(j * svd.k + q)];
      for (int64_t i = 0; i < d; ++i) row[size_t(i)] += u * double(w[size_t(j * d + i)]);
    }
    double norm = 0;
    for (double v : row) norm += v * v;
    const double scale = norm > 0 ? std::sqrt(std::sqrt(norm)) : 1.0;  // both sides get sqrt(|row|)
    for (int64_t i = 0; i < d; ++i) a[size_t(q * d + i)] = float(row[size_t(i)] / scale);
    for (int64_t j = 0; j < F; ++j) b[size_t(j * r + q)] = float(svd.u[size_t(j * svd.k + q)] * scale);
  }
}

// Scores of the rows `tokens`: out [n][F].
void predictor_scores(const LayerSamples& s, const std::vector<int64_t>& tokens, const std::vector<float>& a,
            const std::vector<float>& b, int64_t d, int64_t r, std::vector<float>& out) {
  const int64_t F = s.n_ff;
  out.resize(tokens.size() * size_t(F));
  std::vector<float> h(static_cast<size_t>(r));  // [r] A x
  for (size_t n = 0; n < tokens.size(); ++n) {
    const float* x = s.x.data() + tokens[n] * d;
    for (int64_t q = 0; q < r; ++q) {
      float sum = 0;
      for (int64_t i = 0; i < d; ++i) sum += a[size_t(q * d + i)] * x[i];
      h[size_t(q)] = sum;
    }
    float* o = out.data() + n * size_t(F);
    for (int64_t j = 0; j < F; ++j) {
      float sum = 0;
      for (int64_t q = 0; q < r; ++q) sum += b[size_t(j * r + q)] * h[size_t(q)];
      o[j] = sum;
    }
  }
}

// log(1 + e^z) without overflow.
double softplus(double z) { return z > 0 ? z + std::log1p(std::exp(-z)) : std::log1p(std::exp(z)); }

// Mean over tokens and neurons of the weighted cross-entropy: pos_weight * -log p for an active
// neuron, -log(1 - p) for an inactive one, p = sigmoid(score).
double weighted_bce(const LayerSamples& s, const std::vector<int64_t>& tokens, const std::vector<float>& sc,
                    double pos_weight) {
  const int64_t F = s.n_ff;
  double loss = 0;
  for (size_t n = 0; n < tokens.size(); ++n)
    for (int64_t j = 0; j < F; ++j) {
      const double z = sc[n * size_t(F) + size_t(j)];
      loss += s.active(tokens[n], j) ? pos_weight * softplus(-z) : softplus(z);
    }
  return tokens.empty() ? 0.0 : loss / (double(tokens.size()) * double(F));
}

struct Adam {
  std::vector<float> m, v;
  int64_t step = 0;
  explicit Adam(size_t n) : m(n, 0.0f), v(n, 0.0f) {}
};

void adam_step(std::vector<float>& p, const std::vector<float>& g, Adam& st, float lr) {
  constexpr float kB1 = 0.9f, kB2 = 0.999f, kEps = 1e-8f;
  ++st.step;
  const float c1 = 1.0f - std::pow(kB1, float(st.step)), c2 = 1.0f - std::pow(kB2, float(st.step));
  for (size_t i = 0; i < p.size(); ++i) {
    st.m[i] = kB1 * st.m[i] + (1 - kB1) * g[i];
    st.v[i] = kB2 * st.v[i] + (1 - kB2) * g[i] * g[i];
    p[i] -= lr * (st.m[i] / c1) / (std::sqrt(st.v[i] / c2) + kEps);
  }
}

// Minibatch Adam on the weighted cross-entropy over the training tokens; deterministic for
// opts.seed and the layer.
void train_layer(const LayerSamples& s, const std::vector<int64_t>& train, int64_t d, int64_t r, double pos_weight,
                 const PredictorTrainOptions& opts, int64_t il, std::vector<float>& a, std::vector<float>& b) {
  const int64_t F = s.n_ff;
  const int64_t bs = std::max<int64_t>(1, std::min<int64_t>(opts.batch, int64_t(train.size())));
  std::vector<float> h(size_t(bs * r));   // [bs][r] A x
  std::vector<float> dz(size_t(bs * F));  // [bs][F] d loss / d score
  std::vector<float> dh(size_t(bs * r));  // [bs][r] B^T dz
  std::vector<float> ga(a.size()), gb(b.size());
  Adam sa(a.size()), sb(b.size());
  std::vector<int64_t> order = train;
  std::mt19937_64 rng(opts.seed * 1000003ull + uint64_t(il));
  for (int epoch = 0; epoch < opts.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t b0 = 0; b0 < order.size(); b0 += size_t(bs)) {
      const int64_t n = std::min<int64_t>(bs, int64_t(order.size() - b0));
      const float norm = 1.0f / (float(n) * float(F));
      for (int64_t t = 0; t < n; ++t) {
        const float* x = s.x.data() + order[b0 + size_t(t)] * d;
        float* ht = h.data() + t * r;
        for (int64_t q = 0; q < r; ++q) {
          float sum = 0;
          for (int64_t i = 0; i < d; ++i) sum += a[size_t(q * d + i)] * x[i];
          ht[q] = sum;
        }
        float* dzt = dz.data() + t * F;
        for (int64_t j = 0; j < F; ++j) {
          float z = 0;
          for (int64_t q = 0; q < r; ++q) z += b[size_t(j * r + q)] * ht[q];
          const float p = 1.0f / (1.0f + std::exp(-z));
          dzt[j] = s.active(order[b0 + size_t(t)], j) ? float(pos_weight) * (p - 1.0f) * norm : p * norm;
        }
      }
      std::fill(gb.begin(), gb.end(), 0.0f);
      std::fill(dh.begin(), dh.end(), 0.0f);
      for (int64_t t = 0; t < n; ++t) {
        const float* ht = h.data() + t * r;
        const float* dzt = dz.data() + t * F;
        float* dht = dh.data() + t * r;
        for (int64_t j = 0; j < F; ++j) {
          const float g = dzt[j];
          float* gbj = gb.data() + j * r;
          const float* bj = b.data() + j * r;
          for (int64_t q = 0; q < r; ++q) {
            gbj[q] += g * ht[q];
            dht[q] += g * bj[q];
          }
        }
      }
      std::fill(ga.begin(), ga.end(), 0.0f);
      for (int64_t t = 0; t < n; ++t) {
        const float* x = s.x.data() + order[b0 + size_t(t)] * d;
        const float* dht = dh.data() + t * r;
        for (int64_t q = 0; q < r; ++q) {
          const float g = dht[q];
          float* gaq = ga.data() + q * d;
          for (int64_t i = 0; i < d; ++i) gaq[i] += g * x[i];
        }
      }
      adam_step(a, ga, sa, opts.lr);
      adam_step(b, gb, sb, opts.lr);
    }
  }
}

// The highest threshold whose held-out recall is >= `want`, and that recall and the fraction
// predicted active.
void pick_threshold(const LayerSamples& s, const std::vector<int64_t>& eval, const std::vector<float>& sc, double want,
                    PredictorLayerReport& rep) {
  const int64_t F = s.n_ff;
  std::vector<float> pos;  // scores of the truly active
  for (size_t n = 0; n < eval.size(); ++n)
    for (int64_t j = 0; j < F; ++j)
      if (s.active(eval[n], j)) pos.push_back(sc[n * size_t(F) + size_t(j)]);
  const int64_t P = int64_t(pos.size());
  float t;
  if (P == 0) {
    // Nothing was active: predict nothing (no score exceeds the largest).
    t = sc.empty() ? 0.0f : *std::max_element(sc.begin(), sc.end());
  } else {
    // Up to k of the P may be missed: the threshold sits just below the k-th smallest score.
    int64_t k = std::min<int64_t>(P - 1, int64_t(std::floor((1.0 - want) * double(P))));
    while (k > 0 && double(P - k) / double(P) < want) --k;
    std::nth_element(pos.begin(), pos.begin() + k, pos.end());
    t = std::nextafter(pos[size_t(k)], -std::numeric_limits<float>::infinity());
  }
  int64_t hit = 0, predicted = 0, truly = 0;
  for (size_t n = 0; n < eval.size(); ++n)
    for (int64_t j = 0; j < F; ++j) {
      const bool on = sc[n * size_t(F) + size_t(j)] > t, act = s.active(eval[n], j);
      predicted += on;
      truly += act;
      hit += on && act;
    }
  const double cells = double(eval.size()) * double(F);
  rep.threshold = t;
  rep.recall = truly > 0 ? double(hit) / double(truly) : 1.0;
  rep.predicted_active = cells > 0 ? double(predicted) / cells : 0.0;
  rep.true_active = cells > 0 ? double(truly) / cells : 0.0;
}

}  // namespace

TrainedPredictor train_ffn_predictor(std::shared_ptr<const GgufFile> model, const PredictorTrainOptions& opts) {
  const HParams hp = read_hparams(*model);
  const FfnActivation act = hp.ffn_activation.value_or(find_architecture(hp.arch, model->path()).activation);
  if (act != FfnActivation::Relu)
    fail(model->path(), ": sparsity predictors need a ReLU-fied model (tern sparsify --relufy); this model's FFN is ",
         ffn_activation_name(act));
  if (opts.rank < 1 || opts.rank > hp.n_embd)
    fail("--rank ", opts.rank, " is outside 1 .. n_embd ", hp.n_embd, " of ", model->path());
  if (!(opts.recall > 0.0 && opts.recall <= 1.0)) fail("--recall ", opts.recall, " is outside (0, 1]");
  if (opts.epochs < 0) fail("--epochs ", opts.epochs, " is negative");
  if (!(opts.lr > 0.0f) || !std::isfinite(opts.lr)) fail("--lr ", opts.lr, " must be positive");
  if (!(opts.pos_weight > 0.0) || !std::isfinite(opts.pos_weight)) fail("--pos-weight ", opts.pos_weight, " must be positive");
  const int64_t d = hp.n_embd, r = opts.rank;

  int64_t t0 = now_ns();
  std::vector<LayerSamples> layers(size_t(hp.n_layer));
  const CalibRun run = run_calibration_text(model, opts.calib, [&](ThreadPool&, int64_t total) {
    return std::make_unique<PairCollector>(layers, d, total);
  });
  TrainedPredictor p;
  p.n_embd = d;
  p.rank = r;
  p.report.rank = r;
  p.report.calib_seconds = double(now_ns() - t0) / 1e9;
  t0 = now_ns();

  std::vector<int64_t> dense;  // layers to train
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const LayerSamples& s = layers[size_t(il)];
    if (s.n_x == 0 && s.n_mask == 0) continue;
    if (s.n_x != s.n_mask || s.n_x != run.n_tokens || s.n_ff != hp.ff_length(il) ||
        !model->find_tensor(str_cat("blk.", il, ".ffn_gate.weight")))
      fail(model->path(), ": layer ", il, ": the predictor saw ", s.n_x, " FFN inputs and ", s.n_mask,
           " activations of ", s.n_ff, " neurons over ", run.n_tokens, " tokens (n_ff ", hp.ff_length(il),
           "): not a dense gated FFN it can predict");
    dense.push_back(il);
  }
  if (dense.empty()) fail(model->path(), ": no dense FFN (ffn_gate, ffn_down) ran: nothing to predict");

  const std::vector<int64_t> train = token_split(run.n_tokens, false), eval = token_split(run.n_tokens, true);
  p.report.n_train = int64_t(train.size());
  p.report.n_eval = int64_t(eval.size());
  p.a.resize(size_t(hp.n_layer));
  p.b.resize(size_t(hp.n_layer));
  p.threshold.assign(size_t(hp.n_layer), 0.0f);
  p.recall.assign(size_t(hp.n_layer), 0.0f);
  p.report.layers.resize(dense.size());
  p.freq.resize(size_t(hp.n_layer));
  for (const int64_t il : dense) {
    const LayerSamples& s = layers[size_t(il)];
    std::vector<float>& f = p.freq[size_t(il)];
    std::vector<int64_t> on(size_t(s.n_ff), 0);
    for (int64_t t = 0; t < s.n_mask; ++t)
      for (int64_t j = 0; j < s.n_ff; ++j) on[size_t(j)] += s.active(t, j);
    f.resize(size_t(s.n_ff));
    for (int64_t j = 0; j < s.n_ff; ++j) f[size_t(j)] = float(double(on[size_t(j)]) / double(s.n_mask));
  }

  ThreadPool pool(opts.calib.n_threads > 0 ? opts.calib.n_threads : default_thread_count());
  // The factorisations use the pool's rows; the layers' training then runs one layer per thread.
  std::vector<double> pos_weight(dense.size());
  for (size_t k = 0; k < dense.size(); ++k) {
    const int64_t il = dense[k];
    const LayerSamples& s = layers[size_t(il)];
    const GgufTensorInfo& gate = *model->find_tensor(str_cat("blk.", il, ".ffn_gate.weight"));
    if (gate.ne.size() != 2 || gate.ne[0] != d || gate.ne[1] != s.n_ff)
      fail(model->path(), ": blk.", il, ".ffn_gate.weight is ", gate.shape_string(), ", expected ", d, " x ", s.n_ff);
    init_from_gate(tensor_to_f32(gate, pool), s, train, d, r, pool, p.a[size_t(il)], p.b[size_t(il)]);
    int64_t on = 0;
    for (int64_t t : train)
      for (int64_t j = 0; j < s.n_ff; ++j) on += s.active(t, j);
    const double rate = train.empty() ? 0.0 : double(on) / (double(train.size()) * double(s.n_ff));
    // Positives weighted by the negatives' share over theirs: both classes weigh the same, so
    // that the loss does not buy precision with the recall the threshold needs.
    pos_weight[k] = opts.pos_weight * (rate > 0 && rate < 1 ? (1 - rate) / rate : 1.0);
    if (opts.progress) opts.progress(int64_t(k + 1), int64_t(dense.size()), str_cat("factor layer ", il));
  }

  std::mutex progress_mutex;
  std::atomic<int64_t> done{0};
  pool.for_chunks(int64_t(dense.size()), [&](int64_t k, int) {
    const int64_t il = dense[size_t(k)];
    const LayerSamples& s = layers[size_t(il)];
    std::vector<float>& a = p.a[size_t(il)];
    std::vector<float>& b = p.b[size_t(il)];
    PredictorLayerReport& rep = p.report.layers[size_t(k)];
    rep.layer = il;
    rep.n_ff = s.n_ff;
    std::vector<float> sc;
    predictor_scores(s, eval, a, b, d, r, sc);
    rep.loss_init = weighted_bce(s, eval, sc, pos_weight[size_t(k)]);
    train_layer(s, train, d, r, pos_weight[size_t(k)], opts, il, a, b);
    predictor_scores(s, eval, a, b, d, r, sc);
    rep.loss = weighted_bce(s, eval, sc, pos_weight[size_t(k)]);
    pick_threshold(s, eval, sc, opts.recall, rep);
    rep.predictor_bytes = (r * d + s.n_ff * r) * int64_t(sizeof(float));
    for (const char* part : {"ffn_gate", "ffn_up", "ffn_down"})
      if (const GgufTensorInfo* t = model->find_tensor(str_cat("blk.", il, ".", part, ".weight")))
        rep.ffn_bytes += int64_t(t->n_bytes);
    p.threshold[size_t(il)] = rep.threshold;
    p.recall[size_t(il)] = float(rep.recall);
    const int64_t n_done = ++done;
    if (opts.progress) {
      std::lock_guard<std::mutex> lock(progress_mutex);
      opts.progress(n_done, int64_t(dense.size()), str_cat("trained layer ", il));
    }
  });
  p.report.fingerprint = ffn_gate_fingerprint(*model);
  p.report.train_seconds = double(now_ns() - t0) / 1e9;
  return p;
}

std::vector<PredictorLayerReport> evaluate_ffn_predictor(std::shared_ptr<const GgufFile> model, const CalibOptions& calib) {
  const FfnPredictor p = read_ffn_predictor(*model, *model);
  std::vector<LayerSamples> layers(size_t(p.n_layer()));
  const CalibRun run = run_calibration_text(model, calib, [&](ThreadPool&, int64_t total) {
    return std::make_unique<PairCollector>(layers, p.n_embd, total);
  });
  std::vector<int64_t> all(size_t(run.n_tokens));
  std::iota(all.begin(), all.end(), 0);
  std::vector<PredictorLayerReport> reps;
  for (int64_t il = 0; il < p.n_layer(); ++il) {
    if (!p.has_layer(il)) continue;
    const LayerSamples& s = layers[size_t(il)];
    const FfnPredictorLayer& l = p.layers[size_t(il)];
    if (s.n_x != run.n_tokens || s.n_mask != run.n_tokens || s.n_ff != l.n_ff)
      fail(model->path(), ": layer ", il, ": the evaluation saw ", s.n_x, " FFN inputs and ", s.n_mask,
           " activations of ", s.n_ff, " neurons over ", run.n_tokens, " tokens, the predictor has ", l.n_ff);
    const std::vector<float> a(l.a, l.a + p.rank * p.n_embd), b(l.b, l.b + l.n_ff * p.rank);
    std::vector<float> sc;
    predictor_scores(s, all, a, b, p.n_embd, p.rank, sc);
    PredictorLayerReport rep;
    rep.layer = il;
    rep.n_ff = l.n_ff;
    rep.threshold = p.threshold[size_t(il)];
    int64_t hit = 0, predicted = 0, truly = 0;
    for (int64_t t = 0; t < run.n_tokens; ++t)
      for (int64_t j = 0; j < l.n_ff; ++j) {
        const bool on = sc[size_t(t * l.n_ff + j)] > rep.threshold, act = s.active(t, j);
        predicted += on;
        truly += act;
        hit += on && act;
      }
    const double cells = double(run.n_tokens) * double(l.n_ff);
    rep.recall = truly > 0 ? double(hit) / double(truly) : 1.0;
    rep.predicted_active = double(predicted) / cells;
    rep.true_active = double(truly) / cells;
    rep.predictor_bytes = (p.rank * p.n_embd + l.n_ff * p.rank) * int64_t(sizeof(float));
    for (const char* part : {"ffn_gate", "ffn_up", "ffn_down"})
      if (const GgufTensorInfo* t = model->find_tensor(str_cat("blk.", il, ".", part, ".weight")))
        rep.ffn_bytes += int64_t(t->n_bytes);
    reps.push_back(rep);
  }
  return reps;
}

void write_with_ffn_predictor(const GgufFile& model, const TrainedPredictor& p, const std::string& out) {
  GgufWriter w(model.version() >= 2 ? model.version() : 3);
  w.copy_metadata(model);
  w.set(kFfnPredictorRankKey, GgufValue::u32(uint32_t(p.rank)));
  std::vector<GgufValue> thr, rec;
  for (float t : p.threshold) thr.push_back(GgufValue::f32(t));
  for (float x : p.recall) rec.push_back(GgufValue::f32(x));
  w.set(kFfnPredictorThresholdKey, GgufValue::array(GgufType::F32, std::move(thr)));
  w.set(kFfnPredictorRecallKey, GgufValue::array(GgufType::F32, std::move(rec)));
  w.set(kFfnPredictorModelKey, GgufValue::string(p.report.fingerprint));
  for (const GgufTensorInfo& t : model.tensors())
    if (!is_ffn_predictor_tensor(t.name)) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  for (size_t il = 0; il < p.a.size(); ++il) {
    if (p.a[il].empty()) continue;
    const int64_t n_ff = int64_t(p.b[il].size()) / p.rank;
    w.add_tensor(ffn_pred_a_name(int64_t(il)), DType::F32, {p.n_embd, p.rank}, p.a[il].data(),
                 p.a[il].size() * sizeof(float));
    w.add_tensor(ffn_pred_b_name(int64_t(il)), DType::F32, {p.rank, n_ff}, p.b[il].data(),
                 p.b[il].size() * sizeof(float));
    if (il < p.freq.size() && !p.freq[il].empty()) {
      if (int64_t(p.freq[il].size()) != n_ff)
        fail("write_with_ffn_predictor: layer ", il, " has ", p.freq[il].size(), " frequencies for ", n_ff, " neurons");
      w.add_tensor(ffn_act_freq_name(int64_t(il)), DType::F32, {n_ff}, p.freq[il].data(),
                   p.freq[il].size() * sizeof(float));
    }
  }
  w.write(out);
}

}  // namespace tern
