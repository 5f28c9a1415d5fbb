#include "compress/lowrank.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <queue>

#include "compress/linalg.h"
#include "compress/svd.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "models/hparams.h"
#include "models/tensor_names.h"
#include "quant/quant_traits.h"

namespace tern {
namespace {

// The whitening of one matrix: M = W S ([n_out, n_in]) and St = S^T ([n_in, n_in], row j holds
// column j of S, non-zero from j on). Without a Hessian, M = W and St is empty (S = I).
struct Whitened {
  std::vector<double> m;   // [n_out, n_in]
  std::vector<double> st;  // [n_in, n_in] or empty
};

Whitened whiten(const float* w, int64_t n_out, int64_t n_in, const std::vector<double>* hessian, double damp,
                ThreadPool& pool) {
  Whitened r;
  r.m.resize(size_t(n_out * n_in));
  if (!hessian) {
    for (int64_t i = 0; i < n_out * n_in; ++i) r.m[size_t(i)] = double(w[i]);
    return r;
  }
  if (int64_t(hessian->size()) != n_in * n_in) fail("asvd: the calibration Hessian is not ", n_in, " x ", n_in);
  double mean_diag = 0.0;
  for (int64_t i = 0; i < n_in; ++i) mean_diag += (*hessian)[size_t(i * n_in + i)];
  mean_diag = std::max(mean_diag / double(n_in), 1e-30);
  // H + damp * mean(diag H) * I; a numerically singular H (dead inputs) retries with 10x.
  std::vector<double> s;
  double d = std::max(damp, 1e-10);
  for (int attempt = 0;; ++attempt) {
    s = *hessian;
    for (int64_t i = 0; i < n_in; ++i) s[size_t(i * n_in + i)] += d * mean_diag;
    if (cholesky_lower(s, n_in)) break;
    if (attempt == 6) fail("asvd: the calibration Hessian is not positive definite even with damping ", d);
    d *= 10.0;
  }
  r.st.resize(size_t(n_in * n_in));
  for (int64_t k = 0; k < n_in; ++k)
    for (int64_t j = 0; j <= k; ++j) r.st[size_t(j * n_in + k)] = s[size_t(k * n_in + j)];
  pool.parallel_for(n_out, [&](int64_t o0, int64_t o1, int) {
    std::vector<double> wo(static_cast<size_t>(n_in));  // [n_in] one row of W in double
    for (int64_t o = o0; o < o1; ++o) {
      for (int64_t k = 0; k < n_in; ++k) wo[size_t(k)] = double(w[o * n_in + k]);
      for (int64_t j = 0; j < n_in; ++j) {
        const double* sj = r.st.data() + j * n_in;
        double acc = 0.0;
        for (int64_t k = j; k < n_in; ++k) acc += wo[size_t(k)] * sj[k];
        r.m[size_t(o * n_in + j)] = acc;
      }
    }
  });
  return r;
}

// The Gram matrix of M's smaller side: [n_out, n_out] (rows) when n_out <= n_in, else [n_in, n_in].
std::vector<double> small_gram(const Whitened& wh, int64_t n_out, int64_t n_in, ThreadPool& pool) {
  return n_out <= n_in ? gram_rows(wh.m.data(), n_out, n_in, pool) : gram_cols(wh.m.data(), n_out, n_in, pool);
}

// An output tensor whose bytes are set afterwards (own()) or borrowed.
OutTensor out_tensor(std::string name, DType type, std::vector<int64_t> ne, const uint8_t* data = nullptr,
                     uint64_t n_bytes = 0) {
  OutTensor o;
  o.name = std::move(name);
  o.type = type;
  o.ne = std::move(ne);
  o.data = data;
  o.n_bytes = n_bytes;
  return o;
}

}  // namespace

std::vector<double> lowrank_spectrum(const float* w, int64_t n_out, int64_t n_in, const std::vector<double>* hessian,
                                     double damp, ThreadPool& pool) {
  const Whitened wh = whiten(w, n_out, n_in, hessian, damp, pool);
  std::vector<double> values;
  sym_eigen(small_gram(wh, n_out, n_in, pool), std::min(n_out, n_in), values, nullptr, pool);
  for (double& v : values) v = std::max(v, 0.0);  // rounding leaves tiny negatives
  return values;
}

LowRankBasis lowrank_basis(const float* w, int64_t n_out, int64_t n_in, int64_t n_vectors,
                           const std::vector<double>* hessian, double damp, ThreadPool& pool) {
  const int64_t k = std::min(n_out, n_in);
  if (n_vectors < 0 || n_vectors > k) fail("rank ", n_vectors, " is outside [0, ", k, "] for a ", n_out, " x ", n_in, " matrix");
  const Whitened wh = whiten(w, n_out, n_in, hessian, damp, pool);
  LowRankBasis b;
  b.n_in = n_in;
  b.n_out = n_out;
  b.n_vectors = n_vectors;
  sym_eigen(small_gram(wh, n_out, n_in, pool), k, b.energy, &b.vectors, pool, n_vectors);
  for (double& v : b.energy) v = std::max(v, 0.0);  // rounding leaves tiny negatives
  return b;
}

LowRankFactors lowrank_factor(const float* w, int64_t n_out, int64_t n_in, int64_t rank,
                              const std::vector<double>* hessian, double damp, ThreadPool& pool) {
  const int64_t k = std::min(n_out, n_in);
  if (rank < 1 || rank > k) fail("rank ", rank, " is outside [1, ", k, "] for a ", n_out, " x ", n_in, " matrix");
  return lowrank_factor(w, lowrank_basis(w, n_out, n_in, rank, hessian, damp, pool), rank, hessian, damp, pool);
}

LowRankFactors lowrank_factor(const float* w, const LowRankBasis& basis, int64_t rank,
                              const std::vector<double>* hessian, double damp, ThreadPool& pool) {
  const int64_t n_out = basis.n_out, n_in = basis.n_in, k = std::min(n_out, n_in);
  if (rank < 1 || rank > basis.n_vectors)
    fail("rank ", rank, " is outside [1, ", basis.n_vectors, "] for a ", n_out, " x ", n_in, " matrix's basis");
  // M = W S again (cheaper to recompute than to keep for every matrix of a model).
  const Whitened wh = n_out > n_in ? whiten(w, n_out, n_in, hessian, damp, pool) : Whitened{};
  LowRankFactors f;
  f.n_in = n_in;
  f.n_out = n_out;
  f.rank = rank;
  f.energy = basis.energy;
  const std::vector<double>& vec = basis.vectors;  // [n_vectors, k] eigenvectors as rows
  f.a.assign(size_t(rank * n_in), 0.0);
  f.b.assign(size_t(n_out * rank), 0.0);
  if (n_out <= n_in) {
    // B = U_r, A = U_r^T W: the projection of W's columns onto the top left singular vectors of
    // M (the S of M = W S cancels: U_r U_r^T M S^-1 = U_r U_r^T W).
    for (int64_t o = 0; o < n_out; ++o)
      for (int64_t i = 0; i < rank; ++i) f.b[size_t(o * rank + i)] = vec[size_t(i * k + o)];
    pool.parallel_for(rank, [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i) {
        double* ai = f.a.data() + i * n_in;
        for (int64_t o = 0; o < n_out; ++o) {
          const double u = vec[size_t(i * k + o)];
          const float* wo = w + o * n_in;
          for (int64_t j = 0; j < n_in; ++j) ai[j] += u * double(wo[j]);
        }
      }
    });
  } else {
    // B = M V_r, A = V_r^T S^-1 (rows of A: S^T x = v_i by back-substitution).
    pool.parallel_for(n_out, [&](int64_t o0, int64_t o1, int) {
      for (int64_t o = o0; o < o1; ++o) {
        const double* mo = wh.m.data() + o * n_in;
        for (int64_t i = 0; i < rank; ++i) {
          const double* vi = vec.data() + i * k;
          double acc = 0.0;
          for (int64_t j = 0; j < n_in; ++j) acc += mo[j] * vi[j];
          f.b[size_t(o * rank + i)] = acc;
        }
      }
    });
    pool.parallel_for(rank, [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i) {
        const double* vi = vec.data() + i * k;
        double* x = f.a.data() + i * n_in;
        if (wh.st.empty()) {
          std::copy_n(vi, n_in, x);
          continue;
        }
        for (int64_t j = n_in - 1; j >= 0; --j) {
          const double* sj = wh.st.data() + j * n_in;
          double acc = vi[j];
          for (int64_t c = j + 1; c < n_in; ++c) acc -= sj[c] * x[c];
          x[j] = acc / sj[j];
        }
      }
    });
  }
  return f;
}

