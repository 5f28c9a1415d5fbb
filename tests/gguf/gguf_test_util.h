#pragma once
// Helpers shared by the GGUF tests: fixture paths, a small valid GGUF built with GgufWriter,
// byte patching by field, and running the tern binary / other programs.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"

namespace tern::test {

inline std::string shared_path(const std::string& rel) { return std::string(TERN_SHARED_DIR) + "/" + rel; }

// A fresh directory under the system temp dir, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tern_gguf_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// Parses a copy of `bytes` held in an exactly sized heap block, so that AddressSanitizer
// reports any read past the end.
inline GgufFile parse_bytes(const std::vector<uint8_t>& bytes, const std::string& name = "mem.gguf") {
  auto copy = std::make_shared<const std::vector<uint8_t>>(bytes);
  const uint8_t* p = copy->empty() ? nullptr : copy->data();
  const size_t n = copy->size();
  return GgufFile::parse(std::move(copy), p, n, name);
}

// Tensor payloads of the small file, kept alive for the writer.
struct SmallModel {
  std::vector<float> a;        // "t.a" F32 [8, 2]
  std::vector<uint8_t> q;      // "t.q" Q8_0 [32, 2]: 2 blocks of 34 bytes
  std::vector<uint16_t> h;     // "t.h" F16 [4]
  GgufWriter writer;
};

// A small valid file: every scalar type, a string array, a nested array, explicit alignment,
// three tensors of three types. Field values are distinct so tests can find them by bytes.
inline std::unique_ptr<SmallModel> small_model() {
  auto m = std::make_unique<SmallModel>();
  m->a.resize(16);
  for (size_t i = 0; i < m->a.size(); ++i) m->a[i] = float(i) * 0.5f - 3.0f;
  m->q.resize(68);
  for (size_t i = 0; i < m->q.size(); ++i) m->q[i] = uint8_t(i * 7 + 1);
  m->h = {0x3c00, 0x4000, 0xbc00, 0x0000};
  GgufWriter& w = m->writer;
  w.set("general.architecture", GgufValue::string("llama"));
  w.set("general.alignment", GgufValue::u32(32));
  w.set("test.u8", {GgufType::U8, uint64_t(200)});
  w.set("test.i8", {GgufType::I8, int64_t(-5)});
  w.set("test.u16", {GgufType::U16, uint64_t(60000)});
  w.set("test.i16", {GgufType::I16, int64_t(-30000)});
  w.set("test.u32", GgufValue::u32(123456));
  w.set("test.i32", GgufValue::i32(-123456));
  w.set("test.f32", GgufValue::f32(0.25f));
  w.set("test.bool", GgufValue::boolean(true));
  w.set("test.u64", GgufValue::u64(1ull << 40));
  w.set("test.i64", {GgufType::I64, int64_t(-(1ll << 40))});
  w.set("test.f64", {GgufType::F64, 2.5});
  w.set("test.str", GgufValue::string("hello"));
  w.set("test.arr", GgufValue::array(GgufType::STRING, {GgufValue::string("x"), GgufValue::string("yz")}));
  w.set("test.nested",
        GgufValue::array(GgufType::ARRAY, {GgufValue::array(GgufType::I32, {GgufValue::i32(1), GgufValue::i32(2)})}));
  w.add_tensor("t.a", DType::F32, {8, 2}, m->a.data(), m->a.size() * 4);
  w.add_tensor("t.q", DType::Q8_0, {32, 2}, m->q.data(), m->q.size());
  w.add_tensor("t.h", DType::F16, {4}, m->h.data(), m->h.size() * 2);
  return m;
}

inline std::vector<uint8_t> small_file_bytes() { return small_model()->writer.to_bytes(); }

// Offset just past the first length-prefixed occurrence of string s (its u64 length and
// bytes), i.e. where the field after a key or a tensor name starts.
inline size_t after_string(const std::vector<uint8_t>& b, const std::string& s) {
  std::vector<uint8_t> needle(8);
  const uint64_t n = s.size();
  std::memcpy(needle.data(), &n, 8);
  needle.insert(needle.end(), s.begin(), s.end());
  auto it = std::search(b.begin(), b.end(), needle.begin(), needle.end());
  if (it == b.end()) throw std::runtime_error("string not found in test file: " + s);
  return size_t(it - b.begin()) + needle.size();
}
inline size_t string_start(const std::vector<uint8_t>& b, const std::string& s) {
  return after_string(b, s) - 8 - s.size();
}

template <class T>
void poke(std::vector<uint8_t>& b, size_t at, T v) {
  if (at + sizeof v > b.size()) throw std::runtime_error("poke past end of test file");
  std::memcpy(b.data() + at, &v, sizeof v);
}
template <class T>
T peek(const std::vector<uint8_t>& b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof v);
  return v;
}

// Header field offsets.
constexpr size_t kVersionAt = 4, kTensorCountAt = 8, kKvCountAt = 16;

// Tensor-info field offsets relative to after_string(b, name).
struct TensorInfoAt {
  size_t n_dims, ne0, type, offset;
};
inline TensorInfoAt tensor_info_at(const std::vector<uint8_t>& b, const std::string& name) {
  const size_t at = after_string(b, name);
  const uint32_t n_dims = peek<uint32_t>(b, at);
  return {at, at + 4, at + 4 + 8 * n_dims, at + 4 + 8 * n_dims + 4};
}

// Result of running a program with its stdout and stderr captured.
struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs argv (no shell), capturing stdout and stderr into files of a temp dir.
inline RunResult run_program(const std::vector<std::string>& argv) {
  TempDir dir;
  const std::string out_path = dir.file("out"), err_path = dir.file("err");
  RunResult r;
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    FILE* o = std::freopen(out_path.c_str(), "w", stdout);
    FILE* e = std::freopen(err_path.c_str(), "w", stderr);
    if (!o || !e) _exit(126);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  return r;
}

inline RunResult run_tern(std::vector<std::string> args) {
  args.insert(args.begin(), TERN_BINARY);
  return run_program(args);
}

}  // namespace tern::test
