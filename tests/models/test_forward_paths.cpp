// The execution paths of the Llama forward pass give the same bits: one pool region per
// operation (1 thread, or big steps), one region per pass in phases (small models, steps of at
// most 8 tokens, 2+ threads: forward_spmd), and the calling thread alone (small models, when
// timing finds it faster). Checked on stories260K (f32) and synthetic
// stories260K-shape models in f16, q8_0 and q4_0, over ragged multi-sequence steps with
// scattered KV slots, with 2, 3 and 4 threads (uneven shares, more threads than cores); with
// f32 K/V, and with f16 K/V on stories260K (the paths store K/V per head or per row).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#include "gguf/gguf.h"
#include "models/model.h"
#include "models/synth.h"
#include "test_util.h"

namespace tern {
namespace {

using tern::testing::shared_path;

std::string synth_path(DType type, const std::string& shape = "stories260k") {
  const std::string path =
      ::testing::TempDir() + "tern_paths_" + shape + "_" + dtype_name(type) + "_" + std::to_string(::getpid()) + ".gguf";
  SynthOptions o;
  o.shape = shape;
  o.type = type;
  synth_model(o, path);
  return path;
}

// Runs four steps of two sequences (prefill chunks, then decodes) and returns all logits.
std::vector<float> run_steps(const std::shared_ptr<const GgufFile>& file, int n_threads, KvType kv_type,
                             ForwardObserver* observer = nullptr) {
  auto model = load_model(file);
  model->set_observer(observer);
  model->reserve(16);
  const int64_t V = model->hparams().n_vocab;
  ThreadPool pool(n_threads);
  KvStore kv = make_kv_store(model->hparams(), 64, kv_type);
  const std::vector<int32_t> a = {1, 403, 407, 261, 378, 432, 20, 31};
  const std::vector<int32_t> b = {1, 300, 77, 5, 99, 12, 40, 41, 42};
  const std::vector<int32_t> slots_a = {40, 41, 42, 43, 8, 9, 10, 11, 12};
  const std::vector<int32_t> slots_b = {0, 1, 2, 3, 20, 21, 22, 23, 24};
  struct Step {
    int64_t past_a, n_a, past_b, n_b;
    bool all_b;
  };
  // The first step has 9 tokens: beyond forward_spmd, where small models choose between the
  // pooled path and this thread alone.
  const Step steps[] = {{0, 5, 0, 4, true}, {5, 1, 4, 3, false}, {6, 1, 7, 1, true}, {7, 1, 8, 1, false}};
  std::vector<float> out;
  for (const Step& st : steps) {
    SeqBatch s[2];
    s[0] = {st.past_a, std::span<const int32_t>(a.data() + st.past_a, size_t(st.n_a)),
            std::span<const int32_t>(slots_a.data(), size_t(st.past_a + st.n_a)), false};
    s[1] = {st.past_b, std::span<const int32_t>(b.data() + st.past_b, size_t(st.n_b)),
            std::span<const int32_t>(slots_b.data(), size_t(st.past_b + st.n_b)), st.all_b};
    const int64_t rows = 1 + (st.all_b ? st.n_b : 1);
    std::vector<float> logits(size_t(rows * V));
    model->forward(s, kv, logits.data(), pool);
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

// The first logit that differs in its bits, or a.size().
size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  return a.size();
}

void expect_same_bits(const std::shared_ptr<const GgufFile>& file, const char* what,
                      KvType kv_type = KvType::F32) {
  const std::vector<float> pooled = run_steps(file, 1, kv_type);
  // Every small step through forward_spmd and every larger one pooled (the model reads the
  // variable when it is loaded), then all on the calling thread, then the default, which
  // alternates the paths while it times them.
  for (const char* path : {"phased", "serial", "auto"})
  for (int n_threads : {2, 3, 4}) {
    ::setenv("TERN_SMALL_MODEL_PATH", path, 1);
    const std::vector<float> phased = run_steps(file, n_threads, kv_type);
    ::unsetenv("TERN_SMALL_MODEL_PATH");
    ASSERT_EQ(pooled.size(), phased.size());
    const size_t first_diff = first_difference(pooled, phased);
    EXPECT_EQ(first_diff, pooled.size()) << what << ", " << path << ", " << n_threads << " threads: logit " << first_diff
                                         << " differs: " << pooled[first_diff] << " vs " << phased[first_diff];
  }
}

TEST(ForwardPaths, PhasedPassEqualsPooledPassStories260K) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  expect_same_bits(open_model_file(shared_path("models/stories260K.gguf")), "stories260K f32");
}

TEST(ForwardPaths, PhasedPassEqualsPooledPassStories260KWithF16Kv) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  expect_same_bits(open_model_file(shared_path("models/stories260K.gguf")), "stories260K f32, f16 K/V", KvType::F16);
}

// q8_0 / q4_0 K/V (blocks spanning KV heads: the phased units give way to the pooled path and
// this thread alone, which must still agree).
TEST(ForwardPaths, PhasedPassEqualsPooledPassStories260KWithQuantizedKv) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  for (KvType kv_type : {KvType::Q8_0, KvType::Q4_0})
    expect_same_bits(open_model_file(shared_path("models/stories260K.gguf")), kv_type_name(kv_type), kv_type);
}

