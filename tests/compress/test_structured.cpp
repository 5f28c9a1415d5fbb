// Structured pruning (compress/structured.h): FLaP's scores and selection against a plain f64
// computation, pruning as an exact removal (the pruned model's logits equal the original's with
// the same heads and channels zeroed), the compensation bias against its formula, clear errors,
// and the figures on stories260K and tern's own model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

#include "compress/calibrate.h"
#include "compress/structured.h"
#include "compress_test_util.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "models/hparams.h"
#include "models/model.h"
#include "models/synth.h"
#include "runtime/session.h"
#include "tokenizer/tokenizer.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_structured {
namespace {

using namespace tern::testing;

std::string blk(int il, const char* stem, const char* suffix = "weight") {
  return "blk." + std::to_string(il) + "." + stem + "." + suffix;
}

std::vector<float> f32_of(const GgufFile& f, const std::string& name) {
  ThreadPool pool(1);
  const GgufTensorInfo* t = f.find_tensor(name);
  EXPECT_NE(t, nullptr) << name;
  return t ? tensor_to_f32(*t, pool) : std::vector<float>{};
}

// A calibration text the generated vocabulary tokenizes: plain English words.
std::string calib_text() {
  const std::string path = temp_path("calib.txt");
  std::ofstream o(path);
  for (int i = 0; i < 60; ++i)
    o << "Once upon a time there was a little girl named Lily. She liked to play in the park with her dog, "
         "and every day " << i << " they ran to the big tree and back.\n";
  return path;
}

std::string synth(const std::string& shape) {
  const std::string path = temp_path(shape + ".gguf");
  if (!std::filesystem::exists(path)) {
    SynthOptions so;
    so.shape = shape;
    so.type = DType::F32;
    so.n_threads = 2;
    synth_model(so, path);
  }
  return path;
}

CalibStats calib_of(const std::string& model, const std::string& text, int64_t n_tokens, int64_t seq_len) {
  CalibOptions co;
  co.text_file = text;
  co.n_tokens = n_tokens;
  co.seq_len = seq_len;
  co.max_samples = 1 << 20;  // every token row: the test recomputes the statistics from them
  co.n_threads = 2;
  return calibrate(open_model_file(model), co);
}

// Logits of every position of `tokens`: [n, n_vocab].
std::vector<float> logits_of(const std::string& model, const std::vector<int32_t>& tokens) {
  SessionConfig cfg;
  cfg.n_ctx = 128;
  cfg.n_threads = 2;
  Session s(open_model_file(model), cfg);
  const float* l = s.eval(tokens, /*all_logits=*/true);
  const int64_t V = read_hparams(*open_model_file(model)).n_vocab;
  return std::vector<float>(l, l + int64_t(tokens.size()) * V);
}

// The source with the structures the report removed set to zero (same shapes, f32).
void write_zeroed(const std::string& in, const StructuredReport& rep, const std::string& out) {
  const GgufFile src = GgufFile::open(in);
  const HParams hp = read_hparams(src);
  const int64_t hd = hp.head_dim;
  ThreadPool pool(1);
  std::vector<OutTensor> ts;
  for (const GgufTensorInfo& t : src.tensors()) {
    OutTensor o;
    o.name = t.name;
    o.type = t.type;
    o.ne = t.ne;
    o.data = t.data;
    o.n_bytes = t.n_bytes;
    for (int il = 0; il < int(rep.layers.size()); ++il) {
      const StructuredLayer& L = rep.layers[size_t(il)];
      const int64_t grp = L.n_head_before / L.n_head_kv_before;
      std::set<int64_t> kv(L.kept_kv.begin(), L.kept_kv.end()), ff(L.kept_ffn.begin(), L.kept_ffn.end());
      auto q_dead = [&](int64_t ch) { return !kv.count(ch / hd / grp); };
      auto kv_dead = [&](int64_t ch) { return !kv.count(ch / hd); };
      auto ff_dead = [&](int64_t ch) { return !ff.count(ch); };
      std::function<bool(int64_t)> row_dead, col_dead;
      if (t.name == blk(il, "attn_q") || t.name == blk(il, "attn_q", "bias")) row_dead = q_dead;
      if (t.name == blk(il, "attn_k") || t.name == blk(il, "attn_v") || t.name == blk(il, "attn_k", "bias") ||
          t.name == blk(il, "attn_v", "bias"))
        row_dead = kv_dead;
      if (t.name == blk(il, "ffn_gate") || t.name == blk(il, "ffn_up")) row_dead = ff_dead;
      if (t.name == blk(il, "attn_output")) col_dead = q_dead;
      if (t.name == blk(il, "ffn_down")) col_dead = ff_dead;
      if (!row_dead && !col_dead) continue;
      EXPECT_EQ(t.type, DType::F32) << t.name;
      std::vector<float> w = tensor_to_f32(t, pool);  // [n_rows, n_in]
      const int64_t n_in = t.ne[0], n_rows = int64_t(w.size()) / n_in;
      const bool is_vector = t.ne.size() == 1;
      for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t j = 0; j < n_in; ++j)
          if ((row_dead && row_dead(is_vector ? j : r)) || (col_dead && col_dead(j))) w[size_t(r * n_in + j)] = 0.0f;
      std::vector<uint8_t> b(w.size() * 4);
      std::memcpy(b.data(), w.data(), b.size());
      o.own(std::move(b));
    }
    ts.push_back(std::move(o));
  }
  write_model(src, ts, {}, out);
}

