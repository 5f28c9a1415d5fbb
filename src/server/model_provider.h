#pragma once
// What the HTTP server serves: the models a request may name and, for one request, the model
// it runs on. One model (`tern serve -m FILE`, or a test's fake backend: SingleModelProvider)
// or many loaded on demand under a memory budget (`tern serve --models DIR`, several
// `-m NAME=FILE`: tools/serve_models.h over server/model_pool.h).
//
// A request holds its ModelRef from the moment it names a model to the moment its answer is
// written or its stream ends: while any ModelRef to a model lives, that model is not unloaded.
// That is also what makes a live base swap (SingleModelProvider::swap_base) safe: a request
// keeps the base it acquired, engine and all, until it ends, whatever was swapped in since.
#include <atomic>
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

#include "engine/metrics_sum.h"
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
  // What keeps `backend` alive when the provider owns it (a base loaded by a BaseLoader: its
  // file, engine and backend); an adapter's model shares its base's. Null: the backend's owner
  // is someone else who outlives the provider (a test's fake, an engine on a caller's stack).
  std::shared_ptr<const void> owner;
};

// Holding one keeps the model loaded; the last copy's end releases it.
using ModelRef = std::shared_ptr<const ServedModel>;

// What one acquire gives a request.
struct Acquired {
  ModelRef model;
  int64_t load_ns = 0;              // how long this request waited for a load (0: it was loaded)
};

// POST /admin/swap_base: the new base and, when `lora` is set, its adapters (else the adapters
// served now, loaded again from their files against the new base).
struct SwapAdapter {
  std::string name, path;
  float scale = 1.0f;
};
struct SwapRequest {
  std::string path;
  std::optional<std::vector<SwapAdapter>> lora;
};
struct SwapResult {
  std::string path;
  std::string fingerprint;
  std::vector<std::string> adapters;  // names, in name order
  double load_seconds = 0;            // the new base's load and the adapters' checks
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

  // Replaces the served base (and its adapters) while requests run: see
  // SingleModelProvider::swap_base. Throws ApiError 501 where the provider cannot (a pool).
  virtual SwapResult swap_base(const SwapRequest& request);
};

// One model, always loaded (the Backend's owner, or the model's `owner`, keeps it alive).
// Without `strict_names`, a request naming any model is served by this one, as llama.cpp's
// server does (clients send "gpt-3.5-turbo" by default); with it, only `model.id` and
// `other_names`.
//
// With a BaseLoader (enable_swap) the base can be replaced live. The current base and adapter
// set are one snapshot behind a mutex: acquire() hands out the snapshot's models, so a request
// runs wholly on the base it acquired. A replaced base is kept (`retired`) until no request
// holds it and its engine is idle; collect() (the server's collector thread, about once a
// second) then drops it, so an engine is never destroyed on its own thread (which would join
// itself) nor on a request's.
class SingleModelProvider final : public ModelProvider {
 public:
  // A base as a loader builds it: `model` with its `owner` set (the engine started), the other
  // names requests may call it by (file name, path), and the check of an adapter against it
  // (throws tern::Error naming what does not fit: Engine::check_lora).
  struct LoadedBase {
    std::shared_ptr<ServedModel> model;
    std::vector<std::string> other_names;
    std::function<void(const LoraAdapter&)> check;
  };
  // Loads the base at a path with the server's start-up settings; throws tern::Error naming the
  // file when it cannot. Runs on the swapping request's thread while the old base serves.
  using BaseLoader = std::function<LoadedBase(const std::string& path)>;

  SingleModelProvider(std::shared_ptr<ServedModel> model, std::vector<std::string> other_names, bool strict_names);
  ~SingleModelProvider() override;
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
  void collect() override;

  // Allows swap_base(). The public id stays the model's id across swaps.
  void enable_swap(BaseLoader loader);
  // Loads `request.path` with the loader, loads and checks every adapter against it, then
  // replaces base and adapters at once. Requests already running finish on the old base; new
  // ones get the new. Throws ApiError: 400 for a file that does not load or an adapter that
  // does not fit (nothing changes then), 409 while another swap runs, 501 without a loader.
  SwapResult swap_base(const SwapRequest& request) override;

 private:
  // The served base and adapters, replaced together by a swap.
  struct Snapshot {
    std::shared_ptr<const ServedModel> model;
    std::vector<std::string> other_names;
    std::map<std::string, std::shared_ptr<const ServedModel>> adapters;  // by name
  };
  // A replaced base, kept until no request uses it (then its counters move to `reaped_`).
  struct Retired {
    std::shared_ptr<const void> owner;  // null: not ours to drop (its backend outlives us)
    Backend* backend = nullptr;
    std::chrono::steady_clock::time_point since;
  };

  std::shared_ptr<const Snapshot> snapshot() const;
  bool serves_in(const Snapshot& s, const std::string& name) const;
  // `base` with `adapter` on it, served as the model `name`.
  static std::shared_ptr<ServedModel> adapter_model(const ServedModel& base, const std::string& name,
                                                    std::shared_ptr<const LoraAdapter> adapter, float scale);
  void check_adapter_name(const Snapshot& s, const std::string& name) const;

  bool strict_names_;
  mutable std::mutex mu_;  // guards cur_ (the pointer), strict_names_, check_adapter_, retired_, reaped_
  // Never changed in place: a change publishes a new one, so a reader copies one pointer and
  // reads at leisure.
  std::shared_ptr<const Snapshot> cur_;
  std::function<void(const LoraAdapter&)> check_adapter_;  // set: adapters are served
  // Held by whatever changes the served set (swap, adapter load and unload), for as long as it
  // runs, so that an adapter is never checked against one base and added to another.
  std::mutex change_mu_;
  std::atomic<bool> swapping_{false};
  BaseLoader loader_;
  std::vector<Retired> retired_;
  bool swapped_ = false;
  EngineMetricsSum reaped_;           // counters of retired bases already dropped
};

}  // namespace tern::server
