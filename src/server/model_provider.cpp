#include "server/model_provider.h"

#include <algorithm>
#include <set>
#include <utility>

#include "server/api_error.h"

namespace tern::server {

namespace {


// A retired base still busy after this long is dropped anyway (its requests have been told to
// end by their deadline long before): a leak must not keep an engine forever.
constexpr auto kRetiredPatience = std::chrono::minutes(30);

}  // namespace

void ModelProvider::add_adapter(const std::string& name, std::shared_ptr<const LoraAdapter>, float) {
  throw ApiError(501, "invalid_request_error", "lora_name", "",
                 str_cat("This server does not serve LoRA adapters (adapter `", name,
                         "`): they run on one base model, tern serve -m BASE --lora NAME=FILE."));
}

ModelRef ModelProvider::remove_adapter(const std::string& name) {
  throw ApiError(404, "invalid_request_error", "lora_name", "model_not_found",
                 str_cat("The LoRA adapter `", name, "` is not loaded."));
}

SwapResult ModelProvider::swap_base(const SwapRequest&) {
  throw ApiError(501, "invalid_request_error", "", "",
                 "This server serves several models loaded on demand (--models DIR, -m NAME=FILE): a live base swap "
                 "is for one model (tern serve -m FILE); load another model by naming it instead.");
}

SingleModelProvider::SingleModelProvider(std::shared_ptr<ServedModel> model, std::vector<std::string> other_names,
                                         bool strict_names)
    : strict_names_(strict_names) {
  auto s = std::make_shared<Snapshot>();
  s->model = std::move(model);
  s->other_names = std::move(other_names);
  cur_ = std::move(s);
}

SingleModelProvider::~SingleModelProvider() = default;

void SingleModelProvider::enable_adapters(std::function<void(const LoraAdapter&)> check) {
  std::lock_guard<std::mutex> lock(mu_);
  check_adapter_ = std::move(check);
  strict_names_ = true;
}

void SingleModelProvider::enable_swap(BaseLoader loader) { loader_ = std::move(loader); }

std::shared_ptr<const SingleModelProvider::Snapshot> SingleModelProvider::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cur_;
}

std::shared_ptr<ServedModel> SingleModelProvider::adapter_model(const ServedModel& base, const std::string& name,
                                                                std::shared_ptr<const LoraAdapter> adapter,
                                                                float scale) {
  // The adapter's model: the base's engine, template and grammars, with the adapter.
  auto m = std::make_shared<ServedModel>();
  m->id = name;
  m->backend = base.backend;
  m->owner = base.owner;
  m->chat_template = base.chat_template;
  m->system_fingerprint = base.system_fingerprint;
  m->structured = base.structured;
  m->default_options = base.default_options;
  m->default_system = base.default_system;
  m->entry = base.entry;
  m->entry.name = name;
  m->entry.path = adapter->path();
  m->entry.parent = base.id;
  m->entry.defaults.aliases.clear();
  m->metadata = base.metadata;
  m->bytes = adapter->n_params() * int64_t(sizeof(float));
  m->lora = LoraSet{LoraUse{std::move(adapter), scale}};
  return m;
}

void SingleModelProvider::check_adapter_name(const Snapshot& s, const std::string& name) const {
  if (name.empty()) throw ApiError(400, "invalid_request_error", "lora_name", "", "The adapter needs a name.");
  if (name == s.model->id || std::find(s.other_names.begin(), s.other_names.end(), name) != s.other_names.end())
    throw ApiError(400, "invalid_request_error", "lora_name", "",
                   str_cat("`", name, "` is the base model's name; an adapter needs a name of its own."));
}

void SingleModelProvider::add_adapter(const std::string& name, std::shared_ptr<const LoraAdapter> adapter,
                                      float scale) {
  std::lock_guard<std::mutex> change(change_mu_);
  std::function<void(const LoraAdapter&)> check;
  {
    std::lock_guard<std::mutex> lock(mu_);
    check = check_adapter_;
  }
  if (!check) ModelProvider::add_adapter(name, std::move(adapter), scale);
  // change_mu_ held: the base cannot change before the adapter is added to its set.
  const std::shared_ptr<const Snapshot> s = snapshot();
  check_adapter_name(*s, name);
  try {
    check(*adapter);
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    throw ApiError(400, "invalid_request_error", "lora_path", "", e.what());
  }
  if (s->adapters.count(name))
    throw ApiError(400, "invalid_request_error", "lora_name", "",
                   str_cat("The LoRA adapter `", name, "` is already loaded; unload it first."));
  auto next = std::make_shared<Snapshot>(*s);
  next->adapters.emplace(name, adapter_model(*s->model, name, std::move(adapter), scale));
  std::lock_guard<std::mutex> lock(mu_);
  cur_ = std::move(next);
}

