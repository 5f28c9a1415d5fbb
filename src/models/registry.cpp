#include "models/registry.h"

#include <string>

#include "core/error.h"

namespace tern {

const std::vector<const ArchSpec*>& architectures() {
  static const std::vector<const ArchSpec*> kAll = {&kArchLlama,  &kArchDeci, &kArchQwen2,  &kArchQwen2Moe, &kArchQwen3,
                                                    &kArchQwen3Moe, &kArchPhi3, &kArchGemma2,   &kArchGemma3,
                                                    &kArchGptOss, &kArchMamba, &kArchMamba2, &kArchDeepseek2,
                                                    &kArchGraniteHybrid, &kArchRwkv7, &kArchRwkv6, &kArchQwen3Next};
  return kAll;
}

std::string architecture_list() {
  std::string known;
  for (const ArchSpec* a : architectures()) known += std::string(known.empty() ? "" : ", ") + a->name;
  return known;
}

const ArchSpec& find_architecture(const std::string& name, const std::string& path) {
  for (const ArchSpec* a : architectures())
    if (name == a->name) return *a;
  fail(path, ": unsupported architecture '", name, "' (tern runs: ", architecture_list(), ")");
}

std::unique_ptr<Model> load_model(std::shared_ptr<const GgufFile> file) { return load_model(std::move(file), {}); }

std::unique_ptr<Model> load_model(std::shared_ptr<const GgufFile> file, const ModelPartition& part) {
  const ArchSpec& spec = find_architecture(file->get_string("general.architecture"), file->path());
  if (spec.stack != LayerStack::Decoder) {
    if (!part.whole()) fail(file->path(), ": ", spec.name, " models do not run split over processes (--tp / --pp) yet");
    if (spec.stack == LayerStack::Mamba2) return make_mamba2(spec, std::move(file));
    if (spec.stack == LayerStack::Mla) return make_deepseek2(spec, std::move(file));
    if (spec.stack == LayerStack::Rwkv7) return make_rwkv7(spec, std::move(file));
    if (spec.stack == LayerStack::Rwkv6) return make_rwkv6(spec, std::move(file));
    return make_mamba(spec, std::move(file));
  }
  return make_decoder(spec, std::move(file), part);
}

}  // namespace tern
