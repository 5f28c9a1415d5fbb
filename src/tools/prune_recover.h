#pragma once
// Recovery after pruning (the train -> prune -> fine-tune pipeline): a short knowledge-
// distillation run of the pruned model against the dense one it came from, with its zeros held
// at 0 (`tern distill --teacher DENSE -m PRUNED --keep-zeros`), so that the sparsity survives.
// It runs as a child `tern distill` process: training allocates its own model, optimizer state
// and thread pool, all gone when it ends.
#include <cstdint>
#include <string>

namespace tern {

struct RecoverOptions {
  std::string data;         // training text (not the text perplexity is measured on)
  int64_t tokens = 200000;  // tokens of distillation
  double lr = 3e-4;         // peak learning rate (cosine to lr / 10)
  int threads = 0;
  bool quiet = false;       // no progress bar
};

// Distills `pruned` (f32/f16 weights with exact zeros) toward `dense` into `out` (f32); the
// optimizer state file the trainer writes beside it is removed. Throws tern::Error when the
// child fails (its own message is on stderr).
void recover_pruned(const std::string& dense, const std::string& pruned, const std::string& out,
                    const RecoverOptions& opts);

// Quantization-aware training of `src` into the quantized model `out` (`tern compare`'s qat-TYPE
// rows): LLM-QAT's recipe of distillation from the full-precision model itself,
// `tern distill --teacher SRC -m SRC --qat TYPE [--qat-lsq] --qat-out OUT` on opts.data, in a child process;
// the latent f32 checkpoint and its optimizer state are removed. Throws tern::Error when it fails.
void qat_from_source(const std::string& src, const std::string& qat_type, bool lsq, const std::string& out,
                     const RecoverOptions& opts);

// Throws unless opts can run (data readable, tokens > 0, lr > 0).
void check_recover_options(const RecoverOptions& opts);

}  // namespace tern
