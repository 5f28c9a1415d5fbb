#include "tools/serve_models.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

#include "core/error.h"
#include "engine/metrics_sum.h"
#include "models/lora.h"
#include "models/model.h"
#include "runtime/context_fit.h"
#include "server/api_error.h"
#include "server/backend.h"
#include "server/chat_template.h"
#include "server/openai_format.h"
#include "server/structured_output.h"
#include "server/tool_calls.h"
#include "spec/draft_model.h"
#include "tools/spec_args.h"
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

std::string spec_description(const SpecConfig& spec) {
  std::string what;
  switch (spec.source) {
    case DraftSource::None: return "off";
    case DraftSource::Lookup:
      what = str_cat("prompt lookup (n-grams of ", spec.ngram.ngram_min, "..", spec.ngram.ngram_max, " tokens)");
      break;
    case DraftSource::DraftModel:
      what = spec.self_draft.empty() ? str_cat("draft model ", spec.draft_path)
                                     : str_cat("self-speculation (each model requantized to ", spec.self_draft, ")");
      break;
  }
  return spec.adaptive ? str_cat(what, ", ", spec.n_draft_min, "..", spec.n_draft_max, " drafted tokens a step (adaptive)")
                       : str_cat(what, ", ", spec.n_draft_max, " drafted tokens a step");
}

