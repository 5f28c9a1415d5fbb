// BiLLM binarization (compress/billm.h) and its format (quant/quant_billm.h): the layout round
// trip, the two binarizers against brute force and plain sign, the Hessian saliency, the
// algorithm's output error against the calibration-free encoders, a corrupt file refused at load,
// and on stories260K a lower perplexity than plain sign binarization at the same bytes. (The
// kernels: tests/kernels/test_billm_kernels.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "compress/billm.h"
#include "compress/calibrate.h"
#include "compress/linalg.h"
#include "compress/methods.h"
#include "calib_test_util.h"
#include "compress_test_util.h"
#include "core/fp16.h"
#include "gguf/gguf.h"
#include "models/model.h"
#include "quant/quant_billm.h"
#include "quant/quant_traits.h"
#include "quant_test_util.h"

namespace tern {
namespace {

using namespace tern::testing;

double sq_err(const float* a, const float* b, int64_t n) {
  double e = 0;
  for (int64_t i = 0; i < n; ++i) e += double(a[i] - b[i]) * double(a[i] - b[i]);
  return e;
}

TEST(BillmFormat, SizesAreTheDTypeTables) {
  for (DType t : {DType::BILLM_G64, DType::BILLM_G128}) {
    const BillmFormat f = billm_format(t);
    EXPECT_EQ(dtype_info(t).block_size, f.group);
    EXPECT_EQ(dtype_info(t).block_bytes, f.block_bytes());
    EXPECT_EQ(quant_traits(t)->block_bytes, f.block_bytes());
    EXPECT_EQ(billm_type(f.group), t);
  }
  // 2 plane bits + 4 f16 magnitudes + g/32 index bytes per g weights.
  EXPECT_DOUBLE_EQ(8.0 * dtype_row_bytes(DType::BILLM_G64, 64) / 64, 3.25);
  EXPECT_DOUBLE_EQ(8.0 * dtype_row_bytes(DType::BILLM_G128, 128) / 128, 2.75);
  EXPECT_FALSE(billm_type(32));
}

TEST(BillmFormat, PackUnpackRoundTrip) {
  std::mt19937_64 rng(7);
  for (int g : {64, 128}) {
    const BillmFormat f{g};
    for (int trial = 0; trial < 50; ++trial) {
      BillmBlock b;
      for (int j = 0; j < g; ++j) {
        b.sgn[j] = uint8_t(rng() & 1);
        b.sel[j] = uint8_t(rng() & 1);
      }
      auto f16 = [&] { return fp16_to_f32(f32_to_fp16(float(rng() % 1000) / 997.0f)); };
      b.a_c = f16(), b.a_s = f16(), b.a_1 = f16(), b.a_2 = f16();
      std::vector<int> cols(static_cast<size_t>(g));
      for (int j = 0; j < g; ++j) cols[size_t(j)] = j;
      std::shuffle(cols.begin(), cols.end(), rng);
      b.n_salient = int(rng() % uint64_t(f.slots() + 1));
      std::sort(cols.begin(), cols.begin() + b.n_salient);
      for (int i = 0; i < b.n_salient; ++i) b.salient[i] = uint8_t(cols[size_t(i)]);
      std::vector<uint8_t> bytes(size_t(f.block_bytes()));
      billm_pack_block(f, b, bytes.data());
      EXPECT_EQ(billm_block_defect(f, bytes.data()), nullptr);
      BillmBlock u;
      billm_unpack_block(f, bytes.data(), &u);
      ASSERT_EQ(u.n_salient, b.n_salient);
      for (int i = 0; i < b.n_salient; ++i) EXPECT_EQ(u.salient[i], b.salient[i]);
      for (int j = 0; j < g; ++j) ASSERT_TRUE(u.sgn[j] == b.sgn[j] && u.sel[j] == b.sel[j]) << j;
      EXPECT_EQ(u.a_c, b.a_c);
      EXPECT_EQ(u.a_s, b.a_s);
      EXPECT_EQ(u.a_1, b.a_1);
      EXPECT_EQ(u.a_2, b.a_2);
      // The values: the layout's formula, column by column.
      std::vector<float> v(static_cast<size_t>(g));
      billm_decode(f, bytes.data(), v.data(), g);
      std::vector<bool> sal(size_t(g), false);
      for (int i = 0; i < b.n_salient; ++i) sal[b.salient[i]] = true;
      for (int j = 0; j < g; ++j) {
        const float s = b.sgn[j] ? -1.0f : 1.0f;
        const float want = sal[size_t(j)] ? s * b.a_1 + (b.sel[j] ? -b.a_2 : b.a_2) : s * (b.sel[j] ? b.a_s : b.a_c);
        ASSERT_EQ(v[size_t(j)], want) << "g " << g << " column " << j;
      }
    }
  }
}

TEST(BillmFormat, DefectsAreNamed) {
  const BillmFormat f{64};
  const std::vector<float> w = randn(64, 3);
  std::vector<uint8_t> blk(size_t(f.block_bytes()));
  const uint8_t cols[2] = {5, 9};
  billm_encode_block(f, w.data(), cols, 2, blk.data());
  ASSERT_EQ(billm_block_defect(f, blk.data()), nullptr);
  auto with = [&](size_t at, uint8_t v) {
    std::vector<uint8_t> b = blk;
    b[at] = v;
    const char* d = billm_block_defect(f, b.data());
    return std::string(d ? d : "");
  };
  const size_t mags = 16, idx = 24;
  EXPECT_NE(with(mags + 1, 0x7E).find("non-finite"), std::string::npos);  // a_c = NaN
  EXPECT_NE(with(mags + 7, 0xBC).find("negative"), std::string::npos);    // a_2 = -1
  EXPECT_NE(with(idx, 64).find("beyond"), std::string::npos);
  EXPECT_NE(with(idx, 9).find("order"), std::string::npos);
  std::vector<uint8_t> b = blk;
  b[idx] = kBillmNoColumn;
  EXPECT_NE(std::string(billm_block_defect(f, b.data())).find("unused"), std::string::npos);
}

// Residual binarization of a salient set: a second sign with its own magnitude fits better than
// one sign, for salient-looking (wide) values.
TEST(BillmBinarizers, ResidualBeatsSingleSign) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const std::vector<float> w = heavy(16, seed);
    const ResidualBinarization r = residual_binarize(w.data(), 16);
    double mean_abs = 0;
    for (float x : w) mean_abs += std::fabs(x) / 16;
    std::vector<float> one(16), two(16);
    for (int j = 0; j < 16; ++j) {
      const float s = w[size_t(j)] < 0 ? -1.0f : 1.0f;
      one[size_t(j)] = s * float(mean_abs);
      const float res = w[size_t(j)] - s * r.a_1;
      two[size_t(j)] = s * r.a_1 + (res < 0 ? -r.a_2 : r.a_2);
    }
    EXPECT_LT(sq_err(w.data(), two.data(), 16), 0.9 * sq_err(w.data(), one.data(), 16)) << seed;
  }
}

