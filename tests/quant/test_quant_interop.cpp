// Format interoperability with llama.cpp, bit for bit, on the fixtures in
// ../shared/quant-interop (a small Llama quantized by llama-quantize --pure, and the same
// tensors dequantized by ggml itself):
//  - tern's dequantizers reproduce ggml's f32 values exactly (and the published sha256);
//  - tern's Q8_0/Q4_0 quantizers reproduce llama-quantize's blocks byte for byte from the F16
//    source; the K-quant quantizers follow llama.cpp's reference algorithm and are checked
//    for byte identity too.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "quant/quant_traits.h"
#include "quant/sha256.h"
#include "test_util.h"

namespace tern {
namespace {

using testing::shared_path;

std::vector<float> dequantize_tensor(const GgufTensorInfo& t) {
  const QuantTraits& q = require_quant_traits(t.type, t.name.c_str());
  std::vector<float> out(size_t(t.n_elements()));
  q.to_float(t.data, out.data(), t.n_elements());
  return out;
}

class DequantInterop : public ::testing::TestWithParam<const char*> {};

TEST_P(DequantInterop, MatchesGgmlBitForBit) {
  const std::string type = GetParam();
  const std::string qrel = "quant-interop/small-" + type + ".gguf";
  const std::string drel = "quant-interop/small-" + type + ".ggml-dequant.gguf";
  const std::string jrel = "quant-interop/dequant-reference.json";
  TERN_REQUIRE_SHARED(qrel);
  TERN_REQUIRE_SHARED(drel);
  TERN_REQUIRE_SHARED(jrel);
  const GgufFile qf = GgufFile::open(shared_path(qrel));
  const GgufFile df = GgufFile::open(shared_path(drel));
  std::ifstream js(shared_path(jrel));
  const nlohmann::json ref = nlohmann::json::parse(js);
  const auto& ref_file = ref.at("small-" + type + ".gguf");

  const DType want = *dtype_from_name(type);
  int n_quantized = 0;
  for (const auto& t : qf.tensors()) {
    SCOPED_TRACE(t.name);
    if (t.ne.size() == 2) {  // --pure: every matrix in the target type
      EXPECT_EQ(t.type, want);
      ++n_quantized;
    }
    const std::vector<float> ours = dequantize_tensor(t);
    const auto& bytes_ref = ref_file.at(t.name);
    EXPECT_EQ(dtype_from_name(bytes_ref.at("type").get<std::string>()), t.type) << "type mismatch";
    EXPECT_EQ(testing::sha256_hex(ours.data(), ours.size() * 4),
              bytes_ref.at("sha256_f32le").get<std::string>());

    const GgufTensorInfo* d = df.find_tensor(t.name);
    ASSERT_NE(d, nullptr);
    ASSERT_EQ(d->type, DType::F32);
    ASSERT_EQ(d->n_bytes, ours.size() * 4);
    const auto* theirs = reinterpret_cast<const float*>(d->data);
    size_t n_diff = 0, first = 0;
    for (size_t i = 0; i < ours.size(); ++i)
      if (std::memcmp(&ours[i], &theirs[i], 4) != 0 && n_diff++ == 0) first = i;
    EXPECT_EQ(n_diff, 0u) << "first difference at " << first << ": tern " << ours[first]
                          << " ggml " << theirs[first];
  }
  EXPECT_EQ(n_quantized, 9);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DequantInterop,
                         ::testing::Values("q8_0", "q4_0", "q4_k", "q6_k"));

// Quantizes every matrix of the F16 source into `type` and compares with llama-quantize's
// blocks. Returns the number of tensors compared and of tensors with any differing byte.
struct QuantizeResult {
  int n_tensors = 0;
  int n_tensors_differ = 0;
  int64_t n_blocks = 0;
  int64_t n_blocks_differ = 0;
};

QuantizeResult quantize_and_compare(const std::string& type) {
  QuantizeResult r;
  const GgufFile src = GgufFile::open(shared_path("quant-interop/small-f16src.gguf"));
  const GgufFile ref = GgufFile::open(shared_path("quant-interop/small-" + type + ".gguf"));
  const DType want = *dtype_from_name(type);
  const QuantTraits& q = *quant_traits(want);
  for (const auto& t : src.tensors()) {
    const GgufTensorInfo* rt = ref.find_tensor(t.name);
    EXPECT_NE(rt, nullptr) << t.name;
    if (!rt || rt->type != want) continue;
    EXPECT_EQ(t.type, DType::F16) << t.name;
    std::vector<float> f32 = dequantize_tensor(t);  // exact: f16 -> f32
    std::vector<uint8_t> ours(size_t(dtype_row_bytes(want, t.ne[0]) * t.n_rows()));
    EXPECT_EQ(ours.size(), rt->n_bytes) << t.name;
    if (ours.size() != rt->n_bytes) continue;
    // Row by row, as llama-quantize does (a block never straddles rows anyway).
    const int64_t rb = dtype_row_bytes(want, t.ne[0]);
    for (int64_t row = 0; row < t.n_rows(); ++row)
      q.from_float(f32.data() + row * t.ne[0], ours.data() + row * rb, t.ne[0]);
    ++r.n_tensors;
    bool differ = false;
    for (size_t off = 0; off < ours.size(); off += size_t(q.block_bytes)) {
      ++r.n_blocks;
      if (std::memcmp(ours.data() + off, rt->data + off, size_t(q.block_bytes)) != 0) {
        ++r.n_blocks_differ;
        differ = true;
      }
    }
    r.n_tensors_differ += differ;
  }
  return r;
}

class QuantizeInterop : public ::testing::TestWithParam<const char*> {};

TEST_P(QuantizeInterop, ReproducesLlamaQuantizeBlocks) {
  const std::string type = GetParam();
  TERN_REQUIRE_SHARED("quant-interop/small-f16src.gguf");
  TERN_REQUIRE_SHARED("quant-interop/small-" + type + ".gguf");
  const QuantizeResult r = quantize_and_compare(type);
  EXPECT_EQ(r.n_tensors, 9);
  EXPECT_GT(r.n_blocks, 0);
  EXPECT_EQ(r.n_blocks_differ, 0) << r.n_tensors_differ << " of " << r.n_tensors
                                  << " tensors differ";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantizeInterop,
                         ::testing::Values("q8_0", "q4_0", "q4_k", "q6_k"));

}  // namespace
}  // namespace tern
