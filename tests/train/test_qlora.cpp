// QLoRA: LoRA on a frozen base whose matrices stay in the file's encoding (f16, bf16, Q8_0,
// Q4_0, Q4_K) and are dequantized a tile of rows at a time (train/forward_backward.h). The
// loss and the adapter's gradients must be those of the same file dequantized whole to f32
// (load_model), for every type, a tied output, dropout and the validation forward; and
// `tern finetune --lora` on a quantized base trains an adapter that `tern run --lora` loads.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <unistd.h>
#include <utility>

#include "core/error.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "models/lora.h"
#include "models/synth.h"
#include "quant/quant_traits.h"
#include "test_util.h"
#include "train/forward_backward.h"
#include "train/lora.h"
#include "train/model.h"
#include "train_test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::train::test_qlora {
namespace {

namespace fs = std::filesystem;

using tern::testing::random_windows;
using tern::testing::test_model;

struct QloraDir {
  fs::path path;
  QloraDir() {
    path = fs::temp_directory_path() /
           ("tern_qlora_test_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~QloraDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// Rows of 256 and 512: whole blocks of every type tested, Q4_K's 256 included.
ModelShape qlora_shape(bool tied) {
  ModelShape s;
  s.n_vocab = 300;
  s.n_embd = 256;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 512;
  s.n_ctx_train = 64;
  s.tied_output = tied;
  return s;
}

// The model written with its 2-D tensors in `type` (norms f32), with a generated vocabulary.
std::string write_encoded(const QloraDir& dir, const TrainModel& m, DType type, const std::string& name) {
  GgufWriter w(3);
  const ModelShape& s = m.shape;
  w.set("general.architecture", GgufValue::string("llama"));
  w.set("llama.context_length", GgufValue::u32(uint32_t(s.n_ctx_train)));
  w.set("llama.embedding_length", GgufValue::u32(uint32_t(s.n_embd)));
  w.set("llama.feed_forward_length", GgufValue::u32(uint32_t(s.n_ff)));
  w.set("llama.block_count", GgufValue::u32(uint32_t(s.n_layer)));
  w.set("llama.attention.head_count", GgufValue::u32(uint32_t(s.n_head)));
  w.set("llama.attention.head_count_kv", GgufValue::u32(uint32_t(s.n_head_kv)));
  w.set("llama.attention.layer_norm_rms_epsilon", GgufValue::f32(s.rms_eps));
  add_generated_vocab(w, s.n_vocab);
  const QuantTraits& q = require_quant_traits(type, "test");
  std::vector<std::vector<uint8_t>> bytes;  // alive until write()
  for (const auto& p : m.params) {
    const float* src = m.data.data() + p.offset;
    if (p.ne.size() != 2 || type == DType::F32) {
      w.add_tensor(p.name, DType::F32, p.ne, src, uint64_t(p.size) * 4);
      continue;
    }
    const int64_t row = p.ne[0], rows = p.ne[1], rb = dtype_row_bytes(type, row);
    bytes.emplace_back(size_t(rb * rows));
    for (int64_t r = 0; r < rows; ++r) q.from_float(src + r * row, bytes.back().data() + r * rb, row);
    w.add_tensor(p.name, type, p.ne, bytes.back().data(), bytes.back().size());
  }
  const std::string path = dir.file(name);
  w.write(path);
  return path;
}

LoraWeights random_lora(const ModelShape& s, bool tied, float dropout, uint32_t seed) {
  std::vector<LoraKind> kinds = {LoraKind::Q, LoraKind::K, LoraKind::V, LoraKind::O,
                                 LoraKind::Gate, LoraKind::Up, LoraKind::Down};
  if (!tied) kinds.push_back(LoraKind::Output);
  LoraWeights l = make_lora(s, kinds, 4, 8.0f, dropout);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.1f);
  for (float& v : l.data) v = d(rng);  // B != 0 too: every gradient, and the adapter's dx, non-zero
  return l;
}

struct Result {
  double loss = 0.0, val_loss = 0.0;
  std::vector<float> grads, logits;
};

Result run_lora(const TrainModel& m, LoraWeights& lora, const std::vector<int32_t>& windows, int64_t n_seq,
                int64_t n_ctx, ThreadPool* pool, int64_t tile_rows = 0) {
  ForwardBackward fb(m.shape, n_seq, n_ctx, pool);
  fb.set_tile_rows(tile_rows);
  fb.prepare(m);
  fb.set_lora(&lora);
  fb.prepare_lora();
  fb.set_dropout_seed(5);
  Result r;
  r.val_loss = fb.forward_loss(m, windows.data());
  r.logits.assign(fb.logits(), fb.logits() + n_seq * n_ctx * m.shape.n_vocab);
  r.grads.assign(size_t(lora.n_params()), 0.0f);
  r.loss = fb.forward_backward(m, windows.data(), r.grads.data(), 1.0f);
  return r;
}

// max |a - b| / max(max |b|, tiny) over the vectors.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0.0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return d / scale;
}

struct Case {
  DType type;
  bool tied;
  float dropout;
};

class QloraEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(QloraEquivalence, LossAndAdapterGradientsEqualTheDequantizedF32Base) {
  const Case c = GetParam();
  QloraDir dir;
  const ModelShape s = qlora_shape(c.tied);
  TrainModel src = test_model(s, 3);
  for (float& v : src.data) v *= 0.25f;  // a trained model's scale: softmax not saturated
  const std::string path = write_encoded(dir, src, c.type, "base.gguf");
  const GgufFile file = GgufFile::open(path);
  const TrainModel f32 = load_model(file);
  const TrainModel enc = load_frozen_base(file);
  // Every matrix kept encoded (embedding and output included), only the norms in data.
  const size_t n_matrices = size_t(7 * s.n_layer + 1 + (c.tied ? 0 : 1));
  ASSERT_EQ(enc.encoded.size(), n_matrices);
  EXPECT_EQ(enc.n_params(), (2 * s.n_layer + 1) * s.n_embd);
  EXPECT_EQ(enc.n_elements(), f32.n_elements());
  EXPECT_LT(enc.bytes_in_memory(), f32.bytes_in_memory() / (c.type == DType::F16 || c.type == DType::BF16 ? 1.9 : 3.5));
  EXPECT_NE(describe_base_memory(enc).find(dtype_name(c.type)), std::string::npos) << describe_base_memory(enc);

