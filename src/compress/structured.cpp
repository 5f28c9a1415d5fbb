#include "compress/structured.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "core/output_file.h"
#include "core/stats.h"
#include "models/arch.h"
#include "models/hparams.h"
#include "quant/quant_traits.h"

namespace tern {
namespace {

std::string blk(int64_t il, const char* stem, const char* suffix = "weight") {
  return str_cat("blk.", il, ".", stem, ".", suffix);
}

// The shape every layer has; per-layer counts come from the file's (possibly per-layer) keys.
struct Geometry {
  std::string arch;
  int64_t n_layer = 0, n_embd = 0, head_dim = 0;
  std::vector<int64_t> n_head, n_head_kv, n_ff;
  int64_t group(int64_t il) const { return n_head[size_t(il)] / n_head_kv[size_t(il)]; }
  // Weight parameters one removable unit carries: a KV group's q rows, k and v rows and
  // attn_output columns; an FFN channel's gate and up rows and ffn_down column.
  int64_t kv_unit_params(int64_t il) const { return (2 * group(il) + 2) * head_dim * n_embd; }
  int64_t ffn_unit_params() const { return 3 * n_embd; }
  int64_t layer_params(int64_t il) const {
    return n_head_kv[size_t(il)] * kv_unit_params(il) + n_ff[size_t(il)] * ffn_unit_params();
  }
};

Geometry geometry_of(const GgufFile& src) {
  const HParams hp = read_hparams(src);
  Geometry g;
  g.arch = hp.arch;
  g.n_layer = hp.n_layer;
  g.n_embd = hp.n_embd;
  g.head_dim = hp.head_dim;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    g.n_head.push_back(hp.head_count(il));
    g.n_head_kv.push_back(hp.head_count_kv(il));
    g.n_ff.push_back(hp.ff_length(il));
  }
  return g;
}

// The tensor `name` of `src`, checked to have shape ne.
const GgufTensorInfo& tensor_of(const GgufFile& src, const std::string& name, std::vector<int64_t> ne) {
  const GgufTensorInfo* t = src.find_tensor(name);
  if (!t) fail(src.path(), ": missing tensor ", name);
  if (t->ne != ne) {
    std::string want, have;
    for (int64_t x : ne) want += str_cat(want.empty() ? "" : "x", x);
    for (int64_t x : t->ne) have += str_cat(have.empty() ? "" : "x", x);
    fail(src.path(), ": tensor ", name, " is ", have, ", expected ", want);
  }
  return *t;
}

// Sum of squares of each column of W [n_rows, n_cols] (f64 accumulation), columns split across
// the pool.
std::vector<double> column_sq_norms(const std::vector<float>& w, int64_t n_cols, ThreadPool& pool) {
  const int64_t n_rows = int64_t(w.size()) / n_cols;
  std::vector<double> out(static_cast<size_t>(n_cols), 0.0);  // [n_cols]
  pool.parallel_for(n_cols, [&](int64_t c0, int64_t c1, int) {
    for (int64_t r = 0; r < n_rows; ++r) {
      const float* row = w.data() + r * n_cols;
      for (int64_t j = c0; j < c1; ++j) out[size_t(j)] += double(row[j]) * row[j];
    }
  });
  return out;
}

// Sum of squares of each row of W [n_rows, n_cols].
std::vector<double> row_sq_norms(const std::vector<float>& w, int64_t n_cols, ThreadPool& pool) {
  const int64_t n_rows = int64_t(w.size()) / n_cols;
  std::vector<double> out(static_cast<size_t>(n_rows), 0.0);  // [n_rows]
  pool.parallel_for(n_rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = w.data() + r * n_cols;
      double s = 0;
      for (int64_t j = 0; j < n_cols; ++j) s += double(row[j]) * row[j];
      out[size_t(r)] = s;
    }
  });
  return out;
}

// Sample variance of every channel of a site over the calibration tokens.
std::vector<double> site_variance(const SiteStats& s, const std::string& weight, int64_t n_in) {
  if (s.n_in != n_in)
    fail("calibration of ", weight, " saw inputs of ", s.n_in, " channels, the tensor has ", n_in);
  if (s.sum.size() != size_t(n_in) || s.n_tokens < 2)
    fail("calibration of ", weight, " has no per-channel sums (or fewer than 2 tokens)");
  const double n = double(s.n_tokens);
  std::vector<double> var(static_cast<size_t>(n_in));  // [n_in]
  for (int64_t j = 0; j < n_in; ++j) {
    const double sum = s.sum[size_t(j)], sq = s.sum_sq[size_t(j)];
    var[size_t(j)] = std::max(0.0, (sq - sum * sum / n) / (n - 1.0));  // rounding may dip below 0
  }
  return var;
}

