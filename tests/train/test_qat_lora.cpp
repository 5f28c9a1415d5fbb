// QAT of a LoRA fine-tune (train/qat_lora.h, `tern finetune --qat TYPE`): the merge W0 + s B A
// and the chain rule to A and B against double loops, the backward's subset of weight gradients,
// a run that trains the quantized merged model and resumes bit for bit only under the same
// quantizer, and the command line: the exported merged file decodes to exactly the forward's
// weights, resume, and the errors. tests/py/test_qat_lora_torch_oracle.py checks the gradients
// against PyTorch and the forward weights against numpy's quantizers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "models/lora.h"
#include "quant/quant_traits.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "train/data.h"
#include "train/forward_backward.h"
#include "train/lora.h"
#include "train/qat.h"
#include "train/qat_lora.h"
#include "train/trainer.h"
#include "train_test_util.h"

namespace tern::train {
namespace {

namespace fs = std::filesystem;

using testing::all_matrices;
using testing::json_lines;
using testing::shape32;

const std::vector<LoraKind> kAllKinds = {LoraKind::Q,    LoraKind::K,  LoraKind::V,    LoraKind::O,
                                         LoraKind::Gate, LoraKind::Up, LoraKind::Down, LoraKind::Output};

LoraWeights random_lora(const ModelShape& s, int64_t rank, float alpha, uint32_t seed) {
  LoraWeights l = make_lora(s, kAllKinds, rank, alpha);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.3f);
  for (float& v : l.data) v = d(rng);
  return l;
}

TEST(QatLora, MergeAndChainRuleAreTheAdaptersProducts) {
  ThreadPool pool(2);
  const ModelShape s = shape32(13);
  const TrainModel base = testing::test_model(s, 3);
  LoraWeights lora = random_lora(s, 3, 5.0f, 4);
  LoraMerge merge(base, lora, &pool);
  const double sc = 5.0 / 3.0;
  // The merged weights: W0 + s B A (double reference), the rest of the base as it is.
  std::vector<uint8_t> adapted(base.params.size(), 0);
  for (const LoraSlot& sl : lora.slots) {
    const ParamInfo* p = base.find(sl.target);
    ASSERT_NE(p, nullptr);
    adapted[size_t(p - base.params.data())] = 1;
    for (int64_t o = 0; o < sl.n_out; ++o)
      for (int64_t i = 0; i < sl.n_in; ++i) {
        double ba = 0.0;
        for (int64_t j = 0; j < lora.rank; ++j)
          ba += double(lora.data[size_t(sl.b + o * lora.rank + j)]) * double(lora.data[size_t(sl.a + j * sl.n_in + i)]);
        const size_t k = size_t(p->offset + o * sl.n_in + i);
        const double want = double(base.data[k]) + sc * ba;
        ASSERT_NEAR(merge.merged().data[k], want, 1e-5 * (1.0 + std::abs(want))) << sl.target << " " << o << "," << i;
      }
  }
  for (size_t i = 0; i < base.params.size(); ++i) {
    if (adapted[i]) continue;
    const ParamInfo& p = base.params[i];
    EXPECT_EQ(std::memcmp(merge.merged().data.data() + p.offset, base.data.data() + p.offset, size_t(p.size) * 4), 0)
        << p.name;
  }
  // A changed adapter: update() follows it.
  lora.data[size_t(lora.slots[0].b)] += 1.0f;
  const float before = merge.merged().data[size_t(base.find(lora.slots[0].target)->offset)];
  merge.update();
  EXPECT_NE(merge.merged().data[size_t(base.find(lora.slots[0].target)->offset)], before);

  // The chain rule: dB = s G A^T, dA = s B^T G for a random G.
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> G(size_t(base.n_params()));
  for (float& v : G) v = d(rng);
  std::vector<float> g_lora(size_t(lora.n_params()), 7.0f);  // overwritten
  merge.backward(G.data(), g_lora.data());
  for (const LoraSlot& sl : lora.slots) {
    const float* Gm = G.data() + base.find(sl.target)->offset;
    for (int64_t o = 0; o < sl.n_out; ++o)
      for (int64_t j = 0; j < lora.rank; ++j) {
        double want = 0.0;
        for (int64_t i = 0; i < sl.n_in; ++i)
          want += double(Gm[o * sl.n_in + i]) * double(lora.data[size_t(sl.a + j * sl.n_in + i)]);
        want *= sc;
        ASSERT_NEAR(g_lora[size_t(sl.b + o * lora.rank + j)], want, 1e-4 * (1.0 + std::abs(want))) << sl.target;
      }
    for (int64_t j = 0; j < lora.rank; ++j)
      for (int64_t i = 0; i < sl.n_in; ++i) {
        double want = 0.0;
        for (int64_t o = 0; o < sl.n_out; ++o)
          want += double(lora.data[size_t(sl.b + o * lora.rank + j)]) * double(Gm[o * sl.n_in + i]);
        want *= sc;
        ASSERT_NEAR(g_lora[size_t(sl.a + j * sl.n_in + i)], want, 1e-4 * (1.0 + std::abs(want))) << sl.target;
      }
  }
}

TEST(QatLora, BackwardOfASubsetOfWeightsGivesTheirFullGradientAndNothingElse) {
  ThreadPool pool(2);
  const ModelShape s = shape32(13);
  const TrainModel m = testing::test_model(s, 6);
  const std::vector<int32_t> windows = testing::random_windows(2, 8, s.n_vocab, 9);
  ForwardBackward full(s, 2, 8, &pool), part(s, 2, 8, &pool);
  full.prepare(m);
  part.prepare(m);
  const std::vector<int64_t> wanted = {m.layers[0].wq, m.layers[1].w_down, m.output, m.tok_embd};
  part.set_trained_weights(wanted);
  std::vector<float> gf(size_t(m.n_params()), 0.0f), gp(size_t(m.n_params()), 0.0f);
  const double lf = full.forward_backward(m, windows.data(), gf.data(), 1.0f);
  const double lp = part.forward_backward(m, windows.data(), gp.data(), 1.0f);
  EXPECT_EQ(lf, lp);
  for (const ParamInfo& p : m.params) {
    const bool want = std::find(wanted.begin(), wanted.end(), p.offset) != wanted.end();
    bool nonzero = false;
    for (int64_t k = 0; k < p.size; ++k) nonzero |= gp[size_t(p.offset + k)] != 0.0f;
    if (want) {
      EXPECT_EQ(std::memcmp(gf.data() + p.offset, gp.data() + p.offset, size_t(p.size) * 4), 0) << p.name;
    } else {
      EXPECT_FALSE(nonzero) << p.name << " got a gradient";
    }
  }
  LoraWeights l = make_lora(s, {LoraKind::Q}, 2, 2.0f);
  EXPECT_THROW(part.set_lora(&l), Error);
}

struct QatLoraRun {
  testing::TrainTempDir dir;
  std::unique_ptr<GgufFile> vocab;
  TokenStream data;
  ModelShape s;
  TrainModel base;
  QatLoraRun() {
    vocab = std::make_unique<GgufFile>(GgufFile::open(testing::write_train_vocab(dir)));
    const auto tok = Tokenizer::from_gguf(*vocab);
    data = tokenize_text(testing::read_file_bytes(testing::write_train_text(dir, "data.txt", 12, 12)), *tok, false);
    s = shape32(tok->n_vocab());
    base = init_model(s, 1);
  }
};

TEST(QatLora, TrainsTheQuantizedMergedModelAndResumesBitForBitUnderTheSameQuantizerOnly) {
  QatLoraRun r;
  const std::vector<float> base_before = r.base.data;
  TrainConfig cfg = testing::resume_test_config(2e-2f);
  cfg.opt.warmup = 1;
  cfg.opt.weight_decay = 0.0f;
  ThreadPool pool(2);
  const std::vector<LoraKind> kinds = {LoraKind::Q, LoraKind::V, LoraKind::Down, LoraKind::Output};
  for (bool lsq : {false, true}) {
    SCOPED_TRACE(lsq ? "lsq" : "codec");
    auto fresh = [&] {
      LoraWeights l = make_lora(r.s, kinds, 4, 8.0f);
      init_lora(l, cfg.seed);
      return l;
    };
    struct Result {
      std::vector<double> losses;
      std::vector<float> scales, quantized;
    };
    auto run = [&](LoraWeights& l, const TrainConfig& c, int64_t resume_step, Result& out) {
      Trainer t(r.base, l, *r.vocab, c, &pool);
      LoraMerge merge(r.base, l, &pool);
      QatModel qat(merge.merged(), all_matrices(r.base, DType::Q4_0), &pool, lsq);
      t.set_qat(&qat, &merge);
      if (resume_step > 0) t.resume(GgufFile::open(optimizer_state_path(c.out_path)), resume_step);
      WindowSampler d(&r.data.tokens, c.n_ctx, true, c.seed, "data");
      t.run(d, nullptr, [&](const StepLog& log) { out.losses.push_back(log.loss); }, nullptr);
      out.scales = qat.scales();
      // The forward's weights at the end: Q(W0 + s B A) of the final adapter, row by row.
      const TrainModel& latent = t.qat_latent();
      qat.update(latent);
      out.quantized = qat.quantized().data;
      if (!lsq) {
        for (const LoraSlot& sl : l.slots) {
          const ParamInfo* p = latent.find(sl.target);
          std::vector<float> row(size_t(sl.n_in));
          for (int64_t o = 0; o < sl.n_out; ++o) {
            const int64_t at = p->offset + o * sl.n_in;
            qat_fake_quantize_row(DType::Q4_0, latent.data.data() + at, row.data(), nullptr, sl.n_in);
            EXPECT_EQ(std::memcmp(row.data(), qat.quantized().data.data() + at, row.size() * 4), 0) << sl.target;
          }
        }
      }
    };
    Result whole, first, second;
    LoraWeights l1 = fresh();
    cfg.out_path = r.dir.file(lsq ? "whole-lsq.gguf" : "whole.gguf");
    run(l1, cfg, 0, whole);
    ASSERT_EQ(whole.losses.size(), 8u);
    EXPECT_LT(whole.losses[6] + whole.losses[7], whole.losses[0] + whole.losses[1]);
    EXPECT_TRUE(r.base.data == base_before) << "the frozen base changed";

    LoraWeights l2 = fresh();
    TrainConfig c2 = cfg;
    c2.out_path = r.dir.file(lsq ? "part-lsq.gguf" : "part.gguf");
    c2.stop_after = 4;
    run(l2, c2, 0, first);
    LoraWeights l3 = fresh();
    load_lora_weights(l3, *LoraAdapter::load(c2.out_path));
    c2.stop_after = 0;
    run(l3, c2, 4, second);
    ASSERT_EQ(first.losses.size() + second.losses.size(), 8u);
    for (size_t i = 0; i < 8; ++i)
      EXPECT_EQ(i < 4 ? first.losses[i] : second.losses[i - 4], whole.losses[i]) << "step " << i + 1;
    EXPECT_TRUE(l3.data == l1.data) << "final adapter differs after resume";
    EXPECT_TRUE(second.quantized == whole.quantized) << "final forward weights differ after resume";
    EXPECT_EQ(second.scales, whole.scales);
    if (lsq) {
      EXPECT_FALSE(whole.scales.empty());
    }
  }

  // Resuming the QAT adapter without QAT, or under another type, is refused naming both.
  LoraWeights l = make_lora(r.s, kinds, 4, 8.0f);
  load_lora_weights(l, *LoraAdapter::load(r.dir.file("whole.gguf")));
  TrainConfig c3 = cfg;
  c3.out_path = r.dir.file("whole.gguf");
  c3.steps = 10;
  const GgufFile st = GgufFile::open(optimizer_state_path(c3.out_path));
  {
    Trainer t(r.base, l, *r.vocab, c3, &pool);
    try {
      t.resume(st, 8);
      FAIL() << "resumed a QAT adapter without QAT";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("q4_0"), std::string::npos) << e.what();
    }
  }
  {
    Trainer t(r.base, l, *r.vocab, c3, &pool);
    LoraMerge merge(r.base, l, &pool);
    QatModel q8(merge.merged(), all_matrices(r.base, DType::Q8_0), &pool);
    t.set_qat(&q8, &merge);
    try {
      t.resume(st, 8);
      FAIL() << "resumed a q4_0 adapter under q8_0";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos) << e.what();
    }
  }
  // An adapter with dropout, or QAT of an adapter without its merged model, is refused.
  {
    LoraWeights ld = make_lora(r.s, kinds, 4, 8.0f, 0.1f);
    Trainer t(r.base, ld, *r.vocab, c3, &pool);
    LoraMerge merge(r.base, ld, &pool);
    QatModel q(merge.merged(), all_matrices(r.base, DType::Q4_0), &pool);
    EXPECT_THROW(t.set_qat(&q, &merge), Error);
    LoraWeights l0 = make_lora(r.s, kinds, 4, 8.0f);
    Trainer t0(r.base, l0, *r.vocab, c3, &pool);
    EXPECT_THROW(t0.set_qat(&q, nullptr), Error);
  }
}

