// Pipeline engines over one parallel model (pipeline_engines.h).
#include "tools/pipeline_engines.h"

#include <algorithm>

#include "core/error.h"
#include "dist/parallel_model.h"
#include "models/model.h"

namespace tern {

void add_pipeline_engines_option(CLI::App& app, int& n, const char* default_note) {
  app.add_option("--pipeline-engines", n,
                 std::string("with --pp: engines over the one model, each with its own scheduler and a share of the K/V "
                             "memory, so that one engine's step enters the pipeline while another's is in the later "
                             "stages (vLLM's virtual engines; 0: ") +
                     default_note + ")")
      ->check(CLI::Range(0, 64));
}

EngineConfig pipeline_engine_config(EngineConfig ecfg, int n) {
  const auto share = [n](int64_t v) { return std::max<int64_t>(1, (v + n - 1) / n); };
  if (ecfg.kv_memory_bytes > 0) ecfg.kv_memory_bytes /= n;
  ecfg.n_parallel = share(ecfg.n_parallel);
  ecfg.max_running = share(ecfg.max_running);
  ecfg.max_waiting = share(ecfg.max_waiting);
  return ecfg;
}

std::vector<std::unique_ptr<Engine>> make_pipeline_engines(std::shared_ptr<const GgufFile> file,
                                                           std::shared_ptr<const Tokenizer> tok,
                                                           const EngineConfig& ecfg, int n) {
  if (n < 2) fail("pipeline engines: ", n, " asked, at least 2");
  if (!ecfg.load) fail("pipeline engines need a parallel model's loader (--pp under mpirun)");
  EngineConfig each = pipeline_engine_config(ecfg, n);
  // (Read while the engines are built: the first's model lives as long as its engine.)
  auto first = std::make_shared<const Model*>(nullptr);
  each.load = [first, load = each.load](std::shared_ptr<const GgufFile> f) {
    if (*first) return dist::share_parallel_model(**first);
    std::unique_ptr<Model> m = load(std::move(f));
    *first = m.get();
    return m;
  };
  std::vector<std::unique_ptr<Engine>> engines;
  for (int e = 0; e < n; ++e) engines.push_back(std::make_unique<Engine>(file, tok, each));
  return engines;
}

}  // namespace tern