ModelRef SingleModelProvider::remove_adapter(const std::string& name) {
  std::lock_guard<std::mutex> change(change_mu_);
  const std::shared_ptr<const Snapshot> s = snapshot();
  const auto it = s->adapters.find(name);
  if (it == s->adapters.end()) ModelProvider::remove_adapter(name);
  ModelRef m = it->second;
  auto next = std::make_shared<Snapshot>(*s);
  next->adapters.erase(name);
  std::lock_guard<std::mutex> lock(mu_);
  cur_ = std::move(next);
  return m;
}

bool SingleModelProvider::serves_in(const Snapshot& s, const std::string& name) const {
  if (name == s.model->id) return true;
  if (s.adapters.count(name)) return true;
  return std::find(s.other_names.begin(), s.other_names.end(), name) != s.other_names.end();
}

// /v1/models/{id} answers only for the model's own names, whatever a request may name.
bool SingleModelProvider::serves(const std::string& name) const { return serves_in(*snapshot(), name); }

static std::string served_list(const std::string& base, const std::map<std::string, ModelRef>& adapters) {
  std::string s = "`" + base + "`";
  for (const auto& [a, m] : adapters) s += ", `" + a + "`";
  return s;
}

Acquired SingleModelProvider::acquire(const std::string& name, std::optional<double>) {
  // One snapshot: the base and adapter a request gets belong to one served set, even while a
  // swap replaces it.
  bool strict = false;
  std::shared_ptr<const Snapshot> s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = cur_;
    strict = strict_names_;
  }
  if (const auto it = s->adapters.find(name); it != s->adapters.end()) return Acquired{it->second, 0};
  if (strict && !name.empty() && !serves_in(*s, name))
    throw ApiError(404, "invalid_request_error", "model", "model_not_found",
                   str_cat("The model `", name, "` does not exist. This server serves ",
                           served_list(s->model->id, s->adapters), "."));
  return Acquired{s->model, 0};
}

ModelProvider::Description SingleModelProvider::describe(const std::string& name) const {
  bool strict = false;
  std::shared_ptr<const Snapshot> s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = cur_;
    strict = strict_names_;
  }
  if (const auto it = s->adapters.find(name); it != s->adapters.end()) return {it->second->entry, it->second->metadata};
  if (strict && !name.empty() && !serves_in(*s, name))
    throw ApiError(404, "invalid_request_error", "model", "model_not_found",
                   str_cat("The model `", name, "` does not exist. This server serves `", s->model->id, "`."));
  return {s->model->entry, s->model->metadata};
}

std::vector<ModelEntry> SingleModelProvider::models() const {
  const std::shared_ptr<const Snapshot> s = snapshot();
  std::vector<ModelEntry> out = {s->model->entry};
  for (const auto& [n, m] : s->adapters) out.push_back(m->entry);
  return out;
}

std::vector<LoadedModelInfo> SingleModelProvider::loaded() const {
  const std::shared_ptr<const Snapshot> s = snapshot();
  LoadedModelInfo row;
  row.entry = s->model->entry;
  row.bytes = s->model->bytes;
  row.n_ctx = s->model->backend->n_ctx();
  const EngineMetrics m = s->model->backend->metrics();
  row.leases = int(m.n_running + m.n_waiting);  // the requests in the engine now
  return {row};
}

// The current engine's, plus the retired ones' (still running their last requests, or dropped:
// their counters), so that no counter goes back across a swap.
EngineMetrics SingleModelProvider::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!swapped_)
    return cur_->model->backend->metrics();  // never swapped: the engine's own figures
  std::vector<EngineMetrics> live = {cur_->model->backend->metrics()};
  for (const Retired& r : retired_) live.push_back(r.backend->metrics());
  return reaped_.total(live);
}

