// Pruning (compress/prune.h): each algorithm against a float64 reference written plainly here
// (SparseGPT's as the textbook OBS sequence with an explicit inverse Hessian, not the Cholesky
// form the implementation walks), the patterns' bad input, and on stories260K the quality
// order the papers report and the CLI's errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "compress/prune.h"
#include "compress/quantize.h"
#include "compress_test_util.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"

namespace tern {
namespace {

using testing::kTern;
using testing::temp_path;
using testing::run_command;

struct Problem {
  int64_t n_out, n_in, n_tok;
  std::vector<float> w;  // [n_out, n_in]
  std::vector<float> x;  // [n_tok, n_in]
  std::vector<double> h; // [n_in, n_in] sum x x^T
  std::vector<double> xn;  // [n_in] ||X_j||
};

Problem make_problem(int64_t n_out, int64_t n_in, int64_t n_tok, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Problem p{n_out, n_in, n_tok, {}, {}, {}, {}};
  p.w.resize(size_t(n_out * n_in));
  for (auto& v : p.w) v = nd(rng);
  // Inputs with uneven channel scales (as real activations have), so that Wanda and SparseGPT
  // differ from magnitude pruning, and correlated channels, so that SparseGPT's update matters.
  std::vector<float> scale(static_cast<size_t>(n_in));
  for (auto& s : scale) s = std::exp(nd(rng));
  p.x.resize(size_t(n_tok * n_in));
  for (int64_t t = 0; t < n_tok; ++t) {
    const float common = nd(rng);
    for (int64_t j = 0; j < n_in; ++j) p.x[size_t(t * n_in + j)] = scale[size_t(j)] * (nd(rng) + 0.5f * common);
  }
  p.h.assign(size_t(n_in * n_in), 0.0);
  p.xn.assign(size_t(n_in), 0.0);
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t a = 0; a < n_in; ++a) {
      const double xa = p.x[size_t(t * n_in + a)];
      p.xn[size_t(a)] += xa * xa;
      for (int64_t b = 0; b < n_in; ++b) p.h[size_t(a * n_in + b)] += xa * double(p.x[size_t(t * n_in + b)]);
    }
  for (auto& v : p.xn) v = std::sqrt(v);
  return p;
}

// ||X W^T - X Q^T||^2 in double over the problem's tokens.
double output_error(const Problem& p, const std::vector<float>& q) {
  double e = 0;
  for (int64_t t = 0; t < p.n_tok; ++t)
    for (int64_t o = 0; o < p.n_out; ++o) {
      double d = 0;
      for (int64_t j = 0; j < p.n_in; ++j)
        d += double(p.x[size_t(t * p.n_in + j)]) * (double(p.w[size_t(o * p.n_in + j)]) - double(q[size_t(o * p.n_in + j)]));
      e += d * d;
    }
  return e;
}

// Indices of the k smallest scores (ties: lower index), by a full sort.
std::vector<int64_t> k_smallest(const std::vector<double>& s, int64_t k) {
  std::vector<int64_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return s[size_t(a)] < s[size_t(b)]; });
  idx.resize(size_t(k));
  return idx;
}

std::vector<float> wanda_reference(const Problem& p, const SparsityPattern& pat) {
  std::vector<float> w = p.w;
  for (int64_t o = 0; o < p.n_out; ++o) {
    const int64_t group = pat.nm() ? pat.m : p.n_in;
    const int64_t k = pat.nm() ? pat.m - pat.n : int64_t(std::floor(double(p.n_in) * pat.sparsity));
    for (int64_t g = 0; g < p.n_in; g += group) {
      std::vector<double> s(static_cast<size_t>(group));
      for (int64_t j = 0; j < group; ++j) s[size_t(j)] = std::fabs(double(p.w[size_t(o * p.n_in + g + j)])) * p.xn[size_t(g + j)];
      for (int64_t j : k_smallest(s, k)) w[size_t(o * p.n_in + g + j)] = 0.0f;
    }
  }
  return w;
}

