#include "train/distill_hidden.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <limits>

#include "core/error.h"
#include "core/thread_pool.h"
#include "train/rng.h"

namespace tern::train {
namespace {

constexpr const char* kLossTerms =
    "response (the logits: --kd, --temperature, --hard-weight), feature, relation, attention";

// fn(begin, end) over [0, n) in chunks of `grain`, claimed dynamically (the relation's rows are a
// triangle: contiguous halves would not be balanced).
template <class Fn>
void for_row_chunks(ThreadPool* pool, int64_t n, int64_t grain, Fn&& fn) {
  const int64_t n_chunks = (n + grain - 1) / grain;
  auto chunk = [&](int64_t c, int) { fn(c * grain, std::min(n, (c + 1) * grain)); };
  if (pool != nullptr) pool->for_chunks(n_chunks, [&](int64_t c, int t) { chunk(c, t); });
  else
    for (int64_t c = 0; c < n_chunks; ++c) chunk(c, 0);
}

// a . b with eight partial sums (vectorizes without reassociation flags; the same bits for any
// thread count, as each dot runs in one thread).
template <class T>
T dot8(const T* a, const T* b, int64_t n) {
  T acc[8] = {};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int u = 0; u < 8; ++u) acc[u] += a[k + u] * b[k + u];
  T s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; k < n; ++k) s += a[k] * b[k];
  return s;
}

double parse_weight(const std::string& term, const std::string& text) {
  char* end = nullptr;
  const double w = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(w) || w < 0.0)
    fail("--loss ", term, "=", text, ": the weight must be a finite number >= 0");
  return w;
}

int64_t parse_layer(const std::string& text, int64_t n_layer, const std::string& option, const std::string& pair,
                    const char* side) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size())
    fail(option, " ", pair, ": '", text, "' is not a layer number (pairs are STUDENT:TEACHER, 0-based, e.g. 1:3,3:5)");
  const int64_t il = v < 0 ? n_layer + v : v;
  if (il < 0 || il >= n_layer)
    fail(option, " ", pair, ": ", side, " layer ", v, " is out of range (the ", side, " has ", n_layer, " layers: 0..",
         n_layer - 1, ", or -1 for the last)");
  return il;
}

}  // namespace

DistillLossWeights parse_distill_loss(const std::string& spec) {
  DistillLossWeights w{0.0, 0.0, 0.0, 0.0};
  bool seen[4] = {false, false, false, false};
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    const size_t eq = item.find('=');
    const std::string term = item.substr(0, eq);
    if (item.empty())
      fail("--loss '", spec, "': an empty term (terms are TERM=WEIGHT separated by commas: ", kLossTerms, ")");
    const int idx = term == "response"    ? 0
                    : term == "feature"   ? 1
                    : term == "relation"  ? 2
                    : term == "attention" ? 3
                                          : -1;
    if (idx < 0) fail("--loss ", item, ": unknown term '", term, "' (terms: ", kLossTerms, ")");
    if (eq == std::string::npos) fail("--loss ", item, ": give the term's weight, e.g. ", term, "=0.5");
    if (seen[idx]) fail("--loss '", spec, "': the term ", term, " is given twice");
    seen[idx] = true;
    const double v = parse_weight(term, item.substr(eq + 1));
    (idx == 0 ? w.response : idx == 1 ? w.feature : idx == 2 ? w.relation : w.attention) = v;
    pos = end + 1;
  }
  if (!(w.response > 0.0 || w.hidden()))
    fail("--loss '", spec, "': every weight is 0; give at least one term a positive weight");
  return w;
}

std::vector<LayerPair> parse_layer_pairs(const std::string& spec, int64_t n_s, int64_t n_t, const std::string& option) {
  std::vector<LayerPair> pairs;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    const size_t colon = item.find(':');
    if (colon == std::string::npos)
      fail(option, " '", item, "': pairs are STUDENT:TEACHER (0-based layers, e.g. 1:3,3:5)");
    pairs.push_back({parse_layer(item.substr(0, colon), n_s, option, item, "student"),
                     parse_layer(item.substr(colon + 1), n_t, option, item, "teacher")});
    pos = end + 1;
  }
  return pairs;
}

