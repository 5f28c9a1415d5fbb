// Mamba-2's chunked ("SSD") scan in the models (models/ssm2_block.h): a prompt of 300 tokens in
// one step (the chunked form: 4 chunks of 64 and a tail of 44) against the same prompt token by
// token (the recurrence), for mamba2-tiny, mamba2-130m (tern synth's shape, f16 weights) and
// granitehybrid-tiny (Mamba-2 and attention layers): every position's logits within 1e-4 of the
// row's largest logit, the same argmax at every position, and the same greedy continuation
// from the state each leaves. TERN_SSM_SCAN=recurrent gives the same bits both ways (the
// recurrence everywhere), and its one-step logits are not those of the chunked form (so the
// default did take it); an unknown TERN_SSM_SCAN is refused at load.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "models/model.h"
#include "models/synth.h"

namespace tern {
namespace {

// TERN_SSM_SCAN set (or unset: nullptr) for the guard's lifetime.
class ScanEnv {
 public:
  explicit ScanEnv(const char* v) {
    if (const char* old = std::getenv("TERN_SSM_SCAN")) old_ = old, had_ = true;
    if (v) setenv("TERN_SSM_SCAN", v, 1);
    else unsetenv("TERN_SSM_SCAN");
  }
  ~ScanEnv() {
    if (had_) setenv("TERN_SSM_SCAN", old_.c_str(), 1);
    else unsetenv("TERN_SSM_SCAN");
  }