// Plain Gauss-Jordan inverse of a symmetric positive definite matrix.
std::vector<double> inverse(std::vector<double> a, int64_t n) {
  std::vector<double> inv(size_t(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) inv[size_t(i * n + i)] = 1.0;
  for (int64_t c = 0; c < n; ++c) {
    int64_t piv = c;
    for (int64_t r = c + 1; r < n; ++r)
      if (std::fabs(a[size_t(r * n + c)]) > std::fabs(a[size_t(piv * n + c)])) piv = r;
    for (int64_t k = 0; k < n; ++k) {
      std::swap(a[size_t(c * n + k)], a[size_t(piv * n + k)]);
      std::swap(inv[size_t(c * n + k)], inv[size_t(piv * n + k)]);
    }
    const double d = a[size_t(c * n + c)];
    for (int64_t k = 0; k < n; ++k) {
      a[size_t(c * n + k)] /= d;
      inv[size_t(c * n + k)] /= d;
    }
    for (int64_t r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a[size_t(r * n + c)];
      if (f == 0) continue;
      for (int64_t k = 0; k < n; ++k) {
        a[size_t(r * n + k)] -= f * a[size_t(c * n + k)];
        inv[size_t(r * n + k)] -= f * inv[size_t(c * n + k)];
      }
    }
  }
  return inv;
}

// SparseGPT as Optimal Brain Surgeon over the columns in order: Hinv is the inverse Hessian of
// the columns not yet visited (starting from (H + damp)^-1). Visiting column j removes it from
// that set; a pruned weight's removal moves the remaining columns by -w_j / Hinv_jj * Hinv[j, :]
// (OBS's optimal compensation), then Hinv drops row and column j by the rank-1 downdate.
// The mask score of column j is w_j^2 / Hinv_jj with Hinv as it stands when j is visited; the
// unstructured mask of a block is chosen from the weights at the block's start, with each
// column's Hinv_jj from a dry run of the downdates (they do not depend on W).
std::vector<float> sparsegpt_reference(const Problem& p, const SparsityPattern& pat, double damp, int64_t block) {
  const int64_t n = p.n_in;
  std::vector<double> h = p.h;
  double mean = 0;
  for (int64_t i = 0; i < n; ++i) mean += h[size_t(i * n + i)] / double(n);
  for (int64_t i = 0; i < n; ++i) h[size_t(i * n + i)] += damp * mean;
  const std::vector<double> hinv0 = inverse(h, n);
  // diag[j]: Hinv_jj at the visit of j.
  std::vector<double> diag(static_cast<size_t>(n));
  {
    std::vector<double> hi = hinv0;
    for (int64_t j = 0; j < n; ++j) {
      diag[size_t(j)] = hi[size_t(j * n + j)];
      const double d = hi[size_t(j * n + j)];
      for (int64_t a = j + 1; a < n; ++a)
        for (int64_t b = j + 1; b < n; ++b) hi[size_t(a * n + b)] -= hi[size_t(a * n + j)] * hi[size_t(j * n + b)] / d;
    }
  }
  std::vector<std::vector<double>> w(size_t(p.n_out), std::vector<double>(size_t(n)));
  for (int64_t o = 0; o < p.n_out; ++o)
    for (int64_t j = 0; j < n; ++j) w[size_t(o)][size_t(j)] = p.w[size_t(o * n + j)];
  std::vector<std::vector<bool>> mask(size_t(p.n_out), std::vector<bool>(size_t(n), false));
  std::vector<double> hi = hinv0;
  for (int64_t j = 0; j < n; ++j) {
    if (!pat.nm() && j % block == 0) {
      const int64_t b1 = std::min(n, j + block), nb = b1 - j;
      std::vector<double> s(size_t(p.n_out * nb));
      for (int64_t o = 0; o < p.n_out; ++o)
        for (int64_t c = j; c < b1; ++c) {
          const double v = w[size_t(o)][size_t(c)];
          s[size_t(o * nb + c - j)] = v * v / diag[size_t(c)];
        }
      for (int64_t i : k_smallest(s, int64_t(std::floor(double(p.n_out * nb) * pat.sparsity))))
        mask[size_t(i / nb)][size_t(j + i % nb)] = true;
    }
    for (int64_t o = 0; o < p.n_out; ++o) {
      auto& row = w[size_t(o)];
      if (pat.nm() && j % pat.m == 0) {
        std::vector<double> s(size_t(pat.m));
        for (int64_t t = 0; t < pat.m; ++t) s[size_t(t)] = row[size_t(j + t)] * row[size_t(j + t)] / diag[size_t(j + t)];
        for (int64_t t : k_smallest(s, pat.m - pat.n)) mask[size_t(o)][size_t(j + t)] = true;
      }
      if (!mask[size_t(o)][size_t(j)]) continue;
      const double f = row[size_t(j)] / hi[size_t(j * n + j)];
      for (int64_t c = j; c < n; ++c) row[size_t(c)] -= f * hi[size_t(j * n + c)];
    }
    const double d = hi[size_t(j * n + j)];
    for (int64_t a = j + 1; a < n; ++a)
      for (int64_t b = j + 1; b < n; ++b) hi[size_t(a * n + b)] -= hi[size_t(a * n + j)] * hi[size_t(j * n + b)] / d;
  }
  std::vector<float> out(size_t(p.n_out * n));
  for (int64_t o = 0; o < p.n_out; ++o)
    for (int64_t j = 0; j < n; ++j) out[size_t(o * n + j)] = mask[size_t(o)][size_t(j)] ? 0.0f : float(w[size_t(o)][size_t(j)]);
  return out;
}

TEST(Prune, PatternsParseAndRejectBadInput) {
  EXPECT_DOUBLE_EQ(parse_sparsity("50").sparsity, 0.5);
  EXPECT_DOUBLE_EQ(parse_sparsity("0.3").sparsity, 0.3);
  EXPECT_EQ(parse_sparsity("2:4").n, 2);
  EXPECT_EQ(parse_sparsity("4:8").m, 8);
  EXPECT_EQ(parse_sparsity("2:4").name(), "2:4");
  EXPECT_EQ(parse_sparsity("50").name(), "50%");
  for (const char* bad : {"0", "100", "-5", "150", "abc", "", "4:4", "5:4", "0:4", "2:", ":4", "2:x", "nan"})
    EXPECT_THROW(parse_sparsity(bad), Error) << bad;
  try {
    parse_sparsity("4:4");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("N < M"), std::string::npos) << e.what();
  }
  EXPECT_THROW(check_pattern(parse_sparsity("2:4"), 66, "blk.0.attn_q.weight"), Error);
  EXPECT_NO_THROW(check_pattern(parse_sparsity("2:4"), 64, "blk.0.attn_q.weight"));
  ThreadPool pool(2);
  std::vector<float> w(3 * 10, 1.0f);
  EXPECT_THROW(prune_magnitude(w.data(), 3, 10, parse_sparsity("4:8"), pool), Error);
}

