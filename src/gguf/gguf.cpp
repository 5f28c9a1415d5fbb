#include "gguf/gguf.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <unordered_set>

#include "core/error.h"
#include "core/mapped_file.h"
#include "core/output_file.h"

namespace tern {

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8: return "u8";
    case GgufType::I8: return "i8";
    case GgufType::U16: return "u16";
    case GgufType::I16: return "i16";
    case GgufType::U32: return "u32";
    case GgufType::I32: return "i32";
    case GgufType::F32: return "f32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "string";
    case GgufType::ARRAY: return "array";
    case GgufType::U64: return "u64";
    case GgufType::I64: return "i64";
    case GgufType::F64: return "f64";
  }
  return "?";
}

namespace {

// Names from a damaged file may hold control bytes or be huge; errors must stay one short line.
std::string shown(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < 96; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > 96) out += "...";
  return out;
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::F64); }

size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::BOOL: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    default: return 0;
  }
}

// Smallest number of bytes one element of type t can take in a file (for count sanity checks).
size_t min_encoded_size(GgufType t) {
  if (t == GgufType::STRING) return 8;
  if (t == GgufType::ARRAY) return 12;
  return scalar_size(t);
}

constexpr int kMaxArrayNesting = 16;
// Counts read from a file are only trusted up to what the remaining bytes can hold; even then
// reserve() is capped, so a corrupt count costs at most this many slots up front and the rest
// grows only with elements that were really parsed.
constexpr uint64_t kMaxReserve = 4096;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS

class Reader {
 public:
  Reader(const uint8_t* p, size_t n, const std::string& name) : p_(p), n_(n), name_(name) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return n_ - pos_; }

  template <class... A>
  [[noreturn]] void error(A&&... a) const {
    fail(name_, ": ", std::forward<A>(a)..., " (at byte ", pos_, " of ", n_, ")");
  }

  void need(size_t k, const char* what) const {
    if (k > remaining()) error("truncated file: ", shown(what), " needs ", k, " bytes, ", remaining(), " left");
  }
  template <class T>
  T scalar(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string string(const char* what) {
    const uint64_t len = scalar<uint64_t>(what);
    if (len > remaining())
      error("string length ", len, " of ", shown(what), " is larger than the rest of the file (truncated or corrupt file)");
    std::string s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return s;
  }

  GgufValue value(GgufType type, const std::string& key, int depth) {
    GgufValue v;
    v.type = type;
    switch (type) {
      case GgufType::U8: v.v = uint64_t(scalar<uint8_t>(key.c_str())); break;
      case GgufType::I8: v.v = int64_t(scalar<int8_t>(key.c_str())); break;
      case GgufType::U16: v.v = uint64_t(scalar<uint16_t>(key.c_str())); break;
      case GgufType::I16: v.v = int64_t(scalar<int16_t>(key.c_str())); break;
      case GgufType::U32: v.v = uint64_t(scalar<uint32_t>(key.c_str())); break;
      case GgufType::I32: v.v = int64_t(scalar<int32_t>(key.c_str())); break;
      case GgufType::U64: v.v = scalar<uint64_t>(key.c_str()); break;
      case GgufType::I64: v.v = scalar<int64_t>(key.c_str()); break;
      case GgufType::F32: v.v = double(scalar<float>(key.c_str())); break;
      case GgufType::F64: v.v = scalar<double>(key.c_str()); break;
      case GgufType::BOOL: {
        const uint8_t b = scalar<uint8_t>(key.c_str());
        if (b > 1) error("metadata key ", shown(key), ": bool value ", int(b), " is not 0 or 1");
        v.v = b != 0;
        break;
      }
      case GgufType::STRING: v.v = string(key.c_str()); break;
      case GgufType::ARRAY: {
        if (depth >= kMaxArrayNesting) error("metadata key ", shown(key), ": arrays nested too deeply");
        const uint32_t et = scalar<uint32_t>(key.c_str());
        if (!valid_value_type(et)) error("metadata key ", shown(key), ": unknown array element type ", et);
        const uint64_t count = scalar<uint64_t>(key.c_str());
        const GgufType elem = static_cast<GgufType>(et);
        if (count > remaining() / min_encoded_size(elem))
          error("metadata key ", shown(key), ": array count ", count,
                " is larger than the rest of the file allows (truncated or corrupt file)");
        GgufArray arr;
        arr.elem_type = elem;
        arr.items.reserve(std::min(count, kMaxReserve));
        for (uint64_t i = 0; i < count; ++i) arr.items.push_back(value(elem, key, depth + 1));
        v.v = std::move(arr);
        break;
      }
    }
    return v;
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  const std::string& name_;
};

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}
template <class T>
void put(std::vector<uint8_t>& out, T v) {
  put_bytes(out, &v, sizeof v);
}
void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  put_bytes(out, s.data(), s.size());
}

