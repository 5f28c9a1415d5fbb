#include "tools/model_args.h"

#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "dist/parallel_model.h"
#include "tools/cli_util.h"

namespace tern {

void ModelArgs::add_to(CLI::App& app, bool with_ctx, KvType default_kv_type) {
  app_ = &app;
  app.add_option("-m,--model", model, "model file: GGUF, or a llama2.c .bin with --tokenizer")->required();
  app.add_option("--tokenizer", tokenizer_bin, "llama2.c tokenizer.bin (for a .bin model)");
  app.add_option("-t,--threads", threads, "worker threads (0: all cores)")->check(CLI::Range(0, 1024));
  if (with_ctx) {
    ctx_option_ = app.add_option("-c,--ctx", ctx,
                                 "context size in tokens (0: the model's training context, at most 4096, "
                                 "less if memory is short)")
                      ->check(CLI::Range(int64_t(0), int64_t(1) << 24));
  }
  app.add_option("-b,--batch", batch, "most prompt tokens per forward pass")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 16));
  add_kv_type_option(app, kv_type, default_kv_type);
  app.add_option("--lora", lora,
                 "LoRA adapter in llama.cpp's GGUF format, FILE or FILE:SCALE (default scale 1); "
                 "repeat to stack adapters");
}

void ModelArgs::add_parallel_to(CLI::App& app) { add_parallel_options(app, layout); }

std::function<std::unique_ptr<Model>(std::shared_ptr<const GgufFile>)> parallel_loader(const dist::ParallelLayout& layout,
                                                                                        int n_threads) {
  if (!layout.parallel()) return nullptr;
  return [layout, n_threads](std::shared_ptr<const GgufFile> f) {
    return dist::load_parallel_model(std::move(f), layout, n_threads);
  };
}

void add_parallel_options(CLI::App& app, dist::ParallelLayout& layout) {
  app.add_option("--tp", layout.tp,
                 "tensor parallelism: split every layer's heads and FFN channels over N ranks (under mpirun; "
                 "docs/distributed.md)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--pp", layout.pp, "pipeline parallelism: split the layers into N stages, one per rank group (under mpirun)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--micro-batches", layout.micro_batches,
                 "pipeline: micro-batches a step is cut into, so that the stages work at once (0: --pp)")
      ->check(CLI::Range(0, 65536));
}

void KvPolicyArgs::add_to(CLI::App& app) {
  app.add_option("--kv-policy", kind,
                 "KV cache eviction: none; streaming (attention sinks + a recent window: generation continues past "
                 "the context in constant memory); h2o (heavy hitters: keeps the tokens with the most accumulated "
                 "attention within --kv-budget)")
      ->capture_default_str();
  app.add_option("--sinks", sinks, "first tokens always kept by streaming and h2o")->capture_default_str();
  app.add_option("--window", window, "streaming: recent tokens kept; h2o: recent tokens never evicted (default: half the budget)");
  app.add_option("--kv-budget", budget, "h2o: most tokens in the cache, N or P% of the context");
  app.add_option("--sink-positions", sink_positions,
                 "streaming: cache (the sinks' keys are re-rotated to sit just before the window, as StreamingLLM "
                 "places them) or original (every key keeps its position)")
      ->check(CLI::IsMember({"cache", "original"}))
      ->capture_default_str();
  app.add_option("--h2o-score", h2o_score,
                 "h2o: rank tokens by mean attention since they arrived, or by its sum (the H2O paper's)")
      ->check(CLI::IsMember({"mean", "sum"}))
      ->capture_default_str();
}

KvPolicy KvPolicyArgs::config() const {
  KvPolicy p = make_kv_policy(kind, sinks, window, budget);
  p.sinks_follow = sink_positions == "cache";
  p.h2o_mean = h2o_score == "mean";
  return p;
}

