// Reading then writing a GGUF must reproduce it byte for byte: for every fixture file (written
// by llama.cpp's own tools) and for files tern builds itself.
#include <gtest/gtest.h>

#include <filesystem>

#include "gguf_test_util.h"

namespace tern::test {
namespace {

std::vector<std::string> fixture_ggufs() {
  std::vector<std::string> out;
  for (const char* dir : {"models", "quant-interop", "tokenizer/llama.cpp-vocab"}) {
    const std::filesystem::path p = shared_path(dir);
    std::error_code ec;
    if (!std::filesystem::is_directory(p, ec)) continue;
    for (const auto& e : std::filesystem::directory_iterator(p, ec))
      if (e.is_regular_file() && e.path().extension() == ".gguf") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Index of the first differing byte, or -1.
int64_t first_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return int64_t(i);
  return a.size() == b.size() ? -1 : int64_t(n);
}

TEST(GgufRoundTrip, EveryFixtureFileIsReproducedByteForByte) {
  const std::string model = shared_path("models/stories260K.gguf");
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "missing " << model;
  const auto files = fixture_ggufs();
  // models (2) + quant-interop (9) + llama.cpp vocab (2): a shrinking fixture set is a bug.
  EXPECT_GE(files.size(), 13u);
  for (const auto& path : files) {
    SCOPED_TRACE(path);
    const GgufFile f = GgufFile::open(path);
    const std::vector<uint8_t> written = GgufWriter::from_file(f).to_bytes();
    const std::vector<uint8_t> original = read_bytes(path);
    EXPECT_EQ(written.size(), original.size());
    EXPECT_EQ(first_difference(written, original), -1) << "first differing byte";
  }
}

TEST(GgufRoundTrip, ReparsedFileHasTheSameContent) {
  const std::string path = shared_path("quant-interop/small-q4_k.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "missing " << path;
  const GgufFile f = GgufFile::open(path);
  const std::vector<uint8_t> bytes = GgufWriter::from_file(f).to_bytes();
  const GgufFile g = parse_bytes(bytes);
  ASSERT_EQ(g.metadata().size(), f.metadata().size());
  for (size_t i = 0; i < f.metadata().size(); ++i) {
    EXPECT_EQ(g.metadata()[i].first, f.metadata()[i].first);
    EXPECT_EQ(g.metadata()[i].second.to_display(1u << 20), f.metadata()[i].second.to_display(1u << 20));
  }
  ASSERT_EQ(g.tensors().size(), f.tensors().size());
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const auto &a = f.tensors()[i], &b = g.tensors()[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.type, b.type);
    EXPECT_EQ(a.ne, b.ne);
    EXPECT_EQ(a.offset, b.offset);
    ASSERT_EQ(a.n_bytes, b.n_bytes);
    EXPECT_EQ(std::memcmp(a.data, b.data, a.n_bytes), 0) << a.name;
  }
}

TEST(GgufRoundTrip, SmallWrittenFileParsesWithEveryValue) {
  const std::vector<uint8_t> bytes = small_file_bytes();
  const GgufFile f = parse_bytes(bytes);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get("test.u8").as_uint(), 200u);
  EXPECT_EQ(f.get("test.i8").as_int(), -5);
  EXPECT_EQ(f.get("test.u16").as_uint(), 60000u);
  EXPECT_EQ(f.get("test.i16").as_int(), -30000);
  EXPECT_EQ(f.get_uint("test.u32"), 123456u);
  EXPECT_EQ(f.get("test.i32").as_int(), -123456);
  EXPECT_EQ(f.get_float("test.f32", 0), 0.25);
  EXPECT_TRUE(f.get("test.bool").as_bool());
  EXPECT_EQ(f.get_uint("test.u64"), 1ull << 40);
  EXPECT_EQ(f.get("test.i64").as_int(), -(1ll << 40));
  EXPECT_EQ(f.get_float("test.f64", 0), 2.5);
  EXPECT_EQ(f.get_string("test.str"), "hello");
  EXPECT_EQ(f.get("test.arr").as_array().items.at(1).as_string(), "yz");
  EXPECT_EQ(f.get("test.nested").as_array().items.at(0).as_array().items.at(1).as_int(), 2);
  ASSERT_EQ(f.tensors().size(), 3u);
  const GgufTensorInfo* q = f.find_tensor("t.q");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, DType::Q8_0);
  EXPECT_EQ(q->n_bytes, 68u);
  EXPECT_EQ(q->offset % 32, 0u);
  EXPECT_EQ(q->data[0], 1);
  EXPECT_EQ(f.find_tensor("t.h")->shape_string(), "4");
  // and back again, byte for byte
  EXPECT_EQ(GgufWriter::from_file(f).to_bytes(), bytes);
}

TEST(GgufRoundTrip, WriteGoesThroughATempFileAndReopens) {
  TempDir dir;
  auto m = small_model();
  const std::string path = dir.file("small.gguf");
  m->writer.write(path);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(read_bytes(path), m->writer.to_bytes());
  EXPECT_EQ(f.tensors().size(), 3u);
  EXPECT_THROW(m->writer.write(dir.file("no/such/dir/x.gguf")), Error);
}

TEST(GgufWriterErrors, RejectsWhatTheReaderWouldReject) {
  std::vector<float> data(8);
  GgufWriter w;
  w.add_tensor("a", DType::F32, {8}, data.data(), 32);
  EXPECT_THROW(w.add_tensor("a", DType::F32, {8}, data.data(), 32), Error);                // duplicate
  EXPECT_THROW(w.add_tensor("b", DType::F32, {8}, data.data(), 16), Error);                // size
  EXPECT_THROW(w.add_tensor("c", DType::F32, {}, data.data(), 4), Error);                  // 0 dims
  EXPECT_THROW(w.add_tensor("d", DType::F32, {1, 1, 1, 1, 1}, data.data(), 4), Error);     // 5 dims
  EXPECT_THROW(w.add_tensor("e", DType::Q8_0, {16}, data.data(), 17), Error);              // block
  EXPECT_THROW(w.add_tensor("f", DType::F32, {-8}, data.data(), 32), Error);               // negative
  for (const GgufValue& bad : {GgufValue::u32(0), GgufValue::u32(3), GgufValue::u64(32)}) {
    GgufWriter v;
    v.set("general.alignment", bad);
    try {
      (void)v.to_bytes();
      ADD_FAILURE() << "alignment " << bad.to_display() << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("general.alignment"), std::string::npos) << e.what();
    }
  }
  GgufWriter mixed;
  mixed.set("k", GgufValue::array(GgufType::U8, {GgufValue::u32(1)}));
  EXPECT_THROW((void)mixed.to_bytes(), Error);
}

