// The K/V arena's quantized types hold llama.cpp's blocks byte for byte: rows of the quant-interop
// fixture's f16 source stored as K and V through KvStore::store equal llama-quantize's q8_0 / q4_0
// blocks of the same rows (what llama.cpp's cache holds for them: its set_rows quantizes each
// row with the same reference rule). load_k gives llama.cpp's dequantized values, store_k writes
// the same blocks as store, and copy_slots moves whole rows in every layer.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/fp16.h"
#include "gguf/gguf.h"
#include "kv/kv_store.h"
#include "quant/quant_traits.h"
#include "test_util.h"

namespace tern {
namespace {

using tern::testing::shared_path;

std::vector<float> f16_rows(const GgufTensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.n_elements()));
  const auto* h = reinterpret_cast<const uint16_t*>(t.data);
  for (size_t i = 0; i < out.size(); ++i) out[i] = fp16_to_f32(h[i]);
  return out;
}

class KvStoreInterop : public ::testing::TestWithParam<KvType> {};

TEST_P(KvStoreInterop, StoredRowsAreLlamaQuantizeBlocks) {
  const KvType type = GetParam();
  const std::string name = kv_type_name(type);
  TERN_REQUIRE_SHARED("quant-interop/small-f16src.gguf");
  TERN_REQUIRE_SHARED("quant-interop/small-" + name + ".gguf");
  const GgufFile src = GgufFile::open(shared_path("quant-interop/small-f16src.gguf"));
  const GgufFile ref = GgufFile::open(shared_path("quant-interop/small-" + name + ".gguf"));
  const QuantTraits& q = *quant_traits(kv_type_traits(type).dtype);
  int n_tensors = 0;
  int64_t n_rows_checked = 0;
  for (const auto& t : src.tensors()) {
    const GgufTensorInfo* rt = ref.find_tensor(t.name);
    if (!rt || rt->type != kv_type_traits(type).dtype || t.ne[0] % 32 != 0) continue;
    const int64_t row = t.ne[0], n_rows = std::min<int64_t>(t.n_rows(), 64);
    const int64_t rb = kv_row_bytes(type, row);
    const std::vector<float> x = f16_rows(t);
    // Two layers of this row size; the rows go in reversed slots (a paged cache's scatter).
    KvStore kv({row, row}, n_rows, type);
    for (int64_t r = 0; r < n_rows; ++r) {
      const float* xr = x.data() + r * row;
      kv.store(1, n_rows - 1 - r, 0, xr, xr, row);
    }
    for (int64_t r = 0; r < n_rows; ++r) {
      const uint8_t* want = rt->data + r * rb;
      const int64_t slot = n_rows - 1 - r;
      const auto* k = static_cast<const uint8_t*>(kv.k(1)) + slot * rb;
      const auto* v = static_cast<const uint8_t*>(kv.v(1)) + slot * rb;
      ASSERT_EQ(std::memcmp(k, want, size_t(rb)), 0) << t.name << " row " << r << " (K)";
      ASSERT_EQ(std::memcmp(v, want, size_t(rb)), 0) << t.name << " row " << r << " (V)";
      // load_k: llama.cpp's dequantized values of those blocks.
      std::vector<float> got(static_cast<size_t>(row)), deq(static_cast<size_t>(row));
      kv.load_k(1, slot, got.data());
      q.to_float(want, deq.data(), row);
      ASSERT_EQ(std::memcmp(got.data(), deq.data(), got.size() * sizeof(float)), 0) << t.name << " row " << r;
      ++n_rows_checked;
    }
    // store_k writes K alone, the same blocks; copy_slots copies K and V of every layer.
    kv.store_k(0, 0, x.data());
    EXPECT_EQ(std::memcmp(kv.k(0), rt->data, size_t(rb)), 0) << t.name;
    kv.copy_slots(n_rows - 1, 1, 1);  // row 0's blocks (in slot n_rows - 1) to slot 1
    EXPECT_EQ(std::memcmp(static_cast<const uint8_t*>(kv.v(1)) + rb, rt->data, size_t(rb)), 0) << t.name;
    ++n_tensors;
  }
  EXPECT_GE(n_tensors, 3);
  EXPECT_GT(n_rows_checked, 100);
  EXPECT_EQ(KvStore::bytes_per_token(std::vector<int64_t>{64, 128}, type), 2 * kv_row_bytes(type, 192));
}

INSTANTIATE_TEST_SUITE_P(Types, KvStoreInterop, ::testing::Values(KvType::Q8_0, KvType::Q4_0),
                         [](const auto& info) { return std::string(kv_type_name(info.param)); });

}  // namespace
}  // namespace tern