// `tern finetune --lora --qat` from the command line.
class FinetuneQatCli : public ::testing::Test {
 protected:
  testing::TrainTempDir dir;
  std::string base, data, val;
  void SetUp() override {
    const GgufFile vocab = GgufFile::open(testing::write_train_vocab(dir));
    base = dir.file("base.gguf");
    save_model(init_model(shape32(300), 2), vocab, base);
    data = testing::write_train_text(dir, "data.txt", 20, 1);
    val = testing::write_train_text(dir, "val.txt", 6, 2);
  }
  int finetune(const std::string& args, std::string* out, std::string* err) {
    return testing::run_command(std::string(TERN_BINARY) + " finetune --lora " + args, out, err);
  }
};

TEST_F(FinetuneQatCli, TrainsAndTheExportDecodesToTheForwardsWeightsBitForBit) {
  std::string out, err;
  const std::string o = dir.file("a.gguf");
  ASSERT_EQ(finetune("-m " + base + " --data " + data + " --val " + val +
                         " --qat q4_0 --rank 4 --alpha 8 --targets q,k,v,o,gate,up,down,output --steps 30 --lr 3e-3 "
                         "--ctx 32 --batch 4 -t 2 --json -q -o " + o, &out, &err), 0) << err;
  EXPECT_NE(err.find("validation loss of the base quantized to q4_0"), std::string::npos) << err;
  const auto lines = json_lines(out);
  ASSERT_GE(lines.size(), 3u) << out;
  const double before = lines.front()["val_loss"].get<double>();
  const auto& fin = lines.back();
  ASSERT_TRUE(fin.value("final", false)) << out;
  EXPECT_LT(fin["val_loss"].get<double>(), before - 0.2) << "held-out loss " << before << " -> " << fin["val_loss"];
  ASSERT_EQ(fin["qat_output"].get<std::string>(), dir.file("a-q4_0.gguf"));

  // The adapter is an ordinary adapter of the base.
  const auto ad = LoraAdapter::load(o);
  ad->check_base(GgufFile::open(base));
  // The merged, quantized file against this process's own merge and quantization of the
  // adapter, with the types the file stores: every row decodes to the same bits.
  const GgufFile bf = GgufFile::open(base);
  const TrainModel b = load_model(bf);
  LoraWeights l = make_lora(b.shape, kAllKinds, 4, 8.0f);
  load_lora_weights(l, *ad);
  ThreadPool pool(2);
  LoraMerge merge(b, l, &pool);
  const GgufFile ex = GgufFile::open(dir.file("a-q4_0.gguf"));
  std::vector<DType> types;
  int64_t n_q4 = 0;
  for (const ParamInfo& p : b.params) {
    const GgufTensorInfo* t = ex.find_tensor(p.name);
    ASSERT_NE(t, nullptr) << p.name;
    types.push_back(t->type);
    n_q4 += t->type == DType::Q4_0;
  }
  EXPECT_GE(n_q4, 2 * 7);
  const QatModel qat(merge.merged(), types, &pool);
  for (size_t i = 0; i < b.params.size(); ++i) {
    const ParamInfo& p = b.params[i];
    const GgufTensorInfo* t = ex.find_tensor(p.name);
    const float* want = qat.quantized().data.data() + p.offset;
    if (types[i] == DType::F32) {
      EXPECT_EQ(std::memcmp(t->data, want, size_t(p.size) * 4), 0) << p.name;
      continue;
    }
    const QuantTraits& q = require_quant_traits(types[i], p.name.c_str());
    const int64_t n_in = p.ne[0], rb = dtype_row_bytes(types[i], n_in);
    std::vector<float> row(static_cast<size_t>(n_in));
    for (int64_t r = 0; r < p.size / n_in; ++r) {
      q.to_float(t->data + r * rb, row.data(), n_in);
      ASSERT_EQ(std::memcmp(row.data(), want + r * n_in, size_t(n_in) * 4), 0) << p.name << " row " << r;
    }
  }
  // It runs as a model.
  ASSERT_EQ(testing::run_command(std::string(TERN_BINARY) + " run -m " + dir.file("a-q4_0.gguf") +
                                     " -p 'the cat' -n 4 --temp 0", &out, &err), 0) << err;
}

