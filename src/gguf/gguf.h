#pragma once
// GGUF (v2, v3) reader and writer.
//
// File layout (little-endian):
//   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x (string key | u32 value type | value)          string = u64 length + bytes
//   n_tensors x (string name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset)
//   padding to general.alignment (default 32)
//   tensor data: each tensor at data_start + offset, offsets aligned to the alignment
//
// The reader validates every count, length, offset and size against the file before using it
// (a malformed file is a tern::Error, never a crash or a huge allocation) and keeps the tensor
// data memory-mapped. The writer reproduces any file the reader accepts byte for byte, given
// the same key order, tensor order and offsets.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace tern {

enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* gguf_type_name(GgufType t);

struct GgufValue;
struct GgufArray {
  GgufType elem_type = GgufType::U8;
  std::vector<GgufValue> items;
};

// One metadata value, keeping its exact on-disk type so that writing it back is lossless.
struct GgufValue {
  GgufType type = GgufType::U32;
  std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> v;

  static GgufValue u32(uint32_t x) { return {GgufType::U32, uint64_t(x)}; }
  static GgufValue i32(int32_t x) { return {GgufType::I32, int64_t(x)}; }
  static GgufValue u64(uint64_t x) { return {GgufType::U64, x}; }
  static GgufValue f32(float x) { return {GgufType::F32, double(x)}; }
  static GgufValue boolean(bool x) { return {GgufType::BOOL, x}; }
  static GgufValue string(std::string s) { return {GgufType::STRING, std::move(s)}; }
  static GgufValue array(GgufType elem, std::vector<GgufValue> items) {
    return {GgufType::ARRAY, GgufArray{elem, std::move(items)}};
  }

  bool is_integer() const;
  bool is_float() const { return type == GgufType::F32 || type == GgufType::F64; }
  // Accessors throw tern::Error naming `what` when the stored type does not fit.
  uint64_t as_uint(const std::string& what = "value") const;
  int64_t as_int(const std::string& what = "value") const;
  double as_float(const std::string& what = "value") const;  // integers convert too
  bool as_bool(const std::string& what = "value") const;
  const std::string& as_string(const std::string& what = "value") const;
  const GgufArray& as_array(const std::string& what = "value") const;
  std::string to_display(size_t max_items = 8) const;  // for `tern inspect`
};

// The layer N of a tensor named "blk.N.<rest>"; -1 for any other name (a global tensor, or a
// malformed layer number).
int64_t tensor_layer_index(const std::string& name);

struct GgufTensorInfo {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> ne;      // ggml order: ne[0] is the contiguous (row) dimension
  uint64_t offset = 0;          // relative to the start of the data section
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping (reader) or caller memory (writer)

  int64_t n_elements() const;
  int64_t n_rows() const { return ne.empty() ? 1 : n_elements() / ne[0]; }
  std::string shape_string() const;  // "64 x 512"
};

class GgufFile {
 public:
  // Opens, validates and maps PATH. Throws tern::Error("PATH: what is wrong") on any defect.
  static GgufFile open(const std::string& path);
  // Parses an in-memory image (used by tests and fuzzers); `owner` keeps the bytes alive.
  static GgufFile parse(std::shared_ptr<const void> owner, const uint8_t* data, size_t size,
                        const std::string& name);

  const std::string& path() const { return path_; }
  // True when the tensor bytes are a read-only mapping of the file (open()), whose pages the
  // kernel can drop and read back at will; false for an in-memory image (parse()).
  bool file_mapped() const { return file_mapped_; }
  // Gives every page of the file's mapping back to the kernel (release_mapped_range; nothing is
  // lost, a later read faults pages in again): after a load that copied what it keeps, so that
  // the pages its checks read, and the 2 MiB page-cache folios a kernel maps whole around any
  // byte read (Linux 6.x large folios), leave the process's resident memory. No-op for parse().
  void release_pages() const;
  // The same for [p, p + n) widened to whole 2 MiB (a large folio's most) inside the mapping:
  // what reading those bytes may have mapped. No-op for parse().
  void release_pages_around(const void* p, size_t n) const;
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return size_; }

  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }
  // Required-key accessors: throw "PATH: missing required key KEY" / wrong type.
  const GgufValue& get(const std::string& key) const;
  uint64_t get_uint(const std::string& key) const;
  uint64_t get_uint(const std::string& key, uint64_t fallback) const;
  double get_float(const std::string& key, double fallback) const;
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  uint64_t tensor_data_bytes() const;  // sum of n_bytes over tensors

 private:
  std::string path_;
  std::shared_ptr<const void> owner_;  // MappedFile or caller buffer
  bool file_mapped_ = false;
  const uint8_t* base_ = nullptr;  // the image's first byte
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<GgufTensorInfo> tensors_;
};

// Builds a GGUF file. Metadata keeps insertion order (set() on an existing key replaces it in
// place); tensors are laid out in insertion order at aligned offsets. Tensor bytes are copied
// at write() time from the pointers given, which must stay valid until then.
class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3) : version_(version) {}

  void set(const std::string& key, GgufValue value);
  void remove(const std::string& key);
  // Copies every key of `src` (general.alignment too).
  void copy_metadata(const GgufFile& src);
  void add_tensor(const std::string& name, DType type, std::vector<int64_t> ne,
                  const void* data, uint64_t n_bytes);
  // Round trip helper: same metadata, tensors and offsets as `src`.
  static GgufWriter from_file(const GgufFile& src);

  // Serialises to PATH through core/OutputFile (a temporary file beside it, then renamed, so a
  // failed write never leaves a half file under the final name; devices and FIFOs are written
  // through). Throws tern::Error on I/O failure.
  void write(const std::string& path) const;
  std::vector<uint8_t> to_bytes() const;
  // Writes an already serialised image the same way.
  static void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes);

 private:
  uint64_t alignment() const;
  uint32_t version_;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  struct PendingTensor {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    const void* data;
    uint64_t n_bytes;
    uint64_t offset;  // assigned when added, keeps source offsets in from_file
  };
  std::vector<PendingTensor> tensors_;
  bool keep_offsets_ = false;
};

}  // namespace tern