// Plain f64 FLaP scores from the calibration's token rows (all of them) and the weights.
std::vector<LayerScores> plain_flap_scores(const GgufFile& f, const CalibStats& c) {
  const HParams hp = read_hparams(f);
  std::vector<LayerScores> out(size_t(hp.n_layer));
  for (int il = 0; il < hp.n_layer; ++il) {
    for (int part = 0; part < 2; ++part) {
      const std::string name = blk(il, part == 0 ? "attn_output" : "ffn_down");
      const SiteStats& s = c.of(name);
      EXPECT_EQ(s.n_samples, s.n_tokens) << "the test needs every token row";
      const int64_t n = s.n_samples, n_in = s.n_in;
      const std::vector<float> w = f32_of(f, name);  // [n_embd, n_in]
      std::vector<double> score(static_cast<size_t>(n_in));
      for (int64_t j = 0; j < n_in; ++j) {
        double mean = 0, var = 0, norm = 0;
        for (int64_t t = 0; t < n; ++t) mean += s.samples[size_t(t * n_in + j)];
        mean /= double(n);
        for (int64_t t = 0; t < n; ++t) var += std::pow(s.samples[size_t(t * n_in + j)] - mean, 2);
        var /= double(n - 1);
        for (int64_t r = 0; r < hp.n_embd; ++r) norm += std::pow(double(w[size_t(r * n_in + j)]), 2);
        score[size_t(j)] = var * norm;
      }
      if (part == 1) {
        out[size_t(il)].ffn = score;
      } else {
        const int64_t nh = hp.head_count(il), nkv = hp.head_count_kv(il), hd = hp.head_dim;
        out[size_t(il)].attn_ch = score;
        out[size_t(il)].kv_group.assign(size_t(nkv), 0.0);
        for (int64_t h = 0; h < nh; ++h)
          for (int64_t d = 0; d < hd; ++d) out[size_t(il)].kv_group[size_t(h / (nh / nkv))] += score[size_t(h * hd + d)];
      }
    }
  }
  return out;
}

// The selection written plainly: standardize (per kind over all layers, or per layer with a head
// the mean of its channels' z), remove ascending by z while the layer keeps 1 KV head and n_ff/16
// channels, until `ratio` of the layer weights are gone.
struct Selection {
  std::vector<std::set<int64_t>> drop_kv, drop_ff;
  int64_t total = 0, removed = 0;
};

std::vector<double> zs(const std::vector<double>& v) {
  double mean = 0, sd = 0;
  for (double x : v) mean += x;
  mean /= double(v.size());
  for (double x : v) sd += (x - mean) * (x - mean);
  sd = std::sqrt(sd / double(v.size() - 1));
  std::vector<double> out;
  for (double x : v) out.push_back((x - mean) / sd);
  return out;
}