int64_t draft_model_bytes(const GgufFile& draft, KvType kv_type, int64_t n_ctx, int64_t regions) {
  return int64_t(draft.file_size()) + kv_bytes_per_token(draft, kv_type) * n_ctx * regions;
}

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
  // One loaded file: everything a load built, owned by the pool's slot, and the models served
  // on it (its own and its variants'). Its end stops the engine (requests still unfinished end
  // with Abort) and keeps its counters.
  struct Loaded final : server::PooledModel {
    Impl* owner = nullptr;
    size_t slot = 0;
    bool registered = false;
    std::shared_ptr<const GgufFile> file;
    std::shared_ptr<const Tokenizer> tokenizer;
    std::unique_ptr<Engine> engine;
    std::unique_ptr<server::EngineBackend> backend;
    std::map<size_t, server::ServedModel> served;  // by entry: the file's model and its variants
    std::map<size_t, std::string> unfit;           // by entry: why this engine cannot serve it

    ~Loaded() override {
      if (!engine) return;
      engine->stop();
      if (registered) owner->retire(slot, *engine);
    }
  };

  // A ModelRef's owner: the lease keeps the model loaded.
  struct Holder {
    ModelPool::Lease lease;
  };

  // Per served model (files and variants), by name:
  std::vector<ModelEntry> entries;
  std::vector<size_t> slot_of;      // its pool slot (a variant's: its base's)
  std::vector<LoraSet> lora;        // the adapters its requests run with
  // Per pool slot (one per file):
  std::vector<size_t> file_entry;   // the entry of the file's own model
  std::vector<std::vector<size_t>> family;  // the entries it serves: its own and its variants'
  std::vector<ContextPlan> plans;   // planned at start-up
  std::vector<int64_t> estimates;
  ServeLoadSettings settings;
  std::optional<server::ToolFormat> tool_format;
  std::shared_ptr<const GgufFile> draft;  // --draft's header (null without one)
  std::map<std::string, size_t> names;  // names and aliases -> entry

  mutable std::mutex live_mu;           // guards live and retired
  std::vector<Loaded*> live;            // per slot: the loaded file, nullptr when not
  EngineMetricsSum retired;             // counters of engines already unloaded

  std::unique_ptr<ModelPool> pool;      // last: destroyed first (unloads while the rest lives)

  void retire(size_t slot, const Engine& engine) {
    const EngineMetrics m = engine.metrics();
    std::lock_guard lock(live_mu);
    retired.retire(m);
    live[slot] = nullptr;
    if (settings.log_loads)
      std::fprintf(stderr, "%s: unloaded %s (%lld requests served)\n", settings.command.c_str(),
                   entries[file_entry[slot]].name.c_str(), static_cast<long long>(m.requests_finished));
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

  // The keep_alive a lease of entry `index` leaves its slot: the request's, else a variant's
  // own. The pool keeps the last request's for the slot; where a variant sets one, every request
  // of its family states its model's (else the server's default), lest the variant's outlive
  // its requests and rule the base's.
  std::optional<double> keep_alive_for(size_t index, std::optional<double> requested) const {
    if (requested) return requested;
    const size_t slot = slot_of[index];
    const bool variant_sets_one = std::any_of(family[slot].begin(), family[slot].end(), [&](size_t i) {
      return !entries[i].parent.empty() && entries[i].defaults.keep_alive_s;
    });
    if (!variant_sets_one) return std::nullopt;
    if (const auto& own = entries[index].defaults.keep_alive_s) return own;
    if (const auto& base = entries[file_entry[slot]].defaults.keep_alive_s) return base;
    return pool->config().default_keep_alive_s;
  }

  // The chat template `e` names (else --chat-template, else the file's own).
  server::ChatTemplate chat_template_of(const ModelEntry& e, const Loaded& m, std::string* note) const {
    const Tokenizer& tok = *m.tokenizer;
    const auto token_text = [&](int32_t id) {
      return id >= 0 && id < tok.n_vocab() ? tok.tokens()[size_t(id)] : std::string();
    };
    server::ChatTemplate t = server::select_chat_template(
        e.defaults.chat_template.empty() ? settings.chat_template : e.defaults.chat_template,
        m.file->get_string("tokenizer.chat_template", ""), token_text(tok.bos_id()), token_text(tok.eos_id()), note);
    if (tool_format) t.tool_format = *tool_format;
    return t;
  }

  // Entry `index` as served on `m`: what the load shares (engine, the file's template, grammars,
  // metadata) with the model's own name, defaults, template and adapters. One this engine
  // cannot serve (an adapter it cannot apply, a template that does not load) goes to `unfit`
  // with the reason, so that the file's other models still serve.
  void add_model(Loaded& m, const server::ServedModel& shared, size_t index) const {
    const ModelEntry& e = entries[index];
    server::ServedModel s = shared;
    try {
      for (const LoraUse& u : lora[index]) m.engine->check_lora(*u.adapter);
      if (!e.parent.empty() && !e.defaults.chat_template.empty()) s.chat_template = chat_template_of(e, m, nullptr);
    } catch (const Error& ex) {
      m.unfit[index] = ex.what();
      return;
    }
    s.id = e.name;
    s.entry = e;
    s.default_options = e.defaults.options.is_object() ? e.defaults.options : nlohmann::json::object();
    s.default_system = e.defaults.system_prompt;
    s.lora = lora[index];
    m.served.emplace(index, std::move(s));
  }

  ModelPool::Loaded load(size_t slot) {
    const ModelEntry& e = entries[file_entry[slot]];
    const auto t0 = std::chrono::steady_clock::now();
    auto m = std::make_unique<Loaded>();
    m->owner = this;
    m->slot = slot;
    m->file = open_model_file(e.path.string());
    m->tokenizer = Tokenizer::from_gguf(*m->file);

    EngineConfig ecfg = settings.engine;
    if (e.defaults.threads) ecfg.n_threads = *e.defaults.threads;
    if (e.defaults.parallel) ecfg.n_parallel = *e.defaults.parallel;
    ecfg.n_ctx = plans[slot].n_ctx;
    ecfg.kv_memory_bytes = settings.kv_memory_bytes;
    if (ecfg.max_running < ecfg.n_parallel) ecfg.max_running = ecfg.n_parallel;

    // A draft that does not fit this model throws here (Engine checks the vocabularies): the
    // pool answers the request with the reason, as for any load that fails.
    server::ServedModel shared;
    std::string note;
    shared.chat_template = chat_template_of(e, *m, &note);
    shared.system_fingerprint = server::system_fingerprint_of(
        str_cat(kVersion, "|", e.path.filename().string(), "|", e.file_bytes, "|",
                m->file->get_string("general.name", ""), "|", kv_type_name(ecfg.kv_type), "|", ecfg.n_ctx));
    shared.structured = std::make_unique<server::StructuredOutput>(*m->tokenizer);
    shared.metadata = gguf_metadata_json(*m->file);

    resolve_self_draft(ecfg.spec, m->file, ecfg.n_threads);  // --draft-self: this model's own copy
    m->engine = std::make_unique<Engine>(m->file, m->tokenizer, ecfg);
    m->backend = std::make_unique<server::EngineBackend>(*m->engine);
    shared.backend = m->backend.get();
    m->engine->start();
    const EngineMetrics em = m->engine->metrics();
    shared.bytes = int64_t(m->file->file_size()) + em.kv_bytes;
    if (const GgufFile* df = ecfg.spec.draft_file ? ecfg.spec.draft_file.get() : draft.get())
      shared.bytes += draft_model_bytes(*df, ecfg.kv_type, m->engine->n_ctx(), ecfg.n_parallel);
    for (size_t i : family[slot]) add_model(*m, shared, i);
    {
      std::lock_guard lock(live_mu);
      live[slot] = m.get();
      m->registered = true;
    }
    if (settings.log_loads) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "%s: loaded %s in %.2f s: context %lld tokens, KV %s (%s); %s\n", settings.command.c_str(),
                   e.name.c_str(), secs, static_cast<long long>(m->engine->n_ctx()), format_bytes(em.kv_bytes).c_str(),
                   kv_type_name(ecfg.kv_type), note.c_str());
      for (const auto& [i, why] : m->unfit)
        std::fprintf(stderr, "%s: %s cannot run on this load of %s: %s\n", settings.command.c_str(),
                     entries[i].name.c_str(), e.name.c_str(), why.c_str());
    }
    const int64_t bytes = shared.bytes;
    return ModelPool::Loaded{std::move(m), bytes};
  }

  // ---- start-up: which models of the catalog are served ----------------------------------

  struct Admitted {
    ModelEntry entry;
    LoraSet lora;
  };
  // A file admitted: its pool slot and its header (a variant's adapters are checked against it).
  struct AdmittedFile {
    size_t slot = 0;
    std::shared_ptr<const GgufFile> header;
  };
  std::map<std::string, std::shared_ptr<const LoraAdapter>> adapter_files;  // start-up: by path, one load each

  void skip(const ModelEntry& e, const std::string& why) const {
    const std::string what = e.parent.empty() ? e.path.string() : "variant of " + e.parent;
    std::fprintf(stderr, "%s: skipping %s (%s): %s\n", settings.command.c_str(), e.name.c_str(), what.c_str(),
                 why.c_str());
  }

  // The adapters of `e` (each file loaded once), checked against its file's header. Throws
  // tern::Error naming the adapter file and what does not fit.
  LoraSet load_adapters(const ModelEntry& e, const GgufFile& header) {
    LoraSet set;
    for (const server::AdapterSpec& a : e.defaults.adapters) {
      std::shared_ptr<const LoraAdapter>& adapter = adapter_files[a.path.string()];
      if (!adapter) adapter = LoraAdapter::load(a.path.string());
      adapter->check_base(header);
      set.push_back(LoraUse{adapter, a.scale});
    }
    return set;
  }

  // A model with its own file: served when it is usable, its context can be planned (only the
  // header is read: opening maps the file, no weight is touched) and its adapters fit.
  void admit_file(ModelEntry& e, int64_t budget, std::map<std::string, AdmittedFile>& files,
                  std::vector<Admitted>& out) {
    if (!e.usable()) return skip(e, e.error);
    ContextPlan planned;
    AdmittedFile file;
    LoraSet set;
    try {
      file.header = open_model_file(e.path.string());
      try {
        planned = plan(*file.header, e, budget);
      } catch (const Error&) {
        // It does not fit the budget: planned against the machine, it is then too large for
        // the budget, which the pool reports (start-up when it is the smallest, else 507).
        planned = plan(*file.header, e, 0);
      }
      set = load_adapters(e, *file.header);
    } catch (const std::exception& ex) {
      return skip(e, ex.what());
    }
    const char* cmd = settings.command.c_str();
    if (!planned.note.empty()) std::fprintf(stderr, "%s: %s: %s\n", cmd, e.name.c_str(), planned.note.c_str());
    if (settings.ctx_given && !planned.warning.empty())
      std::fprintf(stderr, "%s: %s: warning: %s\n", cmd, e.name.c_str(), planned.warning.c_str());
    int64_t draft_bytes = 0;
    if (!settings.engine.spec.self_draft.empty()) {
      // A requantized copy of the model: estimated at the model's own size (a cheaper type is
      // smaller), plus its KV regions.
      draft_bytes = e.file_bytes + kv_bytes_per_token(*file.header, settings.engine.kv_type) * planned.n_ctx *
                                       e.defaults.parallel.value_or(settings.engine.n_parallel);
    }
    if (draft) {
      // Served all the same (its variants and the catalog stay as configured); each load fails
      // with this reason, which a request for it is answered with.
      try {
        check_draft_vocab(*file.header, *draft);
      } catch (const Error& ex) {
        std::fprintf(stderr, "%s: %s: warning: --draft cannot draft for it, so its loads will fail: %s\n", cmd,
                     e.name.c_str(), ex.what());
      }
      draft_bytes = draft_model_bytes(*draft, settings.engine.kv_type, planned.n_ctx,
                                      e.defaults.parallel.value_or(settings.engine.n_parallel));
    }
    file.slot = plans.size();
    estimates.push_back(e.file_bytes + planned.kv_bytes + draft_bytes);
    plans.push_back(planned);
    files[e.name] = std::move(file);
    out.push_back({std::move(e), std::move(set)});
  }

  // A variant: served when its base is and its adapters fit the base's file.
  void admit_variant(ModelEntry& e, const std::map<std::string, AdmittedFile>& files, std::vector<Admitted>& out) {
    if (!e.usable()) return skip(e, e.error);
    const auto base = files.find(e.parent);
    if (base == files.end()) return skip(e, str_cat("its base ", e.parent, " is not served (see above)"));
    LoraSet set;
    try {
      set = load_adapters(e, *base->second.header);
    } catch (const std::exception& ex) {
      return skip(e, ex.what());
    }
    out.push_back({std::move(e), std::move(set)});
  }

  // Files first, then the variants on them; then the served models in name order.
  void admit(std::vector<ModelEntry> catalog, int64_t budget) {
    std::sort(catalog.begin(), catalog.end(), [](const ModelEntry& a, const ModelEntry& b) { return a.name < b.name; });
    std::map<std::string, AdmittedFile> files;
    std::vector<Admitted> admitted;
    for (ModelEntry& e : catalog)
      if (e.parent.empty()) admit_file(e, budget, files, admitted);
    for (ModelEntry& e : catalog)
      if (!e.parent.empty()) admit_variant(e, files, admitted);
    std::sort(admitted.begin(), admitted.end(),
              [](const Admitted& a, const Admitted& b) { return a.entry.name < b.entry.name; });
    family.resize(plans.size());
    file_entry.resize(plans.size());
    for (Admitted& a : admitted) {
      const size_t i = entries.size();
      const AdmittedFile& f = files.at(a.entry.parent.empty() ? a.entry.name : a.entry.parent);
      slot_of.push_back(f.slot);
      family[f.slot].push_back(i);
      if (a.entry.parent.empty()) file_entry[f.slot] = i;
      entries.push_back(std::move(a.entry));
      lora.push_back(std::move(a.lora));
    }
    server::check_unique_names(entries);
    for (size_t i = 0; i < entries.size(); ++i) {
      names.emplace(entries[i].name, i);
      for (const std::string& a : entries[i].defaults.aliases) names.emplace(a, i);
    }
    adapter_files.clear();  // the models' LoraSets hold what they use
  }
};