// Encodes v; `key` names the metadata key in errors. Array items must carry the array's
// element type, since the element type is written once and each item in its own encoding.
void put_value(std::vector<uint8_t>& out, const GgufValue& v, const std::string& key) {
  switch (v.type) {
    case GgufType::U8: put<uint8_t>(out, static_cast<uint8_t>(v.as_uint())); break;
    case GgufType::I8: put<int8_t>(out, static_cast<int8_t>(v.as_int())); break;
    case GgufType::U16: put<uint16_t>(out, static_cast<uint16_t>(v.as_uint())); break;
    case GgufType::I16: put<int16_t>(out, static_cast<int16_t>(v.as_int())); break;
    case GgufType::U32: put<uint32_t>(out, static_cast<uint32_t>(v.as_uint())); break;
    case GgufType::I32: put<int32_t>(out, static_cast<int32_t>(v.as_int())); break;
    case GgufType::U64: put<uint64_t>(out, v.as_uint()); break;
    case GgufType::I64: put<int64_t>(out, v.as_int()); break;
    case GgufType::F32: put<float>(out, static_cast<float>(v.as_float(key))); break;
    case GgufType::F64: put<double>(out, v.as_float(key)); break;
    case GgufType::BOOL: put<uint8_t>(out, v.as_bool(key) ? 1 : 0); break;
    case GgufType::STRING: put_string(out, v.as_string(key)); break;
    case GgufType::ARRAY: {
      const auto& a = v.as_array(key);
      put<uint32_t>(out, static_cast<uint32_t>(a.elem_type));
      put<uint64_t>(out, a.items.size());
      for (const auto& item : a.items) {
        if (item.type != a.elem_type)
          fail("gguf writer: key ", key, ": array of ", gguf_type_name(a.elem_type), " holds a ",
               gguf_type_name(item.type), " item");
        put_value(out, item, key);
      }
      break;
    }
    default: fail("gguf writer: key ", key, ": unknown value type ", static_cast<uint32_t>(v.type));
  }
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

// ---- GgufValue -------------------------------------------------------------------------

bool GgufValue::is_integer() const {
  return std::holds_alternative<uint64_t>(v) || std::holds_alternative<int64_t>(v);
}

uint64_t GgufValue::as_uint(const std::string& what) const {
  if (auto p = std::get_if<uint64_t>(&v)) return *p;
  if (auto p = std::get_if<int64_t>(&v)) {
    if (*p < 0) fail(what, ": expected a non-negative integer, got ", *p);
    return static_cast<uint64_t>(*p);
  }
  if (auto p = std::get_if<bool>(&v)) return *p ? 1 : 0;
  fail(what, ": expected an integer, found ", gguf_type_name(type));
}

int64_t GgufValue::as_int(const std::string& what) const {
  if (auto p = std::get_if<int64_t>(&v)) return *p;
  if (auto p = std::get_if<uint64_t>(&v)) {
    if (*p > uint64_t(std::numeric_limits<int64_t>::max())) fail(what, ": integer out of range");
    return static_cast<int64_t>(*p);
  }
  fail(what, ": expected an integer, found ", gguf_type_name(type));
}

double GgufValue::as_float(const std::string& what) const {
  if (auto p = std::get_if<double>(&v)) return *p;
  if (auto p = std::get_if<uint64_t>(&v)) return double(*p);
  if (auto p = std::get_if<int64_t>(&v)) return double(*p);
  fail(what, ": expected a number, found ", gguf_type_name(type));
}

bool GgufValue::as_bool(const std::string& what) const {
  if (auto p = std::get_if<bool>(&v)) return *p;
  fail(what, ": expected a bool, found ", gguf_type_name(type));
}

const std::string& GgufValue::as_string(const std::string& what) const {
  if (auto p = std::get_if<std::string>(&v)) return *p;
  fail(what, ": expected a string, found ", gguf_type_name(type));
}

const GgufArray& GgufValue::as_array(const std::string& what) const {
  if (auto p = std::get_if<GgufArray>(&v)) return *p;
  fail(what, ": expected an array, found ", gguf_type_name(type));
}

std::string GgufValue::to_display(size_t max_items) const {
  std::ostringstream os;
  switch (type) {
    case GgufType::STRING: {
      const auto& s = std::get<std::string>(v);
      std::string shown = s.size() > 80 ? s.substr(0, 77) + "..." : s;
      for (auto& c : shown)
        if (c == '\n' || c == '\r' || c == '\t') c = ' ';
      os << '"' << shown << '"';
      break;
    }
    case GgufType::ARRAY: {
      const auto& a = std::get<GgufArray>(v);
      os << "[" << gguf_type_name(a.elem_type) << " x " << a.items.size() << "] [";
      for (size_t i = 0; i < a.items.size() && i < max_items; ++i)
        os << (i ? ", " : "") << a.items[i].to_display(3);
      if (a.items.size() > max_items) os << ", ...";
      os << "]";
      break;
    }
    case GgufType::BOOL: os << (std::get<bool>(v) ? "true" : "false"); break;
    case GgufType::F32: case GgufType::F64: os << std::get<double>(v); break;
    default:
      if (auto p = std::get_if<uint64_t>(&v)) os << *p;
      else os << std::get<int64_t>(v);
  }
  return os.str();
}

// ---- GgufTensorInfo --------------------------------------------------------------------

int64_t GgufTensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

std::string GgufTensorInfo::shape_string() const {
  std::string s;
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? " x " : "") + std::to_string(ne[i]);
  return s;
}

