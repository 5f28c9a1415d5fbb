// RWKV-6 ("rwkv6", models/rwkv6.cpp) on its tiny synth shape (rwkv6-tiny: n_embd 128 in 2 heads of
// 64, 3 layers, time_mix_extra_dim 16, time_decay_extra_dim 24, FFN 448, the stream halved after
// layer 1): a prompt in one step, in chunks or a token at a time (beside another sequence, 1 or 2
// threads) gives the same bits; the WKV-6 op's SIMD variants equal the scalar reference within a
// few ulps and a float64 recurrence; files whose keys and tensors disagree are refused naming the
// file, key or tensor and both shapes; a file with the five token-shift mixes as separate tensors
// (older converters) runs as the fused one; quantizing keeps what llama-quantize keeps.
// (Logits against llama.cpp and the float64 numpy oracle: tests/py/test_arch_*.py; the serving
// engine: tests/engine/test_engine_recurrent.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <unistd.h>

#include "compress/quantize.h"
#include "core/error.h"
#include "kernels/matmul.h"
#include "models/model.h"
#include "model_test_util.h"
#include "models/synth.h"
#include "ops/ops.h"
#include "runtime/session.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_rwkv6 {
namespace {

using tern::testing::logits_in_steps;
using tern::testing::open_file;

std::string temp_file(const std::string& name) {
  return ::testing::TempDir() + "tern_rwkv6_" + std::to_string(::getpid()) + "_" + name;
}

std::string synth_file(const std::string& name, DType type = DType::F32) {
  const std::string path = temp_file(name + ".gguf");
  SynthOptions o;
  o.shape = "rwkv6-tiny";
  o.type = type;
  synth_model(o, path);
  return path;
}

TEST(Rwkv6, LoadsWithTheShapesHyperParametersAndAFixedSizeState) {
  const std::string path = synth_file("hp");
  auto file = open_file(path);
  auto model = load_model(file);
  const HParams& hp = model->hparams();
  EXPECT_EQ(hp.arch, "rwkv6");
  EXPECT_TRUE(hp.recurrent());
  EXPECT_EQ(hp.rwkv.head_size, 64);
  EXPECT_EQ(hp.rwkv.mix_extra_dim, 16);
  EXPECT_EQ(hp.rwkv.decay_extra_dim, 24);
  EXPECT_EQ(hp.rwkv.rescale_every, 2);
  EXPECT_EQ(hp.n_ff, 448);
  EXPECT_EQ(hp.n_vocab, 512);
  EXPECT_FALSE(model->can_evict_kv());
  // Per layer: the time mix's and the channel mix's shifted token, then 2 heads' 64 x 64 states.
  EXPECT_EQ(hp.state_floats(), 2 * 128 + 2 * 64 * 64);
  EXPECT_EQ(kv_bytes_per_token(hp, KvType::F16), 0);
  const int64_t per_seq = (2 * 128 + 2 * 64 * 64) * 4 * 3;
  EXPECT_EQ(make_kv_store(hp, 16, KvType::F32, 1).bytes(), per_seq);
  EXPECT_EQ(make_kv_store(hp, 65536, KvType::F32, 4).bytes(), 4 * per_seq);
  std::remove(path.c_str());
}

// Prefill = chunks = token by token: every token runs the same arithmetic whatever the step's
// size and whatever shares the step, so the logits are the same bits.
TEST(Rwkv6, ChunkedPrefillEqualsTokenByTokenBitForBit) {
  std::vector<int32_t> ids = {1};
  for (int i = 0; i < 39; ++i) ids.push_back(int32_t(3 + (i * 37) % 500));
  const std::string path = synth_file("chunks");
  auto file = open_file(path);
  auto model = load_model(file);
  const std::vector<float> whole = logits_in_steps(*model, ids, 40, 1, /*alone=*/true);
  float scale = 0.0f;
  for (float x : whole) {
    ASSERT_TRUE(std::isfinite(x));
    scale = std::max(scale, std::fabs(x));
  }
  ASSERT_GT(scale, 1.0f);  // decisive logits
  for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(16), int64_t(40)})
    for (int n_threads : {1, 2})
      for (bool alone : {true, false}) {
        auto m2 = load_model(file);
        const std::vector<float> got = logits_in_steps(*m2, ids, chunk, n_threads, alone);
        ASSERT_EQ(got.size(), whole.size());
        size_t differ = 0;
        for (size_t i = 0; i < got.size(); ++i) differ += got[i] != whole[i];
        EXPECT_EQ(differ, 0u) << "chunk " << chunk << ", " << n_threads << " threads" << (alone ? "" : ", beside B");
      }

  // Through Session: a prompt prefilled at once, then decoded a token at a time, and a session
  // rolled back (truncate: the state recomputed from the kept prefix) equal one run token by token.
  SessionConfig cfg;
  cfg.n_ctx = 64;
  cfg.n_threads = 2;
  const int64_t V = model->hparams().n_vocab;
  Session a(file, cfg), b(file, cfg), c(file, cfg);
  a.eval(std::span<const int32_t>(ids.data(), 25));
  const float* la = nullptr;
  for (size_t i = 25; i < ids.size(); ++i) la = a.eval(std::span<const int32_t>(ids.data() + i, 1));
  const std::vector<float> expect(la, la + V);
  for (size_t i = 0; i < ids.size(); ++i) la = b.eval(std::span<const int32_t>(ids.data() + i, 1));
  for (int64_t v = 0; v < V; ++v) ASSERT_EQ(la[v], expect[size_t(v)]) << v;
  c.eval(ids);
  c.truncate(12);
  la = c.eval(std::span<const int32_t>(ids.data() + 12, ids.size() - 12));
  for (int64_t v = 0; v < V; ++v) ASSERT_EQ(la[v], expect[size_t(v)]) << v;
  for (int64_t v = 0; v < V; ++v) ASSERT_EQ(whole[size_t((int64_t(ids.size()) - 1) * V + v)], expect[size_t(v)]) << v;
  std::remove(path.c_str());
}