Selection plain_select(const std::vector<LayerScores>& sc, const HParams& hp, double ratio, const std::string& mode) {
  struct U { double z; int kind; int64_t il, i; };
  std::vector<U> us;
  const int64_t E = hp.n_embd, hd = hp.head_dim, grp = hp.n_head / hp.n_head_kv;
  if (mode == "global") {
    for (int kind = 0; kind < 2; ++kind) {
      std::vector<double> all;
      for (const auto& l : sc) for (double x : kind == 0 ? l.kv_group : l.ffn) all.push_back(x);
      const std::vector<double> z = zs(all);
      size_t k = 0;
      for (int64_t il = 0; il < hp.n_layer; ++il) {
        const auto& v = kind == 0 ? sc[size_t(il)].kv_group : sc[size_t(il)].ffn;
        for (size_t i = 0; i < v.size(); ++i) us.push_back({z[k++], kind, il, int64_t(i)});
      }
    }
  } else {
    for (int64_t il = 0; il < hp.n_layer; ++il) {
      const std::vector<double> za = zs(sc[size_t(il)].attn_ch), zf = zs(sc[size_t(il)].ffn);
      for (int64_t k = 0; k < hp.head_count_kv(il); ++k) {
        double m = 0;
        for (int64_t c = k * grp * hd; c < (k + 1) * grp * hd; ++c) m += za[size_t(c)];
        us.push_back({m / double(grp * hd), 0, il, k});
      }
      for (size_t i = 0; i < zf.size(); ++i) us.push_back({zf[i], 1, il, int64_t(i)});
    }
  }
  std::stable_sort(us.begin(), us.end(), [](const U& a, const U& b) { return a.z < b.z; });
  const int64_t unit_attn = (2 * grp + 2) * hd * E, unit_ff = 3 * E;
  Selection s;
  for (int64_t il = 0; il < hp.n_layer; ++il) s.total += hp.head_count_kv(il) * unit_attn + hp.ff_length(il) * unit_ff;
  const int64_t target = int64_t(std::ceil(ratio * double(s.total)));
  s.drop_kv.resize(size_t(hp.n_layer));
  s.drop_ff.resize(size_t(hp.n_layer));
  for (const U& u : us) {
    if (s.removed >= target) break;
    if (u.kind == 0 && hp.head_count_kv(u.il) - int64_t(s.drop_kv[size_t(u.il)].size()) > 1) {
      s.drop_kv[size_t(u.il)].insert(u.i);
      s.removed += unit_attn;
    } else if (u.kind == 1 && hp.ff_length(u.il) - int64_t(s.drop_ff[size_t(u.il)].size()) > hp.ff_length(u.il) / 16) {
      s.drop_ff[size_t(u.il)].insert(u.i);
      s.removed += unit_ff;
    }
  }
  return s;
}

class StructuredSynth : public ::testing::TestWithParam<const char*> {};