PoolModelProvider::PoolModelProvider(std::vector<ModelEntry> entries, server::ModelPoolConfig pool_config,
                                     ServeLoadSettings load)
    : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.settings = std::move(load);
  if (d.settings.engine.spec.source == DraftSource::DraftModel && d.settings.engine.spec.self_draft.empty())
    d.draft = open_model_file(d.settings.engine.spec.draft_path);
  if (!d.settings.tool_format.empty()) {
    d.tool_format = server::tool_format_from_name(d.settings.tool_format);
    if (!d.tool_format)
      throw Error(str_cat("--tool-format: unknown format '", d.settings.tool_format,
                          "' (hermes, llama3, mistral or generic)"));
  }
  d.admit(std::move(entries), pool_config.max_memory_bytes);
  if (d.entries.empty()) throw Error("no usable model to serve");
  d.live.assign(d.plans.size(), nullptr);

  std::vector<server::PoolModelSpec> specs;
  for (size_t slot = 0; slot < d.plans.size(); ++slot) {
    const ModelEntry& e = d.entries[d.file_entry[slot]];
    specs.push_back({e.name, d.estimates[slot], e.defaults.keep_alive_s});
  }
  d.pool = std::make_unique<ModelPool>(std::move(specs), [&d](size_t slot) { return d.load(slot); }, pool_config);
}

