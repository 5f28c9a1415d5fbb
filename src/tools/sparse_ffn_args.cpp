#include "tools/sparse_ffn_args.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "models/ffn_bundle_format.h"
#include "models/partition.h"

namespace tern {

void SparseFfnArgs::add_to(CLI::App& app, bool all_steps) {
  if (all_steps) max_step_tokens = 0;
  app.add_flag("--sparse-ffn", enabled,
               "decode with the predicted-sparse FFN: a ReLU-fied model's predictor (tern predictor train) picks each "
               "token's active neurons and only their rows are read (docs/sparsity.md)");
  options_.push_back(app.add_option("--predictor", predictor,
                                    "--sparse-ffn: the file holding the predictor (default: the model file)"));
  options_.push_back(app.add_option("--sparse-density", density,
                                    "--sparse-ffn: each token's top fraction of neurons by predictor score instead "
                                    "of the predictor's thresholds (0: thresholds)")
                         ->check(CLI::Range(0.0, 1.0))
                         ->capture_default_str());
  options_.push_back(app.add_option("--sparse-dense-above", dense_above,
                                    "--sparse-ffn: a token whose selected fraction is above this runs the dense FFN")
                         ->check(CLI::Range(0.0, 1.0))
                         ->capture_default_str());
  options_.push_back(app.add_option("--sparse-max-step", max_step_tokens,
                                    "--sparse-ffn: steps of more tokens run the dense FFN (prefill; 0: every step)")
                         ->check(CLI::Range(int64_t(0), int64_t(1) << 24))
                         ->capture_default_str());
  options_.push_back(app.add_option("--sparse-down-type", down_type,
                                    "--sparse-ffn: type of the transposed ffn_down rows: f32, f16, q8_0 or q4_0 "
                                    "(default: ffn_down's, q8_0 for a q4_0 ffn_down)")
                         ->check(CLI::IsMember({"f32", "f16", "q8_0", "q4_0"})));
  options_.push_back(app.add_option("--ram-budget", ram_budget,
                                    "--sparse-ffn: keep this much of the weights in memory (300M, 1.5G, or 50% of "
                                    "the model's), reading cold FFN neurons from the file's bundles (tern predictor "
                                    "bundle) into an LRU cache; every step runs sparse"));
  options_.push_back(app.add_flag("--ram-readahead", readahead,
                                  "--ram-budget: each layer also predicts the next layer's neurons and asks the "
                                  "kernel to start reading the missing ones (pays when they come from the disk)"));
}

int64_t parse_ram_budget(const std::string& text, int64_t weight_bytes) {
  const auto bad = [&]() -> int64_t {
    fail("--ram-budget ", text, ": expected bytes (e.g. 300M, 1.5G, 512K, 123456) or a percentage of the weights (50%)");
  };
  if (text.empty()) return bad();
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !std::isfinite(v) || v <= 0) return bad();
  const std::string unit(end);
  double bytes = 0;
  if (unit == "%") {
    if (v > 100) fail("--ram-budget ", text, ": a percentage of the weights is at most 100%");
    bytes = v / 100.0 * double(weight_bytes);
  } else if (unit.empty() || unit == "B") {
    bytes = v;
  } else if (unit == "K" || unit == "k" || unit == "KiB") {
    bytes = v * 1024.0;
  } else if (unit == "M" || unit == "MiB") {
    bytes = v * 1024.0 * 1024.0;
  } else if (unit == "G" || unit == "GiB") {
    bytes = v * 1024.0 * 1024.0 * 1024.0;
  } else {
    return bad();
  }
  if (bytes < 1 || bytes > 9.0e18) return bad();
  return int64_t(bytes);
}

bool SparseFfnArgs::options_given() const {
  for (const CLI::Option* o : options_)
    if (o->count() > 0) return true;
  return false;
}

SparseFfnConfig SparseFfnArgs::config() const {
  if (!enabled && options_given()) fail("--predictor and --sparse-* options apply to --sparse-ffn: add it");
  SparseFfnConfig c;
  if (!predictor.empty()) c.predictor = std::make_shared<const GgufFile>(GgufFile::open(predictor));
  c.density = density;
  c.dense_above = dense_above;  // (0 is refused by SparseFfn, naming the option)
  c.max_step_tokens = max_step_tokens;
  if (!down_type.empty()) c.down_t_type = dtype_from_name(down_type);
  c.readahead = readahead;
  if (readahead && ram_budget.empty()) fail("--ram-readahead applies to --ram-budget: add it");
  if (!ram_budget.empty()) (void)parse_ram_budget(ram_budget, int64_t(1) << 40);  // its form now, its size with the model
  return c;
}