std::vector<LayerPair> default_feature_pairs(int64_t n_s, int64_t n_t) {
  const int64_t n = std::min(n_s, n_t);
  std::vector<LayerPair> pairs;
  for (int64_t k = 1; k <= n; ++k)
    pairs.push_back({int64_t(std::lround(double(k * n_s) / double(n))) - 1,
                     int64_t(std::lround(double(k * n_t) / double(n))) - 1});
  return pairs;
}

std::string describe_pairs(const std::vector<LayerPair>& pairs) {
  std::string s;
  for (const LayerPair& p : pairs) s += str_cat(s.empty() ? "" : ",", p.student, ":", p.teacher);
  return s;
}

template <class T>
double feature_mse(ThreadPool* pool, int64_t n, int64_t e_s, int64_t e_t, const T* hs, const T* ht, const T* w,
                   const T* b, T* d_hs, T* d_w, T* d_b, T grad_scale) {
  if (w == nullptr && e_s != e_t) fail("feature loss: widths ", e_s, " and ", e_t, " differ and there is no projection");
  // r = W hs + b - ht per row (the residual), its squared norm per row.
  std::vector<T> r(static_cast<size_t>(n * e_t));
  std::vector<double> row_loss(size_t(n), 0.0);
  const double inv_e = 1.0 / double(e_t);
  for_row_chunks(pool, n, 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      T* ri = r.data() + i * e_t;
      const T* x = hs + i * e_s;
      double acc = 0.0;
      for (int64_t o = 0; o < e_t; ++o) {
        const T y = w != nullptr ? dot8(w + o * e_s, x, e_s) + (b != nullptr ? b[o] : T(0)) : x[o];
        ri[o] = y - ht[i * e_t + o];
        acc += double(ri[o]) * double(ri[o]);
      }
      row_loss[size_t(i)] = acc * inv_e;
    }
  });
  double loss = 0.0;
  for (double v : row_loss) loss += v;
  // dF/dr = 2 r / e_t
  const T c = T(2.0 * inv_e) * grad_scale;
  if (d_hs != nullptr) {
    for_row_chunks(pool, n, 64, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const T* ri = r.data() + i * e_t;
        T* d = d_hs + i * e_s;
        if (w == nullptr) {
          for (int64_t k = 0; k < e_s; ++k) d[k] += c * ri[k];
          continue;
        }
        // d hs_i += c W^T r_i
        for (int64_t o = 0; o < e_t; ++o) {
          const T ro = c * ri[o];
          const T* wo = w + o * e_s;
          for (int64_t k = 0; k < e_s; ++k) d[k] += ro * wo[k];
        }
      }
    });
  }
  if (w != nullptr && (d_w != nullptr || d_b != nullptr)) {
    // dW[o][:] += c sum_i r_i[o] hs_i;  db[o] += c sum_i r_i[o]: split by W's rows, rows of the
    // batch summed in order (the same bits for any thread count).
    for_row_chunks(pool, e_t, 8, [&](int64_t o0, int64_t o1) {
      std::vector<T> acc(static_cast<size_t>(e_s));
      for (int64_t o = o0; o < o1; ++o) {
        std::fill(acc.begin(), acc.end(), T(0));
        T sb = T(0);
        for (int64_t i = 0; i < n; ++i) {
          const T ro = r[size_t(i * e_t + o)];
          const T* x = hs + i * e_s;
          for (int64_t k = 0; k < e_s; ++k) acc[size_t(k)] += ro * x[k];
          sb += ro;
        }
        if (d_w != nullptr)
          for (int64_t k = 0; k < e_s; ++k) d_w[o * e_s + k] += c * acc[size_t(k)];
        if (d_b != nullptr) d_b[o] += c * sb;
      }
    });
  }
  return loss;
}