TEST(Prune, MagnitudeRemovesTheSmallestOfTheMatrixOrOfEachGroup) {
  const Problem p = make_problem(16, 32, 8, 1);
  ThreadPool pool(2);
  std::vector<float> w = p.w;
  prune_magnitude(w.data(), p.n_out, p.n_in, parse_sparsity("0.5"), pool);
  std::vector<double> s(p.w.size());
  for (size_t i = 0; i < s.size(); ++i) s[i] = std::fabs(double(p.w[i]));
  std::vector<float> ref = p.w;
  for (int64_t i : k_smallest(s, int64_t(s.size() / 2))) ref[size_t(i)] = 0.0f;
  EXPECT_EQ(w, ref);
  EXPECT_DOUBLE_EQ(zero_fraction(w.data(), int64_t(w.size())), 0.5);

  w = p.w;
  prune_magnitude(w.data(), p.n_out, p.n_in, parse_sparsity("2:4"), pool);
  for (int64_t o = 0; o < p.n_out; ++o)
    for (int64_t g = 0; g < p.n_in; g += 4) {
      std::vector<double> gs(4);
      for (int t = 0; t < 4; ++t) gs[size_t(t)] = std::fabs(double(p.w[size_t(o * p.n_in + g + t)]));
      const auto low = k_smallest(gs, 2);
      for (int t = 0; t < 4; ++t) {
        const bool removed = std::find(low.begin(), low.end(), t) != low.end();
        EXPECT_EQ(w[size_t(o * p.n_in + g + t)], removed ? 0.0f : p.w[size_t(o * p.n_in + g + t)]);
      }
    }
}

