#pragma once
// Options shared by every command that loads a model (-m, --tokenizer, --threads, --ctx,
// --batch, --kv-type), and sizing its context to the machine.
#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/layout.h"
#include "runtime/context_fit.h"
#include "runtime/session.h"
#include "tokenizer/tokenizer.h"
#include "tools/sparse_ffn_args.h"

namespace tern {

// KV eviction (docs/kv.md): --kv-policy none|streaming|h2o, --sinks, --window, --kv-budget,
// --sink-positions, --h2o-score.
struct KvPolicyArgs {
  std::string kind = "none";
  int64_t sinks = 4;
  int64_t window = 0;
  std::string budget;
  std::string sink_positions = "cache";  // streaming: cache (sinks follow the window) | original
  std::string h2o_score = "mean";        // h2o: mean | sum (the paper's)
  void add_to(CLI::App& app);
  // make_kv_policy's errors name the flag.
  KvPolicy config() const;
};

struct ModelArgs {
  std::string model;
  std::string tokenizer_bin;  // llama2.c tokenizer.bin (only with a .bin model)
  int threads = 0;
  int64_t ctx = 0;              // 0: sized to the machine (runtime/context_fit.h)
  int64_t batch = 512;
  std::string kv_type = "f32";  // KV cache element type (kv/kv_store.h kv_types())
  std::vector<std::string> lora;  // --lora FILE[:SCALE], repeatable: adapters stacked on the model
  KvPolicyArgs kv_policy_args;  // add_kv_policy_to
  dist::ParallelLayout layout;  // --tp, --pp, --micro-batches (add_parallel_to)
  SparseFfnArgs sparse;         // --sparse-ffn and its options (add_sparse_ffn_to)

  // default_kv_type: --kv-type's default for this command (f16 for run and serve, which
  // generate text, as llama.cpp; f32 for the measurements compared with f32 references).
  void add_to(CLI::App& app, bool with_ctx = true, KvType default_kv_type = KvType::F32);
  // --kv-policy and its options (commands that run one Session).
  void add_kv_policy_to(CLI::App& app) { kv_policy_args.add_to(app); }
  KvPolicy kv_policy_config() const { return kv_policy_args.config(); }
  // --tp, --pp and --micro-batches: the model spread over the ranks of `mpirun -np tp*pp`
  // (docs/distributed.md).
  void add_parallel_to(CLI::App& app);
  // --sparse-ffn, --predictor, --sparse-density, --sparse-dense-above, --sparse-max-step
  // (tools/sparse_ffn_args.h); open_session applies them.
  void add_sparse_ffn_to(CLI::App& app, bool all_steps = false) { sparse.add_to(app, all_steps); }
  // True when the user gave --ctx (a command may also set `ctx` itself).
  bool ctx_given() const { return ctx_option_ && ctx_option_->count() > 0; }
  // "tern run" once parsed: the prefix of the warnings open_session prints.
  std::string command() const { return app_ ? app_->get_name() : "tern"; }

 private:
  const CLI::App* app_ = nullptr;
  const CLI::Option* ctx_option_ = nullptr;
};

// --tp, --pp and --micro-batches into `layout` (commands that build their engine themselves).
void add_parallel_options(CLI::App& app, dist::ParallelLayout& layout);
// The model loader of a layout (nullptr when it is one process): rank 0's view of the model over
// the ranks of mpirun (dist/parallel_model.h), each rank with n_threads.
std::function<std::unique_ptr<Model>(std::shared_ptr<const GgufFile>)> parallel_loader(const dist::ParallelLayout& layout,
                                                                                        int n_threads);

// Adds `--kv-type f32|f16` to `app`, writing the name to `name` (a bad value is a usage error).
void add_kv_type_option(CLI::App& app, std::string& name, KvType default_type);

struct LoadedSession {
  std::shared_ptr<const GgufFile> file;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Session> session;
};

// Opens the model file (GGUF, or llama2.c .bin + --tokenizer), its tokenizer and a session
// whose context is --ctx, or the default plan_model_context chooses, running the --lora adapters.
LoadedSession open_session(const ModelArgs& args);
// The same over a model file the command has opened already (to read its header first).
LoadedSession open_session(const ModelArgs& args, std::shared_ptr<const GgufFile> file);

// Loads --lora FILE[:SCALE] arguments (each checked against `base`: tern::Error naming the file).
LoraSet load_lora_args(const std::vector<std::string>& args, const GgufFile& base);

// The memory this process may use: read_memory_info(), capped by $TERN_MEMORY_LIMIT (a size
// as --kv-memory takes it) when set, for sharing a machine (and for tests).
MemoryInfo machine_memory();

// Plans the context of `file` on this machine (runtime/context_fit.h): `r` gives the
// command's --ctx, --parallel, --kv-memory and K/V type; the model's and the machine's
// fields are filled in here. Prints the plan's note, and its warning when `warn` (the user
// gave --ctx), on stderr as `command`. Throws tern::Error for what does not fit.
ContextPlan plan_model_context(const GgufFile& file, ContextRequest r, const std::string& command, bool warn);

}  // namespace tern