// ---- GgufFile --------------------------------------------------------------------------

GgufFile GgufFile::open(const std::string& path) {
  auto mapping = std::make_shared<MappedFile>(path);
  const uint8_t* data = mapping->data();
  const size_t size = mapping->size();
  GgufFile f = parse(std::move(mapping), data, size, path);
  f.file_mapped_ = true;
  return f;
}

void GgufFile::release_pages() const {
  if (file_mapped_) release_mapped_range(base_, size_t(size_));
}

void GgufFile::release_pages_around(const void* p, size_t n) const {
  if (!file_mapped_ || n == 0) return;
  constexpr uintptr_t kFolio = uintptr_t(2) << 20, kPage = 4096;
  const uintptr_t base = reinterpret_cast<uintptr_t>(base_);
  const uintptr_t map_end = (base + uintptr_t(size_) + kPage - 1) / kPage * kPage;  // the mapping's last page's end
  const uintptr_t lo = std::max(reinterpret_cast<uintptr_t>(p) / kFolio * kFolio, base);
  const uintptr_t hi = std::min((reinterpret_cast<uintptr_t>(p) + n + kFolio - 1) / kFolio * kFolio, map_end);
  if (hi > lo) release_mapped_range(reinterpret_cast<const void*>(lo), hi - lo);
}