template <class T>
double relation_cos_mse(ThreadPool* pool, int64_t n_seq, int64_t n_ctx, int64_t e_s, int64_t e_t, const T* hs,
                        const T* ht, T* d_hs, T grad_scale) {
  const int64_t n = n_seq * n_ctx;
  constexpr double kEps = 1e-6;  // inside the norm: a zero state has cosine 0 with everything
  // Unit rows u = h / sqrt(h.h + eps) of both, and the students' norms.
  std::vector<T> us(static_cast<size_t>(n * e_s)), ut(static_cast<size_t>(n * e_t)), norm_s(static_cast<size_t>(n));
  for_row_chunks(pool, n, 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const T ns = T(std::sqrt(double(dot8(hs + i * e_s, hs + i * e_s, e_s)) + kEps));
      const T nt = T(std::sqrt(double(dot8(ht + i * e_t, ht + i * e_t, e_t)) + kEps));
      norm_s[size_t(i)] = ns;
      for (int64_t k = 0; k < e_s; ++k) us[size_t(i * e_s + k)] = hs[i * e_s + k] / ns;
      for (int64_t k = 0; k < e_t; ++k) ut[size_t(i * e_t + k)] = ht[i * e_t + k] / nt;
    }
  });
  // G[i][j] = dR/dcos_s(i, j) = 2 (cos_s - cos_t) / (i + 1) for j < i in i's sequence (the
  // diagonal is 1 - 1 on both sides: no loss, and no gradient through a unit vector's own norm).
  std::vector<T> G(d_hs != nullptr ? size_t(n * n_ctx) : 0);
  std::vector<double> row_loss(size_t(n), 0.0);
  for_row_chunks(pool, n, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      const int64_t s = row / n_ctx, i = row % n_ctx;
      const T* usi = us.data() + row * e_s;
      const T* uti = ut.data() + row * e_t;
      const double inv = 1.0 / double(i + 1);
      double acc = 0.0;
      for (int64_t j = 0; j < i; ++j) {
        const int64_t rj = s * n_ctx + j;
        const T diff = dot8(usi, us.data() + rj * e_s, e_s) - dot8(uti, ut.data() + rj * e_t, e_t);
        acc += double(diff) * double(diff);
        if (d_hs != nullptr) G[size_t(row * n_ctx + j)] = T(2.0 * inv) * diff;
      }
      row_loss[size_t(row)] = acc * inv;
    }
  });
  double loss = 0.0;
  for (double v : row_loss) loss += v;
  if (d_hs == nullptr) return loss;
  // du_k = sum_{j<k} G[k][j] u_j + sum_{i>k} G[i][k] u_i;  dh_k = (du_k - (du_k . u_k) u_k) / |h_k|
  for_row_chunks(pool, n, 16, [&](int64_t r0, int64_t r1) {
    std::vector<T> du(static_cast<size_t>(e_s));
    for (int64_t row = r0; row < r1; ++row) {
      const int64_t s = row / n_ctx, k = row % n_ctx;
      std::fill(du.begin(), du.end(), T(0));
      for (int64_t j = 0; j < k; ++j) {
        const T g = G[size_t(row * n_ctx + j)];
        const T* uj = us.data() + (s * n_ctx + j) * e_s;
        for (int64_t q = 0; q < e_s; ++q) du[size_t(q)] += g * uj[q];
      }
      for (int64_t i = k + 1; i < n_ctx; ++i) {
        const T g = G[size_t((s * n_ctx + i) * n_ctx + k)];
        const T* ui = us.data() + (s * n_ctx + i) * e_s;
        for (int64_t q = 0; q < e_s; ++q) du[size_t(q)] += g * ui[q];
      }
      const T* uk = us.data() + row * e_s;
      const T proj = dot8(du.data(), uk, e_s);
      const T c = grad_scale / norm_s[size_t(row)];
      T* d = d_hs + row * e_s;
      for (int64_t q = 0; q < e_s; ++q) d[q] += c * (du[size_t(q)] - proj * uk[q]);
    }
  });
  return loss;
}