TEST(Prune, WandaMatchesTheReferenceMask) {
  ThreadPool pool(2);
  for (const char* pat : {"50", "30", "2:4", "4:8", "1:4"}) {
    const Problem p = make_problem(24, 64, 40, 7);
    const SparsityPattern sp = parse_sparsity(pat);
    std::vector<float> w = p.w;
    prune_wanda(w.data(), p.n_out, p.n_in, p.xn, sp, pool);
    EXPECT_EQ(w, wanda_reference(p, sp)) << pat;
    EXPECT_NEAR(zero_fraction(w.data(), int64_t(w.size())), sp.nm() ? sp.fraction() : std::floor(64 * sp.sparsity) / 64, 1e-12)
        << pat;
  }
  // Activation norms change the mask: a channel with a huge norm survives even with small weights.
  Problem p = make_problem(8, 32, 4, 3);
  p.xn.assign(32, 1.0);
  p.xn[5] = 1e6;
  std::vector<float> w = p.w;
  prune_wanda(w.data(), p.n_out, p.n_in, p.xn, parse_sparsity("90"), pool);
  for (int64_t o = 0; o < p.n_out; ++o) EXPECT_EQ(w[size_t(o * 32 + 5)], p.w[size_t(o * 32 + 5)]);
}

TEST(Prune, SparseGptMatchesTheObsReference) {
  ThreadPool pool(2);
  struct Case {
    const char* pattern;
    int64_t block;
  };
  for (const Case c : {Case{"50", 48}, Case{"50", 16}, Case{"70", 48}, Case{"2:4", 48}, Case{"4:8", 16}}) {
    const Problem p = make_problem(12, 48, 96, 11);
    const SparsityPattern sp = parse_sparsity(c.pattern);
    std::vector<float> w = p.w;
    SparseGptOptions so;
    so.damp = 0.01;
    so.block = c.block;
    SparseGptStats st;
    prune_sparsegpt(w.data(), p.n_out, p.n_in, p.h, sp, so, pool, &st);
    const std::vector<float> ref = sparsegpt_reference(p, sp, 0.01, c.block);
    int64_t mask_diff = 0;
    double max_diff = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      mask_diff += (w[i] == 0.0f) != (ref[i] == 0.0f);
      max_diff = std::max(max_diff, double(std::fabs(w[i] - ref[i])));
    }
    EXPECT_EQ(mask_diff, 0) << c.pattern << " block " << c.block;
    EXPECT_LT(max_diff, 1e-4) << c.pattern << " block " << c.block;
    EXPECT_EQ(st.dead_columns, 0);
    EXPECT_NEAR(zero_fraction(w.data(), int64_t(w.size())), sp.fraction(), sp.nm() ? 1e-12 : 0.01) << c.pattern;

    // The point of the update: a lower output error than Wanda's and magnitude's at the same pattern.
    std::vector<float> wa = p.w, mg = p.w;
    prune_wanda(wa.data(), p.n_out, p.n_in, p.xn, sp, pool);
    prune_magnitude(mg.data(), p.n_out, p.n_in, sp, pool);
    EXPECT_LT(output_error(p, w), output_error(p, wa)) << c.pattern;
    EXPECT_LT(output_error(p, wa), output_error(p, mg)) << c.pattern;
  }
}

TEST(Prune, SparseGptRemovesDeadInputs) {
  ThreadPool pool(2);
  Problem p = make_problem(4, 16, 32, 5);
  for (int64_t t = 0; t < p.n_tok; ++t) p.x[size_t(t * 16 + 3)] = 0.0f;
  for (int64_t j = 0; j < 16; ++j) p.h[size_t(3 * 16 + j)] = p.h[size_t(j * 16 + 3)] = 0.0;
  std::vector<float> w = p.w;
  SparseGptStats st;
  prune_sparsegpt(w.data(), 4, 16, p.h, parse_sparsity("25"), SparseGptOptions{}, pool, &st);
  EXPECT_EQ(st.dead_columns, 1);
  for (int64_t o = 0; o < 4; ++o) EXPECT_EQ(w[size_t(o * 16 + 3)], 0.0f);
  std::vector<double> bad(10, 0.0);
  EXPECT_THROW(prune_sparsegpt(w.data(), 4, 16, bad, parse_sparsity("25"), SparseGptOptions{}, pool), Error);
}