 private:
  std::string old_;
  bool had_ = false;
};

struct SynthFile {
  std::string path;
  SynthFile(const std::string& shape, DType type) {
    path = ::testing::TempDir() + "tern_ssm2_chunked_" + shape + "_" + std::to_string(::getpid()) + ".gguf";
    SynthOptions o;
    o.shape = shape;
    o.type = type;
    synth_model(o, path);
  }
  ~SynthFile() { std::remove(path.c_str()); }
};

struct PromptRun {
  std::vector<float> logits;   // [n_prompt][V]
  std::vector<int32_t> greedy; // the greedy continuation
};

// The prompt fed in steps of `step` tokens (all logits), then n_gen greedy tokens one at a time.
PromptRun run_prompt(const std::shared_ptr<const GgufFile>& file, const std::vector<int32_t>& ids, int64_t step,
                     int n_gen) {
  std::unique_ptr<Model> model = load_model(file);
  const HParams& hp = model->hparams();
  const int64_t V = hp.n_vocab, n = int64_t(ids.size());
  model->reserve(step);
  ThreadPool pool(2);
  KvStore kv = make_kv_store(hp, n + n_gen + 1, KvType::F32, 1);
  std::vector<int32_t> slots(size_t(n + n_gen + 1));
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = int32_t(i);
  PromptRun r;
  std::vector<int32_t> all = ids;
  auto forward = [&](int64_t p, int64_t m, bool all_logits, float* out) {
    SeqBatch s;
    s.n_past = p;
    s.tokens = std::span<const int32_t>(all.data() + p, size_t(m));
    s.slots = std::span<const int32_t>(slots.data(), size_t(p + m));
    s.all_logits = all_logits;
    s.state_slot = 0;
    model->forward(std::span<const SeqBatch>(&s, 1), kv, out, pool);
  };
  r.logits.resize(size_t(n * V));
  for (int64_t p = 0; p < n; p += step) forward(p, std::min(step, n - p), true, r.logits.data() + p * V);
  std::vector<float> last(r.logits.end() - V, r.logits.end());
  for (int i = 0; i < n_gen; ++i) {
    const int32_t next = int32_t(std::max_element(last.begin(), last.end()) - last.begin());
    r.greedy.push_back(next);
    all.push_back(next);
    forward(n + i, 1, false, last.data());
  }
  return r;
}

int64_t argmax(const float* row, int64_t V) { return std::max_element(row, row + V) - row; }

void expect_close(const PromptRun& got, const PromptRun& want, int64_t V, const std::string& what) {
  ASSERT_EQ(got.logits.size(), want.logits.size());
  const int64_t n = int64_t(want.logits.size()) / V;
  double worst = 0.0;
  int64_t worst_at = -1;
  for (int64_t t = 0; t < n; ++t) {
    const float* a = got.logits.data() + t * V;
    const float* b = want.logits.data() + t * V;
    float scale = 0.0f, err = 0.0f;
    for (int64_t v = 0; v < V; ++v) {
      ASSERT_TRUE(std::isfinite(a[v])) << what << " position " << t;
      scale = std::max(scale, std::fabs(b[v]));
      err = std::max(err, std::fabs(a[v] - b[v]));
    }
    if (double(err) / scale > worst) worst = double(err) / scale, worst_at = t;
    EXPECT_EQ(argmax(a, V), argmax(b, V)) << what << " position " << t;
  }
  EXPECT_LE(worst, 1e-4) << what << ": at position " << worst_at;
  std::printf("[ info ] %s: logits max |diff| / row max %.2e (position %lld)\n", what.c_str(), worst,
              static_cast<long long>(worst_at));
  EXPECT_EQ(got.greedy, want.greedy) << what;
}

std::vector<int32_t> prompt(int64_t n, int64_t V) {
  std::vector<int32_t> ids = {1};
  for (int64_t i = 1; i < n; ++i) ids.push_back(int32_t(3 + (i * 37 + 11) % (V - 3)));
  return ids;
}

struct ShapeCase {
  const char* shape;
  DType type;
  bool check_bits;  // the TERN_SSM_SCAN=recurrent bit-equality (the tiny shapes: f32 matmuls)
};

class Ssm2ChunkedPrefill : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(Ssm2ChunkedPrefill, OneStepEqualsTokenByToken) {
  const ShapeCase& c = GetParam();
#if defined(__SANITIZE_ADDRESS__)
  // The sanitizer build (-O0): 130M parameters decoded token by token would take minutes there;
  // the tiny shapes run the same code.
  if (!c.check_bits) GTEST_SKIP() << c.shape << " is left to the release build";
#endif
  SynthFile synth(c.shape, c.type);
  auto file = std::make_shared<const GgufFile>(GgufFile::open(synth.path));
  const int64_t V = load_model(file)->hparams().n_vocab;
  const std::vector<int32_t> ids = prompt(300, V);
  const int n_gen = 16;
  PromptRun whole, single;
  {
    ScanEnv env(nullptr);  // the default: chunked for the 300-token step, recurrent for 1
    whole = run_prompt(file, ids, 300, n_gen);
    single = run_prompt(file, ids, 1, n_gen);
    expect_close(whole, single, V, std::string(c.shape) + " one step vs token by token");
    // Steps of 100 (chunked, each from the state the last left).
    expect_close(run_prompt(file, ids, 100, n_gen), single, V,
                 std::string(c.shape) + " steps of 100 vs token by token");
  }
  if (c.check_bits) {
    ScanEnv env("recurrent");
    const PromptRun rec_whole = run_prompt(file, ids, 300, n_gen), rec_single = run_prompt(file, ids, 1, n_gen);
    EXPECT_EQ(rec_whole.logits, rec_single.logits) << "TERN_SSM_SCAN=recurrent: the same bits";
    EXPECT_EQ(rec_whole.greedy, rec_single.greedy);
    EXPECT_EQ(rec_single.logits, single.logits) << "decode is the recurrence under either setting";
    EXPECT_NE(rec_whole.logits, whole.logits) << "the default prefill should take the chunked form";
    ScanEnv env2("chunked");  // every step chunked, decode too
    expect_close(run_prompt(file, ids, 1, n_gen), single, V,
                 std::string(c.shape) + " TERN_SSM_SCAN=chunked token by token");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Ssm2ChunkedPrefill,
                         ::testing::Values(ShapeCase{"mamba2-tiny", DType::F32, true},
                                           ShapeCase{"granitehybrid-tiny", DType::F32, true},
                                           ShapeCase{"mamba2-130m", DType::F16, false}),
                         [](const auto& info) {
                           std::string n = info.param.shape;
                           std::replace(n.begin(), n.end(), '-', '_');
                           std::replace(n.begin(), n.end(), '.', '_');
                           return n;
                         });

TEST(Ssm2ChunkedPrefillErrors, AnUnknownScanIsRefused) {
  SynthFile synth("mamba2-tiny", DType::F32);
  auto file = std::make_shared<const GgufFile>(GgufFile::open(synth.path));
  ScanEnv env("ssd");
  try {
    load_model(file);
    ADD_FAILURE() << "TERN_SSM_SCAN=ssd accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TERN_SSM_SCAN=ssd: expected recurrent, chunked or auto"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tern