// Scores and selection against the plain computation; the pruned file's shape and metadata;
// logits equal to the zeroed original's (no compensation); the compensated bias's formula.
TEST_P(StructuredSynth, ExactRemovalAndScores) {
  const std::string model = synth(GetParam());
  const std::string text = calib_text();
  const CalibStats c = calib_of(model, text, 600, 64);
  const GgufFile f = GgufFile::open(model);
  const HParams hp = read_hparams(f);

  // Scores.
  const std::vector<LayerScores> got = structured_scores(f, &c, "flap", 2);
  const std::vector<LayerScores> want = plain_flap_scores(f, c);
  ASSERT_EQ(got.size(), want.size());
  for (size_t il = 0; il < got.size(); ++il) {
    ASSERT_EQ(got[il].kv_group.size(), want[il].kv_group.size());
    ASSERT_EQ(got[il].ffn.size(), want[il].ffn.size());
    for (size_t i = 0; i < got[il].kv_group.size(); ++i)
      EXPECT_NEAR(got[il].kv_group[i], want[il].kv_group[i], 1e-6 * std::fabs(want[il].kv_group[i]) + 1e-12);
    for (size_t i = 0; i < got[il].ffn.size(); ++i)
      EXPECT_NEAR(got[il].ffn[i], want[il].ffn[i], 1e-6 * std::fabs(want[il].ffn[i]) + 1e-12);
  }

  const double ratio = 0.3;
  const int64_t E = hp.n_embd, hd = hp.head_dim;
  const int64_t grp = hp.n_head / hp.n_head_kv;
  const Selection sel_layer = plain_select(want, hp, ratio, "layer");
  const Selection sel = plain_select(want, hp, ratio, "global");
  const int64_t total = sel.total, removed = sel.removed;
  const auto& drop_kv = sel.drop_kv;
  const auto& drop_ff = sel.drop_ff;

  // "layer" standardization: the selection of the plain computation.
  {
    StructuredOptions so;
    so.ratio = ratio;
    so.ratio_of = "layers";  // plain_select's target is the layers' parameters
    so.standardize = "layer";
    so.n_threads = 2;
    const StructuredReport r = structured_prune(model, temp_path(std::string(GetParam()) + "-layer.gguf"), &c, so);
    EXPECT_EQ(r.layer_params_before - r.layer_params_after, sel_layer.removed);
    for (int64_t il = 0; il < hp.n_layer; ++il) {
      const StructuredLayer& L = r.layers[size_t(il)];
      EXPECT_EQ(L.n_head_kv, hp.head_count_kv(il) - int64_t(sel_layer.drop_kv[size_t(il)].size())) << il;
      EXPECT_EQ(L.n_ff, hp.ff_length(il) - int64_t(sel_layer.drop_ff[size_t(il)].size())) << il;
      for (int64_t k : L.kept_kv) EXPECT_FALSE(sel_layer.drop_kv[size_t(il)].count(k)) << il;
      for (int64_t j : L.kept_ffn) EXPECT_FALSE(sel_layer.drop_ff[size_t(il)].count(j)) << il;
    }
  }

  // "global" standardization from here on (it removes heads in these small cases).
  StructuredOptions so;
  so.ratio = ratio;
  so.ratio_of = "layers";
  so.standardize = "global";
  so.bias_compensation = false;
  so.n_threads = 2;
  const std::string pruned = temp_path(std::string(GetParam()) + "-flap.gguf");
  const StructuredReport rep = structured_prune(model, pruned, &c, so);
  ASSERT_EQ(rep.layers.size(), size_t(hp.n_layer));
  EXPECT_EQ(rep.layer_params_before, total);
  EXPECT_EQ(rep.layer_params_before - rep.layer_params_after, removed);
  bool any_head = false;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const StructuredLayer& L = rep.layers[size_t(il)];
    for (int64_t k : L.kept_kv) EXPECT_FALSE(drop_kv[size_t(il)].count(k)) << "layer " << il << " kv " << k;
    EXPECT_EQ(L.n_head_kv, hp.head_count_kv(il) - int64_t(drop_kv[size_t(il)].size())) << il;
    EXPECT_EQ(L.n_ff, hp.ff_length(il) - int64_t(drop_ff[size_t(il)].size())) << il;
    for (int64_t j : L.kept_ffn) EXPECT_FALSE(drop_ff[size_t(il)].count(j)) << "layer " << il << " ffn " << j;
    EXPECT_EQ(L.n_head, L.n_head_kv * grp);
    any_head |= L.n_head < L.n_head_before;
  }
  EXPECT_TRUE(any_head) << "the case should remove a head somewhere";

  // The pruned file: per-layer metadata and shapes as the loader reads them.
  const GgufFile p = GgufFile::open(pruned);
  const HParams php = read_hparams(p);
  EXPECT_EQ(php.head_dim, hd);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const StructuredLayer& L = rep.layers[size_t(il)];
    EXPECT_EQ(php.head_count(il), L.n_head);
    EXPECT_EQ(php.head_count_kv(il), L.n_head_kv);
    EXPECT_EQ(php.ff_length(il), L.n_ff);
    EXPECT_EQ(p.find_tensor(blk(int(il), "attn_q"))->ne, (std::vector<int64_t>{E, L.n_head * hd}));
    EXPECT_EQ(p.find_tensor(blk(int(il), "attn_output"))->ne, (std::vector<int64_t>{L.n_head * hd, E}));
    EXPECT_EQ(p.find_tensor(blk(int(il), "ffn_down"))->ne, (std::vector<int64_t>{L.n_ff, E}));
    EXPECT_EQ(p.find_tensor(blk(int(il), "ffn_down", "bias")), nullptr);
  }
  EXPECT_LT(rep.bytes_after, rep.bytes_before);

  // Exact removal: the logits equal the original's with those structures zeroed.
  const std::string zeroed = temp_path(std::string(GetParam()) + "-zeroed.gguf");
  write_zeroed(model, rep, zeroed);
  const auto tok = Tokenizer::from_gguf(f);
  std::vector<int32_t> ids = tok->encode("Once upon a time there was a little girl named Lily.", true);
  const std::vector<float> a = logits_of(zeroed, ids), b = logits_of(pruned, ids);
  ASSERT_EQ(a.size(), b.size());
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, double(std::fabs(a[i] - b[i])));
    max_abs = std::max(max_abs, double(std::fabs(a[i])));
  }
  EXPECT_LT(max_diff, 1e-4 * max_abs) << "max |diff| " << max_diff << " of logits up to " << max_abs;
  // ... and differ from the unpruned model's (the removal is not a no-op).
  const std::vector<float> full = logits_of(model, ids);
  double full_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) full_diff = std::max(full_diff, double(std::fabs(full[i] - b[i])));
  EXPECT_GT(full_diff, 1e-3 * max_abs);

  // With compensation: the same structures, and the output projections' biases equal
  // W[:, removed] . mean(x[removed]) computed from every calibration row.
  so.bias_compensation = true;
  const std::string comp = temp_path(std::string(GetParam()) + "-flap-comp.gguf");
  const StructuredReport rc = structured_prune(model, comp, &c, so);
  const GgufFile pc = GgufFile::open(comp);
  for (int il = 0; il < hp.n_layer; ++il) {
    EXPECT_EQ(rc.layers[size_t(il)].kept_kv, rep.layers[size_t(il)].kept_kv);
    EXPECT_EQ(rc.layers[size_t(il)].kept_ffn, rep.layers[size_t(il)].kept_ffn);
    for (int part = 0; part < 2; ++part) {
      const char* stem = part == 0 ? "attn_output" : "ffn_down";
      const StructuredLayer& L = rep.layers[size_t(il)];
      const bool lost = part == 0 ? L.n_head < L.n_head_before : L.n_ff < L.n_ff_before;
      const GgufTensorInfo* bt = pc.find_tensor(blk(il, stem, "bias"));
      if (!lost) {
        EXPECT_EQ(bt, nullptr) << blk(il, stem, "bias");
        continue;
      }
      ASSERT_NE(bt, nullptr) << blk(il, stem, "bias");
      EXPECT_EQ(bt->ne, std::vector<int64_t>{E});
      const SiteStats& s = c.of(blk(il, stem));
      const int64_t n_in = s.n_in;
      std::set<int64_t> kept;
      if (part == 0) {
        for (int64_t k : L.kept_kv)
          for (int64_t ch = k * grp * hd; ch < (k + 1) * grp * hd; ++ch) kept.insert(ch);
      } else {
        kept.insert(L.kept_ffn.begin(), L.kept_ffn.end());
      }
      const std::vector<float> w = f32_of(f, blk(il, stem));  // [E, n_in]
      const float* bias = reinterpret_cast<const float*>(bt->data);
      for (int64_t r = 0; r < E; ++r) {
        double want_b = 0;
        for (int64_t j = 0; j < n_in; ++j) {
          if (kept.count(j)) continue;
          double mean = 0;
          for (int64_t t = 0; t < s.n_samples; ++t) mean += s.samples[size_t(t * n_in + j)];
          want_b += double(w[size_t(r * n_in + j)]) * mean / double(s.n_samples);
        }
        EXPECT_NEAR(bias[r], want_b, 1e-5 * std::fabs(want_b) + 1e-6) << blk(il, stem, "bias") << " row " << r;
      }
    }
  }
  // The compensated model loads and runs.
  const std::vector<float> lc = logits_of(comp, ids);
  for (float x : lc) ASSERT_TRUE(std::isfinite(x));
}

