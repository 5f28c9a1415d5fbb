// The sparsity predictor (issue #31, compress/ffn_predictor.h, models/ffn_predictor_format.h)
// on a tiny ReGLU model made by the training module: the written file keeps the model's keys and
// tensors bit for bit and still loads; the format reads back what was trained; recomputed here
// from the stored tensors on the held-out tokens, score = B (A xn) > threshold keeps the asked
// recall; the result does not depend on the thread count; another model's predictor, a SwiGLU
// model, bad --rank / --recall and an output over an input are refused with clear errors; `tern
// predictor eval` reads the stored predictor back and measures it on a text.
#include <gtest/gtest.h>

#include <algorithm>

#include <cstring>
#include <nlohmann/json.hpp>

#include "compress/ffn_predictor.h"
#include "core/error.h"
#include "models/ffn_predictor_format.h"
#include "models/hparams.h"
#include "models/model.h"
#include "test_util.h"
#include "train/model.h"
#include "train/train_test_util.h"

namespace tern {
namespace {

using tern::testing::run_tern;

constexpr int64_t kEmbd = 32, kFf = 64, kLayers = 2, kRank = 8;
constexpr double kRecall = 0.95;

// Each layer's FFN input and activation rows, recorded as the predictor's collector records
// them, so that the stored tensors are checked against data the training code never touched.
struct Recorded {
  std::vector<std::vector<float>> x, act;  // [n_layer][tokens * kEmbd], [n_layer][tokens * kFf]
  Recorded() : x(kLayers), act(kLayers) {}
};
// The calibration run owns (and ends) its observer: the rows go to a Recorded that outlives it.
class Recorder final : public SequenceObserver {
 public:
  explicit Recorder(Recorded& r) : r_(r) {}
  void on_linear_input(const std::string& weight, const float* in, int64_t n_tokens, int64_t n_in) override {
    for (int64_t il = 0; il < kLayers; ++il) {
      if (weight == str_cat("blk.", il, ".ffn_gate.weight"))
        r_.x[size_t(il)].insert(r_.x[size_t(il)].end(), in, in + n_tokens * n_in);
      if (weight == str_cat("blk.", il, ".ffn_down.weight"))
        r_.act[size_t(il)].insert(r_.act[size_t(il)].end(), in, in + n_tokens * n_in);
    }
  }

 private:
  Recorded& r_;
};

class FfnPredictorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new tern::testing::TrainTempDir();
    const GgufFile vocab = GgufFile::open(tern::testing::write_train_vocab(*dir_));
    train::ModelShape s = tern::testing::model_shape(300, kEmbd, kLayers, 4, 2, kFf, 64);
    s.ffn_relu = true;
    train::save_model(tern::testing::test_model(s, 3), vocab, dir_->file("relu.gguf"));
    train::save_model(tern::testing::test_model(s, 4), vocab, dir_->file("relu_other.gguf"));
    s.ffn_relu = false;
    train::save_model(tern::testing::test_model(s, 3), vocab, dir_->file("silu.gguf"));
    tern::testing::write_train_text(*dir_, "text.txt", 80, 5);
    model_ = new std::shared_ptr<const GgufFile>(open_model_file(dir_->file("relu.gguf")));
    predictor_ = new TrainedPredictor(train_ffn_predictor(*model_, options(1)));
    write_with_ffn_predictor(**model_, *predictor_, dir_->file("pred.gguf"));
  }
  static void TearDownTestSuite() {
    delete predictor_;
    delete model_;
    delete dir_;
  }
  static PredictorTrainOptions options(int threads) {
    PredictorTrainOptions o;
    o.calib.text_file = dir_->file("text.txt");
    o.calib.n_tokens = 600;
    o.calib.seq_len = 64;
    o.calib.from_end = false;
    o.calib.n_threads = threads;
    o.rank = kRank;
    o.recall = kRecall;
    o.epochs = 3;
    o.batch = 64;
    return o;
  }
  static std::string file(const std::string& name) { return dir_->file(name); }

  static inline tern::testing::TrainTempDir* dir_ = nullptr;
  static inline std::shared_ptr<const GgufFile>* model_ = nullptr;
  static inline TrainedPredictor* predictor_ = nullptr;
};