TEST_F(FinetuneQatCli, ResumeContinuesTheRunAndTheExportBitForBit) {
  std::string out, err;
  const std::string common = "-m " + base + " --data " + data + " --qat q4_0 --qat-lsq --rank 4 --alpha 4 --steps 6 "
                             "--lr 1e-2 --ctx 32 --batch 2 --grad-accum 2 -t 2 --json -q ";
  std::vector<double> a, b;
  ASSERT_NO_FATAL_FAILURE(testing::run_whole_and_resumed(
      [&](const std::string& args, std::string* o, std::string* e) { return finetune(args, o, e); }, common, dir, &a,
      &b));
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(a, b);
  // The exports (with the base's metadata) are the same bytes.
  EXPECT_EQ(testing::read_file_bytes(dir.file("whole-q4_0.gguf")), testing::read_file_bytes(dir.file("part-q4_0.gguf")));
  // Another --qat, or none, is refused and the checkpoint is left alone.
  const std::string before = testing::read_file_bytes(dir.file("part.gguf"));
  const std::string more = "-m " + base + " --data " + data + " --rank 4 --alpha 4 --steps 8 --lr 1e-2 --ctx 32 "
                           "--batch 2 --grad-accum 2 -t 2 -q --resume -o " + dir.file("part.gguf");
  EXPECT_EQ(finetune(more + " --qat q8_0", &out, &err), 1);
  EXPECT_NE(err.find("q8_0"), std::string::npos) << err;
  EXPECT_EQ(finetune(more, &out, &err), 1);
  EXPECT_NE(err.find("QAT q4_0"), std::string::npos) << err;
  EXPECT_EQ(testing::read_file_bytes(dir.file("part.gguf")), before);
}

