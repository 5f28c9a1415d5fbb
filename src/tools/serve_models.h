#pragma once
// `tern serve --models DIR` / several `-m NAME=FILE`: the models of a catalog
// (server/model_catalog.h) served on demand, each loaded into its own Engine when a request
// names it, under server/model_pool.h's memory budget, count limit and keep-alive rules.
//
// A models.json variant ("from") is served on its base's engine: acquiring it leases the base
// (loading it if needed), and its model is the base's engine with the variant's name, defaults,
// chat template (when it sets one) and adapters, built once per load of the base. A model's
// "adapters" (variant or file) run with each of its requests. loaded() lists files only (what
// holds memory); unload(variant) unloads its base.
//
// Thread-safe: the HTTP workers call acquire, loaded, metrics and n_ctx_of at once; loads run
// on the requesting worker (the pool makes concurrent requests for one model wait for one load).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "gguf/gguf.h"
#include "server/model_catalog.h"
#include "server/model_pool.h"
#include "server/model_provider.h"

namespace tern {

// What `tern serve` gives every load: the command's flags. A model's models.json defaults
// (ctx, threads, parallel, chat_template) override the matching fields.
struct ServeLoadSettings {
  // threads, batch, K/V type, parallel, block size, max running / waiting, prefix caching,
  // speculative decoding (every model gets the same drafter; a --draft whose vocabulary does
  // not fit a model is warned about at start-up and fails that model's loads with the reason);
  // n_ctx and kv_memory_bytes are replaced by the plan below.
  EngineConfig engine;
  int64_t ctx = 0;                  // --ctx (0: planned to the memory, as `tern serve -m`)
  bool ctx_given = false;           // warn when --ctx exceeds a model's training context
  int64_t kv_memory_bytes = 0;      // --kv-memory (0: ctx x parallel tokens)
  std::string chat_template;        // --chat-template ("" : the model's own)
  std::string tool_format;          // --tool-format ("" : from the chat template)
  std::string command = "tern serve";  // prefix of stderr lines
  bool log_loads = true;            // one stderr line per load and unload
};

// Speculative decoding as the start-up lines describe it: "prompt lookup (n-grams of 1..3),
// up to 8 tokens a step, adaptive" or "draft model FILE, ...".
std::string spec_description(const SpecConfig& spec);

// What a draft model adds to a load (its file, and its KV: n_ctx slots for each of `regions`
// sequences, as the engine sizes it), so that the memory budget counts it; 0 without a draft
// model. `draft` is the draft's header (open_model_file maps, reads no weight).
int64_t draft_model_bytes(const GgufFile& draft, KvType kv_type, int64_t n_ctx, int64_t regions);

// The GGUF header's scalar keys as JSON (strings, numbers, bools; arrays such as the
// vocabulary left out): ServedModel::metadata, /api/show's model_info.
nlohmann::json gguf_metadata_json(const GgufFile& file);

class PoolModelProvider final : public server::ModelProvider {
 public:
  // `entries`: the catalog; unusable ones (and ones whose context cannot be planned, whose
  // adapters do not load or fit their file, or whose base is left out) are warned about on
  // stderr and left out. Adapters are loaded here, once per file. Throws tern::Error when no
  // model is left or --tool-format is unknown, std::invalid_argument (ModelPool) when the budget
  // is below the smallest model.
  PoolModelProvider(std::vector<server::ModelEntry> entries, server::ModelPoolConfig pool, ServeLoadSettings load);
  ~PoolModelProvider() override;  // unloads every model; every ModelRef must have ended

  server::Acquired acquire(const std::string& name, std::optional<double> keep_alive_s = std::nullopt) override;
  bool serves(const std::string& name) const override;
  void unload(const std::string& name) override;
  Description describe(const std::string& name) const override;
  std::vector<server::ModelEntry> models() const override;
  std::vector<server::LoadedModelInfo> loaded() const override;
  EngineMetrics metrics() const override;
  int64_t n_ctx_of(const std::string& name) const override;
  void collect() override;

  // The models served (usable, in name order; variants too) and what a load of each is expected
  // to hold (file + planned K/V; a variant's: its base's), for the start-up log.
  const std::vector<server::ModelEntry>& entries() const;
  int64_t estimated_bytes(size_t index) const;
  const server::ModelPoolConfig& pool_config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tern
