// A model file whose hyper-parameters, tensor shapes or tensor types do not fit is refused
// with an error that names the tensor or key, never a crash.
#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"
#include "models/model.h"
#include "test_util.h"

namespace tern {
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
    w.set("general.architecture", GgufValue::string("mamba"));
  });
  EXPECT_NE(e.find("unsupported architecture 'mamba'"), std::string::npos) << e;
}

TEST_F(ModelErrors, BadRopeDimension) {
  const std::string e = load_error([](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    w.set("llama.rope.dimension_count", GgufValue::u32(9));
  });
  EXPECT_NE(e.find("rope.dimension_count 9"), std::string::npos) << e;
}

}  // namespace
}  // namespace tern
