#pragma once
// Recovery after pruning (the train -> prune -> fine-tune pipeline): a short knowledge-
// distillation run of the pruned model against the dense one it came from, with its zeros held
// at 0 (`tern distill --teacher DENSE -m PRUNED --keep-zeros`), so that the sparsity survives.
// It runs as a child `tern distill` process: training allocates its own model, optimizer state
// and thread pool, all gone when it ends.
#include <cstdint>
#include <optional>
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

// Knowledge distillation as a compression method (`tern compare`'s kd-TERMS rows): a student of
// the source's widths with half its layers (rounded up), trained from scratch on opts.data by
// `tern distill --teacher SRC` with the loss `loss_spec` (tern distill --loss: "response=1",
// "response=1,feature=0.5", ...), written to `out` as f32; its optimizer state is removed. The
// source must be a Llama-family model (the feature and relation terms run the teacher's forward
// in training). Throws tern::Error when the child fails.
void kd_from_source(const std::string& src, const std::string& loss_spec, const std::string& out,
                    const RecoverOptions& opts);

// The --loss spec of a kd row: "kd-response" -> "response=1", "kd-feature" ->
// "response=1,feature=0.5", "kd-relation" -> "response=1,relation=0.5", "kd-ce" -> CE only ("" and
// --kd none); nullopt for other names.
std::optional<std::string> kd_loss_of(const std::string& method);

// Throws unless opts can run (data readable, tokens > 0, lr > 0).
void check_recover_options(const RecoverOptions& opts);

}  // namespace tern
