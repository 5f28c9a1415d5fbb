#pragma once
// Files the LoRA serving tests share (test_serve_lora, test_serve_models): a synth base model, a
// model of another architecture (its adapters must be refused on the base) and random adapters.
#include <cstdint>
#include <string>

#include "gguf/gguf.h"
#include "models/lora.h"
#include "models/synth.h"

namespace tern::testing {

// An adapter of `rank` on every attention and FFN matrix of `base`, B drawn large enough that
// it changes greedy text.
inline void write_random_adapter(const GgufFile& base, const std::string& path, int64_t rank, uint32_t seed) {
  write_lora_adapter(path, base.get_string("general.architecture"), float(2 * rank),
                     LoraAdapter::random_pairs(base, rank, seed, /*b_std=*/0.8f));
}

// `base_path`: llama3-tiny in F32 (decisive logits: greedy text does not depend on batching);
// `other_path`: qwen2-tiny, the same seed.
inline void synth_base_and_other(const std::string& base_path, const std::string& other_path) {
  SynthOptions o;
  o.shape = "llama3-tiny";
  o.type = DType::F32;
  o.seed = 5;
  synth_model(o, base_path);
  SynthOptions other = o;
  other.shape = "qwen2-tiny";
  synth_model(other, other_path);
}

}  // namespace tern::testing
