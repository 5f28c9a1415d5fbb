#include "server/model_provider.h"

#include <algorithm>
#include <utility>

#include "server/api_error.h"

namespace tern::server {

SingleModelProvider::SingleModelProvider(std::shared_ptr<ServedModel> model, std::vector<std::string> other_names,
                                         bool strict_names)
    : model_(std::move(model)), other_names_(std::move(other_names)), strict_names_(strict_names) {}

// /v1/models/{id} answers only for the model's own names, whatever a request may name.
bool SingleModelProvider::serves(const std::string& name) const {
  if (name == model_->id) return true;
  return std::find(other_names_.begin(), other_names_.end(), name) != other_names_.end();
}

Acquired SingleModelProvider::acquire(const std::string& name, std::optional<double>) {
  if (strict_names_ && !name.empty() && !serves(name))
    throw ApiError(404, "invalid_request_error", "model", "model_not_found",
                   str_cat("The model `", name, "` does not exist. This server serves `", model_->id, "`."));
  return Acquired{ModelRef(model_), 0};
}

ModelProvider::Description SingleModelProvider::describe(const std::string& name) const {
  if (strict_names_ && !name.empty() && !serves(name))
    throw ApiError(404, "invalid_request_error", "model", "model_not_found",
                   str_cat("The model `", name, "` does not exist. This server serves `", model_->id, "`."));
  return {model_->entry, model_->metadata};
}

std::vector<ModelEntry> SingleModelProvider::models() const { return {model_->entry}; }

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