int64_t SingleModelProvider::n_ctx_of(const std::string&) const { return snapshot()->model->backend->n_ctx(); }

void SingleModelProvider::collect() {
  std::vector<std::shared_ptr<const void>> drop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    for (auto it = retired_.begin(); it != retired_.end();) {
      // use_count 1: only this list holds the base (no request, no adapter model of it is
      // left, and none can come back: the provider no longer hands it out). The engine must
      // also be idle, so that an abort still queued there is counted before it goes.
      if (!it->owner || it->owner.use_count() != 1) {
        ++it;
        continue;
      }
      const EngineMetrics m = it->backend->metrics();
      if (m.n_running + m.n_waiting > 0 && now - it->since < kRetiredPatience) {
        ++it;
        continue;
      }
      reaped_.retire(m);
      drop.push_back(std::move(it->owner));
      it = retired_.erase(it);
    }
  }
  // Outside the lock: dropping a base stops its engine (joins its thread).
}

SwapResult SingleModelProvider::swap_base(const SwapRequest& request) {
  if (!loader_)
    throw ApiError(501, "invalid_request_error", "", "", "This server cannot load another base model.");
  if (swapping_.exchange(true))
    throw ApiError(409, "invalid_request_error", "", "swap_in_progress",
                   "Another base swap is in progress; retry when it has finished.");
  struct Clear {
    std::atomic<bool>& flag;
    ~Clear() { flag.store(false); }
  } clear{swapping_};
  std::lock_guard<std::mutex> change(change_mu_);
  const auto t0 = std::chrono::steady_clock::now();
  const std::shared_ptr<const Snapshot> old = snapshot();

  // The adapters to serve on the new base: the request's, or the ones served now.
  std::vector<SwapAdapter> wanted;
  if (request.lora) {
    wanted = *request.lora;
  } else {
    for (const auto& [name, m] : old->adapters)
      for (const LoraUse& u : m->lora) wanted.push_back({name, u.adapter->path(), u.scale});
  }
  {
    std::set<std::string> seen;
    for (const SwapAdapter& a : wanted) {
      check_adapter_name(*old, a.name);
      if (!seen.insert(a.name).second)
        throw ApiError(400, "invalid_request_error", "lora", "", str_cat("The adapter name `", a.name, "` is given twice."));
    }
  }

  LoadedBase loaded;
  try {
    loaded = loader_(request.path);
  } catch (const ApiError&) {
    throw;
  } catch (const std::exception& e) {
    throw ApiError(400, "invalid_request_error", "model", "",
                   str_cat("Cannot load the base model ", request.path, ": ", e.what()));
  }
  // The public id stays: clients keep calling the model by the name they know.
  loaded.model->id = old->model->id;
  loaded.model->entry.name = old->model->id;

  auto next = std::make_shared<Snapshot>();
  next->model = loaded.model;
  next->other_names = std::move(loaded.other_names);
  for (const SwapAdapter& a : wanted) {
    check_adapter_name(*next, a.name);  // the new file's names too
    std::shared_ptr<const LoraAdapter> adapter;
    try {
      adapter = LoraAdapter::load(a.path);
      loaded.check(*adapter);
    } catch (const std::exception& e) {
      throw ApiError(400, "invalid_request_error", "lora", "",
                     str_cat("The LoRA adapter `", a.name, "` (", a.path, ") cannot be served on the new base ", request.path,
                             ": ", e.what()));
    }
    next->adapters.emplace(a.name, adapter_model(*loaded.model, a.name, std::move(adapter), a.scale));
  }

  SwapResult result;
  result.path = request.path;
  result.fingerprint = loaded.model->system_fingerprint;
  for (const auto& [name, m] : next->adapters) result.adapters.push_back(name);
  const bool with_adapters = !next->adapters.empty();
  {
    std::lock_guard<std::mutex> lock(mu_);
    retired_.push_back(Retired{old->model->owner, old->model->backend, std::chrono::steady_clock::now()});
    cur_ = std::move(next);
    swapped_ = true;
    if (check_adapter_ || with_adapters) {
      check_adapter_ = loaded.check;
      strict_names_ = true;  // with adapters, an unknown name is 404, never the base
    }
  }
  result.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace tern::server
