#pragma once
// Building a model from its file: the architecture's spec (models/arch.h) and its layer stack
// (the shared decoder, models/decoder.cpp, or the state-space stack, models/mamba.cpp).
#include <memory>

#include "models/arch.h"
#include "models/model.h"

namespace tern {

std::unique_ptr<Model> make_decoder(const ArchSpec& spec, std::shared_ptr<const GgufFile> file,
                                    const ModelPartition& part = {});
// The state-space stack (models/mamba.cpp).
std::unique_ptr<Model> make_mamba(const ArchSpec& spec, std::shared_ptr<const GgufFile> file);

}  // namespace tern
