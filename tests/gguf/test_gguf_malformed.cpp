// Malformed GGUF files, generated from a small valid file by corrupting one field at a time:
// each must be a tern::Error whose message says what is wrong (never a crash, never a huge
// allocation). Then a deterministic random-mutation fuzz loop over the same file.
#include <gtest/gtest.h>

#include <filesystem>
#include <iterator>
#include <random>

#include "alloc_watch.h"
#include "gguf_test_util.h"

namespace tern::test {
namespace {

// Parses `bytes` and expects a tern::Error whose message contains every one of `needles`.
void expect_error(const std::vector<uint8_t>& bytes, std::initializer_list<const char*> needles) {
  try {
    (void)parse_bytes(bytes, "bad.gguf");
    ADD_FAILURE() << "malformed file accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("bad.gguf: ", 0), 0u) << "message must start with the file name: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "message must be one line: " << msg;
    for (const char* n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

std::vector<uint8_t> truncated(std::vector<uint8_t> b, size_t n) {
  b.resize(n);
  return b;
}

class GgufMalformed : public ::testing::Test {
 protected:
  void SetUp() override { good = small_file_bytes(); }
  std::vector<uint8_t> good;
};

TEST_F(GgufMalformed, BaseFileIsValid) { EXPECT_NO_THROW((void)parse_bytes(good)); }

TEST_F(GgufMalformed, MissingFile) {
  try {
    (void)GgufFile::open("/nonexistent/dir/model.gguf");
    ADD_FAILURE() << "missing file accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open /nonexistent/dir/model.gguf"), std::string::npos) << e.what();
  }
}

TEST_F(GgufMalformed, EmptyFileAndDirectory) {
  TempDir dir;
  const std::string p = dir.file("empty.gguf");
  write_bytes(p, {});
  try {
    (void)GgufFile::open(p);
    ADD_FAILURE() << "empty file accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a GGUF file (only 0 bytes)"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)GgufFile::open(dir.path()), Error);
  expect_error({}, {"not a GGUF file"});
}

TEST_F(GgufMalformed, WrongMagic) {
  auto b = good;
  b[0] = 'X';
  expect_error(b, {"not a GGUF file", "bad magic"});
  expect_error({'G', 'G', 'U'}, {"not a GGUF file"});
}

TEST_F(GgufMalformed, UnsupportedVersion) {
  for (uint32_t v : {0u, 1u, 4u, 0xFFFFFFFFu}) {
    auto b = good;
    poke<uint32_t>(b, kVersionAt, v);
    expect_error(b, {"unsupported GGUF version", std::to_string(v).c_str()});
  }
  auto b = good;
  poke<uint32_t>(b, kVersionAt, 0x03000000u);
  expect_error(b, {"unsupported GGUF version", "big-endian"});
  // version 2 has the same layout and is accepted
  poke<uint32_t>(b, kVersionAt, 2);
  EXPECT_EQ(parse_bytes(b).version(), 2u);
}

TEST_F(GgufMalformed, TruncatedHeader) {
  for (size_t n : {4u, 6u, 8u, 12u, 16u, 20u}) {
    SCOPED_TRACE(n);
    expect_error(truncated(good, n), {"truncated"});
  }
}

TEST_F(GgufMalformed, TruncatedInMetadata) {
  // Cut inside a key, inside a scalar value, inside a string value and inside an array.
  const size_t cuts[] = {string_start(good, "test.u32") + 3, after_string(good, "test.u32") + 5,
                         after_string(good, "test.str") + 4 + 8 + 2, after_string(good, "test.arr") + 4 + 8 + 3,
                         after_string(good, "test.nested") + 4 + 8 + 4 + 8 + 2};
  for (size_t n : cuts) {
    SCOPED_TRACE(n);
    expect_error(truncated(good, n), {"truncated"});
  }
}

TEST_F(GgufMalformed, TruncatedInTensorInfos) {
  const auto q = tensor_info_at(good, "t.q");
  for (size_t n : {string_start(good, "t.a") + 4, q.n_dims + 2, q.ne0 + 9, q.type + 1, q.offset + 7}) {
    SCOPED_TRACE(n);
    expect_error(truncated(good, n), {"truncated"});
  }
}

TEST_F(GgufMalformed, TruncatedInTensorData) {
  for (size_t cut : {1u, 20u, 40u}) {
    SCOPED_TRACE(cut);
    expect_error(truncated(good, good.size() - 32 + 8 - cut), {"extends past the end", "truncated tensor data"});
  }
  // Dropping the data section entirely names the first tensor that is missing.
  expect_error(truncated(good, parse_bytes(good).data_offset()), {"t.a", "extends past the end"});
}

TEST_F(GgufMalformed, HugeCounts) {
  for (uint64_t n : {uint64_t(1) << 20, uint64_t(1) << 40, ~uint64_t(0)}) {
    auto b = good;
    poke<uint64_t>(b, kKvCountAt, n);
    expect_error(b, {"metadata count", "larger than the rest of the file"});
    b = good;
    poke<uint64_t>(b, kTensorCountAt, n);
    expect_error(b, {"tensor count", "larger than the rest of the file"});
  }
  // A count that fits the bytes but not the content runs into the tensor infos and fails there.
  auto b = good;
  poke<uint64_t>(b, kKvCountAt, peek<uint64_t>(b, kKvCountAt) + 1);
  expect_error(b, {});
}

TEST_F(GgufMalformed, StringLengthLargerThanFile) {
  auto b = good;
  poke<uint64_t>(b, string_start(good, "test.str"), 1ull << 33);
  expect_error(b, {"string length 8589934592", "larger than the rest of the file"});
  b = good;
  poke<uint64_t>(b, after_string(good, "test.str") + 4, ~uint64_t(0));  // the value's length
  expect_error(b, {"string length", "test.str"});
  b = good;
  poke<uint64_t>(b, string_start(good, "t.q"), good.size());  // tensor name
  expect_error(b, {"string length", "tensor name"});
}

TEST_F(GgufMalformed, HugeArrayCount) {
  for (const char* key : {"test.arr", "test.nested"}) {
    auto b = good;
    poke<uint64_t>(b, after_string(good, key) + 4 + 4, uint64_t(1) << 50);
    expect_error(b, {"array count", key, "larger than the rest of the file"});
  }
}

TEST_F(GgufMalformed, NestedArrayTooDeep) {
  GgufValue v = GgufValue::array(GgufType::U8, {});
  for (int depth = 0; depth < 40; ++depth) v = GgufValue::array(GgufType::ARRAY, {v});
  GgufWriter w;
  w.set("deep", v);
  expect_error(w.to_bytes(), {"deep", "nested too deeply"});
  // 10 levels are fine
  GgufValue ok = GgufValue::array(GgufType::U8, {});
  for (int depth = 0; depth < 10; ++depth) ok = GgufValue::array(GgufType::ARRAY, {ok});
  GgufWriter w2;
  w2.set("ok", ok);
  EXPECT_NO_THROW((void)parse_bytes(w2.to_bytes()));
}

TEST_F(GgufMalformed, UnknownMetadataValueType) {
  for (uint32_t t : {13u, 100u, 0xFFFFFFFFu}) {
    auto b = good;
    poke<uint32_t>(b, after_string(good, "test.u32"), t);
    expect_error(b, {"test.u32", "unknown value type", std::to_string(t).c_str()});
  }
}

TEST_F(GgufMalformed, UnknownArrayElementType) {
  auto b = good;
  poke<uint32_t>(b, after_string(good, "test.arr") + 4, 77);
  expect_error(b, {"test.arr", "unknown array element type 77"});
  b = good;  // inner array of the nested one
  poke<uint32_t>(b, after_string(good, "test.nested") + 4 + 4 + 8, 13);
  expect_error(b, {"test.nested", "unknown array element type 13"});
}

TEST_F(GgufMalformed, InvalidBool) {
  auto b = good;
  poke<uint8_t>(b, after_string(good, "test.bool") + 4, 7);
  expect_error(b, {"test.bool", "bool value 7"});
}

TEST_F(GgufMalformed, UnknownTensorType) {
  for (uint32_t t : {4u, 5u, 31u, 99u, 0xFFFFFFFFu}) {  // 4, 5 and 31 are retired ggml ids
    auto b = good;
    poke<uint32_t>(b, tensor_info_at(good, "t.h").type, t);
    expect_error(b, {"unknown tensor type", std::to_string(t).c_str(), "t.h"});
  }
}

TEST_F(GgufMalformed, DimensionCount) {
  for (uint32_t n : {0u, 5u, 1000u}) {
    auto b = good;
    poke<uint32_t>(b, tensor_info_at(good, "t.a").n_dims, n);
    expect_error(b, {"t.a", (std::to_string(n) + " dimensions").c_str(), "1 to 4"});
  }
}

TEST_F(GgufMalformed, ShapeOverflow) {
  const auto a = tensor_info_at(good, "t.a");
  auto b = good;
  poke<uint64_t>(b, a.ne0, ~uint64_t(0));
  expect_error(b, {"t.a", "shape overflows"});
  b = good;
  poke<uint64_t>(b, a.ne0, uint64_t(1) << 40);
  poke<uint64_t>(b, a.ne0 + 8, uint64_t(1) << 40);
  expect_error(b, {"t.a", "shape overflows"});
  // fits int64 elements but not bytes: 2^61 f32 = 2^63 bytes is representable, 2^62 f32 is not
  b = good;
  poke<uint64_t>(b, a.ne0, uint64_t(1) << 31);
  poke<uint64_t>(b, a.ne0 + 8, uint64_t(1) << 31);
  expect_error(b, {"t.a"});
}

TEST_F(GgufMalformed, TensorOffsetPastEnd) {
  const auto q = tensor_info_at(good, "t.q");
  for (uint64_t off : {uint64_t(1) << 20, uint64_t(good.size()), ~uint64_t(31), uint64_t(1) << 63}) {
    SCOPED_TRACE(off);
    auto b = good;
    poke<uint64_t>(b, q.offset, off);
    expect_error(b, {"t.q", "extends past the end"});
  }
}

TEST_F(GgufMalformed, MisalignedOffset) {
  for (uint64_t off : {1u, 16u, 33u}) {
    auto b = good;
    poke<uint64_t>(b, tensor_info_at(good, "t.q").offset, off);
    expect_error(b, {"t.q", "not aligned to 32"});
  }
}

TEST_F(GgufMalformed, BadAlignment) {
  const size_t at = after_string(good, "general.alignment");
  for (uint32_t al : {0u, 3u, 48u}) {
    auto b = good;
    poke<uint32_t>(b, at + 4, al);
    expect_error(b, {"general.alignment", (std::to_string(al) + " is not a power of two").c_str()});
  }
  auto b = good;
  poke<uint32_t>(b, at, uint32_t(GgufType::I32));  // same size, wrong type
  expect_error(b, {"general.alignment must be u32", "i32"});
  b = good;
  poke<uint32_t>(b, at, uint32_t(GgufType::F32));
  expect_error(b, {"general.alignment must be u32", "f32"});
}

TEST_F(GgufMalformed, DuplicateKey) {
  auto b = good;
  const size_t at = string_start(good, "test.i32");
  std::memcpy(b.data() + at + 8, "test.u32", 8);
  expect_error(b, {"duplicate metadata key test.u32"});
}

TEST_F(GgufMalformed, DuplicateTensorName) {
  auto b = good;
  const size_t at = string_start(good, "t.h");
  std::memcpy(b.data() + at + 8, "t.a", 3);
  expect_error(b, {"duplicate tensor name t.a"});
}

TEST_F(GgufMalformed, RowLengthNotAMultipleOfTheBlockSize) {
  auto b = good;
  const auto q = tensor_info_at(good, "t.q");
  poke<uint64_t>(b, q.ne0, 16);
  poke<uint64_t>(b, q.ne0 + 8, 4);  // same element count, rows of half a block
  expect_error(b, {"t.q", "row length 16 is not a multiple of the q8_0 block size 32"});
}

TEST_F(GgufMalformed, ControlBytesInNamesStayOnOneLine) {
  auto b = good;
  const size_t at = string_start(good, "t.h");
  b[at + 8 + 1] = '\n';  // "t\nh"
  poke<uint32_t>(b, tensor_info_at(good, "t.h").type, 99);
  expect_error(b, {"unknown tensor type 99", "t\\x0ah"});
}

TEST_F(GgufMalformed, CorruptCountsNeverCauseHugeAllocations) {
  // The small file plus 4 MiB of tensor data, so that "what the remaining bytes allow" is large:
  // a reader that reserved every count it read would ask for hundreds of MB here.
  auto m = small_model();
  std::vector<float> big(1 << 20, 1.0f);
  m->writer.add_tensor("t.big", DType::F32, {1024, 1024}, big.data(), big.size() * 4);
  const std::vector<uint8_t> good = m->writer.to_bytes();
  const auto arr_count = after_string(good, "test.arr") + 8;
  const auto nested_count = after_string(good, "test.nested") + 8;
  struct Case {
    size_t at;
    uint64_t value;
  };
  // The largest count the bytes after the field allow (13, 32, 8, 12: the smallest encodings
  // of a key-value pair, a tensor info, a string and an array).
  auto fits = [&](size_t end_of_field, size_t min_size) { return (good.size() - end_of_field) / min_size; };
  const Case cases[] = {{kKvCountAt, fits(24, 13)},          {kKvCountAt, ~uint64_t(0)},
                        {kTensorCountAt, fits(24, 32)},      {kTensorCountAt, ~uint64_t(0)},
                        {arr_count, fits(arr_count + 8, 8)}, {arr_count, uint64_t(1) << 60},
                        {nested_count, fits(nested_count + 8, 12)},
                        {string_start(good, "test.str"), good.size() - 30}};
  for (const auto& c : cases) {
    auto b = good;
    poke<uint64_t>(b, c.at, c.value);
    reset_largest_alloc();
    try {
      (void)parse_bytes(b);
    } catch (const Error&) {
    }
    // The parse copy of the file itself is the largest legitimate allocation.
    EXPECT_LE(largest_alloc(), good.size() + (1u << 20)) << "count at " << c.at << " = " << c.value;
  }
}

// ---- fuzz ------------------------------------------------------------------------------

// Exercises everything a successful parse hands out, so that AddressSanitizer sees any
// pointer or size the reader got wrong.
void use_parsed(const GgufFile& f) {
  for (const auto& [k, v] : f.metadata()) (void)v.to_display();
  uint64_t sum = 0;
  for (const auto& t : f.tensors()) {
    if (t.n_bytes) sum += t.data[0] + t.data[t.n_bytes - 1];
  }
  (void)sum;
  try {
    (void)GgufWriter::from_file(f).to_bytes();
  } catch (const Error&) {
    // e.g. tensors that overlap in the mutated file: the writer refuses, fine
  }
}

void fuzz(const std::vector<uint8_t>& base, uint64_t seed, int iterations) {
  std::mt19937_64 rng(seed);
  int accepted = 0, rejected = 0;
  const uint64_t interesting[] = {0, 1, 2, 3, 4, 5, 8, 12, 13, 31, 32, 33, 0x7f, 0x80, 0xff, 0xffff,
                                  0x7fffffffull, 0x80000000ull, 0xffffffffull, base.size(), base.size() - 1,
                                  uint64_t(1) << 40, uint64_t(1) << 62, uint64_t(1) << 63, ~uint64_t(0)};
  for (int it = 0; it < iterations; ++it) {
    std::vector<uint8_t> b = base;
    const int n_mut = 1 + int(rng() % 4);
    for (int m = 0; m < n_mut && !b.empty(); ++m) {
      switch (rng() % 6) {
        case 0:  // flip one bit
          b[rng() % b.size()] ^= uint8_t(1u << (rng() % 8));
          break;
        case 1:  // random byte
          b[rng() % b.size()] = uint8_t(rng());
          break;
        case 2: {  // interesting u32 / u64 at a random place (mostly in the header part)
          const size_t width = (rng() % 2) ? 8 : 4;
          const size_t limit = std::min<size_t>(b.size(), (rng() % 4) ? 700 : b.size());
          if (limit < width) break;
          const size_t at = rng() % (limit - width + 1);
          const uint64_t v = interesting[rng() % std::size(interesting)];
          std::memcpy(b.data() + at, &v, width);
          break;
        }
        case 3:  // truncate
          b.resize(rng() % (b.size() + 1));
          break;
        case 4: {  // delete a short run of bytes (shifts every later field)
          const size_t at = rng() % b.size();
          const size_t n = std::min<size_t>(1 + rng() % 16, b.size() - at);
          b.erase(b.begin() + long(at), b.begin() + long(at + n));
          break;
        }
        case 5: {  // duplicate a short run of bytes
          const size_t at = rng() % b.size();
          const size_t n = std::min<size_t>(1 + rng() % 16, b.size() - at);
          std::vector<uint8_t> run(b.begin() + long(at), b.begin() + long(at + n));
          b.insert(b.begin() + long(at), run.begin(), run.end());
          break;
        }
      }
    }
    try {
      const GgufFile f = parse_bytes(b);
      use_parsed(f);
      ++accepted;
    } catch (const Error& e) {
      ASSERT_NE(e.what()[0], '\0');
      ++rejected;
    }
    // Any other exception (bad_alloc, length_error, bad_variant_access) escapes and fails.
  }
  // The mutations must really exercise both outcomes.
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, iterations / 4);
}

TEST(GgufFuzz, RandomMutationsOfASmallFile) { fuzz(small_file_bytes(), 0x7e57'6755'0001ull, 20000); }

TEST(GgufFuzz, RandomMutationsOfAMetadataOnlyFile) {
  GgufWriter w;
  w.set("general.architecture", GgufValue::string("llama"));
  w.set("tokenizer.ggml.tokens",
        GgufValue::array(GgufType::STRING, {GgufValue::string("<unk>"), GgufValue::string("a"), GgufValue::string("bc")}));
  w.set("tokenizer.ggml.scores", GgufValue::array(GgufType::F32, {GgufValue::f32(0), GgufValue::f32(-1), GgufValue::f32(-2)}));
  w.set("x", GgufValue::array(GgufType::ARRAY, {GgufValue::array(GgufType::ARRAY, {GgufValue::array(GgufType::U8, {})})}));
  fuzz(w.to_bytes(), 0x7e57'6755'0002ull, 5000);
}

TEST(GgufFuzz, TruncationAtEveryByteOfARealFile) {
  // Its last tensor ends the file without padding, so every truncation must be rejected.
  const std::string path = shared_path("models/stories260K.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "missing " << path;
  const std::vector<uint8_t> full = read_bytes(path);
  // Every byte of the header and metadata (~14 KB), then a stride through the tensor data.
  const size_t data_offset = GgufFile::open(path).data_offset();
  for (size_t n = 0; n < full.size(); n += (n < data_offset + 64 ? 1 : 4099)) {
    try {
      (void)parse_bytes(std::vector<uint8_t>(full.begin(), full.begin() + long(n)));
      ADD_FAILURE() << "truncated at " << n << " accepted";
    } catch (const Error&) {
    }
  }
}

}  // namespace
}  // namespace tern::test