INSTANTIATE_TEST_SUITE_P(Archs, StructuredSynth, ::testing::Values("llama3-tiny", "qwen2-tiny", "qwen3-tiny"));

// Magnitude needs no calibration and writes a model that loads; ffn_multiple rounds widths up.
TEST(Structured, MagnitudeAndFfnMultiple) {
  const std::string model = synth("llama3-tiny");
  StructuredOptions so;
  so.method = "magnitude";
  so.ratio = 0.25;
  so.ffn_multiple = 32;
  so.n_threads = 2;
  const std::string out = temp_path("llama3-tiny-mag.gguf");
  const StructuredReport rep = structured_prune(model, out, nullptr, so);
  for (const StructuredLayer& L : rep.layers) {
    EXPECT_EQ(L.n_ff % 32, 0) << L.n_ff;
    EXPECT_GE(L.n_head_kv, 1);
  }
  // Rounding the widths down removes up to 31 more channels per layer: at least 25% of the
  // model's parameters are still gone.
  EXPECT_GE(double(rep.layer_params_before - rep.layer_params_after), 0.25 * double(rep.model_params));
  const std::vector<float> l = logits_of(out, {1, 5, 9, 42});
  for (float x : l) ASSERT_TRUE(std::isfinite(x));
}

using tern::testing::error_of;

