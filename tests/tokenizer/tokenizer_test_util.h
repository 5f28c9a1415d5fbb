#pragma once
// Helpers shared by the tokenizer tests: fixture paths and llama.cpp's vector-file format.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace tern::test {

// $TERN_SHARED_DIR (set by ctest) overrides the configure-time path.
inline std::string shared_path(const std::string& rel) {
  const char* env = std::getenv("TERN_SHARED_DIR");
  return std::string(env && *env ? env : TERN_SHARED_DIR) + "/" + rel;
}

inline bool file_exists(const std::string& path) { return std::filesystem::exists(path); }

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// .inp: every test string is followed by "\n__ggml_vocab_test__\n".
inline std::vector<std::string> read_vector_inputs(const std::string& path) {
  const std::string data = read_bytes(path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t pos = 0;
  for (size_t hit; (hit = data.find(sep, pos)) != std::string::npos; pos = hit + sep.size())
    out.push_back(data.substr(pos, hit - pos));
  return out;
}

// .out: one line of space-prefixed ids per test string.
inline std::vector<std::vector<int32_t>> read_vector_outputs(const std::string& path) {
  std::istringstream in(read_bytes(path));
  std::vector<std::vector<int32_t>> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::vector<int32_t> ids;
    for (int32_t id; ls >> id;) ids.push_back(id);
    out.push_back(std::move(ids));
  }
  return out;
}

inline std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  const GgufFile file = GgufFile::open(path);
  return Tokenizer::from_gguf(file);
}

// GGUF array values for hand-built vocabularies.
inline GgufValue gguf_strings(const std::vector<std::string>& v) {
  std::vector<GgufValue> items;
  for (const auto& s : v) items.push_back(GgufValue::string(s));
  return GgufValue::array(GgufType::STRING, std::move(items));
}
inline GgufValue gguf_floats(const std::vector<float>& v) {
  std::vector<GgufValue> items;
  for (float x : v) items.push_back(GgufValue::f32(x));
  return GgufValue::array(GgufType::F32, std::move(items));
}
inline GgufValue gguf_ints(const std::vector<int32_t>& v) {
  std::vector<GgufValue> items;
  for (int32_t x : v) items.push_back(GgufValue::i32(x));
  return GgufValue::array(GgufType::I32, std::move(items));
}

// The tokenizer of an in-memory GGUF written by `w` (`name`: the file name errors give).
inline std::unique_ptr<Tokenizer> tokenizer_from(const GgufWriter& w, const char* name = "mem.gguf") {
  auto bytes = std::make_shared<std::vector<uint8_t>>(w.to_bytes());
  const GgufFile file = GgufFile::parse(bytes, bytes->data(), bytes->size(), name);
  return Tokenizer::from_gguf(file);
}

// `s` as one single-quoted shell word.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct RunResult {
  int exit_code;
  std::string out;  // stdout (and stderr with merge_stderr)
};
// Runs `tern ARGS` (the binary under test) through the shell.
inline RunResult run_tern_args(const std::string& args, bool merge_stderr) {
  const std::string cmd = shell_quote(TERN_BINARY) + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, ""};
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace tern::test
