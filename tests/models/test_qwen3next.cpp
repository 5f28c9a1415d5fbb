// Qwen3-Next ("qwen3next", qwen3next-tiny: gated delta-net, attention, gated delta-net,
// attention): a prompt over many tokens in one step, in chunks or token by token (beside another
// sequence, through scattered K/V slots) gives the same logits; the gated delta rule's SIMD
// variants equal its scalar reference and a float64 recurrence; the state and K/V sizes count the
// recurrent layers' conv window and delta-net state and no K/V for them; a file of the older
// converters (ssm_in with q, k, v, z grouped per key head) gives the logits of the current one;
// and a file whose layer pattern disagrees with its tensors is refused naming the layer.
// (Logits against llama.cpp and a float64 numpy implementation: tests/py/test_arch_*.py.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <unistd.h>

#include "core/error.h"
#include "kernels/matmul.h"
#include "models/model.h"
#include "model_test_util.h"
#include "models/synth.h"
#include "ops/ops.h"
#include "runtime/session.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_qwen3next {
namespace {

using tern::testing::logits_in_steps;
using tern::testing::open_file;

std::string synth_file(const std::string& shape, int64_t n_layer = 0) {
  const std::string path = ::testing::TempDir() + "tern_q3n_" + shape + "_" + std::to_string(::getpid()) + ".gguf";
  SynthOptions o;
  o.shape = shape;
  o.n_layer = n_layer;
  synth_model(o, path);
  return path;
}

std::shared_ptr<const GgufFile> rewrite(const std::string& path, const std::function<void(const GgufFile&, GgufWriter&)>& edit,
                                        std::shared_ptr<std::vector<uint8_t>>& keep) {
  auto src = open_file(path);
  GgufWriter w(3);
  edit(*src, w);
  keep = std::make_shared<std::vector<uint8_t>>(w.to_bytes());
  return std::make_shared<const GgufFile>(GgufFile::parse(keep, keep->data(), keep->size(), "edited.gguf"));
}

void copy_all(const GgufFile& s, GgufWriter& w) {
  for (const auto& [k, v] : s.metadata()) w.set(k, v);
  for (const auto& t : s.tensors()) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
}

float max_abs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0.0f;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

std::vector<int32_t> test_ids(size_t n) {
  std::vector<int32_t> ids = {1};
  while (ids.size() < n) ids.push_back(int32_t(3 + (ids.size() * 37) % 500));
  return ids;
}

TEST(ArchQwen3Next, HyperParametersAndStateSizes) {
  const std::string path = synth_file("qwen3next-tiny");
  auto file = open_file(path);
  auto model = load_model(file);
  const HParams& hp = model->hparams();
  EXPECT_EQ(hp.arch, "qwen3next");
  ASSERT_TRUE(hp.recurrent() && hp.hybrid() && hp.ssm.gated_delta);
  EXPECT_FALSE(model->can_evict_kv());
  EXPECT_EQ(hp.head_dim, 32);
  EXPECT_EQ(hp.n_rot, 8);  // partial rotary: a quarter of each head
  EXPECT_EQ(hp.rope_layout, RopeLayout::Neox);
  // Conv channels q, k (2 key heads of 32 each) and v (4 value heads of 32): 256; the window keeps
  // d_conv - 1 = 3 inputs; the 4 value heads' states are 32 x 32.
  const int64_t state = 3 * 256 + 4 * 32 * 32;
  for (int64_t il = 0; il < 4; ++il) {
    EXPECT_EQ(hp.is_ssm_layer(il), il % 2 == 0) << il;
    EXPECT_EQ(hp.n_embd_kv(il), il % 2 == 0 ? 0 : 2 * 32) << il;
    EXPECT_EQ(hp.state_floats(il), il % 2 == 0 ? state : 0) << il;
  }
  EXPECT_EQ(hp.state_floats_per_sequence(), 2 * state);
  EXPECT_EQ(kv_bytes_per_token(hp, KvType::F32), 2 * 2 * 64 * 4);  // 2 attention layers, K and V
  EXPECT_EQ(make_kv_store(hp, 16, KvType::F32, 3).bytes(), 16 * 2 * 2 * 64 * 4 + 3 * 2 * state * 4);

  // The real shape (written for benchmarks with fewer layers: a layer holds 1.6G parameters).
  const SynthShape& rs = find_synth_shape("qwen3-next-80b-a3b");
  EXPECT_EQ(rs.n_layer, 48);
  EXPECT_EQ(rs.full_attn_interval, 4);
  EXPECT_EQ(rs.n_rot * 4, rs.head_dim);  // partial_rotary_factor 0.25
  EXPECT_EQ(rs.ssm_d_inner, rs.ssm_dt_rank * rs.ssm_d_state);
  std::remove(path.c_str());
}

TEST(ArchQwen3Next, PrefillChunksAndDecodeGiveTheSameLogits) {
  const std::vector<int32_t> ids = test_ids(100);  // past the 64-token chunks of llama.cpp's chunked path
  const std::string path = synth_file("qwen3next-tiny");
  auto file = open_file(path);
  const std::vector<float> whole = logits_in_steps(*load_model(file), ids, 100, 1);
  const float scale = max_abs(whole);
  ASSERT_GT(scale, 1.0f);
  for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(33), int64_t(-1)})
    for (int n_threads : {1, 2}) {
      const std::vector<float> got = logits_in_steps(*load_model(file), ids, std::max<int64_t>(1, chunk), n_threads, chunk < 0);
      EXPECT_LE(max_diff(got, whole), 1e-4f * scale) << "chunk " << chunk << ", " << n_threads << " threads";
    }
  // A session: the prompt in one step, then token by token, against one prefill of everything.
  SessionConfig cfg;
  cfg.n_ctx = 128;
  cfg.n_threads = 2;
  cfg.kv_type = KvType::F32;
  Session a(file, cfg), b(file, cfg);
  const int64_t V = a.model().hparams().n_vocab;
  const float* all = a.eval(ids, /*all_logits=*/true);
  const std::vector<float> expect(all, all + ids.size() * size_t(V));
  b.eval(std::span<const int32_t>(ids.data(), 10));
  for (size_t i = 10; i < ids.size(); ++i) {
    const float* row = b.eval(std::span<const int32_t>(ids.data() + i, 1));
    float err = 0.0f;
    for (int64_t v = 0; v < V; ++v) err = std::max(err, std::fabs(row[v] - expect[i * size_t(V) + size_t(v)]));
    ASSERT_LE(err, 1e-4f * scale) << "position " << i;
  }
  std::remove(path.c_str());
}