TEST(Prune, OwlRatiosAverageToTheTargetAndFavourOutlierLayers) {
  const std::vector<double> lod = {0.01, 0.05, 0.02, 0.08};
  const std::vector<double> s = owl_layer_sparsity(lod, 0.7, 0.08);
  ASSERT_EQ(s.size(), 4u);
  double mean = 0;
  for (double v : s) mean += v / 4;
  EXPECT_NEAR(mean, 0.7, 1e-12);
  EXPECT_NEAR(*std::max_element(s.begin(), s.end()) - *std::min_element(s.begin(), s.end()), 0.16, 1e-12);
  EXPECT_LT(s[3], s[1]);  // more outliers: fewer weights removed
  EXPECT_LT(s[1], s[2]);
  EXPECT_LT(s[2], s[0]);
  EXPECT_EQ(owl_layer_sparsity({0.1, 0.1}, 0.5, 0.08), (std::vector<double>{0.5, 0.5}));

  std::vector<float> w = {1, 1, 1, 1, 1, 1, 1, 100};
  EXPECT_DOUBLE_EQ(wanda_outlier_share(w.data(), 1, 8, std::vector<double>(8, 1.0), 5.0), 1.0 / 8);
}

// ---- on a real model ----------------------------------------------------------------------------

std::string prune_file(const std::string& method, const std::string& extra = "") {
  const std::string out = temp_path("prune_" + method + ".gguf");
  std::string o, e;
  std::string algo = method.substr(0, method.find('-')), pat = method.substr(method.find('-') + 1);
  const std::string pattern_flag = pat.find(':') != std::string::npos ? "--nm " + pat : "--sparsity 0." + pat;
  const int rc = run_command(kTern + " prune " + testing::stories() + " " + out + " --method " + algo + " " +
                                 pattern_flag + " --calib " + testing::tinystories_val() + " " + extra + " --json",
                             &o, &e);
  EXPECT_EQ(rc, 0) << e;
  if (rc == 0) {
    const auto j = nlohmann::json::parse(o);
    for (const auto& l : j["layers"]) EXPECT_NEAR(l["sparsity"].get<double>(), pat == "2:4" ? 0.5 : 0.5, 0.02) << l.dump();
  }
  return out;
}

TEST(PruneStories, QualityOrderAsThePapersReport) {
  if (!std::filesystem::exists(testing::stories())) GTEST_SKIP() << "../shared not present";
  const double dense = testing::ppl_of(testing::stories(), 20);
  std::map<std::string, double> ppl;
  for (const char* m : {"magnitude-50", "wanda-50", "sparsegpt-50", "magnitude-2:4", "wanda-2:4", "sparsegpt-2:4"})
    ppl[m] = testing::ppl_of(prune_file(m), 20);
  for (const auto& [m, v] : ppl) std::printf("stories260K %-14s ppl %.3f (dense %.3f)\n", m.c_str(), v, dense);
  EXPECT_LT(dense, ppl["wanda-50"]);
  EXPECT_LE(ppl["sparsegpt-50"], ppl["wanda-50"]);
  EXPECT_LT(ppl["wanda-50"], ppl["magnitude-50"]);
  EXPECT_LT(ppl["wanda-50"], ppl["wanda-2:4"]);
  EXPECT_LT(ppl["wanda-2:4"], ppl["magnitude-2:4"]);
  EXPECT_LE(ppl["sparsegpt-2:4"], ppl["wanda-2:4"]);
}

// Zeros per tensor ("blk.*" 2-D), as a mask, read through tern's own loader.
std::map<std::string, std::vector<bool>> zero_masks(const std::string& path) {
  std::map<std::string, std::vector<bool>> m;
  const GgufFile f = GgufFile::open(path);
  ThreadPool pool(2);
  for (const auto& t : f.tensors()) {
    if (t.name.rfind("blk.", 0) != 0 || t.ne.size() != 2) continue;
    const std::vector<float> v = tensor_to_f32(t, pool);
    std::vector<bool> z(v.size());
    for (size_t i = 0; i < v.size(); ++i) z[i] = v[i] == 0.0f;
    m[t.name] = z;
  }
  return m;
}