TEST(Structured, ClearErrors) {
  const std::string model = synth("llama3-tiny");
  const std::string out = temp_path("err.gguf");
  const CalibStats c = calib_of(model, calib_text(), 200, 64);
  StructuredOptions so;
  for (double r : {0.0, 1.0, -0.1, 1.5}) {
    so.ratio = r;
    EXPECT_NE(error_of([&] { structured_prune(model, out, &c, so); }).find("outside (0, 1)"), std::string::npos) << r;
  }
  so.ratio = 0.97;
  EXPECT_NE(error_of([&] { structured_prune(model, out, &c, so); }).find("allows at most"), std::string::npos);
  so.ratio = 0.2;
  so.ratio_of = "blocks";
  EXPECT_NE(error_of([&] { structured_prune(model, out, &c, so); }).find("unknown pruning ratio base 'blocks'"),
            std::string::npos);
  so.ratio_of = "model";
  EXPECT_NE(error_of([&] { structured_prune(model, model, &c, so); }), "");
  EXPECT_NE(error_of([&] { structured_prune(model, out, nullptr, so); }).find("calibration"), std::string::npos);
  so.method = "sheared-llama";
  EXPECT_NE(error_of([&] { structured_prune(model, out, &c, so); }).find("unknown structured pruning method"),
            std::string::npos);
  // llm-pruner's scores come from the caller (the training engine), and only for llm-pruner.
  so.method = "llm-pruner";
  EXPECT_NE(error_of([&] { structured_prune(model, out, &c, so); }).find("gradient scores"), std::string::npos);
  so.method = "magnitude";
  // A quantized source.
  {
    const std::string q = temp_path("llama3-tiny-q8.gguf");
    QuantizeOptions qo;
    qo.type = DType::Q8_0;
    qo.n_threads = 2;
    quantize_model(model, q, qo);
    const std::string e = error_of([&] { structured_prune(q, out, nullptr, so); });
    EXPECT_NE(e.find("prune the float model, then quantize"), std::string::npos) << e;
  }
  // Unsupported architectures.
  for (const char* shape : {"gemma2-tiny", "phi3-tiny", "mixtral-tiny"}) {
    const std::string e = error_of([&] { structured_prune(synth(shape), out, nullptr, so); });
    EXPECT_NE(e, "") << shape;
    EXPECT_NE(e.find("structured pruning"), std::string::npos) << e;
  }
}