TEST(ForwardPaths, PhasedPassEqualsPooledPassSynthetic) {
  for (DType type : {DType::F16, DType::Q8_0, DType::Q4_0}) {
    const std::string path = synth_path(type);
    expect_same_bits(open_model_file(path), dtype_name(type));
    std::remove(path.c_str());
  }
}

// Every architecture's tiny shape: the phased pass implements the dense layers without
// post-norms (biases, q/k head norms, NeoX RoPE, rope_freqs, sliding windows, fused q/k/v and
// gate/up, GeGLU, soft-caps) with the pooled pass's bits; Gemma's post-norms and the experts
// take the pooled path in its place, with the same bits too. f32 and q8_0 weights.
TEST(ForwardPaths, PhasedPassEqualsPooledPassEveryArchitecture) {
  for (const char* shape : {"llama3-tiny", "qwen2-tiny", "qwen3-tiny", "phi3-tiny", "gemma2-tiny", "gemma3-tiny",
                            "mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny"})
    for (DType type : {DType::F32, DType::Q8_0}) {
      const std::string path = synth_path(type, shape);
      expect_same_bits(open_model_file(path), (std::string(shape) + " " + dtype_name(type)).c_str());
      std::remove(path.c_str());
    }
}

// A step of a few tokens runs its experts two regions a layer (experts_batched); with an observer
// of the linears' inputs each expert runs alone (experts_over_tokens), as longer steps do. Both
// give the same bits: the same token groups, rows and sums in expert order (shared experts,
// expert biases, every gate), on 1 and 2 threads (whose blocks of rows differ). The tiny shapes
// route each token to 2 experts, whose sum has one order; qwen3moe-tiny rewritten to route to 5
// of its 8 checks the order of longer sums.
TEST(ForwardPaths, BatchedExpertsEqualExpertsOneAtATime) {
  struct NoOp final : ForwardObserver {
    void on_linear_input(const std::string&, const float*, int64_t, int64_t) override {}
  } observer;
  for (const char* shape : {"mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny", "gpt-oss-tiny", "qwen3moe-tiny/5"})
    for (DType type : {DType::F32, DType::Q8_0}) {
      const std::string name = shape;
      const bool five = name == "qwen3moe-tiny/5";
      const std::string path = synth_path(type, five ? "qwen3moe-tiny" : name);
      if (five) {
        const auto src = open_model_file(path);
        GgufWriter w(3);
        for (const auto& [k, v] : src->metadata()) w.set(k, v);
        for (const auto& t : src->tensors()) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
        w.set("qwen3moe.expert_used_count", GgufValue::u32(5));
        GgufWriter::write_bytes(path, w.to_bytes());  // (the bytes are copied before the file is replaced)
      }
      const auto file = open_model_file(path);
      const std::vector<float> alone = run_steps(file, 2, KvType::F32, &observer);
      for (int n_threads : {1, 2}) {
        const std::vector<float> batched = run_steps(file, n_threads, KvType::F32);
        ASSERT_EQ(alone.size(), batched.size());
        const size_t d = first_difference(alone, batched);
        EXPECT_EQ(d, alone.size()) << shape << " " << dtype_name(type) << ", " << n_threads << " threads: logit " << d
                                   << " differs";
      }
      std::remove(path.c_str());
    }
}

}  // namespace
}  // namespace tern
