#pragma once
// Building a model from its file: the architecture's spec (models/arch.h) and its layer stack
// (the shared decoder, models/decoder.cpp, or a state-space stack, models/mamba.cpp and
// models/mamba2.cpp).
#include <memory>

#include "models/arch.h"
#include "models/model.h"

namespace tern {

std::unique_ptr<Model> make_decoder(const ArchSpec& spec, std::shared_ptr<const GgufFile> file,
                                    const ModelPartition& part = {});
// The state-space stack (models/mamba.cpp).
std::unique_ptr<Model> make_mamba(const ArchSpec& spec, std::shared_ptr<const GgufFile> file);
// Mamba-2's stack (models/mamba2.cpp).
std::unique_ptr<Model> make_mamba2(const ArchSpec& spec, std::shared_ptr<const GgufFile> file);
// DeepSeek-V2/V3's multi-head latent attention stack (models/deepseek2.cpp).
std::unique_ptr<Model> make_deepseek2(const ArchSpec& spec, std::shared_ptr<const GgufFile> file);
// RWKV-7's stack (models/rwkv7.cpp).
std::unique_ptr<Model> make_rwkv7(const ArchSpec& spec, std::shared_ptr<const GgufFile> file);
// RWKV-6's stack (models/rwkv6.cpp).
std::unique_ptr<Model> make_rwkv6(const ArchSpec& spec, std::shared_ptr<const GgufFile> file);

}  // namespace tern
