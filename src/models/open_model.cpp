#include <string>

#include "core/error.h"
#include "models/llama2c_import.h"
#include "models/model.h"

namespace tern {

std::shared_ptr<const GgufFile> open_model_file(const std::string& path, const std::string& tokenizer_bin) {
  const bool is_bin = path.size() >= 4 && path.compare(path.size() - 4, 4, ".bin") == 0;
  if (!tokenizer_bin.empty() || is_bin) {
    if (tokenizer_bin.empty())
      fail(path, ": a llama2.c .bin model needs its tokenizer: add --tokenizer tokenizer.bin");
    // llama2.c checkpoints are converted to GGUF in memory: one loader path for every format.
    return std::make_shared<const GgufFile>(load_llama2c(path, tokenizer_bin));
  }
  return std::make_shared<const GgufFile>(GgufFile::open(path));
}

}  // namespace tern
