#include "tools/serve_models.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

#include "core/error.h"
#include "engine/metrics_sum.h"
#include "models/model.h"
#include "runtime/context_fit.h"
#include "server/api_error.h"
#include "server/backend.h"
#include "server/chat_template.h"
#include "server/openai_format.h"
#include "server/structured_output.h"
#include "server/tool_calls.h"
#include "tools/cli_util.h"
#include "tools/model_args.h"

namespace tern {
namespace {

using server::ApiError;
using server::ModelEntry;
using server::ModelPool;

// "`a`, `b` and `c`"
std::string names_text(const std::vector<ModelEntry>& entries) {
  std::string out;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i > 0) out += i + 1 == entries.size() ? " and " : ", ";
    out += "`" + entries[i].name + "`";
  }
  return out;
}

// Counters only (the gauges of an unloaded engine are gone with it).

}  // namespace

nlohmann::json gguf_metadata_json(const GgufFile& file) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, value] : file.metadata()) {
    if (const auto* u = std::get_if<uint64_t>(&value.v)) out[key] = *u;
    else if (const auto* i = std::get_if<int64_t>(&value.v)) out[key] = *i;
    else if (const auto* d = std::get_if<double>(&value.v)) out[key] = *d;
    else if (const auto* b = std::get_if<bool>(&value.v)) out[key] = *b;
    else if (const auto* s = std::get_if<std::string>(&value.v)) out[key] = *s;
  }
  return out;
}

struct PoolModelProvider::Impl {
  // One loaded model: everything a load built, owned by the pool's slot. Its end stops the
  // engine (requests still unfinished end with Abort) and keeps its counters.
  struct Loaded final : server::PooledModel {
    Impl* owner = nullptr;
    size_t index = 0;
    bool registered = false;
    std::shared_ptr<const GgufFile> file;
    std::shared_ptr<const Tokenizer> tokenizer;
    std::unique_ptr<Engine> engine;
    std::unique_ptr<server::EngineBackend> backend;
    server::ServedModel served;

    ~Loaded() override {
      if (!engine) return;
      engine->stop();
      if (registered) owner->retire(index, *engine);
    }
  };

  // A ModelRef's owner: the lease keeps the model loaded.
  struct Holder {
    ModelPool::Lease lease;
  };

  std::vector<ModelEntry> entries;  // usable, by name
  std::vector<ContextPlan> plans;   // per entry, planned at start-up
  std::vector<int64_t> estimates;
  ServeLoadSettings settings;
  std::optional<server::ToolFormat> tool_format;
  std::map<std::string, size_t> names;  // names and aliases -> index

  mutable std::mutex live_mu;           // guards live and retired
  std::vector<Loaded*> live;            // per entry: the loaded model, nullptr when not
  EngineMetricsSum retired;             // counters of engines already unloaded

  std::unique_ptr<ModelPool> pool;      // last: destroyed first (unloads while the rest lives)

  void retire(size_t index, const Engine& engine) {
    const EngineMetrics m = engine.metrics();
    std::lock_guard lock(live_mu);
    retired.retire(m);
    live[index] = nullptr;
    if (settings.log_loads)
      std::fprintf(stderr, "%s: unloaded %s (%lld requests served)\n", settings.command.c_str(),
                   entries[index].name.c_str(), static_cast<long long>(m.requests_finished));
  }

  // The context a load of `e` gets. `budget` (> 0) caps the memory it is planned against, so
  // that one model's default context leaves room under the server's budget.
  ContextPlan plan(const GgufFile& file, const ModelEntry& e, int64_t budget) const {
    ContextRequest r;
    r.hparams = read_hparams(file);
    r.weight_bytes = int64_t(file.tensor_data_bytes());
    r.kv_type = settings.engine.kv_type;
    r.n_ctx = e.defaults.ctx.value_or(settings.ctx);
    r.n_parallel = e.defaults.parallel.value_or(settings.engine.n_parallel);
    r.kv_memory_bytes = settings.kv_memory_bytes;
    r.serving = true;
    r.memory = machine_memory();
    if (budget > 0) {
      if (r.memory.available <= 0 || budget < r.memory.available) r.memory.available = budget;
      if (r.memory.total <= 0 || budget < r.memory.total) r.memory.total = budget;
    }
    return plan_context(r);
  }

  std::optional<size_t> find(const std::string& name) const {
    if (auto it = names.find(name); it != names.end()) return it->second;
    static const std::string kLatest = ":latest";  // Ollama's clients add it
    if (name.size() > kLatest.size() && name.compare(name.size() - kLatest.size(), kLatest.size(), kLatest) == 0)
      if (auto it = names.find(name.substr(0, name.size() - kLatest.size())); it != names.end()) return it->second;
    return std::nullopt;
  }