// The WKV-6 op: every SIMD variant this CPU runs against the scalar reference (they differ only by
// the rounding of fused multiply-adds: within a few ulps of the outputs' size) and a float64
// recurrence, heads of 64, 16 and 21 (value channels past the last whole vector), rows `ld`
// apart wider than the heads, heads split over two calls; a run split in two calls at token 77
// gives the same bits as one call.
TEST(Rwkv6, WkvVariantsMatchTheReferenceAndDouble) {
  std::vector<Isa> isas;
  for (Isa isa : kAllIsas)
    if (isa_supported(isa) && isa != Isa::Dotprod && isa != Isa::I8mm) isas.push_back(isa);
  for (int64_t N : {int64_t(64), int64_t(16), int64_t(21)}) {
    const int64_t H = 3, C = H * N, ld = C + 5, n = 150;
    std::mt19937 rng(uint32_t(N * 13));
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> r(size_t(n * ld)), k(size_t(n * ld)), v(size_t(n * ld)), w(size_t(n * ld)), u(static_cast<size_t>(C));
    for (auto& x : u) x = 0.5f + 0.3f * g(rng);
    for (int64_t i = 0; i < n * ld; ++i) {
      r[size_t(i)] = g(rng);
      k[size_t(i)] = g(rng);
      v[size_t(i)] = g(rng);
      w[size_t(i)] = std::exp(-std::exp(-2.0f + 1.5f * g(rng)));  // the model's decays, in (0, 1)
    }
    auto run = [&](Isa which, int64_t split) {
      std::vector<float> st(size_t(H * N * N), 0.0f), y(size_t(n * C), NAN);
      for (int64_t t0 = 0; t0 < n; t0 = split) {
        const int64_t t1 = t0 < split ? split : n;
        const int64_t o = t0 * ld;
        Wkv6Args args{r.data() + o, k.data() + o, v.data() + o, w.data() + o, ld, u.data(), st.data(),
                      y.data() + t0 * C, C, t1 - t0, N};
        wkv6_isa(which, args, 0, 1);
        wkv6_isa(which, args, 1, H);
        if (t1 == n) break;
      }
      return y;
    };
    const std::vector<float> ref = run(Isa::Ref, n);
    // float64 recurrence: y_j = sum_i r_i (S_ij + u_i k_i v_j), S_ij = S_ij w_i + k_i v_j.
    std::vector<double> S(size_t(H * N * N), 0.0), want(size_t(n * C)), mag(size_t(n * C));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const size_t o = size_t(t * ld + h * N);
        for (int64_t j = 0; j < N; ++j) {
          double y = 0.0, m = 0.0;
          for (int64_t i = 0; i < N; ++i) {
            const double kv = double(k[o + size_t(i)]) * v[o + size_t(j)];
            const double term = double(r[o + size_t(i)]) * (S[size_t((h * N + i) * N + j)] + u[size_t(h * N + i)] * kv);
            y += term;
            m += std::fabs(term);
          }
          want[size_t(t * C + h * N + j)] = y;
          mag[size_t(t * C + h * N + j)] = m;
        }
        for (int64_t i = 0; i < N; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double& s = S[size_t((h * N + i) * N + j)];
            s = s * w[o + size_t(i)] + double(k[o + size_t(i)]) * v[o + size_t(j)];
          }
      }
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(ref[i], want[i], 1e-5 * std::max(1.0, mag[i])) << "reference, N " << N << " at " << i;
    for (Isa isa : isas) {
      const std::vector<float> got = run(isa, n), halves = run(isa, 77);
      double worst = 0.0;
      for (size_t i = 0; i < got.size(); ++i) {
        // A few float roundings of the sum's terms: the reference rounds each product, the
        // variant fuses it into the add.
        const double bound = 4.0 * 1.2e-7 * std::max(1.0, mag[i]) * std::sqrt(double(N));
        ASSERT_NEAR(got[i], ref[i], bound) << isa_name(isa) << " N " << N << " at " << i;
        ASSERT_NEAR(got[i], want[i], 1e-5 * std::max(1.0, mag[i])) << isa_name(isa) << " N " << N << " at " << i;
        ASSERT_EQ(got[i], halves[i]) << isa_name(isa) << " N " << N << " at " << i << ": split runs differ";
        worst = std::max(worst, std::fabs(double(got[i]) - ref[i]) / std::max(1.0, mag[i]));
      }
      std::printf("wkv6 %s N %lld: max |variant - reference| / max(1, sum |terms|) = %.2e\n", isa_name(isa),
                  static_cast<long long>(N), worst);
    }
  }
}