using tern::testing::error_of;

TEST_F(FfnPredictorTest, WrittenFileKeepsTheModelBitForBitAndLoads) {
  const GgufFile& model = **model_;
  const GgufFile out = GgufFile::open(file("pred.gguf"));
  for (const auto& [key, value] : model.metadata()) {
    const GgufValue* v = out.find(key);
    ASSERT_NE(v, nullptr) << key;
    EXPECT_EQ(v->to_display(1 << 20), value.to_display(1 << 20)) << key;
  }
  for (const GgufTensorInfo& t : model.tensors()) {
    const GgufTensorInfo* o = out.find_tensor(t.name);
    ASSERT_NE(o, nullptr) << t.name;
    EXPECT_EQ(o->type, t.type) << t.name;
    EXPECT_EQ(o->ne, t.ne) << t.name;
    ASSERT_EQ(o->n_bytes, t.n_bytes) << t.name;
    EXPECT_EQ(std::memcmp(o->data, t.data, t.n_bytes), 0) << t.name;
  }
  EXPECT_EQ(out.tensors().size(), model.tensors().size() + 3 * kLayers);  // A, B and the activation frequencies
  const HParams hp = read_hparams(out);
  EXPECT_EQ(hp.n_embd, kEmbd);
  ASSERT_TRUE(hp.ffn_activation.has_value());
  EXPECT_EQ(*hp.ffn_activation, FfnActivation::Relu);
  EXPECT_NO_THROW(load_model(open_model_file(file("pred.gguf"))));
}