// Keeps the rows `rows` (ascending) of a tensor [n_rows, row_bytes].
std::vector<uint8_t> take_rows(const GgufTensorInfo& t, const std::vector<int64_t>& rows) {
  const int64_t rb = dtype_row_bytes(t.type, t.ne[0]);
  std::vector<uint8_t> out(size_t(rb) * rows.size());
  for (size_t i = 0; i < rows.size(); ++i) std::memcpy(out.data() + int64_t(i) * rb, t.data + rows[i] * rb, size_t(rb));
  return out;
}

// Keeps the columns `cols` (ascending) of every row of a float tensor [n_rows, ne[0]].
std::vector<uint8_t> take_cols(const GgufTensorInfo& t, const std::vector<int64_t>& cols) {
  const int64_t es = dtype_info(t.type).block_bytes;  // f32/f16/bf16: one element per block
  const int64_t n_in = t.ne[0], n_rows = t.n_rows(), n_out = int64_t(cols.size());
  std::vector<uint8_t> out(size_t(n_out * n_rows * es));  // [n_rows, n_out] elements
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* src = t.data + r * n_in * es;
    uint8_t* dst = out.data() + r * n_out * es;
    for (int64_t i = 0; i < n_out; ++i) std::memcpy(dst + i * es, src + cols[size_t(i)] * es, size_t(es));
  }
  return out;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// Expands kept KV heads to the kept query heads' (or KV heads') rows / channels.
std::vector<int64_t> head_channels(const std::vector<int64_t>& kept_kv, int64_t heads_per_kv, int64_t head_dim) {
  std::vector<int64_t> out;
  for (int64_t g : kept_kv)
    for (int64_t h = g * heads_per_kv; h < (g + 1) * heads_per_kv; ++h)
      for (int64_t d = 0; d < head_dim; ++d) out.push_back(h * head_dim + d);
  return out;
}

const char* kLayerLinears[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};

}  // namespace

void check_structured_source(const GgufFile& src) {
  const std::string arch = src.get_string("general.architecture", "");
  if (arch != "llama" && arch != "deci" && arch != "qwen2" && arch != "qwen3")
    fail(src.path(), ": structured pruning supports the llama (deci), qwen2 and qwen3 architectures, not '", arch,
         "' (Gemma's query scale depends on the head count; Phi-3's fused q/k/v and gate/up matrices and MoE experts "
         "are not handled)");
  const Geometry g = geometry_of(src);
  for (int64_t il = 0; il < g.n_layer; ++il) {
    if (src.find_tensor(blk(il, "ffn_gate_inp")))
      fail(src.path(), ": layer ", il, " routes experts (", blk(il, "ffn_gate_inp"),
           "); structured pruning handles dense FFNs only");
    if (src.find_tensor(blk(il, "attn_qkv")))
      fail(src.path(), ": layer ", il, " has a fused ", blk(il, "attn_qkv"), "; structured pruning needs separate q/k/v");
    for (const char* l : kLayerLinears) {
      const GgufTensorInfo* t = src.find_tensor(blk(il, l));
      if (!t) fail(src.path(), ": missing tensor ", blk(il, l));
      if (!dtype_is_float(t->type))
        fail(src.path(), ": tensor ", t->name, " is ", dtype_name(t->type),
             "; structured pruning needs float weights (f32/f16/bf16): prune the float model, then quantize");
    }
  }
}

