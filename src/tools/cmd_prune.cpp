// tern prune: remove weights from a float model's linear layers (docs/prune.md): magnitude,
// Wanda or SparseGPT, unstructured or N:M, uniform or OWL layer sparsities.
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "compress/calibrate.h"
#include "compress/methods.h"
#include "compress/prune.h"
#include "compress/quantize.h"
#include "compress/structured.h"
#include "core/error.h"
#include "core/output_file.h"
#include "gguf/gguf.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/llm_pruner.h"
#include "tools/prune_recover.h"
#include "tools/run_method.h"

namespace tern {

int cmd_prune(int argc, char** argv) {
  CLI::App app{"Prune a float GGUF model's linear layers: magnitude, Wanda or SparseGPT, unstructured (--sparsity)\n"
               "or semi-structured (--nm 2:4), with OWL layer-wise sparsities as an option: docs/prune.md."};
  std::string in, out, algo = "wanda", nm, type_name;
  double sparsity = 0.5;
  bool owl = false, json = false, one_shot = false;
  int n_threads = 0;
  MethodOptions mopts;
  CalibOptions copts;
  app.add_option("input", in, "source GGUF model (f32, f16 or bf16 weights)")->required();
  app.add_option("output", out, "GGUF file to write")->required();
  app.add_option("--method", algo,
                 "unstructured / N:M: magnitude (no calibration), wanda, sparsegpt; structured (whole heads and FFN "
                 "channels: a smaller dense model): flap, llm-pruner (gradient importance), structured-magnitude (no calibration)")
      ->check(CLI::IsMember({"magnitude", "wanda", "sparsegpt", "flap", "llm-pruner", "structured-magnitude"}))
      ->capture_default_str();
  auto* sp = app.add_option("--sparsity", sparsity,
                            "fraction of each linear's weights removed (structured: of the parameters --ratio-of names), in (0, 1)")
                 ->capture_default_str();
  app.add_option("--ratio-of", mopts.structured_ratio_of,
                 "structured: --sparsity is a fraction of the model's parameters (embeddings and output included, "
                 "as LLM-Pruner and FLaP count; the file shrinks by about that much) or of the layers' weights alone")
      ->check(CLI::IsMember({"model", "layers"}))
      ->capture_default_str();
  app.add_option("--ffn-multiple", mopts.structured_ffn_multiple,
                 "structured: kept FFN widths rounded down to a multiple of this (default: the block of --type, "
                 "e.g. 32 for q8_0, 256 for q4_K, so that ffn_down quantizes; 1 for float)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  auto* nmo = app.add_option("--nm", nm, "semi-structured N:M instead: keep N of every M consecutive inputs (2:4, 4:8)");
  sp->excludes(nmo);
  app.add_flag("--owl", owl, "OWL: per-layer sparsities from each layer's share of outlier activations");
  app.add_option("--owl-lambda", mopts.owl_lambda, "OWL: largest deviation of a layer's sparsity from the target")
      ->check(CLI::Range(0.0, 0.5))
      ->capture_default_str();
  app.add_option("--owl-m", mopts.owl_m, "OWL: an outlier's score exceeds M times its matrix's mean")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--one-shot", one_shot,
               "calibrate once on the dense model (faster) instead of layer by layer through the pruned layers");
  app.add_option("--type", type_name,
                 "storage type of the pruned linears (default: the source's float type): " + quantize_type_names());
  app.add_option("--calib", copts.text_file, "calibration text (wanda, sparsegpt, --owl)");
  app.add_option("--calib-tokens", copts.n_tokens, "calibration tokens (from the end of the text)")->capture_default_str();
  app.add_option("--damp", mopts.damp, "SparseGPT dampening (fraction of the mean Hessian diagonal)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--block", mopts.sparsegpt_block, "SparseGPT: columns whose mask is chosen together")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  RecoverOptions ro;
  int64_t recover_tokens = 0;
  app.add_option("--recover", recover_tokens,
                 "then recover: distill the pruned model toward the dense one on this many tokens of --recover-data, "
                 "zeros held (0: no recovery)");
  app.add_option("--recover-data", ro.data, "recovery training text (not the text you measure perplexity on)");
  app.add_option("--recover-lr", ro.lr, "recovery peak learning rate")->capture_default_str();
  app.add_option("-t,--threads", n_threads, "worker threads (default: all cores)")->check(CLI::Range(0, 1024));
  app.add_flag("--json", json, "print the report as one JSON object");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;

  if (!(sparsity > 0.0 && sparsity < 1.0)) fail("--sparsity ", sparsity, " is outside (0, 1)");
  const bool structured = algo == "flap" || algo == "llm-pruner" || algo == "structured-magnitude";
  if (structured && !nm.empty()) fail("--nm is for unstructured methods: ", algo, " removes whole heads and channels");
  for (const char* opt : {"--ratio-of", "--ffn-multiple"})
    if (!structured && app.count(opt))
      fail(opt, " is for the structured methods (flap, llm-pruner, structured-magnitude): ", algo,
           " prunes each linear by --sparsity");
  if (structured && owl) fail("--owl is for unstructured methods: ", algo, " chooses its structures over all layers");
  std::string pattern;
  if (!nm.empty()) {
    if (owl) fail("--owl chooses per-layer sparsities, which --nm fixes: give one of them");
    pattern = parse_sparsity(nm).name();  // validates N:M
  } else {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", sparsity * 100.0);
    pattern = buf;
  }
  if (!type_name.empty()) mopts.prune_type = parse_quantize_type(type_name);
  const std::string method = algo + (owl ? "-owl-" : "-") + pattern;
  const MethodInfo& info = find_method(method);
  if ((info.needs_calib || algo == "llm-pruner") && copts.text_file.empty())
    fail(algo, owl ? " with --owl" : "", " needs a calibration text: --calib FILE (magnitude pruning does not)");
  check_output_not_input(out, {in, copts.text_file});
  if (!one_shot) mopts.sequential = copts;
  copts.n_threads = n_threads;
  enable_llm_pruner(mopts, copts);
  if (recover_tokens < 0) fail("--recover must not be negative");
  if (recover_tokens == 0 && !ro.data.empty()) fail("--recover-data needs --recover TOKENS");
  // Structured pruning writes the source's types; recovery trains in f32: both store --type after.
  const bool retype = structured && mopts.prune_type.has_value();
  if (recover_tokens == 0 && !retype) return run_method(in, out, method, mopts, copts, n_threads, json);
  if (recover_tokens > 0) {
    ro.tokens = recover_tokens;
    ro.threads = n_threads;
    ro.quiet = json;
    check_recover_options(ro);
    check_output_not_input(out, {ro.data});
  }
  check_output_path(out);
  const std::optional<DType> final_type = mopts.prune_type;
  mopts.prune_type.reset();
  // The widths the final type stores whole.
  if (structured && mopts.structured_ffn_multiple == 0) mopts.structured_ffn_multiple = ffn_multiple_for(final_type);
  // Scratch files of their own (never an existing OUT.something of the user's).
  const std::string pruned_tmp = make_scratch_file(out, "pruned"), recovered_tmp = make_scratch_file(out, "recovered");
  struct Cleanup {
    std::vector<std::string> paths;
    ~Cleanup() {
      std::error_code ec;
      for (const auto& p : paths) std::filesystem::remove(p, ec);
    }
  } cleanup{{pruned_tmp, recovered_tmp, recovered_tmp + ".optim"}};
  return run_method(in, pruned_tmp, method, mopts, copts, n_threads, json, [&](MethodReport& rep) {
    if (recover_tokens > 0) recover_pruned(in, pruned_tmp, recovered_tmp, ro);
    std::vector<std::pair<std::string, GgufValue>> kv;
    if (recover_tokens > 0) kv.emplace_back("tern.prune.recover_tokens", GgufValue::u32(uint32_t(recover_tokens)));
    const QuantizeReport stored =
        store_in_layout(pruned_tmp, recover_tokens > 0 ? recovered_tmp : pruned_tmp, out, final_type, kv, n_threads);
    rep.quant.tensors = stored.tensors;
    rep.quant.bytes = stored.bytes;
    if (recover_tokens > 0)
      rep.notes.push_back(str_cat("recovered: distilled toward ", in, " on ", ro.tokens, " tokens of ", ro.data,
                                  " with the zeros held"));
    return out;
  });
}

}  // namespace tern