GgufFile GgufFile::parse(std::shared_ptr<const void> owner, const uint8_t* data, size_t size,
                         const std::string& name) {
  GgufFile f;
  f.path_ = name;
  f.owner_ = std::move(owner);
  f.base_ = data;
  f.size_ = size;
  Reader r(data, size, name);

  if (size < 4 || std::memcmp(data, "GGUF", 4) != 0) {
    if (size < 4) fail(name, ": not a GGUF file (only ", size, " bytes)");
    fail(name, ": not a GGUF file (bad magic)");
  }
  r.scalar<uint32_t>("magic");
  f.version_ = r.scalar<uint32_t>("version");
  if (f.version_ != 2 && f.version_ != 3) {
    const uint32_t swapped = __builtin_bswap32(f.version_);
    fail(name, ": unsupported GGUF version ", f.version_, " (tern reads versions 2 and 3",
         swapped == 2 || swapped == 3 ? "; this looks like a big-endian file" : "", ")");
  }
  const uint64_t n_tensors = r.scalar<uint64_t>("tensor count");
  const uint64_t n_kv = r.scalar<uint64_t>("metadata count");
  // Smallest encodings: a key-value pair is 13 bytes (empty key, type, u8), a tensor info 32.
  if (n_kv > r.remaining() / 13)
    r.error("metadata count ", n_kv, " is larger than the rest of the file allows (truncated or corrupt file)");
  if (n_tensors > r.remaining() / 32)
    r.error("tensor count ", n_tensors, " is larger than the rest of the file allows (truncated or corrupt file)");

  std::unordered_set<std::string> keys;
  f.kv_.reserve(std::min(n_kv, kMaxReserve));
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = r.string("metadata key");
    const uint32_t t = r.scalar<uint32_t>("metadata value type");
    if (!valid_value_type(t)) r.error("metadata key ", shown(key), ": unknown value type ", t);
    if (!keys.insert(key).second) r.error("duplicate metadata key ", shown(key));
    GgufValue v = r.value(static_cast<GgufType>(t), key, 0);
    f.kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const GgufValue* a = f.find("general.alignment")) {
    if (a->type != GgufType::U32) fail(name, ": general.alignment must be u32, found ", gguf_type_name(a->type));
    const uint64_t al = a->as_uint();
    if (al == 0 || (al & (al - 1)) != 0) fail(name, ": general.alignment ", al, " is not a power of two");
    f.alignment_ = al;
  }

  std::unordered_set<std::string> names;
  f.tensors_.reserve(std::min(n_tensors, kMaxReserve));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = r.string("tensor name");
    const uint32_t n_dims = r.scalar<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > kMaxDims)
      r.error("tensor ", shown(t.name), ": ", n_dims, " dimensions (1 to ", kMaxDims, " allowed)");
    int64_t n_el = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = r.scalar<uint64_t>("tensor shape");
      if (ne > uint64_t(std::numeric_limits<int64_t>::max()) ||
          (ne != 0 && uint64_t(n_el) > uint64_t(std::numeric_limits<int64_t>::max()) / ne))
        r.error("tensor ", shown(t.name), ": shape overflows");
      t.ne.push_back(static_cast<int64_t>(ne));
      n_el *= static_cast<int64_t>(ne);
    }
    const uint32_t type_id = r.scalar<uint32_t>("tensor type");
    const auto ts = dtype_size(type_id);
    if (!ts) r.error("unknown tensor type ", type_id, " in tensor ", shown(t.name));
    t.type = ts->type;
    t.offset = r.scalar<uint64_t>("tensor offset");
    if (t.ne[0] % ts->block_size != 0)
      fail(name, ": tensor ", shown(t.name), ": row length ", t.ne[0], " is not a multiple of the ",
           ts->name, " block size ", ts->block_size);
    const uint64_t blocks = uint64_t(n_el) / uint64_t(ts->block_size);
    if (blocks > std::numeric_limits<uint64_t>::max() / uint64_t(ts->block_bytes))
      r.error("tensor ", shown(t.name), ": size overflows");
    t.n_bytes = blocks * uint64_t(ts->block_bytes);
    if (t.offset % f.alignment_ != 0)
      fail(name, ": tensor ", shown(t.name), ": data offset ", t.offset, " is not aligned to ", f.alignment_);
    if (!names.insert(t.name).second) fail(name, ": duplicate tensor name ", shown(t.name));
    f.tensors_.push_back(std::move(t));
  }

  f.data_offset_ = align_up(r.pos(), f.alignment_);
  for (auto& t : f.tensors_) {
    // Compare before adding: a huge offset must not wrap around to a small start.
    const uint64_t start = f.data_offset_ + t.offset;
    if (f.data_offset_ > size || t.offset > size - f.data_offset_ || t.n_bytes > size - start)
      fail(name, ": tensor ", shown(t.name), " (", t.n_bytes, " bytes at offset ", t.offset,
           ") extends past the end of the file (", size, " bytes): truncated tensor data");
    t.data = data + start;
  }
  return f;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  for (const auto& [k, v] : kv_)
    if (k == key) return &v;
  return nullptr;
}

const GgufValue& GgufFile::get(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) fail(path_, ": missing required key ", key);
  return *v;
}

uint64_t GgufFile::get_uint(const std::string& key) const { return get(key).as_uint(path_ + ": " + key); }
uint64_t GgufFile::get_uint(const std::string& key, uint64_t fallback) const {
  const GgufValue* v = find(key);
  return v ? v->as_uint(path_ + ": " + key) : fallback;
}
double GgufFile::get_float(const std::string& key, double fallback) const {
  const GgufValue* v = find(key);
  return v ? v->as_float(path_ + ": " + key) : fallback;
}
std::string GgufFile::get_string(const std::string& key) const { return get(key).as_string(path_ + ": " + key); }
std::string GgufFile::get_string(const std::string& key, const std::string& fallback) const {
  const GgufValue* v = find(key);
  return v ? v->as_string(path_ + ": " + key) : fallback;
}

int64_t tensor_layer_index(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  int64_t il = 0;
  size_t i = 4;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && il < (int64_t(1) << 40); ++i) il = il * 10 + (name[i] - '0');
  return i > 4 && i < name.size() && name[i] == '.' ? il : -1;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

uint64_t GgufFile::tensor_data_bytes() const {
  uint64_t s = 0;
  for (const auto& t : tensors_) s += t.n_bytes;
  return s;
}