  size_t resolve(const std::string& name) const {
    if (name.empty()) {
      if (entries.size() == 1) return 0;
      throw ApiError(400, "invalid_request_error", "model", "", "model is required");
    }
    if (auto i = find(name)) return *i;
    throw ApiError(404, "invalid_request_error", "model", "model_not_found",
                   str_cat("The model `", name, "` does not exist. This server serves ", names_text(entries), "."));
  }

  ModelPool::Loaded load(size_t index) {
    const ModelEntry& e = entries[index];
    const auto t0 = std::chrono::steady_clock::now();
    auto m = std::make_unique<Loaded>();
    m->owner = this;
    m->index = index;
    m->file = open_model_file(e.path.string());
    m->tokenizer = Tokenizer::from_gguf(*m->file);

    EngineConfig ecfg = settings.engine;
    if (e.defaults.threads) ecfg.n_threads = *e.defaults.threads;
    if (e.defaults.parallel) ecfg.n_parallel = *e.defaults.parallel;
    ecfg.n_ctx = plans[index].n_ctx;
    ecfg.kv_memory_bytes = settings.kv_memory_bytes;
    if (ecfg.max_running < ecfg.n_parallel) ecfg.max_running = ecfg.n_parallel;

    server::ServedModel& s = m->served;
    s.id = e.name;
    const Tokenizer& tok = *m->tokenizer;
    const auto token_text = [&](int32_t id) {
      return id >= 0 && id < tok.n_vocab() ? tok.tokens()[size_t(id)] : std::string();
    };
    std::string note;
    s.chat_template = server::select_chat_template(
        e.defaults.chat_template.empty() ? settings.chat_template : e.defaults.chat_template,
        m->file->get_string("tokenizer.chat_template", ""), token_text(tok.bos_id()), token_text(tok.eos_id()), &note);
    if (tool_format) s.chat_template.tool_format = *tool_format;
    s.system_fingerprint = server::system_fingerprint_of(
        str_cat(kVersion, "|", e.path.filename().string(), "|", e.file_bytes, "|",
                m->file->get_string("general.name", ""), "|", kv_type_name(ecfg.kv_type), "|", ecfg.n_ctx));
    s.structured = std::make_unique<server::StructuredOutput>(tok);
    s.default_options = e.defaults.options.is_object() ? e.defaults.options : nlohmann::json::object();
    s.default_system = e.defaults.system_prompt;
    s.entry = e;
    s.metadata = gguf_metadata_json(*m->file);

    m->engine = std::make_unique<Engine>(m->file, m->tokenizer, ecfg);
    m->backend = std::make_unique<server::EngineBackend>(*m->engine);
    s.backend = m->backend.get();
    m->engine->start();
    const EngineMetrics em = m->engine->metrics();
    s.bytes = int64_t(m->file->file_size()) + em.kv_bytes;
    {
      std::lock_guard lock(live_mu);
      live[index] = m.get();
      m->registered = true;
    }
    if (settings.log_loads) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "%s: loaded %s in %.2f s: context %lld tokens, KV %s (%s); %s\n", settings.command.c_str(),
                   e.name.c_str(), secs, static_cast<long long>(m->engine->n_ctx()), format_bytes(em.kv_bytes).c_str(),
                   kv_type_name(ecfg.kv_type), note.c_str());
    }
    const int64_t bytes = s.bytes;
    return ModelPool::Loaded{std::move(m), bytes};
  }
};

PoolModelProvider::PoolModelProvider(std::vector<ModelEntry> entries, server::ModelPoolConfig pool_config,
                                     ServeLoadSettings load)
    : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.settings = std::move(load);
  if (!d.settings.tool_format.empty()) {
    d.tool_format = server::tool_format_from_name(d.settings.tool_format);
    if (!d.tool_format)
      throw Error(str_cat("--tool-format: unknown format '", d.settings.tool_format,
                          "' (hermes, llama3, mistral or generic)"));
  }
  std::sort(entries.begin(), entries.end(), [](const ModelEntry& a, const ModelEntry& b) { return a.name < b.name; });
  const char* cmd = d.settings.command.c_str();
  for (ModelEntry& e : entries) {
    if (!e.usable()) {
      std::fprintf(stderr, "%s: skipping %s (%s): %s\n", cmd, e.name.c_str(), e.path.string().c_str(), e.error.c_str());
      continue;
    }
    // The header only: opening maps the file and parses its header, no weight is read.
    ContextPlan plan;
    try {
      const std::shared_ptr<const GgufFile> file = open_model_file(e.path.string());
      try {
        plan = d.plan(*file, e, pool_config.max_memory_bytes);
      } catch (const Error&) {
        // It does not fit the budget: planned against the machine, it is then too large for
        // the budget, which the pool reports (start-up when it is the smallest, else 507).
        plan = d.plan(*file, e, 0);
      }
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "%s: skipping %s (%s): %s\n", cmd, e.name.c_str(), e.path.string().c_str(), ex.what());
      continue;
    }
    if (!plan.note.empty()) std::fprintf(stderr, "%s: %s: %s\n", cmd, e.name.c_str(), plan.note.c_str());
    if (d.settings.ctx_given && !plan.warning.empty())
      std::fprintf(stderr, "%s: %s: warning: %s\n", cmd, e.name.c_str(), plan.warning.c_str());
    d.estimates.push_back(e.file_bytes + plan.kv_bytes);
    d.plans.push_back(plan);
    d.entries.push_back(std::move(e));
  }
  if (d.entries.empty()) throw Error("no usable model to serve");
  server::check_unique_names(d.entries);
  for (size_t i = 0; i < d.entries.size(); ++i) {
    d.names.emplace(d.entries[i].name, i);
    for (const std::string& a : d.entries[i].defaults.aliases) d.names.emplace(a, i);
  }
  d.live.assign(d.entries.size(), nullptr);

  std::vector<server::PoolModelSpec> specs;
  for (size_t i = 0; i < d.entries.size(); ++i)
    specs.push_back({d.entries[i].name, d.estimates[i], d.entries[i].defaults.keep_alive_s});
  d.pool = std::make_unique<ModelPool>(std::move(specs), [&d](size_t i) { return d.load(i); }, pool_config);
}

