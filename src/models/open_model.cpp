#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "core/error.h"
#include "models/llama2c_import.h"
#include "models/model.h"

namespace tern {
namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

}  // namespace

bool has_gguf_magic(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char magic[4] = {};
  const ssize_t n = ::read(fd, magic, sizeof magic);
  ::close(fd);
  return n == ssize_t(sizeof magic) && std::memcmp(magic, "GGUF", 4) == 0;
}

std::shared_ptr<const GgufFile> open_model_file(const std::string& path, const std::string& tokenizer_bin) {
  if (has_gguf_magic(path)) {
    if (!tokenizer_bin.empty())
      fail(path, " is a GGUF file, which carries its own tokenizer: --tokenizer ", tokenizer_bin,
           " is for llama2.c checkpoints (drop it)");
    return std::make_shared<const GgufFile>(GgufFile::open(path));
  }
  if (!tokenizer_bin.empty() || ends_with(path, ".bin")) {
    if (tokenizer_bin.empty())
      fail(path, ": a llama2.c .bin model needs its tokenizer: add --tokenizer tokenizer.bin");
    // llama2.c checkpoints are converted to GGUF in memory: one loader path for every format.
    return std::make_shared<const GgufFile>(load_llama2c(path, tokenizer_bin));
  }
  return std::make_shared<const GgufFile>(GgufFile::open(path));  // reports "not a GGUF file"
}

}  // namespace tern
