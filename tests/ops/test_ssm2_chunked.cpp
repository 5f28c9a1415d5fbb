// Mamba-2's scan in the chunked ("SSD") form (ops.h ssm2_scan_chunked): every variant (the
// scalar reference of the chunked arithmetic and the SIMD ones) equals the recurrent scan
// (ssm2_scan, Isa::Ref) and a float64 recurrence within a tight relative bound, outputs and the
// state it leaves, over token counts that are and are not multiples of the chunk (1 token, a
// chunk exactly, one past and one short of a boundary, several chunks and a tail), chunks of 1,
// 16, 17, 64 and 100 tokens, heads sharing a B/C group (1, 4 and 8 per group) and heads split
// over calls mid-group, a nonzero incoming state, time steps above softplus' cut-off (20) with
// decays that underflow, state sizes and head widths that are not multiples of the 16-float
// vectors, and inputs as the block hands them over (x, B and C in one row, z in another, every
// row wider than what it holds). A run split in two calls carries the state across.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "ops/ops.h"

namespace tern {
namespace {

std::vector<Isa> chunked_variants() {
  std::vector<Isa> v;
  for (Isa isa : kAllIsas)
    if (isa_supported(isa) && isa != Isa::Dotprod && isa != Isa::I8mm) v.push_back(isa);
  return v;
}

struct Case {
  int64_t S, P, H, G, n, chunk;
};

// The inputs of one sequence, strided as Ssm2Block lays them out: row t of `xbc` is
// [pad | x (H P) | B (G S) | C (G S) | pad], of `zr` [pad | z | pad], of `dtr` [dt (H) | pad].
struct Inputs {
  Case c;
  int64_t DI, ldx, ldz, lddt, ldy;
  std::vector<float> xbc, zr, dtr, a, d, h0;
  const float* x() const { return xbc.data() + 3; }
  const float* b() const { return x() + DI; }
  const float* cc() const { return b() + c.G * c.S; }
  const float* z() const { return zr.data() + 5; }

  Inputs(const Case& cs, uint32_t seed) : c(cs) {
    DI = c.H * c.P;
    ldx = 3 + DI + 2 * c.G * c.S + 2;
    ldz = 5 + DI + 1;
    lddt = c.H + 3;
    ldy = DI + 7;
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0.0f, 1.0f);
    xbc.resize(size_t(c.n * ldx));
    zr.resize(size_t(c.n * ldz));
    dtr.resize(size_t(c.n * lddt));
    for (auto& v : xbc) v = g(rng);
    for (auto& v : zr) v = g(rng);
    for (auto& v : dtr) v = g(rng) - 2.0f;
    // Above softplus' cut-off: dt = raw, and with A down to -8 decays of exp(-200) and
    // exp(-8000), which underflow (the state restarts), and one of exp(-21) that does not. The
    // -8000 makes the cumulative sums of the chunk's later tokens large: a segment sum taken as
    // their difference (rather than summed directly) is then ~5e-4 off, and so its decays.
    if (c.n > 5) dtr[size_t(5 * lddt + 0)] = 1000.0f;
    if (c.n > 70) dtr[size_t(70 * lddt + 0)] = 25.0f;
    if (c.n > 2) dtr[size_t(2 * lddt + c.H - 1)] = 21.0f;
    for (int64_t t = 0; t < c.n; t += 37) dtr[size_t(t * lddt + (t / 37) % c.H)] = 20.5f;
    a.resize(size_t(c.H));
    d.resize(size_t(c.H));
    for (int64_t h = 0; h < c.H; ++h) a[size_t(h)] = h == 0 ? -8.0f : -float(h) * (0.1f + 0.05f * std::fabs(g(rng)));
    if (c.H > 2) a[size_t(c.H - 2)] = 0.0f;  // no decay at all
    for (auto& v : d) v = 1.0f + 0.1f * g(rng);
    h0.resize(size_t(DI * c.S));
    for (auto& v : h0) v = 0.5f * g(rng);  // a nonzero incoming state
  }