TEST(PruneStories, RecoveryKeepsTheMaskAndLowersPerplexity) {
  if (!std::filesystem::exists(testing::stories())) GTEST_SKIP() << "../shared not present";
  const std::string train = testing::shared_path("data/tinystories/tinystories_train_prefix_4M.txt");
  const std::string pruned = prune_file("wanda-50");
  const std::string rec = temp_path("prune_wanda_rec.gguf");
  // A user's file with a name like a scratch file's is not touched.
  const std::string bystander = rec + ".pruned.tmp";
  {
    FILE* f = std::fopen(bystander.c_str(), "w");
    std::fputs("mine", f);
    std::fclose(f);
  }
  std::string o, e;
  ASSERT_EQ(run_command(kTern + " prune " + testing::stories() + " " + rec + " --method wanda --calib " +
                            testing::tinystories_val() + " --recover 20000 --recover-data " + train + " --json",
                        &o, &e),
            0)
      << e;
  EXPECT_EQ(testing::read_file_bytes(bystander), "mine");
  // No scratch file is left beside the output.
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(rec).parent_path()))
    if (entry.path() != bystander) {
      EXPECT_EQ(entry.path().filename().string().find("prune_wanda_rec.gguf.pruned."), std::string::npos) << entry.path();
    }
  const GgufFile f = GgufFile::open(rec);
  EXPECT_EQ(f.get_uint("tern.prune.recover_tokens"), 20000u);
  // The mask is the pruned model's, exactly: recovery moves only the kept weights.
  const auto a = zero_masks(pruned), b = zero_masks(rec);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, z] : a) EXPECT_EQ(z, b.at(name)) << name;
  const double p_pruned = testing::ppl_of(pruned, 20), p_rec = testing::ppl_of(rec, 20);
  std::printf("stories260K wanda-50 ppl %.3f, after 20000 tokens of recovery %.3f\n", p_pruned, p_rec);
  EXPECT_LT(p_rec, p_pruned);
}

TEST(PruneStories, StoredTypesAndStructuredThroughTheCli) {
  if (!std::filesystem::exists(testing::stories())) GTEST_SKIP() << "../shared not present";
  const std::string v = " --calib " + testing::tinystories_val();
  std::string o, e;
  // 2:4 stored in q8_0: exact zeros survive the rounding, so the pattern holds in the file.
  const std::string q = temp_path("prune_24_q8.gguf");
  ASSERT_EQ(run_command(kTern + " prune " + testing::stories() + " " + q + " --nm 2:4 --type q8_0" + v, &o, &e), 0) << e;
  for (const auto& [name, z] : zero_masks(q)) {
    int64_t zeros = 0;
    for (bool b : z) zeros += b;
    EXPECT_GE(zeros, int64_t(z.size() / 2)) << name;
  }
  // Structured: a smaller dense model with per-layer widths.
  const std::string s = temp_path("prune_flap.gguf");
  ASSERT_EQ(run_command(kTern + " prune " + testing::stories() + " " + s + " --method flap --sparsity 0.2" + v, &o, &e),
            0)
      << e;
  // 20% of the model's parameters by default (the papers' count): the f32 file shrinks by that
  // much; --ratio-of layers removes 20% of the layers' weights, less of the file.
  const double whole = double(std::filesystem::file_size(testing::stories()));
  EXPECT_LT(double(std::filesystem::file_size(s)), 0.81 * whole);
  const std::string sl = temp_path("prune_flap_layers.gguf");
  ASSERT_EQ(run_command(kTern + " prune " + testing::stories() + " " + sl +
                            " --method structured-magnitude --sparsity 0.2 --ratio-of layers",
                        &o, &e),
            0)
      << e;
  EXPECT_GT(double(std::filesystem::file_size(sl)), 0.81 * whole);
  EXPECT_LT(double(std::filesystem::file_size(sl)), whole);
  const double ppl = testing::ppl_of(s, 10);
  EXPECT_TRUE(std::isfinite(ppl));
  EXPECT_GT(ppl, 1.0);
  // Stored in q8_0: the kept FFN widths are rounded down to q8_0's block of 32, so every
  // ffn_down (rows of n_ff) is q8_0, none fell back.
  const std::string sq = temp_path("prune_flap_q8.gguf");
  ASSERT_EQ(run_command(kTern + " prune " + testing::stories() + " " + sq + " --method flap --sparsity 0.2 --type q8_0" + v,
                        &o, &e),
            0)
      << e;
  const GgufFile fq = GgufFile::open(sq);
  int n_down = 0;
  for (const GgufTensorInfo& t : fq.tensors())
    if (t.name.find("ffn_down.weight") != std::string::npos) {
      ++n_down;
      EXPECT_EQ(t.type, DType::Q8_0) << t.name;
      EXPECT_EQ(t.ne[0] % 32, 0) << t.name;
    }
  EXPECT_EQ(n_down, 5);
}