// The older converters' ssm_in (per key head: q, k, v of its value heads, z of them) in place of
// attn_qkv and attn_gate: the same model, the same logits.
TEST(ArchQwen3Next, OlderFilesWithSsmInGiveTheSameLogits) {
  const std::string path = synth_file("qwen3next-tiny");
  auto file = open_file(path);
  const HParams hp = read_hparams(*file);
  const int64_t S = hp.ssm.d_state, Hk = hp.ssm.n_group, r = hp.ssm.dt_rank / Hk, E = hp.n_embd;
  std::vector<std::vector<float>> keep;
  std::shared_ptr<std::vector<uint8_t>> bytes;
  auto legacy = rewrite(path, [&](const GgufFile& s, GgufWriter& w) {
    for (const auto& [k, v] : s.metadata()) w.set(k, v);
    for (const auto& t : s.tensors()) {
      const std::string n = t.name;
      if (n.find(".attn_gate.") != std::string::npos) continue;
      if (n.find(".attn_qkv.") == std::string::npos) {
        w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
        continue;
      }
      ASSERT_EQ(t.type, DType::F32);
      const std::string blk = n.substr(0, n.find(".attn_qkv."));
      const GgufTensorInfo* z = s.find_tensor(blk + ".attn_gate.weight");
      ASSERT_NE(z, nullptr);
      const float* qkv = reinterpret_cast<const float*>(t.data);
      const float* zr = reinterpret_cast<const float*>(z->data);
      std::vector<float> out;
      for (int64_t g = 0; g < Hk; ++g) {
        const auto rows = [&](const float* m, int64_t row0, int64_t n_rows) {
          out.insert(out.end(), m + row0 * E, m + (row0 + n_rows) * E);
        };
        rows(qkv, g * S, S);                      // q of key head g
        rows(qkv, Hk * S + g * S, S);             // k
        rows(qkv, 2 * Hk * S + g * r * S, r * S);  // v of its value heads
        rows(zr, g * r * S, r * S);                // z of them
      }
      keep.push_back(std::move(out));
      const int64_t n_rows = int64_t(keep.back().size()) / E;
      w.add_tensor(blk + ".ssm_in.weight", DType::F32, {E, n_rows}, keep.back().data(), uint64_t(keep.back().size() * 4));
    }
  }, bytes);
  ASSERT_FALSE(legacy->find_tensor("blk.0.attn_qkv.weight"));
  ASSERT_TRUE(legacy->find_tensor("blk.0.ssm_in.weight"));
  const std::vector<int32_t> ids = test_ids(24);
  const std::vector<float> want = logits_in_steps(*load_model(file), ids, 24, 2, true);
  const std::vector<float> got = logits_in_steps(*load_model(legacy), ids, 24, 2, true);
  EXPECT_LE(max_diff(got, want), 1e-5f * max_abs(want));
  std::remove(path.c_str());
}

