#include "tools/prune_recover.h"

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/read_file.h"
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

}  // namespace tern
