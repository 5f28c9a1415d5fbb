#pragma once
// Helpers shared by the tokenizer tests: fixture paths and llama.cpp's vector-file format.
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

}  // namespace tern::test
