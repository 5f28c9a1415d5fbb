#include "server/model_provider.h"

#include <algorithm>
#include <utility>

#include "server/api_error.h"

namespace tern::server {

void ModelProvider::add_adapter(const std::string& name, std::shared_ptr<const LoraAdapter>, float) {
  throw ApiError(501, "invalid_request_error", "lora_name", "",
                 str_cat("This server does not serve LoRA adapters (adapter `", name,
                         "`): they run on one base model, tern serve -m BASE --lora NAME=FILE."));
}

ModelRef ModelProvider::remove_adapter(const std::string& name) {
  throw ApiError(404, "invalid_request_error", "lora_name", "model_not_found",
                 str_cat("The LoRA adapter `", name, "` is not loaded."));
}

SingleModelProvider::SingleModelProvider(std::shared_ptr<ServedModel> model, std::vector<std::string> other_names,
                                         bool strict_names)
    : model_(std::move(model)), other_names_(std::move(other_names)), strict_names_(strict_names) {}

void SingleModelProvider::enable_adapters(std::function<void(const LoraAdapter&)> check) {
  check_adapter_ = std::move(check);
  strict_names_ = true;
}

ModelRef SingleModelProvider::adapter(const std::string& name) const {
  std::lock_guard<std::mutex> lock(adapters_mu_);
  const auto it = adapters_.find(name);
  return it == adapters_.end() ? nullptr : it->second;
}

void SingleModelProvider::add_adapter(const std::string& name, std::shared_ptr<const LoraAdapter> adapter,
                                      float scale) {
  if (!check_adapter_) ModelProvider::add_adapter(name, std::move(adapter), scale);
  if (name.empty()) throw ApiError(400, "invalid_request_error", "lora_name", "", "The adapter needs a name.");
  if (name == model_->id || std::find(other_names_.begin(), other_names_.end(), name) != other_names_.end())
    throw ApiError(400, "invalid_request_error", "lora_name", "",
                   str_cat("`", name, "` is the base model's name; an adapter needs a name of its own."));
  try {
    check_adapter_(*adapter);
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    throw ApiError(400, "invalid_request_error", "lora_path", "", e.what());
  }
  // The adapter's model: the base's engine, template and grammars, with the adapter.
  auto m = std::make_shared<ServedModel>();
  m->id = name;
  m->backend = model_->backend;
  m->chat_template = model_->chat_template;
  m->system_fingerprint = model_->system_fingerprint;
  m->structured = model_->structured;
  m->default_options = model_->default_options;
  m->default_system = model_->default_system;
  m->entry = model_->entry;
  m->entry.name = name;
  m->entry.path = adapter->path();
  m->entry.parent = model_->id;
  m->entry.defaults.aliases.clear();
  m->metadata = model_->metadata;
  m->bytes = adapter->n_params() * int64_t(sizeof(float));
  m->lora = LoraSet{LoraUse{std::move(adapter), scale}};
  std::lock_guard<std::mutex> lock(adapters_mu_);
  if (!adapters_.emplace(name, std::move(m)).second)
    throw ApiError(400, "invalid_request_error", "lora_name", "",
                   str_cat("The LoRA adapter `", name, "` is already loaded; unload it first."));
}

ModelRef SingleModelProvider::remove_adapter(const std::string& name) {
  std::lock_guard<std::mutex> lock(adapters_mu_);
  const auto it = adapters_.find(name);
  if (it == adapters_.end()) ModelProvider::remove_adapter(name);
  ModelRef m = std::move(it->second);
  adapters_.erase(it);
  return m;
}

// /v1/models/{id} answers only for the model's own names, whatever a request may name.
bool SingleModelProvider::serves(const std::string& name) const {
  if (name == model_->id) return true;
  if (adapter(name)) return true;
  return std::find(other_names_.begin(), other_names_.end(), name) != other_names_.end();
}

static std::string served_list(const std::string& base, const std::vector<std::string>& adapters) {
  std::string s = "`" + base + "`";
  for (const auto& a : adapters) s += ", `" + a + "`";
  return s;
}

Acquired SingleModelProvider::acquire(const std::string& name, std::optional<double>) {
  if (ModelRef a = adapter(name)) return Acquired{std::move(a), 0};
  if (strict_names_ && !name.empty() && !serves(name)) {
    std::vector<std::string> names;
    {
      std::lock_guard<std::mutex> lock(adapters_mu_);
      for (const auto& [n, m] : adapters_) names.push_back(n);
    }
    throw ApiError(404, "invalid_request_error", "model", "model_not_found",
                   str_cat("The model `", name, "` does not exist. This server serves ", served_list(model_->id, names), "."));
  }
  return Acquired{ModelRef(model_), 0};
}

ModelProvider::Description SingleModelProvider::describe(const std::string& name) const {
  if (ModelRef a = adapter(name)) return {a->entry, a->metadata};
  if (strict_names_ && !name.empty() && !serves(name))
    throw ApiError(404, "invalid_request_error", "model", "model_not_found",
                   str_cat("The model `", name, "` does not exist. This server serves `", model_->id, "`."));
  return {model_->entry, model_->metadata};
}

std::vector<ModelEntry> SingleModelProvider::models() const {
  std::vector<ModelEntry> out = {model_->entry};
  std::lock_guard<std::mutex> lock(adapters_mu_);
  for (const auto& [n, m] : adapters_) out.push_back(m->entry);
  return out;
}

std::vector<LoadedModelInfo> SingleModelProvider::loaded() const {
  LoadedModelInfo row;
  row.entry = model_->entry;
  row.bytes = model_->bytes;
  row.n_ctx = model_->backend->n_ctx();
  const EngineMetrics m = model_->backend->metrics();
  row.leases = int(m.n_running + m.n_waiting);  // the requests in the engine now
  return {row};
}

EngineMetrics SingleModelProvider::metrics() const { return model_->backend->metrics(); }

int64_t SingleModelProvider::n_ctx_of(const std::string&) const { return model_->backend->n_ctx(); }

}  // namespace tern::server
