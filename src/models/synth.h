#pragma once
// Random-weight models with real architecture shapes, written directly in a storage type:
// how benchmarks get realistic sizes without downloading weights (`tern synth`).
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gguf/gguf.h"

namespace tern {

struct SynthShape {
  const char* name;
  int64_t n_embd, n_ff, n_layer, n_head, n_head_kv, n_vocab, n_ctx;
  float rope_freq_base;
  bool tied_output;
};

// The known shapes ("tinyllama-1.1b", "llama2-7b", "llama3-8b", "qwen2-0.5b", "stories260k").
const std::vector<SynthShape>& synth_shapes();
const SynthShape& find_synth_shape(const std::string& name);  // throws listing the known names

struct SynthOptions {
  std::string shape = "stories260k";
  DType type = DType::F32;     // type of the 2-D weights (norms stay f32)
  std::string vocab_gguf;      // copy tokenizer.* from this file; empty: generate a vocabulary
  uint64_t seed = 1234;
  int n_threads = 0;
  int64_t n_ctx_train = 0;     // llama.context_length to write; 0: the shape's
};

struct SynthReport {
  int64_t n_params = 0;
  int64_t weight_bytes = 0;
  int64_t n_vocab = 0;
  // Tensors whose rows did not fit the requested type's block size and the type used instead.
  std::vector<std::pair<std::string, DType>> fallbacks;
};

// Writes the model to `out_path`. Throws tern::Error for an unknown shape or unquantizable type.
SynthReport synth_model(const SynthOptions& opts, const std::string& out_path);

// Adds a generated SentencePiece-style ("llama") vocabulary of n_vocab tokens to `w`:
// <unk>, <s>, </s>, the 256 byte tokens, then single characters and word pieces.
void add_generated_vocab(GgufWriter& w, int64_t n_vocab);

}  // namespace tern