template <class T>
double attention_kl(ThreadPool* pool, int64_t n_seq, int64_t n_ctx, const HeadShape& hs, const T* qs, const T* ks,
                    const HeadShape& ht, const T* qt, const T* kt, T* dqs, T* dks, T grad_scale) {
  const int64_t H = hs.n_head, Ht = ht.n_head, d = hs.head_dim, dt = ht.head_dim;
  const int64_t gs = H / hs.n_head_kv, gt = Ht / ht.n_head_kv;  // query heads per key head
  const int64_t qw = H * d, kw = hs.n_head_kv * d, qwt = Ht * dt, kwt = ht.n_head_kv * dt;
  const double sc = 1.0 / std::sqrt(double(d)), sct = 1.0 / std::sqrt(double(dt));
  const bool per_head = H == Ht;
  std::vector<double> row_loss(static_cast<size_t>(n_seq * n_ctx), 0.0);
  // One sequence per unit: a row's gradient reaches the keys of every earlier row of its
  // sequence, so units never write the same dk rows (the same bits for any thread count).
  for_row_chunks(pool, n_seq, 1, [&](int64_t s0, int64_t s1) {
    // log-probabilities and probabilities, [heads][n_ctx] (one exp per element)
    std::vector<double> ls(static_cast<size_t>(H * n_ctx)), lt(static_cast<size_t>(Ht * n_ctx));
    std::vector<double> ps(static_cast<size_t>(H * n_ctx)), pt(static_cast<size_t>(Ht * n_ctx));
    std::vector<double> dz(static_cast<size_t>(H * n_ctx));
    std::vector<double> savg(static_cast<size_t>(n_ctx)), tavg(static_cast<size_t>(n_ctx)), dp(static_cast<size_t>(n_ctx));
    // out[j] = log softmax over j < L of scale * q . k_j (k_j at k + j * kstride), prob[j] = its exp
    auto log_softmax_row = [&](const T* q, const T* k, int64_t kstride, int64_t hd, double scale, int64_t L,
                               double* out, double* prob) {
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < L; ++j) {
        double z = 0.0;
        for (int64_t c = 0; c < hd; ++c) z += double(q[c]) * double(k[j * kstride + c]);
        out[j] = z * scale;
        mx = std::max(mx, out[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < L; ++j) sum += (prob[j] = std::exp(out[j] - mx));
      const double lse = mx + std::log(sum), inv = 1.0 / sum;
      for (int64_t j = 0; j < L; ++j) {
        out[j] -= lse;
        prob[j] *= inv;
      }
    };
    for (int64_t s = s0; s < s1; ++s) {
      for (int64_t i = 0; i < n_ctx; ++i) {
        const int64_t row = s * n_ctx + i, L = i + 1, base = s * n_ctx;
        for (int64_t h = 0; h < H; ++h)
          log_softmax_row(qs + row * qw + h * d, ks + base * kw + (h / gs) * d, kw, d, sc, L, ls.data() + h * n_ctx,
                          ps.data() + h * n_ctx);
        for (int64_t h = 0; h < Ht; ++h)
          log_softmax_row(qt + row * qwt + h * dt, kt + base * kwt + (h / gt) * dt, kwt, dt, sct, L,
                          lt.data() + h * n_ctx, pt.data() + h * n_ctx);
        double loss = 0.0;
        if (per_head) {
          // KL(t || s) per head; d/dz = (s - t) / H.
          for (int64_t h = 0; h < H; ++h)
            for (int64_t j = 0; j < L; ++j) {
              const double t = pt[size_t(h * n_ctx + j)], p = ps[size_t(h * n_ctx + j)];
              loss += t * (lt[size_t(h * n_ctx + j)] - ls[size_t(h * n_ctx + j)]) / double(H);
              dz[size_t(h * n_ctx + j)] = (p - t) / double(H);
            }
        } else {
          // KL(mean t || mean s); dL/d(mean s)_j = -tavg_j / savg_j, each head's share 1 / H,
          // through each head's softmax: dz = p (dp - p . dp).
          for (int64_t j = 0; j < L; ++j) {
            double a = 0.0, b = 0.0;
            for (int64_t h = 0; h < H; ++h) a += ps[size_t(h * n_ctx + j)];
            for (int64_t h = 0; h < Ht; ++h) b += pt[size_t(h * n_ctx + j)];
            savg[size_t(j)] = a / double(H);
            tavg[size_t(j)] = b / double(Ht);
            if (tavg[size_t(j)] > 0.0)
              loss += tavg[size_t(j)] * (std::log(tavg[size_t(j)]) - std::log(savg[size_t(j)]));
            dp[size_t(j)] = -tavg[size_t(j)] / savg[size_t(j)] / double(H);
          }
          for (int64_t h = 0; h < H; ++h) {
            const double* p = ps.data() + h * n_ctx;
            double pdp = 0.0;
            for (int64_t j = 0; j < L; ++j) pdp += p[j] * dp[size_t(j)];
            for (int64_t j = 0; j < L; ++j) dz[size_t(h * n_ctx + j)] = p[j] * (dp[size_t(j)] - pdp);
          }
        }
        row_loss[size_t(row)] = loss;
        if (dqs == nullptr && dks == nullptr) continue;
        // z_hj = sc q_h,i . k_j:  dq_h,i += sc sum_j dz_hj k_j;  dk_j += sc dz_hj q_h,i
        for (int64_t h = 0; h < H; ++h) {
          const T* q = qs + row * qw + h * d;
          const int64_t kh = (h / gs) * d;
          for (int64_t j = 0; j < L; ++j) {
            const double g = double(grad_scale) * sc * dz[size_t(h * n_ctx + j)];
            const T* k = ks + (base + j) * kw + kh;
            if (dqs != nullptr)
              for (int64_t c = 0; c < d; ++c) dqs[row * qw + h * d + c] += T(g * double(k[c]));
            if (dks != nullptr)
              for (int64_t c = 0; c < d; ++c) dks[(base + j) * kw + kh + c] += T(g * double(q[c]));
          }
        }
      }
    }
  });
  double loss = 0.0;
  for (double v : row_loss) loss += v;
  return loss;
}

template double feature_mse<float>(ThreadPool*, int64_t, int64_t, int64_t, const float*, const float*, const float*,
                                   const float*, float*, float*, float*, float);
template double feature_mse<double>(ThreadPool*, int64_t, int64_t, int64_t, const double*, const double*, const double*,
                                    const double*, double*, double*, double*, double);
template double relation_cos_mse<float>(ThreadPool*, int64_t, int64_t, int64_t, int64_t, const float*, const float*,
                                        float*, float);
template double relation_cos_mse<double>(ThreadPool*, int64_t, int64_t, int64_t, int64_t, const double*, const double*,
                                         double*, double);
template double attention_kl<float>(ThreadPool*, int64_t, int64_t, const HeadShape&, const float*, const float*,
                                    const HeadShape&, const float*, const float*, float*, float*, float);
template double attention_kl<double>(ThreadPool*, int64_t, int64_t, const HeadShape&, const double*, const double*,
                                     const HeadShape&, const double*, const double*, double*, double*, double);

HiddenDistill::HiddenDistill(HiddenDistillConfig cfg, TrainModel teacher, const ModelShape& student, int64_t n_seq,
                             int64_t n_ctx, ThreadPool* pool)
    : cfg_(std::move(cfg)), teacher_(std::move(teacher)), student_(student), n_seq_(n_seq), n_ctx_(n_ctx), pool_(pool),
      teacher_fb_(teacher_.shape, n_seq, n_ctx, pool) {
  if (teacher_.shape.n_vocab != student.n_vocab)
    fail("feature/relation distillation: the teacher's vocabulary has ", teacher_.shape.n_vocab, " tokens, the student's ",
         student.n_vocab);
  if (cfg_.grad_accum < 1) fail("feature/relation distillation: grad_accum must be at least 1");
  auto check = [&](const std::vector<LayerPair>& pairs, const char* what, std::vector<int64_t>& layers) {
    for (const LayerPair& p : pairs) {
      if (p.student < 0 || p.student >= student.n_layer)
        fail(what, " layer pair ", p.student, ":", p.teacher, ": student layer ", p.student,
             " is out of range (the student has ", student.n_layer, " layers: 0..", student.n_layer - 1, ")");
      if (p.teacher < 0 || p.teacher >= teacher_.shape.n_layer)
        fail(what, " layer pair ", p.student, ":", p.teacher, ": teacher layer ", p.teacher,
             " is out of range (the teacher has ", teacher_.shape.n_layer, " layers: 0..", teacher_.shape.n_layer - 1, ")");
      if (std::find(layers.begin(), layers.end(), p.student) == layers.end()) layers.push_back(p.student);
    }
  };
  if (cfg_.feature_weight > 0.0) {
    if (cfg_.feature_pairs.empty()) fail("feature distillation: no layer pairs");
    check(cfg_.feature_pairs, "feature", layers_);
  }
  if (cfg_.relation_weight > 0.0) {
    if (cfg_.relation_pairs.empty()) fail("relation distillation: no layer pairs");
    check(cfg_.relation_pairs, "relation", layers_);
  }
  if (cfg_.attention_weight > 0.0) {
    if (cfg_.attention_pairs.empty()) fail("attention distillation: no layer pairs");
    check(cfg_.attention_pairs, "attention", attn_layers_);
  }
  teacher_fb_.prepare(teacher_);
  const int64_t e_s = student.n_embd, e_t = teacher_.shape.n_embd;
  if (cfg_.feature_weight > 0.0 && e_s != e_t) {
    int64_t off = 0;
    for (const LayerPair& p : cfg_.feature_pairs) {
      const std::string name = str_cat("distill.proj.", p.student, "_", p.teacher);
      proj_params_.push_back({name + ".weight", {e_s, e_t}, off, e_s * e_t, true});
      off += e_s * e_t;
      proj_params_.push_back({name + ".bias", {e_t}, off, e_t, false});
      off += e_t;
    }
    proj_data_.assign(size_t(off), 0.0f);
    proj_grad_.assign(size_t(off), 0.0f);
    // W ~ N(0, 1 / e_s): the projection starts near norm-preserving; b = 0.
    Rng rng(mix_seed(cfg_.seed, 11, 0));
    const double sd = 1.0 / std::sqrt(double(e_s));
    for (size_t i = 0; i < proj_params_.size(); i += 2)
      for (int64_t k = 0; k < proj_params_[i].size; ++k)
        proj_data_[size_t(proj_params_[i].offset + k)] = float(sd * rng.normal());
    proj_opt_ = std::make_unique<AdamW>(cfg_.opt, off);
  }
}

void HiddenDistill::save_state(GgufWriter& w) {
  if (proj_opt_ == nullptr) return;
  for (const ParamInfo& p : proj_params_) {
    const uint64_t bytes = uint64_t(p.size) * sizeof(float);
    w.add_tensor(p.name, DType::F32, p.ne, proj_data_.data() + p.offset, bytes);
    w.add_tensor(p.name + ".adam_m", DType::F32, p.ne, proj_opt_->m().data() + p.offset, bytes);
    w.add_tensor(p.name + ".adam_v", DType::F32, p.ne, proj_opt_->v().data() + p.offset, bytes);
  }
}

void HiddenDistill::restore_state(const GgufFile& st) {
  auto shape = [](const std::vector<int64_t>& ne) {
    std::string s = "[";
    for (size_t i = 0; i < ne.size(); ++i) s += str_cat(i ? ", " : "", ne[i]);
    return s + "]";
  };
  // A projection the checkpoint has and this run does not: its pairs or widths differ.
  for (const GgufTensorInfo& t : st.tensors()) {
    if (t.name.rfind("distill.proj.", 0) != 0) continue;
    std::string base = t.name;
    for (const char* suffix : {".adam_m", ".adam_v"})
      if (base.size() > 7 && base.compare(base.size() - 7, 7, suffix) == 0) base.resize(base.size() - 7);
    bool ours = false;
    for (const ParamInfo& p : proj_params_) ours |= p.name == base;
    if (!ours) {
      std::string have;
      for (size_t i = 0; i < proj_params_.size(); i += 2)
        have += str_cat(have.empty() ? "" : ", ", proj_params_[i].name, " ", shape(proj_params_[i].ne));
      fail("--resume: ", st.path(), " holds the feature projection ", base, " ", shape(t.ne),
           " which this run does not have (it has ", have.empty() ? std::string("none") : have,
           "); give the same --loss and --feature-layers as the run had");
    }
  }
  for (const ParamInfo& p : proj_params_) {
    std::vector<float>* dst[3] = {&proj_data_, &proj_opt_->m(), &proj_opt_->v()};
    const std::string names[3] = {p.name, p.name + ".adam_m", p.name + ".adam_v"};
    for (int k = 0; k < 3; ++k) {
      const GgufTensorInfo* t = st.find_tensor(names[k]);
      if (t == nullptr)
        fail("--resume: ", st.path(), " has no ", names[k], " ", shape(p.ne),
             ": the run had another feature projection (other --feature-layers or widths), or was checkpointed by a "
             "tern that did not keep projections; give the same --loss and --feature-layers, or start anew");
      if (t->type != DType::F32 || t->ne != p.ne)
        fail("--resume: ", st.path(), ": ", names[k], " is ", shape(t->ne), " ", dtype_name(t->type), ", this run's is ",
             shape(p.ne), " f32 (the student's or the teacher's width differs)");
      std::memcpy(dst[k]->data() + p.offset, t->data, size_t(p.size) * sizeof(float));
    }
  }
}

void HiddenDistill::teacher_forward(const int32_t* windows) { teacher_fb_.forward_loss(teacher_, windows); }

void HiddenDistill::attach(ForwardBackward& student) {
  student.set_hidden_loss(layers_, [this](const std::vector<const float*>& states, const std::vector<float*>& grads,
                                          int64_t n_tok, int64_t n_embd, float grad_scale) {
    return loss(states, grads, n_tok, n_embd, grad_scale);
  });
  student.set_attention_loss(attn_layers_, [this](const std::vector<const float*>& q, const std::vector<const float*>& k,
                                                  const std::vector<float*>& dq, const std::vector<float*>& dk,
                                                  float grad_scale) { return attention_loss(q, k, dq, dk, grad_scale); });
}

double HiddenDistill::attention_loss(const std::vector<const float*>& q, const std::vector<const float*>& k,
                                     const std::vector<float*>& dq, const std::vector<float*>& dk, float grad_scale) {
  if (q.size() != attn_layers_.size() || k.size() != q.size() || dq.size() != q.size() || dk.size() != q.size())
    fail("attention distillation: ", q.size(), " layers given, ", attn_layers_.size(), " expected");
  const double w = cfg_.attention_weight / double(cfg_.attention_pairs.size());
  double total = 0.0;
  for (const LayerPair& p : cfg_.attention_pairs) {
    const size_t sl = size_t(std::find(attn_layers_.begin(), attn_layers_.end(), p.student) - attn_layers_.begin());
    const HeadShape hs{student_.head_count(p.student), student_.head_count_kv(p.student), student_.head_dim()};
    const HeadShape ht{teacher_.shape.head_count(p.teacher), teacher_.shape.head_count_kv(p.teacher),
                       teacher_.shape.head_dim()};
    total += w * attention_kl<float>(pool_, n_seq_, n_ctx_, hs, q[sl], k[sl], ht, teacher_fb_.layer_q(p.teacher),
                                     teacher_fb_.layer_k(p.teacher), dq[sl], dk[sl], float(w) * grad_scale);
  }
  last_attention_ = total / double(n_seq_ * n_ctx_);
  return total;
}

double HiddenDistill::loss(const std::vector<const float*>& states, const std::vector<float*>& grads, int64_t n_tok,
                           int64_t n_embd, float grad_scale) {
  if (n_tok != n_seq_ * n_ctx_ || n_embd != student_.n_embd || states.size() != layers_.size())
    fail("feature/relation distillation: the student's batch or width differs from the one it was set up for");
  auto slot = [&](int64_t il) { return size_t(std::find(layers_.begin(), layers_.end(), il) - layers_.begin()); };
  const int64_t e_s = student_.n_embd, e_t = teacher_.shape.n_embd;
  double feature = 0.0, relation = 0.0;
  if (cfg_.feature_weight > 0.0) {
    const double w = cfg_.feature_weight / double(cfg_.feature_pairs.size());
    for (size_t k = 0; k < cfg_.feature_pairs.size(); ++k) {
      const LayerPair& p = cfg_.feature_pairs[k];
      const size_t sl = slot(p.student);
      const bool proj = !proj_params_.empty();
      float* pw = proj ? proj_data_.data() + proj_params_[2 * k].offset : nullptr;
      float* pb = proj ? proj_data_.data() + proj_params_[2 * k + 1].offset : nullptr;
      float* gw = proj ? proj_grad_.data() + proj_params_[2 * k].offset : nullptr;
      float* gb = proj ? proj_grad_.data() + proj_params_[2 * k + 1].offset : nullptr;
      feature += w * feature_mse<float>(pool_, n_tok, e_s, e_t, states[sl], teacher_fb_.layer_output(p.teacher), pw, pb,
                                        grads[sl], gw, gb, float(w) * grad_scale);
    }
  }
  if (cfg_.relation_weight > 0.0) {
    const double w = cfg_.relation_weight / double(cfg_.relation_pairs.size());
    for (const LayerPair& p : cfg_.relation_pairs) {
      const size_t sl = slot(p.student);
      relation += w * relation_cos_mse<float>(pool_, n_seq_, n_ctx_, e_s, e_t, states[sl],
                                              teacher_fb_.layer_output(p.teacher), grads[sl], float(w) * grad_scale);
    }
  }
  last_feature_ = feature / double(n_tok);
  last_relation_ = relation / double(n_tok);
  // The last micro-batch of a step: its gradient (accumulated with the student's scale, so a
  // mean over the step's micro-batches) updates the projections, on the student's schedule.
  if (proj_opt_ != nullptr && ++n_calls_ % cfg_.grad_accum == 0) {
    const int64_t step = cfg_.first_step + n_calls_ / cfg_.grad_accum - 1;
    proj_opt_->step(proj_params_, proj_data_, proj_grad_.data(), step, pool_);
    std::fill(proj_grad_.begin(), proj_grad_.end(), 0.0f);
  }
  return feature + relation;
}

}  // namespace tern::train