PoolModelProvider::~PoolModelProvider() { impl_->pool.reset(); }

server::Acquired PoolModelProvider::acquire(const std::string& name, std::optional<double> keep_alive_s) {
  const Impl& d = *impl_;
  const size_t index = d.resolve(name);
  ModelPool::Lease lease;
  try {
    lease = d.pool->acquire(d.slot_of[index]);
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
  const auto& loaded = static_cast<const Impl::Loaded&>(lease.model());
  if (const auto unfit = loaded.unfit.find(index); unfit != loaded.unfit.end()) {
    const ModelEntry& e = d.entries[index];
    throw ApiError(500, "server_error", "", "model_load_failed",
                   str_cat("The model `", e.name, "` cannot be served",
                           e.parent.empty() ? "" : str_cat(" on the engine of `", e.parent, "`"), ": ", unfit->second));
  }
  lease.set_keep_alive(d.keep_alive_for(index, keep_alive_s));
  const int64_t load_ns = lease.load_ns();
  auto holder = std::make_shared<Impl::Holder>();
  holder->lease = std::move(lease);
  // The variant's model lives in the base's Loaded, which the lease keeps.
  return server::Acquired{server::ModelRef(holder, &loaded.served.at(index)), load_ns};
}

bool PoolModelProvider::serves(const std::string& name) const {
  return impl_->find(name).has_value();
}

// A variant's name unloads its base: that is what holds the memory.
void PoolModelProvider::unload(const std::string& name) { impl_->pool->unload(impl_->slot_of[impl_->resolve(name)]); }

// The header alone (the file is mapped, its tensors never touched): a description loads
// nothing and unloads nothing. A variant's entry names its base's file.
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
    row.entry = impl_->entries[impl_->file_entry[i]];
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
  const size_t slot = d.slot_of[*i];
  {
    std::lock_guard lock(d.live_mu);
    if (const Impl::Loaded* m = d.live[slot]) return m->engine->n_ctx();
  }
  return d.plans[slot].n_ctx;
}

void PoolModelProvider::collect() { impl_->pool->collect(); }

const std::vector<server::ModelEntry>& PoolModelProvider::entries() const { return impl_->entries; }
int64_t PoolModelProvider::estimated_bytes(size_t index) const { return impl_->estimates.at(impl_->slot_of.at(index)); }
const server::ModelPoolConfig& PoolModelProvider::pool_config() const { return impl_->pool->config(); }

}  // namespace tern