// llama.cpp loads the structured-pruned model (written as "deci": llama.cpp's llama loader sizes
// every layer by layer 0), the unstructured one and a merged low-rank one, and its greedy tokens
// are tern's (f32 weights: both engines compute the same function; measured 30 of 30 equal for
// flap-20).
TEST(PruneStories, LlamaCppLoadsThePrunedModelsAndAgrees) {
  if (!std::filesystem::exists(testing::stories())) GTEST_SKIP() << "../shared not present";
  const std::string script = testing::peer_script();
  if (script.empty()) GTEST_SKIP() << "llama.cpp peer not installed (../shared/peer/setup.sh)";
  const std::string v = " --calib " + testing::tinystories_val();
  const std::string flap = temp_path("peer_flap.gguf"), wanda = temp_path("peer_wanda.gguf");
  std::string o, e;
  ASSERT_EQ(run_command(kTern + " prune " + testing::stories() + " " + flap + " --method flap --sparsity 0.2" + v, &o, &e),
            0)
      << e;
  ASSERT_EQ(run_command(kTern + " prune " + testing::stories() + " " + wanda + " --method wanda" + v, &o, &e), 0) << e;
  // And a low-rank model merged back into dense matrices (tern lowrank --merge).
  const std::string svd = temp_path("peer_svd_merged.gguf");
  ASSERT_EQ(run_command(kTern + " lowrank " + testing::stories() + " " + svd + " --method svd --budget 0.9 --merge", &o, &e),
            0)
      << e;
  EXPECT_EQ(GgufFile::open(flap).get_string("general.architecture"), "deci");
  for (const std::string& model : {flap, wanda, svd}) {
    std::string peer_out, err, tern_out;
    ASSERT_EQ(run_command("node " + script + " --model " + model + " --greedy 'Once upon a time' --n 16 --bos", &peer_out,
                          &err),
              0)
        << err;
    const auto peer = nlohmann::json::parse(peer_out.substr(peer_out.find('{')));
    ASSERT_EQ(run_command(kTern + " run -m " + model + " -p 'Once upon a time' -n 16 --temp 0 --json", &tern_out), 0);
    const auto ours = nlohmann::json::parse(tern_out);
    EXPECT_EQ(peer["prompt_ids"], ours["prompt_ids"]) << model;
    EXPECT_EQ(peer["ids"], ours["ids"]) << model;
  }
}