  // 48 tokens: every encoded forward goes by x^T; 128: every one transposes W's tiles.
  for (const auto& [n_seq, n_ctx] : {std::pair<int64_t, int64_t>{2, 24}, {4, 32}}) {
    const auto windows = random_windows(n_seq, n_ctx, s.n_vocab, 17);
    {
      ForwardBackward probe(s, n_seq, n_ctx, nullptr);
      for (const EncodedTensor& e : enc.encoded) ASSERT_EQ(probe.forward_by_x_t(e), n_seq * n_ctx == 48);
    }
    ThreadPool pool(2);
    LoraWeights la = random_lora(s, c.tied, c.dropout, 9), lb = la;
    const Result want = run_lora(f32, la, windows, n_seq, n_ctx, &pool);
    // Tiles of 96 rows: several per matrix, the last one partial (300, 256 and 512 rows).
    const Result got = run_lora(enc, lb, windows, n_seq, n_ctx, &pool, 96);
    const std::string label = std::string(dtype_name(c.type)) + (c.tied ? " tied" : "") +
                              (c.dropout > 0 ? " dropout" : "") + ", " + std::to_string(n_seq * n_ctx) + " tokens";
    EXPECT_NEAR(got.loss, want.loss, 1e-5 * std::abs(want.loss)) << label;
    EXPECT_NEAR(got.val_loss, want.val_loss, 1e-5 * std::abs(want.val_loss)) << label;
    EXPECT_LE(rel_diff(got.logits, want.logits), 1e-5) << label;
    // Per adapter tensor, relative to its largest gradient.
    for (const auto& p : la.params) {
      const std::vector<float> g(got.grads.begin() + p.offset, got.grads.begin() + p.offset + p.size);
      const std::vector<float> w(want.grads.begin() + p.offset, want.grads.begin() + p.offset + p.size);
      EXPECT_LE(rel_diff(g, w), 1e-5) << label << ": " << p.name;
    }
    // The products are the same FMA chains as the f32 model's (train/gemm.h), so in fact the
    // bits agree; the tolerance above is the contract, this documents what the code achieves.
    EXPECT_EQ(got.loss, want.loss) << label;
    EXPECT_TRUE(got.grads == want.grads) << label;
    // The adapted run did train something: the gradients are not all zero.
    double norm = 0.0;
    for (float v : got.grads) norm += double(v) * v;
    EXPECT_GT(norm, 0.0) << label;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, QloraEquivalence,
                         ::testing::Values(Case{DType::Q8_0, false, 0.0f}, Case{DType::Q4_0, false, 0.0f},
                                           Case{DType::Q4_K, false, 0.0f}, Case{DType::F16, false, 0.0f},
                                           Case{DType::BF16, false, 0.0f}, Case{DType::Q8_0, true, 0.0f},
                                           Case{DType::Q4_K, true, 0.1f}, Case{DType::Q6_K, false, 0.1f}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(dtype_name(i.param.type)) + (i.param.tied ? "_tied" : "") +
                                  (i.param.dropout > 0 ? "_dropout" : "");
                         });

// One thread or several, any tile size: the same bits (the tiles' dequantization is split over
// the pool too).
TEST(Qlora, SameBitsForAnyThreadCountAndTileSize) {
  QloraDir dir;
  const ModelShape s = qlora_shape(false);
  TrainModel src = test_model(s, 4);
  for (float& v : src.data) v *= 0.25f;
  const GgufFile file = GgufFile::open(write_encoded(dir, src, DType::Q4_K, "q4k.gguf"));
  const TrainModel enc = load_frozen_base(file);
  const auto windows = random_windows(1, 16, s.n_vocab, 3);
  LoraWeights l1 = random_lora(s, false, 0.0f, 2), l2 = l1;
  ThreadPool pool(3);
  LoraWeights l3 = l1;
  const Result a = run_lora(enc, l1, windows, 1, 16, nullptr);
  const Result b = run_lora(enc, l2, windows, 1, 16, &pool);
  const Result c = run_lora(enc, l3, windows, 1, 16, &pool, 40);  // and any tile size
  LoraWeights l4 = l1;
  const Result d = run_lora(enc, l4, windows, 1, 16, nullptr, 40);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_TRUE(a.grads == b.grads);
  EXPECT_EQ(a.loss, c.loss);
  EXPECT_TRUE(a.grads == c.grads);
  EXPECT_EQ(a.loss, d.loss);
  EXPECT_TRUE(a.grads == d.grads);
}

// An f32 file gives load_model's model (nothing encoded); an encoded base refuses full training.
TEST(Qlora, F32FileIsLoadModelAndEncodedBaseTrainsOnlyAdapters) {
  QloraDir dir;
  const ModelShape s = qlora_shape(false);
  const TrainModel src = test_model(s, 5);
  const GgufFile f32_file = GgufFile::open(write_encoded(dir, src, DType::F32, "f32.gguf"));
  const TrainModel a = load_model(f32_file), b = load_frozen_base(f32_file);
  EXPECT_TRUE(b.encoded.empty());
  EXPECT_TRUE(a.data == b.data);
  EXPECT_EQ(describe_base_memory(b).rfind("f32: ", 0), 0u) << describe_base_memory(b);

  const GgufFile q_file = GgufFile::open(write_encoded(dir, src, DType::Q8_0, "q8.gguf"));
  const TrainModel enc = load_frozen_base(q_file);
  ForwardBackward fb(s, 1, 8, nullptr);
  fb.prepare(enc);
  const auto windows = random_windows(1, 8, s.n_vocab, 1);
  std::vector<float> g(100, 0.0f);
  try {
    fb.forward_backward(enc, windows.data(), g.data(), 1.0f);
    ADD_FAILURE() << "full training of an encoded base did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LoRA"), std::string::npos) << e.what();
  }
  // The forward alone (validation of the base) runs.
  EXPECT_TRUE(std::isfinite(fb.forward_loss(enc, windows.data())));
}

// A non-finite value in an encoded matrix is refused at load, naming the file and the tensor.
TEST(Qlora, NonFiniteEncodedValueIsRefusedAtLoad) {
  QloraDir dir;
  const ModelShape s = qlora_shape(false);
  TrainModel src = test_model(s, 6);
  src.data[size_t(src.find("blk.1.ffn_up.weight")->offset + 700)] = INFINITY;
  const std::string path = write_encoded(dir, src, DType::F16, "inf.gguf");
  const GgufFile file = GgufFile::open(path);
  try {
    load_frozen_base(file);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("blk.1.ffn_up.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("non-finite"), std::string::npos) << m;
  }
}

// `tern finetune --lora` on bases requantized by `tern quantize`: the same losses as --base-f32
// (the QLoRA products equal the dequantized model's), the start-up line says what is kept
// encoded, and the adapter runs with `tern run --lora` on the quantized base.
TEST(QloraCli, FinetuneOnAQuantizedBaseRunsAndTheAdapterLoads) {
  QloraDir dir;
  const std::string tern = TERN_BINARY;
  const ModelShape s = qlora_shape(false);
  TrainModel src = test_model(s, 7);
  for (float& v : src.data) v *= 0.25f;
  const std::string f32 = write_encoded(dir, src, DType::F32, "base-f32.gguf");
  {
    std::ofstream out(dir.file("data.txt"));
    std::mt19937 rng(1);
    const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "home"};
    for (int d = 0; d < 12; ++d) {
      for (int i = 0; i < 40; ++i) out << words[rng() % 10] << (i % 10 == 9 ? ".\n" : " ");
      out << "\n\n";
    }
  }
  for (const std::string type : {"q4_k", "q8_0"}) {
    SCOPED_TRACE(type);
    const std::string base = dir.file("base-" + type + ".gguf");
    std::string out, err;
    ASSERT_EQ(testing::run_command(tern + " quantize " + f32 + " " + base + " --type " + type, &out, &err), 0) << err;
    auto finetune = [&](const std::string& extra, const std::string& adapter, std::string* o, std::string* e) {
      return testing::run_command(tern + " finetune --lora -m " + base + " --data " + dir.file("data.txt") +
                                      " --rank 4 --alpha 8 --targets q,k,v,o,gate,up,down,output --steps 3 --ctx 16 "
                                      "--batch 2 -t 2 --json -o " + adapter + extra,
                                  o, e);
    };
    const std::string adapter = dir.file("adapter-" + type + ".gguf");
    std::string out_q, err_q, out_f, err_f;
    ASSERT_EQ(finetune("", adapter, &out_q, &err_q), 0) << err_q;
    EXPECT_NE(err_q.find("base: " + type), std::string::npos) << err_q;
    EXPECT_NE(err_q.find("kept encoded"), std::string::npos) << err_q;
    ASSERT_EQ(finetune(" --base-f32", dir.file("adapter-f32-" + type + ".gguf"), &out_f, &err_f), 0) << err_f;
    EXPECT_NE(err_f.find("base: f32: "), std::string::npos) << err_f;
    // The per-step losses (JSON lines without the timings) agree.
    auto losses = [](const std::string& o) {
      std::vector<double> v;
      std::istringstream lines(o);
      for (std::string line; std::getline(lines, line);) {
        if (line.empty() || line[0] != '{') continue;
        const auto j = nlohmann::json::parse(line);
        if (j.contains("step") && j.contains("loss")) v.push_back(j["loss"].get<double>());
      }
      return v;
    };
    const std::vector<double> lq = losses(out_q), lf = losses(out_f);
    ASSERT_EQ(lq.size(), 3u) << out_q;
    ASSERT_EQ(lq.size(), lf.size());
    for (size_t i = 0; i < lq.size(); ++i) EXPECT_NEAR(lq[i], lf[i], 1e-5 * std::abs(lf[i])) << "step " << i + 1;
    const auto ad = LoraAdapter::load(adapter);
    ad->check_base(GgufFile::open(base));
    ASSERT_EQ(testing::run_command(tern + " run -m " + base + " --lora " + adapter + " -p 'the cat' -n 4 --temp 0",
                                   &out, &err),
              0)
        << err;
  }
}

}  // namespace
}  // namespace tern::train::test_qlora