// The converter's multi-token-prediction block (nextn_predict_layers: the last of block_count,
// with nextn tensors of its own) is not run: the main pass gives the logits of the file without it.
TEST(ArchQwen3Next, TheMtpBlockIsNotRun) {
  const std::string path = synth_file("qwen3next-tiny");
  auto file = open_file(path);
  std::shared_ptr<std::vector<uint8_t>> bytes;
  std::vector<float> eh(size_t(64 * 128), 0.01f);
  auto mtp = rewrite(path, [&](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    w.set("qwen3next.block_count", GgufValue::u32(5));
    w.set("qwen3next.nextn_predict_layers", GgufValue::u32(1));
    for (const auto& t : s.tensors())  // layer 3 (attention) copied as the MTP block, layer 4
      if (t.name.rfind("blk.3.", 0) == 0) w.add_tensor("blk.4." + t.name.substr(6), t.type, t.ne, t.data, t.n_bytes);
    w.add_tensor("blk.4.nextn.eh_proj.weight", DType::F32, {128, 64}, eh.data(), eh.size() * 4);
  }, bytes);
  auto model = load_model(mtp);
  EXPECT_EQ(model->hparams().n_layer, 4);
  const std::vector<int32_t> ids = test_ids(20);
  const std::vector<float> want = logits_in_steps(*load_model(file), ids, 20, 2, true);
  EXPECT_EQ(max_diff(logits_in_steps(*model, ids, 20, 2, true), want), 0.0f);
  std::remove(path.c_str());
}

std::string load_error(const std::function<void(const GgufFile&, GgufWriter&)>& edit) {
  const std::string path = synth_file("qwen3next-tiny");
  std::string what = "(no error)";
  try {
    std::shared_ptr<std::vector<uint8_t>> bytes;
    auto file = rewrite(path, edit, bytes);
    load_model(file);
  } catch (const Error& e) {
    what = e.what();
  }
  std::remove(path.c_str());
  return what;
}