ModelLoader sparse_ffn_loader(const SparseFfnArgs& args, ModelLoader load) {
  const SparseFfnConfig cfg = args.config();
  if (!args.enabled) return load;
  if (!args.ram_budget.empty() && load) fail("--ram-budget is not supported with --tp / --pp");
  return [cfg, load, budget = args.ram_budget](std::shared_ptr<const GgufFile> f) {
    std::unique_ptr<Model> m;
    SparseFfnConfig c = cfg;
    if (!budget.empty()) {
      c.ram_budget = parse_ram_budget(budget, model_weight_bytes(*f));
      ModelPartition part;
      part.ffn_in_store = true;
      m = load_model(f, part);
    } else {
      m = load ? load(f) : load_model(f);
    }
    m->enable_sparse_ffn(c);
    return m;
  };
}

std::string sparse_ffn_summary(const SparseFfn& s, int64_t tokens) {
  const SparseFfnStats& st = s.stats();
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "sparse FFN: %.1f%% of neurons selected (%s), sparse on %.1f%% of %lld token-layer visits "
                "(%lld dense fallbacks), %.1f MiB beside the weights (down_t, the predictor in f16)",
                100.0 * st.selected_fraction(),
                s.config().density > 0 ? str_cat("top ", s.config().density * 100.0, "%").c_str() : "predictor thresholds",
                100.0 * st.sparse_share(), static_cast<long long>(st.visits), static_cast<long long>(st.dense_fallbacks),
                double(s.extra_bytes()) / (1 << 20));
  std::string out = buf;
  if (const NeuronStore* store = s.store()) {
    const SparseFfn::BudgetBytes& b = s.budget_bytes();
    const NeuronStoreStats& st2 = store->stats();
    const double mb = 1 << 20;
    std::snprintf(buf, sizeof buf,
                  "\nram budget %.1f MiB of %.1f MiB weights: %.1f MiB other weights, %.1f MiB predictor, %.1f MiB "
                  "neuron store (%lld hot + %lld cache neurons); %.1f%% of lookups hit, %.1f MiB read from the file "
                  "in %lld reads (%.3f s)",
                  double(b.budget) / mb, double(b.model) / mb, double(b.other_weights) / mb, double(b.predictor) / mb,
                  double(b.store) / mb, static_cast<long long>(store->hot_neurons()),
                  static_cast<long long>(store->cache_neurons()), 100.0 * st2.hit_rate(), double(st2.bytes_read) / mb,
                  static_cast<long long>(st2.reads), st2.read_seconds);
    out += buf;
    if (tokens > 0) out += str_cat(", ", double(int64_t(double(st2.bytes_read) / double(tokens) / mb * 100 + 0.5)) / 100,
                                   " MiB per token");
  }
  return out;
}

nlohmann::json sparse_ffn_json(const SparseFfn& s, int64_t tokens) {
  const SparseFfnStats& st = s.stats();
  nlohmann::json j = {{"selected_fraction", st.selected_fraction()},
          {"sparse_share", st.sparse_share()},
          {"visits", st.visits},
          {"sparse_visits", st.sparse_visits},
          {"dense_fallbacks", st.dense_fallbacks},
          {"extra_bytes", s.extra_bytes()},
          {"density", s.config().density},
          {"dense_above", s.config().dense_above},
          {"max_step_tokens", s.config().max_step_tokens}};
  if (const NeuronStore* store = s.store()) {
    const SparseFfn::BudgetBytes& b = s.budget_bytes();
    const NeuronStoreStats& ns = store->stats();
    j["ram_budget"] = {{"budget_bytes", b.budget},
                       {"model_weight_bytes", b.model},
                       {"other_weight_bytes", b.other_weights},
                       {"predictor_bytes", b.predictor},
                       {"store_bytes", b.store},
                       {"minimum_bytes", b.minimum},
                       {"hot_neurons", store->hot_neurons()},
                       {"cache_neurons", store->cache_neurons()},
                       {"lookups", ns.lookups},
                       {"hits", ns.hits},
                       {"hit_rate", ns.hit_rate()},
                       {"reads", ns.reads},
                       {"bytes_read", ns.bytes_read},
                       {"read_seconds", ns.read_seconds},
                       {"readahead", s.config().readahead},
                       {"advised_bytes", ns.advised_bytes},
                       {"bytes_read_per_token", tokens > 0 ? double(ns.bytes_read) / double(tokens) : 0.0}};
  }
  return j;
}

}  // namespace tern
