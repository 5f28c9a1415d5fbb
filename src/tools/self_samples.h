#pragma once
// Texts a model writes itself, by pure sampling from BOS: sequence-level distillation's teacher
// samples (`tern distill --teacher-samples`) and the data-free training text of quantization-
// aware training (`tern train --qat ... --data self`, LLM-QAT's recipe).
#include <cstdint>
#include <memory>
#include <string>

#include "gguf/gguf.h"

namespace tern {

struct SampleOptions {
  int64_t n_samples = 0;
  int64_t sample_len = 256;   // tokens per sample
  float temperature = 1.0f;   // no top-k / top-p / min-p: the model's own distribution
  uint64_t seed = 42;         // sample i uses seed * 1000003 + i
  int threads = 0;
  bool progress = true;
};

// One sample per document: blank lines inside a sample would split it.
std::string as_one_document(const std::string& text);

// n_samples documents separated by blank lines; *n_tokens (optional): the tokens generated.
std::string sample_documents(const std::string& model_path, std::shared_ptr<const GgufFile> file,
                             const SampleOptions& opts, const std::string& label, int64_t* n_tokens = nullptr);

}  // namespace tern