// stories260K (and tern's own model, dequantized to f32) at ratio 0.2: the layer parameters
// shrink by ~20%, the files load and run, and the perplexities are finite (printed for the docs).
class StructuredReal : public ::testing::Test {
 protected:
  void SetUp() override {
    TERN_REQUIRE_SHARED("models/stories260K.gguf");
    TERN_REQUIRE_SHARED("data/tinystories/tinystories_val.txt");
  }
};

void prune_and_report(const std::string& model, const std::string& tag, int chunks) {
  CalibOptions co;
  co.text_file = tinystories_val();
  co.n_tokens = 4096;
  co.n_threads = 2;
  const CalibStats c = calibrate(open_model_file(model), co);
  const double base = ppl_of(model, chunks);
  std::printf("[%s] dense: ppl %.4f\n", tag.c_str(), base);
  struct Run { const char* method; bool comp; const char* standardize; };
  for (const Run r : {Run{"flap", true, "layer"}, Run{"flap", false, "layer"}, Run{"flap", true, "global"},
                      Run{"flap", false, "global"}, Run{"magnitude", false, "layer"}, Run{"magnitude", false, "global"}}) {
    StructuredOptions so;
    so.method = r.method;
    so.standardize = r.standardize;
    so.ratio = 0.2;
    so.bias_compensation = r.comp;
    so.n_threads = 2;
    const std::string out = temp_path(tag + "-" + r.method + (r.comp ? "-comp-" : "-") + r.standardize + ".gguf");
    const StructuredReport rep = structured_prune(model, out, &c, so);
    const double removed = 1.0 - double(rep.layer_params_after) / double(rep.layer_params_before);
    // 20% of the model's parameters (the papers' count), all from the layers: the f32 file
    // shrinks by about as much (the vocabulary's metadata and FLaP's new biases aside).
    const double removed_of_model = double(rep.layer_params_before - rep.layer_params_after) / double(rep.model_params);
    EXPECT_GE(removed_of_model, 0.20);
    EXPECT_LT(removed_of_model, 0.22);
    EXPECT_GT(removed, removed_of_model);
    EXPECT_LT(double(std::filesystem::file_size(out)), 0.81 * double(std::filesystem::file_size(model)));
    const double ppl = ppl_of(out, chunks);
    EXPECT_TRUE(std::isfinite(ppl) && ppl > 1.0) << ppl;
    std::string shape;
    for (const StructuredLayer& L : rep.layers) shape += " " + std::to_string(L.n_head) + "h/" + std::to_string(L.n_ff);
    std::printf("[%s] %s-20%s (%s z): ppl %.4f, layer params %lld -> %lld (%.1f%% of the layers', %.1f%% of the "
                "model's removed), bytes %lld -> %lld, layers%s\n",
                tag.c_str(), r.method, r.comp ? " +bias" : "", r.standardize, ppl, (long long)rep.layer_params_before,
                (long long)rep.layer_params_after, 100.0 * removed, 100.0 * removed_of_model, (long long)rep.bytes_before,
                (long long)rep.bytes_after, shape.c_str());
  }
}

TEST_F(StructuredReal, Stories260K) { prune_and_report(stories(), "stories260K", 100); }

TEST_F(StructuredReal, TernStoriesDequantized) {
  const std::string q8 = std::string(TERN_SOURCE_DIR) + "/models/tern-stories.gguf";
  if (!std::filesystem::exists(q8)) GTEST_SKIP() << "missing " << q8;
  const std::string f32 = temp_path("tern-stories-f32.gguf");
  QuantizeOptions qo;
  qo.type = DType::F32;
  qo.pure = true;
  qo.n_threads = 2;
  quantize_model(q8, f32, qo);
  prune_and_report(f32, "tern-stories", 100);
}

}  // namespace
}  // namespace tern::test_structured