TEST(GgufWriter, FreshOffsetsAreAlignedAndPacked) {
  std::vector<float> a(3), b(5);
  GgufWriter w;
  w.set("general.alignment", GgufValue::u32(64));
  w.add_tensor("a", DType::F32, {3}, a.data(), 12);
  w.add_tensor("b", DType::F32, {5}, b.data(), 20);
  const auto bytes = w.to_bytes();
  const GgufFile f = parse_bytes(bytes);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.tensors()[0].offset, 0u);
  EXPECT_EQ(f.tensors()[1].offset, 64u);
  EXPECT_EQ(bytes.size() % 64, 0u);  // padded after the last tensor too, as llama.cpp does
}

}  // namespace
}  // namespace tern::test
TEST(TensorLayerIndex, OnlyBlkNumberDotNames) {
  EXPECT_EQ(tern::tensor_layer_index("blk.0.attn_q.weight"), 0);
  EXPECT_EQ(tern::tensor_layer_index("blk.27.ffn_down_exps.weight"), 27);
  EXPECT_EQ(tern::tensor_layer_index("output.weight"), -1);
  EXPECT_EQ(tern::tensor_layer_index("blk.x.attn_q.weight"), -1);
  EXPECT_EQ(tern::tensor_layer_index("blk.12"), -1);
  EXPECT_EQ(tern::tensor_layer_index("blk..weight"), -1);
  EXPECT_EQ(tern::tensor_layer_index("blk.3a.weight"), -1);
}