LoraSet load_lora_args(const std::vector<std::string>& args, const GgufFile& base) {
  LoraSet set;
  for (const std::string& a : args) {
    const auto [path, scale] = parse_lora_arg(a);
    auto adapter = LoraAdapter::load(path);
    adapter->check_base(base);
    set.push_back(LoraUse{std::move(adapter), scale});
  }
  return set;
}

void add_kv_type_option(CLI::App& app, std::string& name, KvType default_type) {
  name = kv_type_name(default_type);
  std::vector<std::string> names;
  for (const KvTypeTraits& t : kv_types()) names.push_back(t.name);
  app.add_option("--kv-type", name,
                 "K/V cache element type: f32; f16 (half the bytes per token); q8_0 or q4_0 (llama.cpp's blocks: "
                 "0.53 / 0.28 of f16's bytes); kivi2 (KIVI: 2-bit keys per channel and values per token, the newest "
                 "group of 32 tokens in fp16; 0.19 of f16's bytes)")
      ->check(CLI::IsMember(names))
      ->capture_default_str();
}

LoadedSession open_session(const ModelArgs& args) {
  return open_session(args, open_model_file(args.model, args.tokenizer_bin));
}

LoadedSession open_session(const ModelArgs& args, std::shared_ptr<const GgufFile> file) {
  LoadedSession s;
  s.file = std::move(file);
  s.tokenizer = Tokenizer::from_gguf(*s.file);
  ContextRequest req;
  req.kv_type = kv_type_from_name(args.kv_type);
  req.n_ctx = args.ctx;
  const ContextPlan plan = plan_model_context(*s.file, req, args.command(), args.ctx_given());
  SessionConfig cfg;
  cfg.n_ctx = plan.n_ctx;
  cfg.n_threads = args.threads;
  cfg.n_batch = args.batch;
  cfg.kv_type = kv_type_from_name(args.kv_type);
  cfg.kv_policy = args.kv_policy_config();
  if (args.layout.parallel()) {
    if (args.sparse.enabled) fail("--sparse-ffn is not supported with --tp / --pp yet");
    cfg.load = parallel_loader(args.layout, args.threads);
  }
  cfg.load = sparse_ffn_loader(args.sparse, cfg.load);
  if (!args.lora.empty() && !args.sparse.ram_budget.empty()) fail(kLoraWithRamBudget);
  LoraSet lora = load_lora_args(args.lora, *s.file);  // (before the model: a bad adapter fails fast)
  s.session = std::make_unique<Session>(s.file, cfg);
  if (!lora.empty()) s.session->set_lora(std::move(lora));
  if (s.tokenizer->n_vocab() > s.session->hparams().n_vocab)
    fail(args.model, ": the tokenizer has ", s.tokenizer->n_vocab(), " tokens but the model's embedding only ",
         s.session->hparams().n_vocab);
  return s;
}

MemoryInfo machine_memory() {
  MemoryInfo m = read_memory_info();
  const char* limit_text = std::getenv("TERN_MEMORY_LIMIT");
  if (!limit_text || !*limit_text) return m;
  int64_t limit = 0;
  try {
    limit = parse_memory_size(limit_text);
  } catch (const Error& e) {
    fail("TERN_MEMORY_LIMIT: ", e.what());
  }
  return apply_cgroup_limit(m, limit, /*usage=*/0, /*reclaimable=*/0);
}

ContextPlan plan_model_context(const GgufFile& file, ContextRequest r, const std::string& command, bool warn) {
  r.hparams = read_hparams(file);
  r.weight_bytes = int64_t(file.tensor_data_bytes());
  r.memory = machine_memory();
  const ContextPlan plan = plan_context(r);
  if (!plan.note.empty()) std::fprintf(stderr, "%s: %s\n", command.c_str(), plan.note.c_str());
  if (warn && !plan.warning.empty()) std::fprintf(stderr, "%s: warning: %s\n", command.c_str(), plan.warning.c_str());
  return plan;
}

}  // namespace tern
