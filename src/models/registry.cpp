#include "models/registry.h"

#include <cstring>
#include <string>

#include "core/error.h"

namespace tern {
namespace {

// Mistral, TinyLlama, Llama 2/3 and llama2.c checkpoints all use general.architecture "llama".
constexpr ArchEntry kArchitectures[] = {
    {"llama", make_llama},
};

}  // namespace

std::unique_ptr<Model> load_model(std::shared_ptr<const GgufFile> file) {
  const std::string arch = file->get_string("general.architecture");
  for (const auto& e : kArchitectures)
    if (arch == e.arch) return e.make(std::move(file));
  std::string known;
  for (const auto& e : kArchitectures) known += std::string(known.empty() ? "" : ", ") + e.arch;
  fail(file->path(), ": unsupported architecture '", arch, "' (tern runs: ", known, ")");
}

}  // namespace tern
