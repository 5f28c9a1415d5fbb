#pragma once
// Architecture registry: general.architecture -> factory. One line per architecture in
// registry.cpp; each architecture lives in its own file.
#include <memory>

#include "models/model.h"

namespace tern {

using ModelFactory = std::unique_ptr<Model> (*)(std::shared_ptr<const GgufFile>);

struct ArchEntry {
  const char* arch;
  ModelFactory make;
};

std::unique_ptr<Model> make_llama(std::shared_ptr<const GgufFile> file);

}  // namespace tern
