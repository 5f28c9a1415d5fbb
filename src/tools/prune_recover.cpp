#include "tools/prune_recover.h"

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/read_file.h"
#include "models/hparams.h"
#include "models/model.h"
#include "tools/kv_compare.h"

namespace tern {

void check_recover_options(const RecoverOptions& opts) {
  if (opts.data.empty()) fail("recovery needs a training text: --recover-data FILE");
  (void)read_file_text(opts.data, "recovery training text");  // exists and is readable
  if (opts.tokens <= 0) fail("--recover tokens must be positive (got ", opts.tokens, ")");
  if (!(opts.lr > 0.0) || !std::isfinite(opts.lr)) fail("--recover-lr must be positive");
}

void recover_pruned(const std::string& dense, const std::string& pruned, const std::string& out,
                    const RecoverOptions& opts) {
  check_recover_options(opts);
  namespace fs = std::filesystem;
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const auto q = compare_shell_quote;
  // No weight decay: it would pull the kept weights toward 0 for no reason in a short run.
  const std::string cmd = q(self) + " distill --teacher " + q(dense) + " -m " + q(pruned) + " --keep-zeros --data " +
                          q(opts.data) + " --tokens " + std::to_string(opts.tokens) + " --lr " + str_cat(opts.lr) +
                          " --weight-decay 0 -t " + std::to_string(opts.threads) + " -o " + q(out) +
                          (opts.quiet ? " -q >/dev/null" : " >&2");
  std::fflush(stdout);
  const int status = std::system(cmd.c_str());
  std::error_code ec;
  fs::remove(out + ".optim", ec);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail("recovery (tern distill of ", pruned, " toward ", dense, ") failed; its message is above");
}

void qat_from_source(const std::string& src, const std::string& qat_type, bool lsq, const std::string& out,
                     const RecoverOptions& opts) {
  check_recover_options(opts);
  namespace fs = std::filesystem;
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::string latent = out + ".latent.gguf";
  const auto q = compare_shell_quote;
  const std::string cmd = q(self) + " distill --teacher " + q(src) + " -m " + q(src) + " --qat " + q(qat_type) +
                          (lsq ? " --qat-lsq" : "") + " --qat-out " + q(out) + " --qat-fallback --data " + q(opts.data) + " --tokens " +
                          std::to_string(opts.tokens) + " --lr " + str_cat(opts.lr) + " --weight-decay 0 -t " +
                          std::to_string(opts.threads) + " -o " + q(latent) + (opts.quiet ? " -q >/dev/null" : " >&2");
  std::fflush(stdout);
  const int status = std::system(cmd.c_str());
  std::error_code ec;
  fs::remove(latent, ec);
  fs::remove(latent + ".optim", ec);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail("quantization-aware training (tern distill --qat ", qat_type, " of ", src, ") failed; its message is above");
}

std::optional<std::string> kd_loss_of(const std::string& method) {
  // The table of kd rows: the response-based loss alone, then each family added to it.
  static const std::pair<const char*, const char*> kRows[] = {
      {"kd-ce", ""},
      {"kd-response", "response=1"},
      {"kd-feature", "response=1,feature=0.5"},
      {"kd-relation", "response=1,relation=0.5"},
  };
  for (const auto& [name, loss] : kRows)
    if (method == name) return std::string(loss);
  return std::nullopt;
}

void kd_from_source(const std::string& src, const std::string& loss_spec, const std::string& out,
                    const RecoverOptions& opts) {
  check_recover_options(opts);
  namespace fs = std::filesystem;
  const HParams hp = read_hparams(*open_model_file(src));
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const auto q = compare_shell_quote;
  const int64_t ctx = std::min<int64_t>(256, hp.n_ctx_train);
  const std::string loss = loss_spec.empty() ? " --kd none --hard-weight 1" : " --loss " + loss_spec;
  const std::string cmd = q(self) + " distill --teacher " + q(src) + " --vocab-from " + q(src) + " --n-embd " +
                          std::to_string(hp.n_embd) + " --n-layer " + std::to_string((hp.n_layer + 1) / 2) +
                          " --n-head " + std::to_string(hp.n_head) + " --n-head-kv " + std::to_string(hp.n_head_kv) +
                          " --n-ff " + std::to_string(hp.n_ff) + " --ctx " + std::to_string(ctx) + loss + " --data " +
                          q(opts.data) + " --tokens " + std::to_string(opts.tokens) + " --lr " + str_cat(opts.lr) +
                          " -t " + std::to_string(opts.threads) + " -o " + q(out) + (opts.quiet ? " -q >/dev/null" : " >&2");
  std::fflush(stdout);
  const int status = std::system(cmd.c_str());
  std::error_code ec;
  fs::remove(out + ".optim", ec);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail("distillation (tern distill of a half-depth student from ", src, ") failed; its message is above");
}

}  // namespace tern