TEST(PruneStories, BadInputIsAClearError) {
  if (!std::filesystem::exists(testing::stories())) GTEST_SKIP() << "../shared not present";
  const std::string model = testing::stories(), out = temp_path("bad_prune.gguf");
  struct Case {
    std::string args, expect;
  };
  // A quantized source for the "already quantized" case.
  const std::string q8 = temp_path("stories_q8.gguf");
  ASSERT_EQ(run_command(kTern + " quantize " + model + " " + q8 + " --type q8_0", nullptr, nullptr), 0);
  const std::string tiny = temp_path("tiny_calib.txt");
  {
    FILE* f = std::fopen(tiny.c_str(), "w");
    std::fputs("once upon a time", f);
    std::fclose(f);
  }
  const std::string v = " --calib " + testing::tinystories_val();
  const std::vector<Case> cases = {
      {model + " " + out + " --sparsity 1.5" + v, "outside (0, 1)"},
      {model + " " + out + " --sparsity 0" + v, "outside (0, 1)"},
      {model + " " + out + " --nm 4:4" + v, "N < M"},
      {model + " " + out + " --nm 3:5" + v, "groups of 5"},
      {model + " " + out + " --method wanda", "needs a calibration text"},
      {model + " " + out + " --method sparsegpt --calib " + tiny, "too short"},
      {q8 + " " + out + v, "already quantized"},
      {model + " " + model + " --method magnitude", "is the input file"},
      {model + " " + out + " --nm 2:4 --owl" + v, "--owl"},
      {model + " " + out + " --method nonsense" + v, "nonsense"},
      {model + " " + out + " --method flap --nm 2:4" + v, "--nm is for unstructured"},
      {model + " " + out + " --method wanda --recover 1000" + v, "--recover-data"},
      {model + " " + out + " --method wanda --recover 1000 --recover-data /nonexistent" + v, "/nonexistent"},
      {model + " " + out + " --type nonsense" + v, "unknown type"},
      {model + " " + out + " --method wanda --ratio-of model" + v, "--ratio-of is for the structured methods"},
      {model + " " + out + " --method sparsegpt --ffn-multiple 32" + v, "--ffn-multiple is for the structured"},
      {model + " " + out + " --method flap --ratio-of blocks" + v, "--ratio-of"},
      {model + " " + out + " --method flap --ffn-multiple 0" + v, "--ffn-multiple"},
  };
  for (const auto& c : cases) {
    std::string o, e;
    const int rc = run_command(kTern + " prune " + c.args, &o, &e);
    EXPECT_NE(rc, 0) << c.args;
    EXPECT_NE((o + e).find(c.expect), std::string::npos) << c.args << "\n" << o << e;
  }
  EXPECT_TRUE(std::filesystem::exists(model));
  EXPECT_FALSE(std::filesystem::exists(out));

  // tern compare: +recover follows pruning methods only, and needs its own training text.
  for (const auto& [args, expect] : std::vector<std::pair<std::string, std::string>>{
           {"--methods q8_0+recover", "+recover follows a pruning method"},
           {"--methods wanda-50+recover", "--recover-data"},
           {"--methods wanda-50+recover --recover-data " + testing::tinystories_val(), "perplexity text"},
           {"--methods wanda-50 --recover-data " + testing::tinystories_val(), "for +recover, qat- and kd- methods"},
           {"--methods wanda-2:5", "groups of 5"},
           // qat-TYPE: a type tern quantizes to, and a training text.
           {"--methods qat-q9_9", "--qat: unknown type 'q9_9'"},
           {"--methods qat-q4_0", "--recover-data"},
           // kd-TERMS: a training text too.
           {"--methods kd-feature", "--recover-data"},
           {"--methods kd-magic", "unknown method 'kd-magic'"}}) {
    std::string o, e;
    const int rc = run_command(kTern + " compare -m " + model + " --ppl-file " + testing::tinystories_val() + " " + args,
                               &o, &e);
    EXPECT_NE(rc, 0) << args;
    EXPECT_NE((o + e).find(expect), std::string::npos) << args << "\n" << o << e;
  }
}

// tern compare's distillation rows: a half-depth student of the source trained from scratch with
// each loss family on --recover-data, stored in f32 (fewer bytes than the source's f32: half the
// layers), its perplexity measured like any other row's.
TEST(CompareKd, RowsAreHalfDepthStudentsOfEachLoss) {
  if (!std::filesystem::exists(testing::stories())) GTEST_SKIP() << "../shared not present";
  const std::string json_out = temp_path("kd_rows.json");
  std::string o, e;
  const int rc = run_command(kTern + " compare -m " + testing::stories() + " --methods f32,kd-ce,kd-feature,kd-relation" +
                                 " --recover-data " + testing::tinystories_train() + " --recover-tokens 4096 --ppl-file " +
                                 testing::tinystories_val() + " --ctx 128 --ppl-chunks 2 --gen-tokens 4 --prompt-tokens 8 -t 2" +
                                 " --json-out " + json_out,
                             &o, &e);
  ASSERT_EQ(rc, 0) << o << e;
  const auto rows = nlohmann::json::parse(testing::read_file_bytes(json_out));
  ASSERT_EQ(rows.size(), 4u) << rows.dump();
  const double f32_bytes = rows[0]["weight_bytes"].get<double>();
  for (size_t i = 1; i < rows.size(); ++i) {
    EXPECT_FALSE(rows[i].contains("error")) << rows[i].dump();
    EXPECT_LT(rows[i]["weight_bytes"].get<double>(), f32_bytes) << rows[i].dump();
    EXPECT_TRUE(std::isfinite(rows[i]["ppl"].get<double>())) << rows[i].dump();
  }
  EXPECT_NE(rows[2].dump().find("feature=0.5"), std::string::npos) << rows[2].dump();
  std::filesystem::remove(json_out);
}

}  // namespace
}  // namespace tern