// The split search is the best threshold p (brute force over every |w| as p), never worse than
// no split, and strictly better on heavy-tailed weights.
TEST(BillmBinarizers, SplitSearchIsTheBestBreakPoint) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const int n = 60;
    const std::vector<float> w = heavy(size_t(n), seed);
    const SplitBinarization sp = split_binarize(w.data(), n);
    double brute = 1e300;
    for (int t = 0; t < n; ++t) {
      const float p = std::fabs(w[size_t(t)]);
      double sc = 0, ss = 0;
      int nc = 0;
      for (float x : w)
        if (std::fabs(x) <= p) sc += std::fabs(x), ++nc;
        else ss += std::fabs(x);
      const double ac = nc ? sc / nc : 0, as = nc < n ? ss / (n - nc) : 0;
      double e = 0;
      for (float x : w) {
        const double m = std::fabs(x) <= p ? ac : as;
        e += (std::fabs(x) - m) * (std::fabs(x) - m);
      }
      brute = std::min(brute, e);
    }
    double mean_abs = 0;
    for (float x : w) mean_abs += std::fabs(x) / n;
    double no_split = 0;
    for (float x : w) no_split += (std::fabs(x) - mean_abs) * (std::fabs(x) - mean_abs);
    EXPECT_NEAR(sp.err, brute, 1e-6 * brute) << seed;
    EXPECT_LT(sp.err, 0.8 * no_split) << seed;
    EXPECT_LE(sp.a_c, sp.a_s);
    EXPECT_GE(sp.p, 0.0f);
  }
}

// With H = I (every U[j][j] equal) the Hessian saliency is the columns' squared norm; a column
// whose inverse-Hessian diagonal is small (a well-determined input) moves up.
TEST(BillmAlgorithm, IdentityHessianSaliencyIsMagnitudeOrder) {
  const int64_t n_out = 8;
  const int g = 64;
  std::vector<float> wf = randn(size_t(n_out * g), 11);
  std::vector<double> w(wf.begin(), wf.end());
  std::vector<double> ud(size_t(g), 0.7);
  const std::vector<int> order = billm_salient_order(w.data(), n_out, g, g, ud.data());
  std::vector<double> norm(size_t(g), 0.0);
  for (int64_t o = 0; o < n_out; ++o)
    for (int j = 0; j < g; ++j) norm[size_t(j)] += w[size_t(o * g + j)] * w[size_t(o * g + j)];
  for (int i = 1; i < g; ++i) EXPECT_GE(norm[size_t(order[size_t(i - 1)])], norm[size_t(order[size_t(i)])]);
  const int last = order.back();
  ud[size_t(last)] = 1e-3;
  EXPECT_EQ(billm_salient_order(w.data(), n_out, g, g, ud.data()).front(), last);
}

