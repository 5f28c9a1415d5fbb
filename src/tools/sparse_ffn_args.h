#pragma once
// --sparse-ffn and its options (docs/sparsity.md "Sparse decoding"): the commands that decode
// (run, chat, bench, perplexity, serve) build their model through sparse_ffn_loader, which
// switches the predicted-sparse FFN on (models/sparse_ffn_runtime.h).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <functional>
#include <memory>
#include <string>

#include "gguf/gguf.h"
#include "models/model.h"
#include "models/sparse_ffn_runtime.h"

namespace tern {

struct SparseFfnArgs {
  bool enabled = false;
  std::string predictor;         // file with the predictor ("": the model file)
  double density = 0.0;          // SparseFfnConfig::density
  double dense_above = 0.6;      // SparseFfnConfig::dense_above
  int64_t max_step_tokens = 8;   // SparseFfnConfig::max_step_tokens
  std::string down_type;         // SparseFfnConfig::down_t_type ("": its default)
  std::string ram_budget;        // --ram-budget: bytes (K/M/G suffixes) or a percentage of the weights ("": none)
  bool readahead = false;        // --ram-readahead: SparseFfnConfig::readahead

  // `all_steps`: the command's steps are all sparse by default (perplexity measures the sparse
  // model, prompt tokens included), else decode steps only.
  void add_to(CLI::App& app, bool all_steps = false);
  // The options as a config; opens --predictor (tern::Error naming it when it cannot be read).
  // The options without --sparse-ffn are an error (they would do nothing).
  SparseFfnConfig config() const;
  // Whether any option besides --sparse-ffn was given.
  bool options_given() const;

 private:
  std::vector<const CLI::Option*> options_;
};

// The error for --lora with --ram-budget.
inline constexpr const char* kLoraWithRamBudget =
    "--lora is not supported with --ram-budget (adapters apply to the dense FFN, whose weights stay in the file)";

using ModelLoader = std::function<std::unique_ptr<Model>(std::shared_ptr<const GgufFile>)>;

// `load` (nullptr: load_model) followed by enable_sparse_ffn(config) when args.enabled; `load`
// unchanged otherwise. Checks the options now (a bad --predictor fails before any model loads).
// With --ram-budget the model loads with its FFN left in the file (ModelPartition::ffn_in_store),
// and `load` must be nullptr (tern::Error otherwise).
ModelLoader sparse_ffn_loader(const SparseFfnArgs& args, ModelLoader load);

// What the sparse FFN did (its counts since enable or reset), for the commands' reports:
// "sparse FFN: 23.4% of neurons selected on 100% of decode-token layers (0 dense fallbacks),
// 12.0 MiB beside the weights (down_t, the predictor in f16)" and the same as JSON
// (selected_fraction, sparse_share, visits, sparse_visits, dense_fallbacks, extra_bytes, density,
// max_step_tokens).
// With --ram-budget, a second line and a "ram_budget" object: the budget and what holds it,
// hot and cache neurons, hit rate, bytes read from the file (per token, over `tokens` decoded
// tokens when > 0) and the read time.
std::string sparse_ffn_summary(const SparseFfn& s, int64_t tokens = 0);
nlohmann::json sparse_ffn_json(const SparseFfn& s, int64_t tokens = 0);

// --ram-budget's value in bytes: "300M", "1.5G", "512K", "123456" (bytes), or "50%" of
// `weight_bytes`. Throws tern::Error naming the option for anything else, or 0 and less.
int64_t parse_ram_budget(const std::string& text, int64_t weight_bytes);

}  // namespace tern
