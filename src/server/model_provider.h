#pragma once
// What the HTTP server serves: the models a request may name and, for one request, the model
// it runs on. One model (`tern serve -m FILE`, or a test's fake backend: SingleModelProvider)
// or many loaded on demand under a memory budget (`tern serve --models DIR`, several
// `-m NAME=FILE`: tools/serve_models.h over server/model_pool.h).
//
// A request holds its ModelRef from the moment it names a model to the moment its answer is
// written or its stream ends: while any ModelRef to a model lives, that model is not unloaded.
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/backend.h"
#include "server/chat_template.h"
#include "server/model_catalog.h"
#include "server/structured_output.h"

namespace tern::server {

// One model as the server uses it. Built once per load, read-only afterwards (requests on many
// threads share it).
struct ServedModel {
  std::string id;                   // the name answers report ("model"): the catalog name
  Backend* backend = nullptr;       // the engine (or a test's fake)
  ChatTemplate chat_template;
  std::string system_fingerprint;   // OpenAI's; "" leaves it out
  std::shared_ptr<StructuredOutput> structured;  // grammars of constrained answers, for this tokenizer
  // models.json's defaults (multi-model): Ollama options and a system prompt applied where a
  // request sets none.
  nlohmann::json default_options = nlohmann::json::object();
  std::string default_system;
  ModelEntry entry;                 // the catalog's facts (name, file, details for /api/tags, /api/show)
  nlohmann::json metadata = nlohmann::json::object();  // scalar GGUF header keys (for /api/show)
  int64_t bytes = 0;                // weights + KV + buffers it holds (for /api/ps)
  // A LoRA adapter served as a model (vLLM's convention: the request's `model` names the
  // adapter): the adapters its requests run with on `backend`, the base's engine. Empty: the base.
  LoraSet lora;
};

// Holding one keeps the model loaded; the last copy's end releases it.
using ModelRef = std::shared_ptr<const ServedModel>;

// What one acquire gives a request.
struct Acquired {
  ModelRef model;
  int64_t load_ns = 0;              // how long this request waited for a load (0: it was loaded)
};

// A model loaded now, as /api/ps and `tern ps` show it.
struct LoadedModelInfo {
  ModelEntry entry;
  int64_t bytes = 0;
  int64_t n_ctx = 0;
  int leases = 0;                   // requests using it now
  // When an idle model unloads (system clock, for clients); nullopt: never, or in use.
  std::optional<std::chrono::system_clock::time_point> expires;
};

class ModelProvider {
 public:
  virtual ~ModelProvider() = default;

  // The model `name` names ("" : the default one when the server has a single model), loaded
  // when it is not. `keep_alive_s`: the request's (Ollama's keep_alive; < 0 forever, 0 unload
  // when this request ends); unset: the model's or the server's default. Throws ApiError: 404
  // model_not_found naming the served models, 400 when "" names none of several, 507
  // (insufficient storage: the model alone is over the memory budget), 503 (no room: the
  // models in use leave none within the wait), 500 (the load failed, with the reason).
  virtual Acquired acquire(const std::string& name, std::optional<double> keep_alive_s = std::nullopt) = 0;

  // Whether `name` is one of the served models' names (or aliases), without loading anything
  // (/v1/models/{id}). Strict even where acquire() serves any name.
  virtual bool serves(const std::string& name) const = 0;

  // Unloads `name` now if no request uses it (Ollama's keep_alive 0 with nothing to
  // generate); a model in use unloads when its last request ends. Throws ApiError 404 for a
  // name not served.
  virtual void unload(const std::string& name) = 0;

  // What /api/show tells of `name` without loading it: its catalog entry and the scalar keys
  // of its file's header. Throws ApiError as acquire() does for a name not served.
  struct Description {
    ModelEntry entry;
    nlohmann::json metadata = nlohmann::json::object();
  };
  virtual Description describe(const std::string& name) const = 0;

  // Every usable model served, loaded or not, in name order (for /v1/models and /api/tags).
  virtual std::vector<ModelEntry> models() const = 0;
  // The models loaded now.
  virtual std::vector<LoadedModelInfo> loaded() const = 0;
  // The engines' metrics summed over the loaded models (counters of unloaded models are kept,
  // so that totals never go back).
  virtual EngineMetrics metrics() const = 0;
  // The context of `name` when loaded, else what it would be loaded with (0 when unknown).
  virtual int64_t n_ctx_of(const std::string& name) const = 0;
  // Unloads models whose keep_alive ran out. The server calls it about once a second.
  virtual void collect() {}

  // LoRA adapters served as models of their own, added and removed at run time
  // (/v1/load_lora_adapter, /v1/unload_lora_adapter). add_adapter throws ApiError 400 for a name
  // in use or an adapter that does not fit the model, 501 where the provider serves none.
  // remove_adapter returns the adapter's model, which requests may still hold (the caller waits
  // for them), or throws ApiError 404 for a name that is no adapter.
  virtual void add_adapter(const std::string& name, std::shared_ptr<const LoraAdapter> adapter, float scale);
  virtual ModelRef remove_adapter(const std::string& name);
};

// One model, always loaded (the Backend's owner keeps it alive). Without `strict_names`, a
// request naming any model is served by this one, as llama.cpp's server does (clients send
// "gpt-3.5-turbo" by default); with it, only `model.id` and `other_names`.
class SingleModelProvider final : public ModelProvider {
 public:
  SingleModelProvider(std::shared_ptr<ServedModel> model, std::vector<std::string> other_names, bool strict_names);
  // Serves adapters beside the model (`tern serve -m BASE --lora NAME=FILE`): `check` throws
  // tern::Error when an adapter does not fit the model (Engine::check_lora). With adapters,
  // names are strict: an unknown name is 404, never the base.
  void enable_adapters(std::function<void(const LoraAdapter&)> check);
  void add_adapter(const std::string& name, std::shared_ptr<const LoraAdapter> adapter, float scale) override;
  ModelRef remove_adapter(const std::string& name) override;

  Acquired acquire(const std::string& name, std::optional<double> keep_alive_s) override;
  bool serves(const std::string& name) const override;
  void unload(const std::string&) override {}  // never unloaded
  Description describe(const std::string& name) const override;
  std::vector<ModelEntry> models() const override;
  std::vector<LoadedModelInfo> loaded() const override;
  EngineMetrics metrics() const override;
  int64_t n_ctx_of(const std::string&) const override;

 private:
  ModelRef adapter(const std::string& name) const;  // nullptr: not an adapter's name

  std::shared_ptr<ServedModel> model_;
  std::vector<std::string> other_names_;
  bool strict_names_;
  std::function<void(const LoraAdapter&)> check_adapter_;  // set: adapters are served
  mutable std::mutex adapters_mu_;
  std::map<std::string, std::shared_ptr<const ServedModel>> adapters_;  // by name
};

}  // namespace tern::server