// ---- GgufWriter ------------------------------------------------------------------------

void GgufWriter::set(const std::string& key, GgufValue value) {
  for (auto& [k, v] : kv_)
    if (k == key) {
      v = std::move(value);
      return;
    }
  kv_.emplace_back(key, std::move(value));
}

void GgufWriter::remove(const std::string& key) {
  for (auto it = kv_.begin(); it != kv_.end(); ++it)
    if (it->first == key) {
      kv_.erase(it);
      return;
    }
}

void GgufWriter::copy_metadata(const GgufFile& src) {
  for (const auto& [k, v] : src.metadata()) set(k, v);
}

uint64_t GgufWriter::alignment() const {
  for (const auto& [k, v] : kv_) {
    if (k != "general.alignment") continue;
    // The reader rejects anything else, so the writer must never produce it.
    if (v.type != GgufType::U32) fail("gguf writer: general.alignment must be u32, not ", gguf_type_name(v.type));
    const uint64_t al = v.as_uint();
    if (al == 0 || (al & (al - 1)) != 0) fail("gguf writer: general.alignment ", al, " is not a power of two");
    return al;
  }
  return 32;
}

void GgufWriter::add_tensor(const std::string& name, DType type, std::vector<int64_t> ne,
                            const void* data, uint64_t n_bytes) {
  for (const auto& t : tensors_)
    if (t.name == name) fail("gguf writer: duplicate tensor name ", name);
  if (ne.empty() || ne.size() > kMaxDims) fail("gguf writer: tensor ", name, " has ", ne.size(), " dimensions");
  int64_t n = 1;
  for (int64_t d : ne) {
    if (d < 0 || (d != 0 && n > std::numeric_limits<int64_t>::max() / d))
      fail("gguf writer: tensor ", name, ": invalid shape");
    n *= d;
  }
  const auto& info = dtype_info(type);
  if (ne[0] % info.block_size != 0)
    fail("gguf writer: tensor ", name, ": row length ", ne[0], " is not a multiple of the block size ", info.block_size);
  const uint64_t expect = uint64_t(n / info.block_size * info.block_bytes);
  if (expect != n_bytes) fail("gguf writer: tensor ", name, ": ", n_bytes, " bytes given, shape needs ", expect);
  tensors_.push_back({name, type, std::move(ne), data, n_bytes, 0});
}

GgufWriter GgufWriter::from_file(const GgufFile& src) {
  GgufWriter w(src.version());
  w.copy_metadata(src);
  for (const auto& t : src.tensors()) {
    w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
    w.tensors_.back().offset = t.offset;
  }
  w.keep_offsets_ = true;
  return w;
}

std::vector<uint8_t> GgufWriter::to_bytes() const {
  const uint64_t al = alignment();
  std::vector<uint8_t> out;
  out.insert(out.end(), {'G', 'G', 'U', 'F'});
  put<uint32_t>(out, version_);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kv_.size());
  for (const auto& [k, v] : kv_) {
    put_string(out, k);
    put<uint32_t>(out, static_cast<uint32_t>(v.type));
    put_value(out, v, k);
  }
  std::vector<uint64_t> offsets;
  uint64_t next = 0;
  for (const auto& t : tensors_) {
    const uint64_t off = keep_offsets_ ? t.offset : next;
    offsets.push_back(off);
    next = align_up(off + t.n_bytes, al);
    put_string(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) put<uint64_t>(out, static_cast<uint64_t>(d));
    put<uint32_t>(out, static_cast<uint32_t>(t.type));
    put<uint64_t>(out, off);
  }
  // With no tensors there is no data section to align: llama.cpp's metadata-only files (the
  // vocab fixtures) end right after the header, and byte-exact round trips need the same.
  if (tensors_.empty()) return out;
  const uint64_t data_start = align_up(out.size(), al);
  out.resize(data_start, 0);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const auto& t = tensors_[i];
    const uint64_t start = data_start + offsets[i];
    if (out.size() < start) out.resize(start, 0);
    if (out.size() != start) fail("gguf writer: tensor ", t.name, " overlaps the previous tensor");
    put_bytes(out, t.data, t.n_bytes);
    out.resize(align_up(out.size(), al), 0);  // llama.cpp pads after every tensor, the last too
  }
  return out;
}

void GgufWriter::write(const std::string& path) const { write_bytes(path, to_bytes()); }

void GgufWriter::write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  // Atomic replace (temporary file + rename), symbolic links and devices written through.
  write_output_file(path, bytes.data(), bytes.size());
}

}  // namespace tern