// Correlated inputs X [n_t, n_in] and their Hessian X^T X.
struct Inputs {
  std::vector<float> x;
  std::vector<double> h;
};
Inputs correlated_inputs(int64_t n_t, int64_t n_in, uint64_t seed) {
  Inputs in;
  const std::vector<float> z = randn(size_t(n_t * n_in), seed);
  const std::vector<float> mix = randn(size_t(n_in * n_in), seed + 1, 0.3f);
  const std::vector<float> chan = heavy(size_t(n_in), seed + 2);  // a few loud channels
  in.x.assign(size_t(n_t * n_in), 0.0f);
  for (int64_t t = 0; t < n_t; ++t)
    for (int64_t i = 0; i < n_in; ++i) {
      float s = z[size_t(t * n_in + i)];
      for (int64_t k = 0; k < 8; ++k) s += mix[size_t(i * n_in + k)] * z[size_t(t * n_in + k)];
      in.x[size_t(t * n_in + i)] = s * (0.5f + std::fabs(chan[size_t(i)]));
    }
  in.h.assign(size_t(n_in * n_in), 0.0);
  for (int64_t t = 0; t < n_t; ++t)
    for (int64_t i = 0; i < n_in; ++i)
      for (int64_t j = 0; j < n_in; ++j) in.h[size_t(i * n_in + j)] += double(in.x[size_t(t * n_in + i)]) * in.x[size_t(t * n_in + j)];
  return in;
}

// BiLLM's objective is the layer's output error on the calibration inputs: below the
// calibration-free encoder of the same format, itself below plain sign binarization; BiLLM's
// structured variant (the salient columns shared by a block's rows) between sign and the default.
TEST(BillmAlgorithm, HessianPassLowersOutputError) {
  ThreadPool pool(2);
  for (int g : {64, 128}) {
    const int64_t n_in = 256, n_out = 48;
    const Inputs in = correlated_inputs(512, n_in, 5 + uint64_t(g));
    const std::vector<float> w = heavy(size_t(n_out * n_in), 9);
    const DType t = *billm_type(g);
    BillmOptions bo;
    bo.group = g;
    BillmStats st;
    const auto q = billm_decode_rows(t, billm_quantize(w.data(), n_out, n_in, in.h, bo, pool, &st), n_out, n_in);
    bo.shared_salient = true;
    const auto qs = billm_decode_rows(t, billm_quantize(w.data(), n_out, n_in, in.h, bo, pool), n_out, n_in);
    const auto r = billm_decode_rows(t, billm_encode_rows_rtn(w.data(), n_out, n_in, g, pool), n_out, n_in);
    const auto s = billm_decode_rows(t, billm_encode_rows_sign(w.data(), n_out, n_in, g, pool), n_out, n_in);
    const double eb = output_error_gram(w.data(), q.data(), n_out, n_in, in.h, pool);
    const double ebs = output_error_gram(w.data(), qs.data(), n_out, n_in, in.h, pool);
    const double er = output_error_gram(w.data(), r.data(), n_out, n_in, in.h, pool);
    const double es = output_error_gram(w.data(), s.data(), n_out, n_in, in.h, pool);
    std::printf("g %d output error: billm %.4g (shared columns %.4g), calibration-free %.4g, sign %.4g\n", g, eb, ebs,
                er, es);
    EXPECT_LT(eb, 0.9 * er) << "g " << g;
    EXPECT_LT(eb, ebs) << "g " << g << ": per-row salient columns (the default) below BiLLM's shared ones";
    EXPECT_LT(ebs, es) << "g " << g;
    EXPECT_LT(er, es) << "g " << g;
    EXPECT_GT(st.salient_columns, 0);
    EXPECT_EQ(st.blocks, n_in / g);
  }
}

