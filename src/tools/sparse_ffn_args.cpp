#include "tools/sparse_ffn_args.h"

#include <cstdio>

#include "core/error.h"

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
  return c;
}

ModelLoader sparse_ffn_loader(const SparseFfnArgs& args, ModelLoader load) {
  const SparseFfnConfig cfg = args.config();
  if (!args.enabled) return load;
  return [cfg, load](std::shared_ptr<const GgufFile> f) {
    std::unique_ptr<Model> m = load ? load(f) : load_model(f);
    m->enable_sparse_ffn(cfg);
    return m;
  };
}

std::string sparse_ffn_summary(const SparseFfn& s) {
  const SparseFfnStats& st = s.stats();
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "sparse FFN: %.1f%% of neurons selected (%s), sparse on %.1f%% of %lld token-layer visits "
                "(%lld dense fallbacks), down_t %.1f MiB",
                100.0 * st.selected_fraction(),
                s.config().density > 0 ? str_cat("top ", s.config().density * 100.0, "%").c_str() : "predictor thresholds",
                100.0 * st.sparse_share(), static_cast<long long>(st.visits), static_cast<long long>(st.dense_fallbacks),
                double(s.extra_bytes()) / (1 << 20));
  return buf;
}

nlohmann::json sparse_ffn_json(const SparseFfn& s) {
  const SparseFfnStats& st = s.stats();
  return {{"selected_fraction", st.selected_fraction()},
          {"sparse_share", st.sparse_share()},
          {"visits", st.visits},
          {"sparse_visits", st.sparse_visits},
          {"dense_fallbacks", st.dense_fallbacks},
          {"extra_bytes", s.extra_bytes()},
          {"density", s.config().density},
          {"dense_above", s.config().dense_above},
          {"max_step_tokens", s.config().max_step_tokens}};
}

}  // namespace tern