TEST(ArchQwen3Next, LayerPatternMustMatchTheTensors) {
  // A gated delta-net layer (0) that carries an attention tensor.
  std::string e = load_error([](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    const GgufTensorInfo* q = s.find_tensor("blk.1.attn_q.weight");
    w.add_tensor("blk.0.attn_q.weight", q->type, q->ne, q->data, q->n_bytes);
  });
  EXPECT_NE(e.find("edited.gguf: layer 0 is a gated delta-net layer (qwen3next.full_attention_interval 2) but the "
                   "file has blk.0.attn_q.weight, an attention tensor"),
            std::string::npos)
      << e;
  // A gated delta-net layer without its ssm_ba.
  e = load_error([](const GgufFile& s, GgufWriter& w) {
    for (const auto& [k, v] : s.metadata()) w.set(k, v);
    for (const auto& t : s.tensors())
      if (t.name != "blk.2.ssm_ba.weight") w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  });
  EXPECT_NE(e.find("layer 2 is a gated delta-net layer (qwen3next.full_attention_interval 2) but the file has no "
                   "blk.2.ssm_ba.weight"),
            std::string::npos)
      << e;
  // An interval that makes layer 1 recurrent: it has attention tensors.
  e = load_error([](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    w.set("qwen3next.full_attention_interval", GgufValue::u32(4));
  });
  EXPECT_NE(e.find("layer 1 is a gated delta-net layer (qwen3next.full_attention_interval 4) but the file has "
                   "blk.1.attn_q.weight"),
            std::string::npos)
      << e;
  // attention.recurrent_layers (what llama.cpp reads first) marking layer 2 as attention.
  e = load_error([](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    std::vector<GgufValue> flags;
    for (bool b : {true, false, false, false}) flags.push_back(GgufValue::boolean(b));
    w.set("qwen3next.attention.recurrent_layers", GgufValue::array(GgufType::BOOL, std::move(flags)));
  });
  EXPECT_NE(e.find("layer 2 is an attention layer (qwen3next.attention.recurrent_layers[2] = false) but the file has "
                   "blk.2.attn_qkv.weight, a gated delta-net tensor"),
            std::string::npos)
      << e;
  // The same array agreeing with the interval loads.
  EXPECT_EQ(load_error([](const GgufFile& s, GgufWriter& w) {
              copy_all(s, w);
              std::vector<GgufValue> flags;
              for (bool b : {true, false, true, false}) flags.push_back(GgufValue::boolean(b));
              w.set("qwen3next.attention.recurrent_layers", GgufValue::array(GgufType::BOOL, std::move(flags)));
            }),
            "(no error)");
  // Value heads that are not the key heads' size.
  e = load_error([](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    w.set("qwen3next.ssm.state_size", GgufValue::u32(16));
  });
  EXPECT_NE(e.find("qwen3next.ssm.inner_size 128 / ssm.time_step_rank 4 (the value heads' size) is not "
                   "ssm.state_size 16"),
            std::string::npos)
      << e;
  // A growing state (ssm_a > 0) is refused.
  std::vector<float> a;
  e = load_error([&](const GgufFile& s, GgufWriter& w) {
    for (const auto& [k, v] : s.metadata()) w.set(k, v);
    for (const auto& t : s.tensors()) {
      if (t.name == "blk.0.ssm_a") {
        a.assign(reinterpret_cast<const float*>(t.data), reinterpret_cast<const float*>(t.data) + t.ne[0]);
        a[1] = 0.5f;
        w.add_tensor(t.name, t.type, t.ne, a.data(), a.size() * 4);
      } else {
        w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
      }
    }
  });
  EXPECT_NE(e.find("blk.0.ssm_a holds 0.5 at value head 1"), std::string::npos) << e;
}