// Rewrites rwkv6-tiny through `edit` and returns the error of loading it.
std::string load_error(const std::function<void(const GgufFile&, GgufWriter&)>& edit) {
  const std::string path = synth_file("edit");
  auto src = open_file(path);
  GgufWriter w(3);
  edit(*src, w);
  auto bytes = std::make_shared<std::vector<uint8_t>>(w.to_bytes());
  std::remove(path.c_str());
  try {
    auto file = std::make_shared<const GgufFile>(GgufFile::parse(bytes, bytes->data(), bytes->size(), "edited.gguf"));
    load_model(file);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void copy_all(const GgufFile& s, GgufWriter& w) {
  for (const auto& [k, v] : s.metadata()) w.set(k, v);
  for (const auto& t : s.tensors()) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
}

std::function<void(const GgufFile&, GgufWriter&)> with_key(const std::string& key, uint32_t v) {
  return [key, v](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    w.set(key, GgufValue::u32(v));
  };
}

std::function<void(const GgufFile&, GgufWriter&)> without_tensor(const std::string& name) {
  return [name](const GgufFile& s, GgufWriter& w) {
    for (const auto& [k, v] : s.metadata()) w.set(k, v);
    for (const auto& t : s.tensors())
      if (t.name != name) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  };
}

// The tensor's data under another shape of at most as many elements.
std::function<void(const GgufFile&, GgufWriter&)> reshaped(const std::string& name, std::vector<int64_t> ne) {
  return [name, ne](const GgufFile& s, GgufWriter& w) {
    for (const auto& [k, v] : s.metadata()) w.set(k, v);
    for (const auto& t : s.tensors()) {
      if (t.name != name) {
        w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
      } else {
        int64_t n = 1;
        for (int64_t d : ne) n *= d;
        w.add_tensor(t.name, t.type, ne, t.data, size_t(n) * 4);
      }
    }
  };
}

TEST(Rwkv6, MissingOrMisshapenTensorsAndBadKeysAreRefusedByName) {
  std::string e = load_error(with_key("rwkv6.wkv.head_size", 48));
  EXPECT_NE(e.find("edited.gguf: rwkv6.wkv.head_size 48 does not divide embedding_length 128"), std::string::npos) << e;
  e = load_error(with_key("rwkv6.token_shift_count", 1));
  EXPECT_NE(e.find("edited.gguf: rwkv6.token_shift_count 1 is not 2"), std::string::npos) << e;
  // Valid ranks the tensors do not have.
  e = load_error(with_key("rwkv6.time_mix_extra_dim", 8));
  EXPECT_NE(e.find("edited.gguf: loading blk.0.time_mix_w1.weight: expected 128 x 40, file has 128 x 80"),
            std::string::npos)
      << e;
  e = load_error(with_key("rwkv6.time_decay_extra_dim", 16));
  EXPECT_NE(e.find("blk.0.time_mix_decay_w1.weight: expected 128 x 16, file has 128 x 24"), std::string::npos) << e;
  e = load_error(with_key("rwkv6.feed_forward_length", 512));
  EXPECT_NE(e.find("blk.0.channel_mix_key.weight: expected 128 x 512, file has 128 x 448"), std::string::npos) << e;
  for (const char* key : {"rwkv6.time_mix_extra_dim", "rwkv6.time_decay_extra_dim", "rwkv6.wkv.head_size"}) {
    e = load_error([key](const GgufFile& s, GgufWriter& w) {
      for (const auto& [k, v] : s.metadata())
        if (k != key) w.set(k, v);
      for (const auto& t : s.tensors()) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
    });
    EXPECT_NE(e.find(std::string("edited.gguf: missing required key ") + key), std::string::npos) << e;
  }

  // Missing tensors: each named with the file (the fused mixes too, when the older split ones are
  // absent as well).
  for (const char* name : {"token_embd_norm.bias", "output_norm.bias", "blk.0.time_mix_lerp_fused.weight",
                           "blk.1.time_mix_first.weight", "blk.1.time_mix_lerp_x.weight", "blk.2.time_mix_decay.weight",
                           "blk.2.time_mix_decay_w2.weight", "blk.0.time_mix_gate.weight",
                           "blk.1.channel_mix_lerp_r.weight", "blk.2.channel_mix_receptance.weight",
                           "blk.2.attn_norm_2.bias", "blk.1.time_mix_w2.weight"}) {
    e = load_error(without_tensor(name));
    EXPECT_NE(e.find(std::string("edited.gguf: missing tensor ") + name), std::string::npos) << e;
  }

  // Wrong shapes: each named with the expected and the file's shapes.
  e = load_error(reshaped("blk.1.time_mix_lerp_fused.weight", {128, 1, 1, 4}));
  EXPECT_NE(e.find("edited.gguf: loading blk.1.time_mix_lerp_fused.weight: expected 128 x 1 x 1 x 5"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("file has 128 x 1 x 1 x 4"), std::string::npos) << e;
  e = load_error(reshaped("blk.0.time_mix_first.weight", {2, 64}));
  EXPECT_NE(e.find("loading blk.0.time_mix_first.weight: expected 64 x 2"), std::string::npos) << e;
  EXPECT_NE(e.find("file has 2 x 64"), std::string::npos) << e;
  e = load_error(reshaped("blk.2.time_mix_w2.weight", {16, 128, 4}));
  EXPECT_NE(e.find("loading blk.2.time_mix_w2.weight: expected 16 x 128 x 5, file has 16 x 128 x 4"),
            std::string::npos)
      << e;
  e = load_error(reshaped("blk.1.channel_mix_lerp_k.weight", {64}));
  EXPECT_NE(e.find("loading blk.1.channel_mix_lerp_k.weight: expected 128 x 1 x 1"), std::string::npos) << e;
  e = load_error(reshaped("blk.0.time_mix_gate.weight", {128, 64}));
  EXPECT_NE(e.find("loading blk.0.time_mix_gate.weight: expected 128 x 128, file has 128 x 64"), std::string::npos)
      << e;
  e = load_error(reshaped("blk.2.time_mix_ln.bias", {100}));
  EXPECT_NE(e.find("loading blk.2.time_mix_ln.bias: expected 128, file has 100"), std::string::npos) << e;
  // (The 1-D vectors also load as llama.cpp's [n, 1, 1]: trailing 1s are the same shape.)
  EXPECT_EQ(load_error(reshaped("blk.1.time_mix_lerp_x.weight", {128, 1, 1})), "(no error)");
}

// Files of older converters hold the five token-shift mixes as time_mix_lerp_{w,k,v,r,g}, which
// llama.cpp reads in place of time_mix_lerp_fused: the same model, the same logits.
TEST(Rwkv6, SplitTokenShiftMixesRunAsTheFusedOnes) {
  const std::string path = synth_file("fused"), split_path = temp_file("split.gguf");
  auto file = open_file(path);
  {
    GgufWriter w(3);
    for (const auto& [k, v] : file->metadata()) w.set(k, v);
    for (const auto& t : file->tensors()) {
      const std::string suffix = ".time_mix_lerp_fused.weight";
      if (t.name.size() > suffix.size() && t.name.ends_with(suffix)) {
        const std::string blk = t.name.substr(0, t.name.size() - suffix.size());
        const char* parts[] = {"w", "k", "v", "r", "g"};
        for (int m = 0; m < 5; ++m)
          w.add_tensor(blk + ".time_mix_lerp_" + parts[m] + ".weight", DType::F32, {128, 1, 1},
                       t.data + size_t(m) * 128 * 4, 128 * 4);
      } else {
        w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
      }
    }
    w.write(split_path);
  }
  std::vector<int32_t> ids = {1, 5, 70, 100, 300, 301, 40, 41, 42, 200};
  auto a = load_model(file);
  auto split = open_file(split_path);
  ASSERT_EQ(split->find_tensor("blk.0.time_mix_lerp_fused.weight"), nullptr);
  ASSERT_NE(split->find_tensor("blk.2.time_mix_lerp_g.weight"), nullptr);
  auto b = load_model(split);
  const std::vector<float> la = logits_in_steps(*a, ids, 10, 2, true), lb = logits_in_steps(*b, ids, 10, 2, true);
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) ASSERT_EQ(la[i], lb[i]) << i;
  std::remove(path.c_str());
  std::remove(split_path.c_str());
}

// Quantizing keeps what llama-quantize keeps of RWKV-6 (time_mix_first, the mixes' and the
// decay's LoRAs, time_mix_w2 3-D, the fused mixes; every vector), quantizes the projections, and
// the q8_0 file runs with logits close to the f32 one's.
TEST(Rwkv6, QuantizeKeepsTheSmallMatrices) {
  const std::string src = synth_file("q-src"), out = temp_file("q8.gguf");
  QuantizeOptions qo;
  qo.type = DType::Q8_0;
  qo.n_threads = 2;
  const QuantizeReport rep = quantize_model(src, out, qo);
  auto type_of = [&](const std::string& name) {
    for (const TensorReport& t : rep.tensors)
      if (t.name == name) return t.type;
    ADD_FAILURE() << "no tensor " << name;
    return DType::F32;
  };
  for (const char* name : {"blk.0.time_mix_first.weight", "blk.0.time_mix_w1.weight", "blk.1.time_mix_w2.weight",
                           "blk.2.time_mix_decay_w1.weight", "blk.2.time_mix_decay_w2.weight",
                           "blk.1.time_mix_lerp_fused.weight", "blk.0.time_mix_lerp_x.weight",
                           "blk.0.time_mix_decay.weight", "blk.1.channel_mix_lerp_r.weight"})
    EXPECT_EQ(type_of(name), DType::F32) << name;
  for (const char* name : {"blk.0.time_mix_key.weight", "blk.1.time_mix_gate.weight", "blk.2.time_mix_output.weight",
                           "blk.0.channel_mix_receptance.weight", "blk.2.channel_mix_value.weight"})
    EXPECT_EQ(type_of(name), DType::Q8_0) << name;
  std::vector<int32_t> ids = {1, 5, 70, 100, 300, 301, 40, 41, 42, 200};
  auto f32 = load_model(open_file(src)), q8 = load_model(open_file(out));
  const std::vector<float> a = logits_in_steps(*f32, ids, 10, 2, true), b = logits_in_steps(*q8, ids, 10, 2, true);
  float scale = 0.0f, err = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::fabs(a[i]));
    err = std::max(err, std::fabs(a[i] - b[i]));
  }
  EXPECT_LT(err, 0.05f * scale);
  std::remove(src.c_str());
  std::remove(out.c_str());
}

}  // namespace
}  // namespace tern::test_rwkv6