std::vector<LayerScores> structured_scores(const GgufFile& src, const CalibStats* calib, const std::string& method,
                                           int n_threads, const ProgressFn& progress) {
  const bool flap = method == "flap";
  if (!flap && method != "magnitude") fail("unknown structured pruning method '", method, "' (known: flap, magnitude)");
  if (flap && !calib) fail("structured pruning with flap needs calibration statistics");
  check_structured_source(src);
  const Geometry g = geometry_of(src);
  ThreadPool pool(n_threads > 0 ? n_threads : default_thread_count());
  const int64_t E = g.n_embd, hd = g.head_dim;
  std::vector<LayerScores> out(size_t(g.n_layer));
  for (int64_t il = 0; il < g.n_layer; ++il) {
    const int64_t nh = g.n_head[size_t(il)], nkv = g.n_head_kv[size_t(il)], F = g.n_ff[size_t(il)];
    const int64_t grp = g.group(il), Eq = nh * hd;
    LayerScores& s = out[size_t(il)];
    // Per input channel of attn_output / ffn_down: ||W[:, j]||^2 (times Var(x_j) for flap).
    const std::string on = blk(il, "attn_output"), dn = blk(il, "ffn_down");
    std::vector<double> o_ch = column_sq_norms(tensor_to_f32(tensor_of(src, on, {Eq, E}), pool), Eq, pool);  // [Eq]
    std::vector<double> d_ch = column_sq_norms(tensor_to_f32(tensor_of(src, dn, {F, E}), pool), F, pool);    // [F]
    if (flap) {
      const std::vector<double> vo = site_variance(calib->of(on), on, Eq), vd = site_variance(calib->of(dn), dn, F);
      for (int64_t j = 0; j < Eq; ++j) o_ch[size_t(j)] *= vo[size_t(j)];
      for (int64_t j = 0; j < F; ++j) d_ch[size_t(j)] *= vd[size_t(j)];
    } else {
      // Magnitude: every weight of the structure, its input-side rows too.
      const std::vector<double> q = row_sq_norms(tensor_to_f32(tensor_of(src, blk(il, "attn_q"), {E, Eq}), pool), E, pool);
      const std::vector<double> k =
          row_sq_norms(tensor_to_f32(tensor_of(src, blk(il, "attn_k"), {E, nkv * hd}), pool), E, pool);
      const std::vector<double> v =
          row_sq_norms(tensor_to_f32(tensor_of(src, blk(il, "attn_v"), {E, nkv * hd}), pool), E, pool);
      const std::vector<double> ga = row_sq_norms(tensor_to_f32(tensor_of(src, blk(il, "ffn_gate"), {E, F}), pool), E, pool);
      const std::vector<double> up = row_sq_norms(tensor_to_f32(tensor_of(src, blk(il, "ffn_up"), {E, F}), pool), E, pool);
      for (int64_t j = 0; j < Eq; ++j) o_ch[size_t(j)] += q[size_t(j)];
      for (int64_t j = 0; j < F; ++j) d_ch[size_t(j)] += ga[size_t(j)] + up[size_t(j)];
      // k/v rows belong to the KV group as a whole: spread over its first query head's channels.
      for (int64_t kv = 0; kv < nkv; ++kv)
        for (int64_t d = 0; d < hd; ++d) o_ch[size_t(kv * grp * hd + d)] += k[size_t(kv * hd + d)] + v[size_t(kv * hd + d)];
    }
    s.kv_group.assign(size_t(nkv), 0.0);
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t d = 0; d < hd; ++d) s.kv_group[size_t(h / grp)] += o_ch[size_t(h * hd + d)];
    s.attn_ch = std::move(o_ch);
    s.ffn = std::move(d_ch);
    if (progress) progress(il + 1, g.n_layer, str_cat("scores of layer ", il));
  }
  return out;
}

int64_t ffn_multiple_for(std::optional<DType> stored) {
  const QuantTraits* q = stored ? quant_traits(*stored) : nullptr;
  return q ? q->block_size : 1;
}