TEST_F(FinetuneQatCli, BadInputGetsAClearErrorAndWritesNothing) {
  std::string out, err;
  const std::string o = " -o " + dir.file("a.gguf");
  const std::string ok = "-m " + base + " --data " + data + " --ctx 16 --batch 2 --steps 2 -t 1 -q";
  // A base whose ffn_down rows (40) do not fit q4_0's blocks of 32.
  ModelShape s40 = shape32(300);
  s40.n_ff = 40;
  save_model(init_model(s40, 2), GgufFile::open(dir.file("vocab.gguf")), dir.file("ff40.gguf"));
  struct Case {
    std::string args, expect;
  } cases[] = {
      {ok + " --qat q9_9" + o, "--qat: unknown type 'q9_9'"},
      {ok + " --qat-lsq" + o, "go with --qat TYPE"},
      {ok + " --qat q4_0 --dropout 0.1" + o, "give --dropout 0"},
      {ok + " --qat q4_0 --qat-out " + base + o, "is the input file"},
      {ok + " --qat q4_0 --qat-out " + dir.file("a.gguf") + o, "the checkpoint's own path"},
      {ok + " --qat q4_0 --qat-out " + dir.file("a.gguf.optim") + o, "the checkpoint's own path"},
      {ok + " --qat q4_0 --qat-out " + dir.file("no/such/dir/m.gguf") + o, "no/such/dir"},
      {"-m " + dir.file("ff40.gguf") + " --data " + data + " --ctx 16 --batch 2 --steps 2 -q --qat q4_0" + o,
       "blk.0.ffn_down.weight: rows of 40"},
      {"-m " + dir.file("ff40.gguf") + " --data " + data + " --ctx 16 --batch 2 --steps 2 -q --qat q4_0" + o,
       "--qat-fallback"},
      {ok + " --qat q2_k" + o, "cannot take it"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(finetune(c.args, &out, &err), 1) << c.args << "\n" << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.args << "\nstderr: " << err;
    EXPECT_FALSE(fs::exists(dir.file("a.gguf"))) << c.args;
    EXPECT_FALSE(fs::exists(dir.file("a.gguf.optim"))) << c.args;
  }
  // With --qat-fallback the ff40 base trains (ffn_down in the substitute) and exports.
  ASSERT_EQ(finetune("-m " + dir.file("ff40.gguf") + " --data " + data +
                         " --ctx 16 --batch 2 --steps 2 -q --qat q4_0 --qat-fallback" + o, &out, &err), 0) << err;
  EXPECT_NE(err.find("blk.0.ffn_down.weight: rows of 40"), std::string::npos) << err;
  EXPECT_TRUE(fs::exists(dir.file("a-q4_0.gguf")));
}

TEST_F(FinetuneQatCli, AQuantizedBaseTrainsOnItsDecodedValues) {
  std::string out, err;
  const std::string q8 = dir.file("base-q8_0.gguf");
  ASSERT_EQ(testing::run_command(std::string(TERN_BINARY) + " quantize " + base + " " + q8 + " --type q8_0", &out, &err),
            0) << err;
  ASSERT_EQ(finetune("-m " + q8 + " --data " + data + " --qat q4_0 --ctx 16 --batch 2 --steps 2 -t 2 -q -o " +
                         dir.file("a.gguf"), &out, &err), 0) << err;
  EXPECT_NE(err.find("W0 = the base's decoded values"), std::string::npos) << err;
  EXPECT_TRUE(fs::exists(dir.file("a-q4_0.gguf")));
}

}  // namespace
}  // namespace tern::train