PoolModelProvider::~PoolModelProvider() { impl_->pool.reset(); }

server::Acquired PoolModelProvider::acquire(const std::string& name, std::optional<double> keep_alive_s) {
  const size_t index = impl_->resolve(name);
  ModelPool::Lease lease;
  try {
    lease = impl_->pool->acquire(index);
  } catch (const server::PoolError& e) {
    switch (e.kind()) {
      case server::PoolError::Kind::TooLarge:
        throw ApiError(507, "server_error", "model", "model_too_large", e.what());
      case server::PoolError::Kind::NoRoom:
        throw ApiError(503, "server_error", "", "no_room", e.what());
      case server::PoolError::Kind::LoadFailed:
        break;
    }
    throw ApiError(500, "server_error", "", "model_load_failed", e.what());
  }
  lease.set_keep_alive(keep_alive_s);
  const int64_t load_ns = lease.load_ns();
  auto holder = std::make_shared<Impl::Holder>();
  holder->lease = std::move(lease);
  const auto& loaded = static_cast<const Impl::Loaded&>(holder->lease.model());
  return server::Acquired{server::ModelRef(holder, &loaded.served), load_ns};
}

bool PoolModelProvider::serves(const std::string& name) const {
  return impl_->find(name).has_value();
}

void PoolModelProvider::unload(const std::string& name) { impl_->pool->unload(impl_->resolve(name)); }

// The header alone (the file is mapped, its tensors never touched): a description loads
// nothing and unloads nothing.
server::ModelProvider::Description PoolModelProvider::describe(const std::string& name) const {
  const server::ModelEntry& e = impl_->entries.at(impl_->resolve(name));
  return {e, gguf_metadata_json(*open_model_file(e.path.string()))};
}

std::vector<server::ModelEntry> PoolModelProvider::models() const { return impl_->entries; }

std::vector<server::LoadedModelInfo> PoolModelProvider::loaded() const {
  const std::vector<ModelPool::Status> status = impl_->pool->status();
  const auto steady_now = ModelPool::Clock::now();
  const auto system_now = std::chrono::system_clock::now();
  std::vector<server::LoadedModelInfo> out;
  for (size_t i = 0; i < status.size(); ++i) {
    const ModelPool::Status& st = status[i];
    if (!st.loaded) continue;
    server::LoadedModelInfo row;
    row.entry = impl_->entries[i];
    row.bytes = st.bytes;
    row.n_ctx = n_ctx_of(st.name);
    row.leases = st.leases;
    if (st.expires)
      row.expires = system_now + std::chrono::duration_cast<std::chrono::system_clock::duration>(*st.expires - steady_now);
    out.push_back(std::move(row));
  }
  return out;
}

EngineMetrics PoolModelProvider::metrics() const {
  const Impl& d = *impl_;
  std::lock_guard lock(d.live_mu);
  std::vector<EngineMetrics> live;
  for (const Impl::Loaded* m : d.live)
    if (m) live.push_back(m->engine->metrics());
  return d.retired.total(live);
}

int64_t PoolModelProvider::n_ctx_of(const std::string& name) const {
  const Impl& d = *impl_;
  const std::optional<size_t> i = name.empty() && d.entries.size() == 1 ? std::optional<size_t>(0) : d.find(name);
  if (!i) return 0;
  {
    std::lock_guard lock(d.live_mu);
    if (const Impl::Loaded* m = d.live[*i]) return m->engine->n_ctx();
  }
  return d.plans[*i].n_ctx;
}

void PoolModelProvider::collect() { impl_->pool->collect(); }

const std::vector<server::ModelEntry>& PoolModelProvider::entries() const { return impl_->entries; }
int64_t PoolModelProvider::estimated_bytes(size_t index) const { return impl_->estimates.at(index); }
const server::ModelPoolConfig& PoolModelProvider::pool_config() const { return impl_->pool->config(); }

}  // namespace tern