TEST_F(FfnPredictorTest, FormatReadsBackWhatWasTrained) {
  const GgufFile out = GgufFile::open(file("pred.gguf"));
  const FfnPredictor p = read_ffn_predictor(out, **model_);
  EXPECT_EQ(p.rank, kRank);
  EXPECT_EQ(p.n_embd, kEmbd);
  EXPECT_EQ(p.fingerprint, ffn_gate_fingerprint(**model_));
  EXPECT_EQ(p.fingerprint.size(), 16u);
  ASSERT_EQ(p.n_layer(), kLayers);
  EXPECT_EQ(p.threshold, predictor_->threshold);
  EXPECT_EQ(p.recall, predictor_->recall);
  for (int64_t il = 0; il < kLayers; ++il) {
    ASSERT_TRUE(p.has_layer(il));
    EXPECT_EQ(p.layers[size_t(il)].n_ff, kFf);
    EXPECT_EQ(std::memcmp(p.layers[size_t(il)].a, predictor_->a[size_t(il)].data(), kRank * kEmbd * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(p.layers[size_t(il)].b, predictor_->b[size_t(il)].data(), kFf * kRank * sizeof(float)), 0);
    // Each neuron's activation frequency over the calibration tokens: read back as written, each
    // in [0, 1], some neurons active and none always (a ReLU model on text).
    ASSERT_NE(p.layers[size_t(il)].freq, nullptr);
    ASSERT_EQ(predictor_->freq[size_t(il)].size(), size_t(kFf));
    EXPECT_EQ(std::memcmp(p.layers[size_t(il)].freq, predictor_->freq[size_t(il)].data(), kFf * sizeof(float)), 0);
    const float* f = p.layers[size_t(il)].freq;
    EXPECT_GT(*std::max_element(f, f + kFf), 0.0f);
    EXPECT_LT(*std::min_element(f, f + kFf), 1.0f);
    for (int64_t j = 0; j < kFf; ++j) {
      EXPECT_GE(f[j], 0.0f);
      EXPECT_LE(f[j], 1.0f);
    }
  }
  // The output's gates are the model's: it is its own model.
  EXPECT_NO_THROW(read_ffn_predictor(out, out));
}

TEST_F(FfnPredictorTest, StoredPredictorKeepsTheAskedRecallOnHeldOutTokens) {
  const GgufFile out = GgufFile::open(file("pred.gguf"));
  const FfnPredictor p = read_ffn_predictor(out, **model_);
  Recorded recorded;
  const Recorded* rec = &recorded;
  const CalibRun run = run_calibration_text(*model_, options(1).calib, [&](ThreadPool&, int64_t) {
    return std::make_unique<Recorder>(recorded);
  });
  ASSERT_EQ(predictor_->report.layers.size(), size_t(kLayers));
  for (int64_t il = 0; il < kLayers; ++il) {
    const FfnPredictorLayer& l = p.layers[size_t(il)];
    ASSERT_EQ(int64_t(rec->x[size_t(il)].size()), run.n_tokens * kEmbd);
    int64_t truly = 0, hit = 0, predicted = 0, cells = 0;
    for (int64_t t = 9; t < run.n_tokens; t += 10) {  // every 10th token is held out
      const float* x = rec->x[size_t(il)].data() + t * kEmbd;
      std::vector<float> h(static_cast<size_t>(kRank), 0.0f);
      for (int64_t q = 0; q < kRank; ++q)
        for (int64_t i = 0; i < kEmbd; ++i) h[size_t(q)] += l.a[q * kEmbd + i] * x[i];
      for (int64_t j = 0; j < kFf; ++j) {
        float score = 0;
        for (int64_t q = 0; q < kRank; ++q) score += l.b[j * kRank + q] * h[size_t(q)];
        const bool on = score > p.threshold[size_t(il)];
        const bool active = rec->act[size_t(il)][size_t(t * kFf + j)] != 0.0f;
        truly += active;
        predicted += on;
        hit += on && active;
        ++cells;
      }
    }
    ASSERT_GT(truly, 0) << "layer " << il;
    const double recall = double(hit) / double(truly);
    // Sums in another order may move a score that sits on the threshold: one neuron of slack.
    EXPECT_GE(recall + 1.0 / double(truly), kRecall) << "layer " << il;
    EXPECT_GE(p.recall[size_t(il)], kRecall) << "layer " << il;
    EXPECT_NEAR(p.recall[size_t(il)], recall, 2.0 / double(truly)) << "layer " << il;
    const PredictorLayerReport& r = predictor_->report.layers[size_t(il)];
    EXPECT_NEAR(r.predicted_active, double(predicted) / double(cells), 2.0 / double(cells)) << "layer " << il;
    EXPECT_NEAR(r.true_active, double(truly) / double(cells), 1e-9) << "layer " << il;
    EXPECT_LT(r.loss, r.loss_init) << "layer " << il << ": training did not lower the held-out loss";
  }
}

TEST_F(FfnPredictorTest, SameResultForAnyThreadCount) {
  const TrainedPredictor two = train_ffn_predictor(*model_, options(2));
  EXPECT_EQ(two.a, predictor_->a);
  EXPECT_EQ(two.b, predictor_->b);
  EXPECT_EQ(two.threshold, predictor_->threshold);
}

TEST_F(FfnPredictorTest, PredictorOfAnotherModelIsRefused) {
  const GgufFile out = GgufFile::open(file("pred.gguf"));
  const GgufFile other = GgufFile::open(file("relu_other.gguf"));
  EXPECT_NE(ffn_gate_fingerprint(other), ffn_gate_fingerprint(out));
  const std::string e = error_of([&] { read_ffn_predictor(out, other); });
  EXPECT_NE(e.find("a predictor made for another model"), std::string::npos) << e;
  EXPECT_NE(e.find(kFfnPredictorModelKey), std::string::npos) << e;
  EXPECT_NE(e.find(ffn_gate_fingerprint(other)), std::string::npos) << e;
  // A model without a predictor says so.
  const std::string none = error_of([&] { read_ffn_predictor(other, other); });
  EXPECT_NE(none.find(kFfnPredictorRankKey), std::string::npos) << none;
}

TEST_F(FfnPredictorTest, WrongTensorShapeIsNamed) {
  const GgufFile out = GgufFile::open(file("pred.gguf"));
  GgufWriter w(3);
  w.copy_metadata(out);
  for (const GgufTensorInfo& t : out.tensors()) {
    if (t.name == ffn_pred_b_name(1))
      w.add_tensor(t.name, t.type, {kRank, kFf / 2}, t.data, t.n_bytes / 2);
    else
      w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  }
  w.write(file("bad_shape.gguf"));
  const GgufFile bad = GgufFile::open(file("bad_shape.gguf"));
  const std::string e = error_of([&] { read_ffn_predictor(bad, **model_); });
  EXPECT_NE(e.find("bad_shape.gguf"), std::string::npos) << e;
  EXPECT_NE(e.find("blk.1.ffn_pred_b.weight is f32 8 x 32, expected f32 8 x 64"), std::string::npos) << e;
}

TEST_F(FfnPredictorTest, SwigluModelIsRefused) {
  const std::string e =
      error_of([&] { train_ffn_predictor(open_model_file(file("silu.gguf")), options(1)); });
  EXPECT_NE(e.find("sparsity predictors need a ReLU-fied model (tern sparsify --relufy); this model's FFN is silu"),
            std::string::npos)
      << e;
}

TEST_F(FfnPredictorTest, CommandLineTrainsAndRefusesBadArguments) {
  const std::string base =
      "predictor train -m " + file("relu.gguf") + " --calib " + file("text.txt") + " --epochs 1 -t 1 ";
  const auto ok = run_tern(base + "--calib-tokens 300 --rank 4 --recall 0.99 --json -o " + file("cli.gguf"));
  ASSERT_EQ(ok.rc, 0) << ok.err;
  const nlohmann::json j = nlohmann::json::parse(ok.out);
  EXPECT_EQ(j["rank"], 4);
  ASSERT_EQ(j["layers"].size(), size_t(kLayers));
  for (const auto& l : j["layers"]) {
    EXPECT_GE(l["recall"].get<double>(), 0.99);
    EXPECT_GT(l["predictor_bytes"].get<int64_t>(), 0);
  }
  EXPECT_EQ(read_ffn_predictor(GgufFile::open(file("cli.gguf")), **model_).rank, 4);
  // eval runs the stored predictor over a text: the text it was trained on, all of it.
  const auto ev = run_tern("predictor eval -m " + file("cli.gguf") + " --text " + file("text.txt") +
                           " --tokens 300 -t 1 --json");
  ASSERT_EQ(ev.rc, 0) << ev.err;
  const nlohmann::json e = nlohmann::json::parse(ev.out);
  ASSERT_EQ(e["layers"].size(), size_t(kLayers));
  for (size_t il = 0; il < size_t(kLayers); ++il) {
    EXPECT_GT(e["layers"][il]["recall"].get<double>(), 0.9);
    EXPECT_NEAR(e["layers"][il]["threshold"].get<double>(), j["layers"][il]["threshold"].get<double>(), 1e-6);
  }
  const auto no_pred = run_tern("predictor eval -m " + file("relu.gguf") + " --text " + file("text.txt") + " --tokens 300");
  EXPECT_NE(no_pred.rc, 0);
  EXPECT_NE(no_pred.err.find("no sparsity predictor"), std::string::npos) << no_pred.err;

  const struct {
    std::string args, message;
  } bad[] = {
      {"--rank 0 -o " + file("x.gguf"), "--rank 0 must be at least 1"},
      {"--rank 33 -o " + file("x.gguf"), "--rank 33 is outside 1 .. n_embd 32"},
      {"--recall 0 -o " + file("x.gguf"), "--recall 0 is outside (0, 1]"},
      {"--recall 1.5 -o " + file("x.gguf"), "--recall 1.5 is outside (0, 1]"},
      {"-o " + file("relu.gguf"), "is the input file"},
      {"-o " + file("text.txt"), "is the input file"},
      {"--calib-tokens 100000 -o " + file("x.gguf"), "is too short"},
  };
  for (const auto& b : bad) {
    const auto r = run_tern(base + b.args);
    EXPECT_NE(r.rc, 0) << b.args;
    EXPECT_NE(r.err.find(b.message), std::string::npos) << b.args << ": " << r.err;
  }
  const auto silu = run_tern("predictor train -m " + file("silu.gguf") + " --calib " + file("text.txt") + " -o " +
                             file("x.gguf"));
  EXPECT_NE(silu.rc, 0);
  EXPECT_NE(silu.err.find("need a ReLU-fied model"), std::string::npos) << silu.err;
  EXPECT_FALSE(std::filesystem::exists(file("x.gguf")));
}

}  // namespace
}  // namespace tern
