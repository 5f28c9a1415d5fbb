#pragma once
// Building a model from its file: the architecture's spec (models/arch.h) and the shared
// decoder (models/decoder.cpp).
#include <memory>

#include "models/arch.h"
#include "models/model.h"

namespace tern {

std::unique_ptr<Model> make_decoder(const ArchSpec& spec, std::shared_ptr<const GgufFile> file,
                                    const ModelPartition& part = {});

}  // namespace tern