std::vector<float> lowrank_merge(const LowRankFactors& f) {
  std::vector<float> w(size_t(f.n_out * f.n_in));  // [n_out, n_in]
  std::vector<double> row(size_t(f.n_in));
  for (int64_t o = 0; o < f.n_out; ++o) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int64_t i = 0; i < f.rank; ++i) {
      const double b = f.b[size_t(o * f.rank + i)];
      const double* ai = f.a.data() + i * f.n_in;
      for (int64_t j = 0; j < f.n_in; ++j) row[size_t(j)] += b * ai[j];
    }
    for (int64_t j = 0; j < f.n_in; ++j) w[size_t(o * f.n_in + j)] = float(row[size_t(j)]);
  }
  return w;
}

std::vector<int64_t> allocate_ranks(const std::vector<std::vector<double>>& spectra,
                                    const std::vector<std::pair<int64_t, int64_t>>& shapes, double budget) {
  TERN_ASSERT(spectra.size() == shapes.size());
  if (!(budget > 0.0 && budget <= 1.0)) fail("--budget ", budget, " is outside (0, 1]");
  const size_t n = shapes.size();
  int64_t total = 0;
  for (const auto& [n_out, n_in] : shapes) total += n_out * n_in;
  const double allowed = budget * double(total);
  std::vector<int64_t> rank(n, 0);
  std::vector<bool> dense(n, false);
  // The largest rank whose factors cost less than the dense matrix (0: none does).
  const auto r_max = [&](size_t i) {
    const auto [n_out, n_in] = shapes[i];
    return std::min(std::min(n_out, n_in), (n_out * n_in - 1) / (n_out + n_in));
  };
  double used = 0;
  // Every matrix starts at rank 1 (or dense when even that costs as much).
  for (size_t i = 0; i < n; ++i) {
    const auto [n_out, n_in] = shapes[i];
    if (r_max(i) < 1) {
      dense[i] = true;
      used += double(n_out * n_in);
    } else {
      rank[i] = 1;
      used += double(n_out + n_in);
    }
  }
  if (used > allowed)
    fail("--budget ", budget, " is too small: rank 1 for every matrix already keeps ", used / double(total) * 100.0,
         "% of the parameters");
  // The next step of matrix i: one more rank (gain sigma_r^2 at cost n_in + n_out) or, at the
  // crossover rank, going dense (the rest of the spectrum at the rest of the dense cost).
  struct Step {
    double ratio;
    size_t i;
    bool operator<(const Step& o) const { return ratio < o.ratio || (ratio == o.ratio && i > o.i); }
  };
  const auto next = [&](size_t i, double* gain, double* cost) {
    const auto [n_out, n_in] = shapes[i];
    const std::vector<double>& s = spectra[i];
    if (rank[i] < r_max(i)) {
      *gain = size_t(rank[i]) < s.size() ? s[size_t(rank[i])] : 0.0;
      *cost = double(n_out + n_in);
    } else {
      double rest = 0;
      for (size_t j = size_t(rank[i]); j < s.size(); ++j) rest += s[j];
      *gain = rest;
      *cost = double(n_out * n_in - rank[i] * (n_out + n_in));
    }
  };
  std::priority_queue<Step> heap;
  const auto push = [&](size_t i) {
    if (dense[i]) return;
    double gain, cost;
    next(i, &gain, &cost);
    heap.push(Step{gain / std::max(cost, 1.0), i});
  };
  for (size_t i = 0; i < n; ++i) push(i);
  while (!heap.empty()) {
    const size_t i = heap.top().i;
    heap.pop();
    double gain, cost;
    next(i, &gain, &cost);
    if (used + cost > allowed) continue;  // this matrix stops growing; smaller steps may still fit
    used += cost;
    if (rank[i] < r_max(i)) {
      ++rank[i];
    } else {
      dense[i] = true;
    }
    push(i);
  }
  for (size_t i = 0; i < n; ++i)
    if (dense[i]) rank[i] = 0;
  return rank;
}

