// A model file whose hyper-parameters, tensor shapes or tensor types do not fit is refused
// with an error that names the tensor or key, never a crash.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <tuple>

#include "core/error.h"
#include "models/model.h"
#include "test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_model_errors {
namespace {

using tern::testing::shared_path;

// Rebuilds stories260K in memory after `edit` changed the writer, then loads it.
std::unique_ptr<Model> load_edited(const std::function<void(const GgufFile&, GgufWriter&)>& edit) {
  auto src = std::make_shared<GgufFile>(GgufFile::open(shared_path("models/stories260K.gguf")));
  GgufWriter w(3);
  edit(*src, w);
  auto bytes = std::make_shared<std::vector<uint8_t>>(w.to_bytes());
  auto file = std::make_shared<const GgufFile>(GgufFile::parse(bytes, bytes->data(), bytes->size(), "edited.gguf"));
  return load_model(file);
}

void copy_all(const GgufFile& src, GgufWriter& w, const std::string& skip_key = "", const std::string& skip_tensor = "") {
  for (const auto& [k, v] : src.metadata())
    if (k != skip_key) w.set(k, v);
  for (const auto& t : src.tensors())
    if (t.name != skip_tensor) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
}

std::string load_error(const std::function<void(const GgufFile&, GgufWriter&)>& edit) {
  try {
    load_edited(edit);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

class ModelErrors : public ::testing::Test {
 protected:
  void SetUp() override { TERN_REQUIRE_SHARED("models/stories260K.gguf"); }
};

TEST_F(ModelErrors, UnmodifiedLoads) {
  EXPECT_NE(load_edited([](const GgufFile& s, GgufWriter& w) { copy_all(s, w); }), nullptr);
}

TEST_F(ModelErrors, MissingRequiredKey) {
  const std::string e = load_error([](const GgufFile& s, GgufWriter& w) { copy_all(s, w, "llama.block_count"); });
  EXPECT_NE(e.find("missing required key llama.block_count"), std::string::npos) << e;
}

TEST_F(ModelErrors, MissingTensor) {
  const std::string e = load_error([](const GgufFile& s, GgufWriter& w) { copy_all(s, w, "", "blk.3.ffn_up.weight"); });
  EXPECT_NE(e.find("missing tensor blk.3.ffn_up.weight"), std::string::npos) << e;
}

TEST_F(ModelErrors, ShapeDisagreesWithHyperParameters) {
  // Claim 8 KV heads: attn_k (64 x 32) no longer fits.
  const std::string e = load_error([](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    w.set("llama.attention.head_count_kv", GgufValue::u32(8));
  });
  EXPECT_NE(e.find("loading blk.0.attn_k.weight: expected 64 x 64, file has 64 x 32"), std::string::npos) << e;
}

TEST_F(ModelErrors, HeadCountMustDivideEmbedding) {
  const std::string e = load_error([](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    w.set("llama.attention.head_count", GgufValue::u32(7));
  });
  EXPECT_NE(e.find("head_count 7 does not divide"), std::string::npos) << e;
}

TEST_F(ModelErrors, UnsupportedTensorType) {
  // iq4_nl is a valid GGUF type (block 32, 18 bytes) that tern has no kernels for.
  static std::vector<uint8_t> zeros(64 / 32 * 18 * 64, 0);
  const std::string e = load_error([](const GgufFile& s, GgufWriter& w) {
    for (const auto& [k, v] : s.metadata()) w.set(k, v);
    for (const auto& t : s.tensors()) {
      if (t.name == "blk.0.attn_q.weight")
        w.add_tensor(t.name, DType::IQ4_NL, t.ne, zeros.data(), zeros.size());
      else
        w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
    }
  });
  EXPECT_NE(e.find("unsupported tensor type iq4_nl in tensor blk.0.attn_q.weight"), std::string::npos) << e;
}

TEST_F(ModelErrors, NormMustBeF32) {
  static std::vector<uint16_t> half(64, 0x3C00);
  const std::string e = load_error([](const GgufFile& s, GgufWriter& w) {
    for (const auto& [k, v] : s.metadata()) w.set(k, v);
    for (const auto& t : s.tensors()) {
      if (t.name == "output_norm.weight")
        w.add_tensor(t.name, DType::F16, t.ne, half.data(), half.size() * 2);
      else
        w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
    }
  });
  EXPECT_NE(e.find("output_norm.weight: norm weights must be f32"), std::string::npos) << e;
}

TEST_F(ModelErrors, UnknownArchitecture) {
  const std::string e = load_error([](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    w.set("general.architecture", GgufValue::string("rwkv6qwen2"));  // (rwkv6 and rwkv7 are supported)
  });
  EXPECT_NE(e.find("unsupported architecture 'rwkv6qwen2'"), std::string::npos) << e;
}

TEST_F(ModelErrors, BadRopeDimension) {
  const std::string e = load_error([](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    w.set("llama.rope.dimension_count", GgufValue::u32(9));
  });
  EXPECT_NE(e.find("rope.dimension_count 9"), std::string::npos) << e;
}

// Non-finite weights turn every logit into NaN (and greedy decoding into token 0 forever):
// refused at load, naming the file, the tensor, its type and shape. Float tensors are scanned
// whole; quantized ones by their block scales.
std::string load_error_with(const std::string& name, DType type, const std::vector<uint8_t>& bytes) {
  return load_error([&](const GgufFile& s, GgufWriter& w) {
    for (const auto& [k, v] : s.metadata()) w.set(k, v);
    for (const auto& t : s.tensors()) {
      if (t.name == name)
        w.add_tensor(t.name, type, t.ne, bytes.data(), bytes.size());
      else
        w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
    }
  });
}

TEST_F(ModelErrors, NonFiniteFloatWeightsAreRefused) {
  const GgufFile src = GgufFile::open(shared_path("models/stories260K.gguf"));
  const GgufTensorInfo& gate = *src.find_tensor("blk.0.ffn_gate.weight");  // f32, 64 x 172
  std::vector<uint8_t> f32(gate.data, gate.data + gate.n_bytes);
  const float nan = std::nanf("");
  std::memcpy(f32.data() + 4 * 130, &nan, 4);
  std::string e = load_error_with(gate.name, DType::F32, f32);
  EXPECT_NE(e.find("edited.gguf: tensor blk.0.ffn_gate.weight (f32, 64 x 172) holds a non-finite value (NaN or Inf) "
                   "at element 130 (row 2, column 2)"),
            std::string::npos)
      << e;
  // F16 +Inf and BF16 NaN, in attn_q (64 x 64).
  std::vector<uint16_t> half(64 * 64, 0x3C00);
  half[64 * 5 + 1] = 0x7C00;
  std::vector<uint8_t> bytes(half.size() * 2);
  std::memcpy(bytes.data(), half.data(), bytes.size());
  e = load_error_with("blk.0.attn_q.weight", DType::F16, bytes);
  EXPECT_NE(e.find("tensor blk.0.attn_q.weight (f16, 64 x 64) holds a non-finite value (NaN or Inf) at element 321"),
            std::string::npos)
      << e;
  std::fill(half.begin(), half.end(), uint16_t(0x3F80));
  half[4000] = 0x7FC0;
  std::memcpy(bytes.data(), half.data(), bytes.size());
  e = load_error_with("blk.0.attn_q.weight", DType::BF16, bytes);
  EXPECT_NE(e.find("(bf16, 64 x 64) holds a non-finite value"), std::string::npos) << e;
  // A norm (read as it is stored, never copied).
  const GgufTensorInfo& norm = *src.find_tensor("blk.3.ffn_norm.weight");
  std::vector<uint8_t> n(norm.data, norm.data + norm.n_bytes);
  const float inf = INFINITY;
  std::memcpy(n.data() + 4 * 63, &inf, 4);
  e = load_error_with(norm.name, DType::F32, n);
  EXPECT_NE(e.find("tensor blk.3.ffn_norm.weight (f32, 64) holds a non-finite value"), std::string::npos) << e;
}

TEST_F(ModelErrors, NonFiniteBlockScalesAreRefused) {
  // Q4_0 (18-byte blocks, d first) and Q4_1 (20-byte blocks, d then the offset m) of attn_k
  // (64 x 32): two blocks per row; zero quants with a finite d everywhere but one field.
  for (const auto& [type, block, field] : {std::tuple{DType::Q4_0, 18, 0}, std::tuple{DType::Q4_1, 20, 2}}) {
    std::vector<uint8_t> q(size_t(32 * 2 * block), 0);
    for (size_t b = 0; b < q.size(); b += size_t(block)) q[b + 1] = 0x3C;  // d = 1.0
    q[size_t(block * 9 + field)] = 0x00;
    q[size_t(block * 9 + field + 1)] = 0x7E;  // NaN
    const std::string e = load_error_with("blk.4.attn_k.weight", type, q);
    EXPECT_NE(e.find(std::string("tensor blk.4.attn_k.weight (") + dtype_name(type) +
                     ", 64 x 32) holds a non-finite value (NaN or Inf) in the scale of block 9 (row 4)"),
              std::string::npos)
        << e;
  }
}

}  // namespace
}  // namespace tern::test_model_errors