// The Hessian-free encoder (from_float) never does worse than no salient column.
TEST(BillmAlgorithm, RtnSalientSearchNeverWorseThanNone) {
  for (int g : {64, 128}) {
    const BillmFormat f{g};
    for (uint64_t seed = 1; seed <= 10; ++seed) {
      const std::vector<float> w = heavy(size_t(g), seed);
      std::vector<uint8_t> a(size_t(f.block_bytes())), b(size_t(f.block_bytes()));
      billm_encode_rtn(f, w.data(), g, a.data());
      const double none = billm_encode_block(f, w.data(), nullptr, 0, b.data());
      std::vector<float> v(static_cast<size_t>(g));
      billm_decode(f, a.data(), v.data(), g);
      EXPECT_LE(sq_err(w.data(), v.data(), g), none * (1 + 1e-12)) << seed;
    }
  }
}

// ---- models ----------------------------------------------------------------------------------

class StoriesBillm : public StoriesCalibrated<1024> {};

// The acceptance row: BiLLM below plain sign binarization at the same bytes (same format, same
// fallbacks), and below its own calibration-free encoder.
TEST_F(StoriesBillm, LowerPerplexityThanSignAtTheSameBytes) {
  MethodOptions mo;
  std::map<std::string, double> ppl;
  std::map<std::string, int64_t> bytes;
  for (const char* m : {"billm", "billm-rtn", "billm-sign"}) {
    const std::string out = temp_path(std::string("s-") + m + ".gguf");
    const MethodReport rep = apply_method(m, stories(), out, calib_, mo);
    bytes[m] = rep.quant.bytes;
    ppl[m] = ppl_of(out, 8);
    const GgufFile f = GgufFile::open(out);
    EXPECT_EQ(f.find_tensor("blk.0.attn_q.weight")->type, DType::BILLM_G64) << m;
    EXPECT_EQ(f.find_tensor("blk.0.ffn_gate.weight")->type, DType::BILLM_G64) << m;
    EXPECT_EQ(f.find_tensor("blk.0.ffn_down.weight")->type, DType::F16) << m << ": rows of 172 fall back";
  }
  EXPECT_EQ(bytes["billm"], bytes["billm-sign"]);
  EXPECT_LT(ppl["billm"], ppl["billm-sign"]);
  EXPECT_LT(ppl["billm"], ppl["billm-rtn"]);
  std::printf("stories260K ppl (8 chunks): billm %.3f, billm-rtn %.3f, billm-sign %.3f\n", ppl["billm"],
              ppl["billm-rtn"], ppl["billm-sign"]);
}

// A file whose billm block holds a NaN magnitude, or a salient index past the block, is refused at
// load with the file, the tensor and the row named.
TEST_F(StoriesBillm, CorruptBlocksAreRefusedAtLoad) {
  const std::string good = temp_path("s-billm-rtn-src.gguf");
  MethodOptions mo;
  apply_method("billm-rtn", stories(), good, nullptr, mo);
  const GgufFile src = GgufFile::open(good);
  const BillmFormat f{64};
  struct Damage {
    size_t at;
    uint8_t v;
    const char* what;
  };
  // Row 3, block 0 of blk.1.attn_v: a_s's high byte NaN; the first salient slot 70 (>= 64).
  const int64_t row = 3;
  for (const Damage d : {Damage{size_t(16 + 3), 0x7E, "non-finite"}, Damage{size_t(24), 70, "beyond the block"}}) {
    GgufWriter w(src.version());
    w.copy_metadata(src);
    std::vector<uint8_t> copy;
    for (const auto& t : src.tensors()) {
      if (t.name == "blk.1.attn_v.weight") {
        copy.assign(t.data, t.data + t.n_bytes);
        copy[size_t(row * f.block_bytes()) + d.at] = d.v;
        w.add_tensor(t.name, t.type, t.ne, copy.data(), copy.size());
      } else {
        w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
      }
    }
    const std::string bad = temp_path("s-billm-bad.gguf");
    w.write(bad);
    std::string out, err;
    const int rc = run_command(kTern + " ppl -m " + bad + " -f " + tinystories_val() + " --ctx 64 --chunks 1", &out, &err);
    EXPECT_NE(rc, 0);
    EXPECT_NE(err.find(bad), std::string::npos) << err;
    EXPECT_NE(err.find("blk.1.attn_v.weight"), std::string::npos) << err;
    EXPECT_NE(err.find("row 3"), std::string::npos) << err;
    EXPECT_NE(err.find(d.what), std::string::npos) << err;
  }
}

TEST_F(StoriesBillm, NeedsCalibration) {
  std::string out, err;
  const int rc = run_command(kTern + " quantize " + stories() + " " + temp_path("nc.gguf") + " --method billm", &out, &err);
  EXPECT_NE(rc, 0);
  EXPECT_NE(err.find("--calib"), std::string::npos) << err;
  EXPECT_THROW(apply_method("billm", stories(), temp_path("nc2.gguf"), nullptr, MethodOptions{}), Error);
}

}  // namespace
}  // namespace tern