// The gated delta rule's SIMD variants against the scalar reference and a float64 recurrence;
// a run split over value heads equals one run.
TEST(ArchQwen3Next, GatedDeltaVariantsEqualTheReference) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t S : {int64_t(16), int64_t(20), int64_t(32), int64_t(128)}) {
    const int64_t Hk = 2, r = 2, Hv = Hk * r, n = 9, ldqk = 2 * Hk * S + 3, ldv = Hv * S + 5, ldgb = Hv + 1;
    std::vector<float> qk(size_t(n * ldqk)), v(size_t(n * ldv)), g(size_t(n * ldgb)), beta(size_t(n * ldgb));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < 2 * Hk; ++h) {  // L2-normalised q and k heads, as the block gives them
        float* x = qk.data() + t * ldqk + h * S;
        double ss = 0.0;
        for (int64_t i = 0; i < S; ++i) {
          x[i] = nd(rng);
          ss += double(x[i] * x[i]);
        }
        for (int64_t i = 0; i < S; ++i) x[i] = float(x[i] / std::sqrt(ss));
      }
      for (int64_t i = 0; i < Hv * S; ++i) v[size_t(t * ldv + i)] = nd(rng);
      for (int64_t h = 0; h < Hv; ++h) {
        g[size_t(t * ldgb + h)] = -0.5f * std::fabs(nd(rng));
        beta[size_t(t * ldgb + h)] = 1.0f / (1.0f + std::exp(-nd(rng)));
      }
    }
    std::vector<float> s0(size_t(Hv * S * S));
    for (float& x : s0) x = 0.3f * nd(rng);
    const float scale = 1.0f / std::sqrt(float(S));
    auto run = [&](Isa isa, bool split) {
      std::vector<float> s = s0, o(size_t(n * Hv * S), 0.0f);
      GatedDeltaArgs a{qk.data(), qk.data() + Hk * S, ldqk, v.data(), ldv, g.data(), beta.data(), ldgb,
                       s.data(), o.data(), Hv * S, n, S, r, scale};
      if (split) {
        gated_delta_isa(isa, a, 0, 1);
        gated_delta_isa(isa, a, 1, Hv);
      } else {
        gated_delta_isa(isa, a, 0, Hv);
      }
      o.insert(o.end(), s.begin(), s.end());
      return o;
    };
    // float64: M = M exp(g); d = (v - M k) beta; M += d k^T; o = scale M q
    std::vector<double> M(s0.begin(), s0.end()), want(size_t(n * Hv * S));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < Hv; ++h) {
        double* m = M.data() + h * S * S;
        const float* q = qk.data() + t * ldqk + (h / r) * S;
        const float* k = q + Hk * S;
        const double dec = std::exp(double(g[size_t(t * ldgb + h)])), b = beta[size_t(t * ldgb + h)];
        for (int64_t j = 0; j < S; ++j) {
          double sk = 0.0;
          for (int64_t i = 0; i < S; ++i) sk += (m[j * S + i] *= dec) * k[i];
          const double d = (v[size_t(t * ldv + h * S + j)] - sk) * b;
          double o = 0.0;
          for (int64_t i = 0; i < S; ++i) o += (m[j * S + i] += d * k[i]) * q[i];
          want[size_t(t * Hv * S + h * S + j)] = o * scale;
        }
      }
    const std::vector<float> ref = run(Isa::Ref, false);
    for (Isa isa : kAllIsas) {
      if (!isa_supported(isa) || isa == Isa::Dotprod || isa == Isa::I8mm) continue;
      const std::vector<float> got = run(isa, false), split = run(isa, true);
      for (size_t i = 0; i < got.size(); ++i) {
        const double w = i < want.size() ? want[i] : M[i - want.size()];
        ASSERT_NEAR(got[i], w, 2e-4 * std::max(1.0, std::fabs(w))) << isa_name(isa) << " S " << S << " at " << i;
        ASSERT_NEAR(got[i], ref[i], 2e-4 * std::max(1.0, std::fabs(w))) << isa_name(isa) << " S " << S << " at " << i;
        ASSERT_EQ(got[i], split[i]) << isa_name(isa) << " S " << S << ": split runs differ";
      }
    }
  }
}

}  // namespace
}  // namespace tern::test_qwen3next