  Ssm2ScanArgs args(float* h, float* y, int64_t t0, int64_t t1) const {
    return Ssm2ScanArgs{x() + t0 * ldx, ldx, dtr.data() + t0 * lddt, lddt, b() + t0 * ldx, cc() + t0 * ldx, ldx,
                        z() + t0 * ldz, ldz, a.data(), d.data(), h, y + t0 * ldy, ldy, t1 - t0, c.S, c.P,
                        c.H / c.G};
  }
};

struct Result {
  std::vector<float> y, h;
};

// split: tokens [0, split) in one call and [split, n) in a second (0: one call); heads in two
// calls, [0, hs) and [hs, H), hs in the middle of a group where a group has several heads.
Result run(const Inputs& in, bool chunked, Isa isa, int64_t chunk, int64_t split = 0) {
  Result r;
  r.h = in.h0;
  r.y.assign(size_t(in.c.n * in.ldy), NAN);
  const int64_t hs = in.c.H / 2 + (in.c.H > 2 ? 1 : 0);
  for (int64_t t0 = 0; t0 < in.c.n;) {
    const int64_t t1 = split > 0 && t0 < split ? split : in.c.n;
    const Ssm2ScanArgs a = in.args(r.h.data(), r.y.data(), t0, t1);
    for (auto [h0, h1] : {std::pair<int64_t, int64_t>{0, hs}, {hs, in.c.H}}) {
      if (chunked) ssm2_scan_chunked_isa(isa, a, h0, h1, chunk);
      else ssm2_scan_isa(isa, a, h0, h1);
    }
    t0 = t1;
  }
  return r;
}

// The recurrence in double: y and the final state.
struct Oracle {
  std::vector<double> y, h;
};
Oracle oracle(const Inputs& in) {
  const Case& c = in.c;
  Oracle o;
  o.h.assign(in.h0.begin(), in.h0.end());
  o.y.assign(size_t(c.n * in.DI), 0.0);
  const int64_t hpg = c.H / c.G;
  for (int64_t t = 0; t < c.n; ++t)
    for (int64_t hd = 0; hd < c.H; ++hd) {
      const double raw = in.dtr[size_t(t * in.lddt + hd)];
      const double dt = raw <= 20.0 ? std::log1p(std::exp(raw)) : raw;
      const double decay = std::exp(dt * in.a[size_t(hd)]);
      const float* B = in.b() + t * in.ldx + (hd / hpg) * c.S;
      const float* C = in.cc() + t * in.ldx + (hd / hpg) * c.S;
      for (int64_t p = 0; p < c.P; ++p) {
        const int64_t ch = hd * c.P + p;
        const double x = in.x()[t * in.ldx + ch];
        double y = 0.0;
        for (int64_t k = 0; k < c.S; ++k) {
          double& s = o.h[size_t(ch * c.S + k)];
          s = s * decay + double(B[k]) * x * dt;
          y += s * C[k];
        }
        y += in.d[size_t(hd)] * x;
        const double z = in.z()[t * in.ldz + ch];
        o.y[size_t(t * in.DI + ch)] = y * z / (1.0 + std::exp(-z));
      }
    }
  return o;
}

// max |got - want| / (|want| + typical), the typical magnitude being the mean |want| of its
// token's row (outputs) or of the whole state: relative where values are ordinary, and not
// blown up where one lands near 0 (silu(z) ~ 0, a state that just restarted).
double y_err(const Inputs& in, const std::vector<float>& got, const std::vector<double>& want) {
  double worst = 0.0;
  for (int64_t t = 0; t < in.c.n; ++t) {
    double typ = 0.0;
    for (int64_t ch = 0; ch < in.DI; ++ch) typ += std::fabs(want[size_t(t * in.DI + ch)]) / double(in.DI);
    for (int64_t ch = 0; ch < in.DI; ++ch) {
      const double w = want[size_t(t * in.DI + ch)], v = got[size_t(t * in.ldy + ch)];
      if (!std::isfinite(v)) return INFINITY;
      worst = std::max(worst, std::fabs(v - w) / (std::fabs(w) + typ + 1e-30));
    }
  }
  return worst;
}
template <class T>
double h_err(const std::vector<float>& got, const std::vector<T>& want) {
  double typ = 0.0, worst = 0.0;
  for (T w : want) typ += std::fabs(double(w)) / double(want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    worst = std::max(worst, std::fabs(double(got[i]) - double(want[i])) / (std::fabs(double(want[i])) + typ + 1e-30));
  }
  return worst;
}

const Case kCases[] = {
    // S, P, H, G, n, chunk
    {16, 16, 8, 2, 300, 64},   // mamba2-tiny's heads: 4 chunks and a tail of 44
    {16, 16, 8, 2, 1, 64},     // one token
    {16, 16, 8, 2, 64, 64},    // one chunk exactly
    {16, 16, 8, 2, 65, 64},    // one past a boundary
    {16, 16, 8, 2, 127, 64},   // one short of the second
    {128, 64, 4, 1, 200, 64},  // mamba2-130m's heads, 4 per group
    {128, 64, 4, 1, 130, 100}, // a chunk that is not a multiple of 16
    {21, 6, 8, 8, 77, 16},     // state and head tails, one head per group
    {21, 6, 8, 8, 40, 17},
    {32, 20, 8, 1, 50, 1},     // chunks of one token: the recurrence itself
    {16, 16, 8, 2, 3, 64},
};

// The bounds: the float recurrence (ssm2_scan's reference) is itself up to 4.9e-5 (outputs, a
// 128-state dot product that cancels) and 9.4e-7 (state) off the float64 one on these inputs;
// the chunked form is at most 2.6e-5 and 1.2e-6 off. Both must stay within kTolY / kTolH, and
// the chunked form within them of the float recurrence too.
constexpr double kTolY = 6e-5, kTolH = 4e-6;

TEST(Ssm2Chunked, EveryVariantEqualsTheRecurrenceWithinRounding) {
  uint32_t seed = 11;
  for (const Case& c : kCases) {
    const Inputs in(c, seed++);
    const Oracle want = oracle(in);
    const Result rec = run(in, false, Isa::Ref, 0);
    const double rec_y = y_err(in, rec.y, want.y), rec_h = h_err(rec.h, want.h);
    EXPECT_LE(rec_y, kTolY);
    EXPECT_LE(rec_h, kTolH);
    std::vector<double> rec_yd(want.y.size());
    for (int64_t t = 0; t < c.n; ++t)
      for (int64_t ch = 0; ch < in.DI; ++ch) rec_yd[size_t(t * in.DI + ch)] = rec.y[size_t(t * in.ldy + ch)];
    for (Isa isa : chunked_variants()) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " S " + std::to_string(c.S) + " P " + std::to_string(c.P) + " H " +
                   std::to_string(c.H) + " G " + std::to_string(c.G) + " n " + std::to_string(c.n) + " chunk " +
                   std::to_string(c.chunk));
      const Result got = run(in, true, isa, c.chunk);
      // Against the float64 recurrence, and against the float recurrence.
      EXPECT_LE(y_err(in, got.y, want.y), kTolY) << "the float recurrence: " << rec_y;
      EXPECT_LE(h_err(got.h, want.h), kTolH) << "the float recurrence: " << rec_h;
      EXPECT_LE(y_err(in, got.y, rec_yd), kTolY);
      EXPECT_LE(h_err(got.h, rec.h), kTolH);
      // Only the outputs' columns are written.
      for (int64_t t = 0; t < c.n; ++t)
        for (int64_t i = in.DI; i < in.ldy; ++i) ASSERT_TRUE(std::isnan(got.y[size_t(t * in.ldy + i)])) << t;
      // A run split in two calls at token 20 (mid-chunk) carries the state from one to the other.
      if (c.n > 20) {
        const Result halves = run(in, true, isa, c.chunk, 20);
        EXPECT_LE(y_err(in, halves.y, want.y), kTolY);
        EXPECT_LE(h_err(halves.h, want.h), kTolH);
      }
    }
  }
}

}  // namespace
}  // namespace tern