StructuredReport structured_prune(const std::string& in_path, const std::string& out_path, const CalibStats* calib,
                                  const StructuredOptions& opts) {
  const int64_t t0 = now_ns();
  if (!(opts.ratio > 0.0 && opts.ratio < 1.0)) fail("pruning ratio ", opts.ratio, " is outside (0, 1)");
  if (opts.method != "flap" && opts.method != "magnitude" && opts.method != "llm-pruner")
    fail("unknown structured pruning method '", opts.method, "' (known: flap, magnitude, llm-pruner)");
  if ((opts.method == "llm-pruner") != (opts.scores != nullptr))
    fail("structured pruning: llm-pruner takes its gradient scores from the caller, the other methods compute theirs");
  if (opts.standardize != "layer" && opts.standardize != "global")
    fail("unknown standardization '", opts.standardize, "' (known: layer, global)");
  if (opts.ffn_multiple < 1) fail("ffn_multiple ", opts.ffn_multiple, " must be at least 1");
  if (opts.ratio_of != "model" && opts.ratio_of != "layers")
    fail("unknown pruning ratio base '", opts.ratio_of, "' (known: model, layers)");
  // The input stays memory-mapped while the output is written: the same file would be lost.
  check_output_not_input(out_path, {in_path});
  const GgufFile src = GgufFile::open(in_path);
  check_structured_source(src);
  const Geometry g = geometry_of(src);
  const int64_t E = g.n_embd, hd = g.head_dim, L = g.n_layer;

  StructuredReport rep;
  rep.method = opts.method;
  rep.ratio = opts.ratio;
  rep.ratio_of = opts.ratio_of;
  for (const GgufTensorInfo& t : src.tensors()) rep.model_params += t.n_elements();

  // Per-layer minimums and the most the search could remove: checked before any slow work.
  std::vector<int64_t> min_ff(static_cast<size_t>(L));
  int64_t total = 0, removable = 0;
  for (int64_t il = 0; il < L; ++il) {
    const int64_t F = g.n_ff[size_t(il)];
    int64_t m = opts.min_ffn > 0 ? opts.min_ffn : std::max<int64_t>(1, F / 16);
    m = std::min(F, (m + opts.ffn_multiple - 1) / opts.ffn_multiple * opts.ffn_multiple);
    min_ff[size_t(il)] = m;
    total += g.layer_params(il);
    removable += (g.n_head_kv[size_t(il)] - 1) * g.kv_unit_params(il) + (F - m) * g.ffn_unit_params();
  }
  const bool of_model = opts.ratio_of == "model";
  const int64_t base = of_model ? rep.model_params : total;
  const int64_t target = int64_t(std::ceil(opts.ratio * double(base)));
  if (target > removable)
    fail(in_path, ": pruning ratio ", opts.ratio, " asks for ", target, " of the ", of_model ? "model's " : "layers' ",
         base, " parameters; keeping 1 KV head and ", min_ff[0], " FFN channels per layer allows at most ", removable,
         " (ratio ", double(removable) / double(base), ")");

  // Scores, standardized (per layer, or per kind over all layers) so that heads and channels of
  // different layers compare on one scale.
  const std::vector<LayerScores> scores =
      opts.scores ? *opts.scores : structured_scores(src, calib, opts.method, opts.n_threads, opts.progress);
  if (int64_t(scores.size()) != L) fail("structured pruning: ", scores.size(), " layers of scores for ", L, " layers");
  for (int64_t il = 0; il < L; ++il)
    if (int64_t(scores[size_t(il)].attn_ch.size()) != g.n_head[size_t(il)] * hd ||
        int64_t(scores[size_t(il)].kv_group.size()) != g.n_head_kv[size_t(il)] ||
        int64_t(scores[size_t(il)].ffn.size()) != g.n_ff[size_t(il)])
      fail("structured pruning: the scores of layer ", il, " do not match its shape");
  struct Unit {
    double z;
    bool attn;
    int64_t il, idx;
  };
  std::vector<Unit> units;
  // z-scores of xs with their own mean and sample standard deviation (all equal: every z is 0).
  auto zscores = [](const std::vector<double>& xs) {
    double sum = 0, sq = 0;
    for (double x : xs) sum += x, sq += x * x;
    const double n = double(xs.size()), mean = xs.empty() ? 0.0 : sum / n;
    const double var = xs.size() > 1 ? (sq - sum * mean) / (n - 1.0) : 0.0;
    const double sd = var > 0 ? std::sqrt(var) : 1.0;
    std::vector<double> z;
    for (double x : xs) z.push_back((x - mean) / sd);
    return z;
  };
  if (opts.standardize == "global") {
    for (int kind = 0; kind < 2; ++kind) {
      std::vector<double> all;
      for (const LayerScores& s : scores) all.insert(all.end(), (kind == 0 ? s.kv_group : s.ffn).begin(),
                                                    (kind == 0 ? s.kv_group : s.ffn).end());
      const std::vector<double> z = zscores(all);
      size_t k = 0;
      for (int64_t il = 0; il < L; ++il) {
        const size_t n = (kind == 0 ? scores[size_t(il)].kv_group : scores[size_t(il)].ffn).size();
        for (size_t i = 0; i < n; ++i) units.push_back({z[k++], kind == 0, il, int64_t(i)});
      }
    }
  } else {
    for (int64_t il = 0; il < L; ++il) {
      const LayerScores& s = scores[size_t(il)];
      const std::vector<double> za = zscores(s.attn_ch), zf = zscores(s.ffn);
      const int64_t per = g.group(il) * hd;  // channels of one KV group
      for (int64_t k = 0; k < g.n_head_kv[size_t(il)]; ++k) {
        double m = 0;
        for (int64_t c = k * per; c < (k + 1) * per; ++c) m += za[size_t(c)];
        units.push_back({m / double(per), true, il, k});
      }
      for (size_t i = 0; i < zf.size(); ++i) units.push_back({zf[i], false, il, int64_t(i)});
    }
  }
  std::stable_sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) { return a.z < b.z; });

  // Greedy: the globally lowest structures go first, until the parameter target is met.
  std::vector<std::vector<char>> drop_kv(static_cast<size_t>(L)), drop_ff(static_cast<size_t>(L));
  std::vector<int64_t> kv_left(g.n_head_kv), ff_left(g.n_ff);
  for (int64_t il = 0; il < L; ++il) {
    drop_kv[size_t(il)].assign(size_t(g.n_head_kv[size_t(il)]), 0);
    drop_ff[size_t(il)].assign(size_t(g.n_ff[size_t(il)]), 0);
  }
  int64_t removed = 0;
  for (const Unit& u : units) {
    if (removed >= target) break;
    const size_t l = size_t(u.il);
    if (u.attn) {
      if (kv_left[l] <= 1) continue;
      drop_kv[l][size_t(u.idx)] = 1;
      --kv_left[l];
      removed += g.kv_unit_params(u.il);
    } else {
      if (ff_left[l] <= min_ff[l]) continue;
      drop_ff[l][size_t(u.idx)] = 1;
      --ff_left[l];
      removed += g.ffn_unit_params();
    }
  }
  TERN_ASSERT(removed >= target);  // guaranteed by the `removable` check

  // FFN widths rounded down to the multiple (never below the layer's minimum, itself a
  // multiple): each layer's lowest-scoring kept channels go too, so the target still holds.
  if (opts.ffn_multiple > 1) {
    for (int64_t il = 0; il < L; ++il) {
      const size_t l = size_t(il);
      const int64_t want = std::max(min_ff[l], ff_left[l] / opts.ffn_multiple * opts.ffn_multiple);
      if (want >= ff_left[l]) continue;
      std::vector<int64_t> kept;
      for (int64_t j = 0; j < g.n_ff[l]; ++j)
        if (!drop_ff[l][size_t(j)]) kept.push_back(j);
      std::stable_sort(kept.begin(), kept.end(),
                       [&](int64_t a, int64_t b) { return scores[l].ffn[size_t(a)] < scores[l].ffn[size_t(b)]; });
      for (int64_t i = 0; i < ff_left[l] - want; ++i) drop_ff[l][size_t(kept[size_t(i)])] = 1;
      ff_left[l] = want;
    }
  }

  // The report's per-layer structure.
  rep.layers.resize(size_t(L));
  for (int64_t il = 0; il < L; ++il) {
    StructuredLayer& s = rep.layers[size_t(il)];
    const size_t l = size_t(il);
    s.n_head_before = g.n_head[l];
    s.n_head_kv_before = g.n_head_kv[l];
    s.n_ff_before = g.n_ff[l];
    for (int64_t k = 0; k < g.n_head_kv[l]; ++k)
      if (!drop_kv[l][size_t(k)]) s.kept_kv.push_back(k);
    for (int64_t j = 0; j < g.n_ff[l]; ++j)
      if (!drop_ff[l][size_t(j)]) s.kept_ffn.push_back(j);
    s.n_head_kv = int64_t(s.kept_kv.size());
    s.n_head = s.n_head_kv * g.group(il);
    s.n_ff = int64_t(s.kept_ffn.size());
    rep.layer_params_before += g.layer_params(il);
    rep.layer_params_after += s.n_head_kv * g.kv_unit_params(il) + s.n_ff * g.ffn_unit_params();
  }

  // The output tensors: the layers' linears shrunk, everything else borrowed from the mapping.
  const bool compensate = opts.bias_compensation && opts.method == "flap";
  if (opts.bias_compensation && !compensate)
    rep.notes.push_back("bias compensation needs calibration means: only flap applies it");
  ThreadPool pool(opts.n_threads > 0 ? opts.n_threads : default_thread_count());
  std::vector<OutTensor> out;
  int64_t n_done = 0;
  out.reserve(src.tensors().size() + size_t(2 * L));
  std::vector<std::string> added_bias;  // bias tensors written that the source lacks
  for (const GgufTensorInfo& t : src.tensors()) {
    rep.bytes_before += int64_t(t.n_bytes);
    OutTensor o;
    o.name = t.name;
    o.type = t.type;
    o.ne = t.ne;
    o.data = t.data;
    o.n_bytes = t.n_bytes;
    int64_t il = -1;
    std::string stem, suffix;
    if (t.name.rfind("blk.", 0) == 0) {
      const size_t a = t.name.find('.', 4), b = t.name.rfind('.');
      if (a != std::string::npos && b > a) {
        il = std::stoll(t.name.substr(4, a - 4));
        stem = t.name.substr(a + 1, b - a - 1);
        suffix = t.name.substr(b + 1);
      }
    }
    std::vector<OutTensor> extra;  // a compensation bias written right after its weight
    if (il >= 0 && il < L) {
      const StructuredLayer& s = rep.layers[size_t(il)];
      const int64_t grp = g.group(il);
      const std::vector<int64_t> q_rows = head_channels(s.kept_kv, grp, hd), kv_rows = head_channels(s.kept_kv, 1, hd);
      const bool w = suffix == "weight", bias = suffix == "bias";
      const std::vector<int64_t>* rows = nullptr;
      const std::vector<int64_t>* cols = nullptr;
      if (stem == "attn_q" && (w || bias)) rows = &q_rows;
      else if ((stem == "attn_k" || stem == "attn_v") && (w || bias)) rows = &kv_rows;
      else if ((stem == "ffn_gate" || stem == "ffn_up") && (w || bias)) rows = &s.kept_ffn;
      else if (stem == "attn_output" && w) cols = &q_rows;
      else if (stem == "ffn_down" && w) cols = &s.kept_ffn;
      if (rows && bias) {
        // A 1-D bias [n_out]: its elements are the rows.
        if (t.type != DType::F32) fail(in_path, ": bias ", t.name, " is ", dtype_name(t.type), ", expected f32");
        std::vector<float> v(rows->size());
        for (size_t i = 0; i < rows->size(); ++i) v[i] = reinterpret_cast<const float*>(t.data)[(*rows)[i]];
        o.ne = {int64_t(v.size())};
        o.own(f32_bytes(v));
      } else if (rows) {
        o.ne = {t.ne[0], int64_t(rows->size())};
        o.own(take_rows(t, *rows));
      } else if (cols) {
        const int64_t n_in = t.ne[0];
        o.ne = {int64_t(cols->size()), t.ne[1]};
        o.own(take_cols(t, *cols));
        // Bias compensation: the removed channels' mean contribution, b = W[:, removed] . mean(x[removed]).
        const std::string bname = blk(il, stem.c_str(), "bias");
        const GgufTensorInfo* old = src.find_tensor(bname);
        const bool any_removed = int64_t(cols->size()) < n_in;
        if (compensate && any_removed) {
          const SiteStats& site = calib->of(t.name);
          if (site.n_in != n_in || site.sum.size() != size_t(n_in))
            fail("calibration of ", t.name, " does not match its ", n_in, " input channels");
          std::vector<char> kept(size_t(n_in), 0);
          for (int64_t j : *cols) kept[size_t(j)] = 1;
          const std::vector<float> wf = tensor_to_f32(t, pool);  // [E, n_in]
          std::vector<float> b(size_t(E), 0.0f);                 // [E]
          pool.parallel_for(E, [&](int64_t r0, int64_t r1, int) {
            for (int64_t r = r0; r < r1; ++r) {
              double acc = old ? double(reinterpret_cast<const float*>(old->data)[r]) : 0.0;
              for (int64_t j = 0; j < n_in; ++j)
                if (!kept[size_t(j)]) acc += double(wf[size_t(r * n_in + j)]) * site.mean(j);
              b[size_t(r)] = float(acc);
            }
          });
          if (old) {
            if (old->type != DType::F32 || old->ne != std::vector<int64_t>{E})
              fail(in_path, ": bias ", bname, " is not an f32 vector of ", E);
          } else {
            added_bias.push_back(bname);
          }
          OutTensor bo;
          bo.name = bname;
          bo.type = DType::F32;
          bo.ne = {E};
          bo.own(f32_bytes(b));
          extra.push_back(std::move(bo));
        }
      } else if (bias && compensate && ((stem == "attn_output" && s.n_head < s.n_head_before) ||
                                        (stem == "ffn_down" && s.n_ff < s.n_ff_before))) {
        continue;  // replaced by the compensated bias written after the weight
      }
    }
    rep.bytes_after += int64_t(o.n_bytes);
    out.push_back(std::move(o));
    for (OutTensor& e : extra) {
      rep.bytes_after += int64_t(e.n_bytes);
      out.push_back(std::move(e));
    }
    ++n_done;  // source tensors handled (the output has more: the added biases)
    if (opts.progress) opts.progress(n_done, int64_t(src.tensors().size()), t.name);
  }
  if (!added_bias.empty())
    rep.notes.push_back(str_cat("bias compensation: ", added_bias.size(), " output-projection biases added"));

  // Per-layer counts as llama.cpp's converter writes them (i32 arrays), and the head size
  // explicitly: without it a reader derives n_embd / head_count of layer 0, which pruning changed.
  // llama.cpp's llama architecture sizes every layer's tensors by layer 0's counts; its "deci"
  // architecture is the same block with per-layer shapes (and the optional biases), so a Llama
  // whose layers now differ is written as deci: llama.cpp and tern both load it.
  bool uniform = true;
  for (const StructuredLayer& s : rep.layers)
    uniform &= s.n_head == rep.layers[0].n_head && s.n_head_kv == rep.layers[0].n_head_kv && s.n_ff == rep.layers[0].n_ff;
  const bool as_deci = g.arch == "llama" && !uniform;
  const std::string a = (as_deci ? std::string("deci") : g.arch) + ".";
  std::vector<GgufValue> nh, nkv, nff;
  for (const StructuredLayer& s : rep.layers) {
    nh.push_back(GgufValue::i32(int32_t(s.n_head)));
    nkv.push_back(GgufValue::i32(int32_t(s.n_head_kv)));
    nff.push_back(GgufValue::i32(int32_t(s.n_ff)));
  }
  std::vector<std::pair<std::string, GgufValue>> kv = {
      {a + "attention.head_count", GgufValue::array(GgufType::I32, std::move(nh))},
      {a + "attention.head_count_kv", GgufValue::array(GgufType::I32, std::move(nkv))},
      {a + "feed_forward_length", GgufValue::array(GgufType::I32, std::move(nff))},
  };
  if (!src.has(a + "attention.key_length")) {
    kv.emplace_back(a + "attention.key_length", GgufValue::u32(uint32_t(hd)));
    kv.emplace_back(a + "attention.value_length", GgufValue::u32(uint32_t(hd)));
  }
  if (as_deci) {
    // Every "llama.*" key under "deci.*" (the per-layer ones above are set under deci already).
    const std::string from = g.arch + ".";
    std::vector<std::pair<std::string, GgufValue>> renamed;
    for (const auto& [k, v] : src.metadata())
      if (k.rfind(from, 0) == 0) renamed.emplace_back(a + k.substr(from.size()), v);
    GgufWriter w(src.version() >= 2 ? src.version() : 3);
    w.copy_metadata(src);
    for (const auto& [k, v] : src.metadata())
      if (k.rfind(from, 0) == 0) w.remove(k);
    w.set("general.architecture", GgufValue::string("deci"));
    for (auto& [k, v] : renamed)
      if (std::none_of(kv.begin(), kv.end(), [&](const auto& e) { return e.first == k; })) w.set(k, v);
    for (const auto& [k, v] : kv) w.set(k, v);
    for (const auto& t : out) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
    w.write(out_path);
    rep.notes.push_back("written as architecture deci (llama with per-layer shapes, which llama.cpp's llama loader lacks)");
  } else {
    write_model(src, out, kv, out_path);
  }
  rep.notes.push_back(str_cat("removed ", rep.layer_params_before - rep.layer_params_after, " of ",
                              rep.layer_params_before, " layer weight parameters (",
                              100.0 * double(rep.layer_params_before - rep.layer_params_after) /
                                  double(rep.layer_params_before),
                              "%), ", 100.0 * double(rep.layer_params_before - rep.layer_params_after) /
                                          double(rep.model_params),
                              "% of the model's ", rep.model_params));
  rep.seconds = double(now_ns() - t0) / 1e9;
  return rep;
}

}  // namespace tern