LowRankReport lowrank_model(const std::string& in_path, const std::string& out_path, const LowRankOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool by_budget = opts.rank <= 0;
  if (by_budget && !(opts.budget > 0.0 && opts.budget <= 1.0)) fail("--budget ", opts.budget, " is outside (0, 1]");
  if (!by_budget && opts.budget != 0.0) fail("give --budget or --rank, not both");
  if (opts.damp < 0) fail("--damp must be >= 0");
  const bool whitened = opts.method == LowRankMethod::Asvd;
  if (whitened && opts.calib.text_file.empty())
    fail("asvd needs a calibration text: --calib FILE (svd does not)");

  auto file = std::make_shared<const GgufFile>(GgufFile::open(in_path));
  const GgufFile& src = *file;
  const HParams hp = read_hparams(src);
  ThreadPool pool(opts.n_threads > 0 ? opts.n_threads : default_thread_count());

  // The linears: every layer's q, k, v, o, gate, up, down.
  std::vector<const GgufTensorInfo*> mats;
  for (int64_t il = 0; il < hp.n_layer; ++il)
    for (Tensor t : {Tensor::AttnQ, Tensor::AttnK, Tensor::AttnV, Tensor::AttnOutput, Tensor::FfnGate, Tensor::FfnUp,
                     Tensor::FfnDown}) {
      const std::string name = tensor_name(t, il);
      const GgufTensorInfo* ti = src.find_tensor(name);
      if (!ti)
        fail(in_path, ": missing tensor ", name,
             " (low-rank handles llama-style layers: separate attn_q/k/v/output, ffn_gate/up/down)");
      if (ti->ne.size() != 2) fail(in_path, ": ", name, " is not a matrix (", ti->shape_string(), ")");
      if (!dtype_is_float(ti->type))
        fail(in_path, ": ", name, " is ", dtype_name(ti->type),
             ": low-rank starts from float weights; dequantize with tern quantize IN OUT --type f16 first");
      mats.push_back(ti);
    }
  const size_t n_mats = mats.size();
  std::vector<std::pair<int64_t, int64_t>> shapes;  // {n_out, n_in}
  for (const GgufTensorInfo* t : mats) shapes.emplace_back(t->ne[1], t->ne[0]);
  if (!by_budget)
    for (size_t i = 0; i < n_mats; ++i)
      if (opts.rank > std::min(shapes[i].first, shapes[i].second))
        fail("rank ", opts.rank, " exceeds tensor ", mats[i]->name, "'s shape ", shapes[i].first, " x ",
             shapes[i].second);

  LowRankReport rep;
  rep.method = whitened ? "asvd" : "svd";
  rep.merged = opts.merge;
  CalibStats calib;
  if (whitened) {
    CalibOptions c = opts.calib;
    c.hessian = true;
    c.n_threads = opts.n_threads;
    if (!c.progress) c.progress = opts.progress;
    const auto tc = std::chrono::steady_clock::now();
    calib = calibrate(file, c);
    rep.calib_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - tc).count();
  }
  const auto hessian_of = [&](size_t i) -> const std::vector<double>* {
    return whitened ? &calib.of(mats[i]->name).hessian : nullptr;
  };

  // Ranks: fixed, or by the budget from every matrix's spectrum. The budget's first pass keeps
  // each matrix's basis up to its crossover rank (the most it can get), so the factors need no
  // second eigendecomposition (TinyLlama: ~2.4 GB of double vectors at the peak).
  std::vector<int64_t> ranks(n_mats, 0);
  std::vector<LowRankBasis> bases(n_mats);
  const int64_t total_steps = by_budget ? int64_t(2 * n_mats) : int64_t(n_mats);
  int64_t step = 0;
  if (by_budget) {
    std::vector<std::vector<double>> spectra(n_mats);
    for (size_t i = 0; i < n_mats; ++i) {
      if (opts.progress) opts.progress(step, total_steps, "spectrum " + mats[i]->name);
      const auto [n_out, n_in] = shapes[i];
      const int64_t r_max = std::min(std::min(n_out, n_in), (n_out * n_in - 1) / (n_out + n_in));
      const std::vector<float> w = tensor_to_f32(*mats[i], pool);
      bases[i] = lowrank_basis(w.data(), n_out, n_in, r_max, hessian_of(i), opts.damp, pool);
      spectra[i] = bases[i].energy;
      if (opts.relative) {
        double sum = 0;
        for (double v : spectra[i]) sum += v;
        if (sum > 0)
          for (double& v : spectra[i]) v /= sum;
      }
      ++step;
    }
    ranks = allocate_ranks(spectra, shapes, opts.budget);
  } else {
    for (size_t i = 0; i < n_mats; ++i) {
      const auto [n_out, n_in] = shapes[i];
      ranks[i] = opts.rank * (n_out + n_in) < n_out * n_in ? opts.rank : 0;  // factors no cheaper: dense
    }
  }

  // Factor and encode.
  std::vector<OutTensor> out;
  out.reserve(src.tensors().size() + n_mats);
  std::map<std::string, size_t> mat_of;
  for (size_t i = 0; i < n_mats; ++i) mat_of[mats[i]->name] = i;
  std::vector<std::vector<OutTensor>> replaced(n_mats);
  for (size_t i = 0; i < n_mats; ++i) {
    const GgufTensorInfo& t = *mats[i];
    const auto [n_out, n_in] = shapes[i];
    if (opts.progress) opts.progress(step, total_steps, "factor " + t.name);
    LowRankEntry e;
    e.name = t.name;
    e.n_in = n_in;
    e.n_out = n_out;
    e.rank = ranks[i];
    e.params_before = n_in * n_out;
    e.type_a = e.type_b = t.type;
    const DType want = opts.type.value_or(t.type);
    if (e.rank == 0) {
      e.params_after = e.params_before;
      if (opts.type && want != t.type) {
        // Dense under --type: stored in that type too, so the file is uniform.
        const std::vector<float> w = tensor_to_f32(t, pool);
        OutTensor o = out_tensor(t.name, fit_row_type(want, n_in), t.ne);
        o.own(encode_rows(w.data(), n_in, n_out, o.type, pool));
        e.type_a = e.type_b = o.type;
        replaced[i].push_back(std::move(o));
      }
    } else {
      const std::vector<float> w = tensor_to_f32(t, pool);
      const LowRankFactors f =
          by_budget ? lowrank_factor(w.data(), bases[i], e.rank, hessian_of(i), opts.damp, pool)
                    : lowrank_factor(w.data(), n_out, n_in, e.rank, hessian_of(i), opts.damp, pool);
      double all = 0, kept = 0;
      for (size_t j = 0; j < f.energy.size(); ++j) {
        all += f.energy[j];
        if (int64_t(j) < e.rank) kept += f.energy[j];
      }
      e.rel_error = all > 0 ? std::sqrt(std::max(0.0, all - kept) / all) : 0.0;
      if (opts.merge) {
        e.params_after = e.params_before;
        const std::vector<float> m = lowrank_merge(f);
        OutTensor o = out_tensor(t.name, fit_row_type(want, n_in), t.ne);
        o.own(encode_rows(m.data(), n_in, n_out, o.type, pool));
        e.type_a = e.type_b = o.type;
        replaced[i].push_back(std::move(o));
      } else {
        e.params_after = e.rank * (n_in + n_out);
        std::vector<float> a(f.a.begin(), f.a.end());  // [rank, n_in]
        std::vector<float> b(f.b.begin(), f.b.end());  // [n_out, rank]
        const std::string stem = t.name.substr(0, t.name.size() - std::string(".weight").size());
        OutTensor oa = out_tensor(stem + ".lr_a.weight", fit_row_type(want, n_in), {n_in, e.rank});
        oa.own(encode_rows(a.data(), n_in, e.rank, oa.type, pool));
        OutTensor ob = out_tensor(stem + ".lr_b.weight", fit_row_type(want, e.rank), {e.rank, n_out});
        ob.own(encode_rows(b.data(), e.rank, n_out, ob.type, pool));
        e.type_a = oa.type;
        e.type_b = ob.type;
        replaced[i].push_back(std::move(oa));
        replaced[i].push_back(std::move(ob));
      }
    }
    bases[i] = LowRankBasis{};  // its memory goes back as the factors are written
    rep.params_before += e.params_before;
    rep.params_after += e.params_after;
    rep.entries.push_back(std::move(e));
    ++step;
  }
  if (opts.progress) opts.progress(total_steps, total_steps, "writing " + out_path);

  for (const GgufTensorInfo& t : src.tensors()) {
    rep.src_bytes += int64_t(t.n_bytes);
    const auto it = mat_of.find(t.name);
    if (it != mat_of.end() && !replaced[it->second].empty()) {
      for (OutTensor& o : replaced[it->second]) {
        rep.bytes += int64_t(o.n_bytes);
        out.push_back(std::move(o));
      }
      continue;
    }
    OutTensor o = out_tensor(t.name, t.type, t.ne, static_cast<const uint8_t*>(t.data), t.n_bytes);
    rep.bytes += int64_t(o.n_bytes);
    out.push_back(std::move(o));
  }
  std::vector<std::pair<std::string, GgufValue>> kv;
  kv.emplace_back("tern.lowrank.method", GgufValue::string(rep.method));
  if (by_budget) kv.emplace_back("tern.lowrank.budget", GgufValue::f32(float(opts.budget)));
  if (by_budget) kv.emplace_back("tern.lowrank.alloc", GgufValue::string(opts.relative ? "relative" : "energy"));
  else kv.emplace_back("tern.lowrank.rank", GgufValue::u32(uint32_t(opts.rank)));
  kv.emplace_back("tern.lowrank.merged", GgufValue::boolean(opts.merge));
  write_model(src, out, kv, out_path);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace tern
