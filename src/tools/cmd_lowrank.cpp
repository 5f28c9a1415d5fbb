// tern lowrank: replace a float model's linear layers by low-rank factors (docs/lowrank.md):
// truncated SVD or activation-aware SVD (whitened by the calibration Gram matrix), ranks from a
// parameter budget or fixed; written factored (lr_a / lr_b pairs tern runs) or merged back.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "compress/lowrank.h"
#include "core/error.h"
#include "core/output_file.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/progress.h"

namespace tern {

int cmd_lowrank(int argc, char** argv) {
  CLI::App app{"Low-rank factorization of a float GGUF model's linear layers (attn_q/k/v/output, ffn_gate/up/down):\n"
               "W [n_out, n_in] becomes B A of rank r (docs/lowrank.md)."};
  std::string in, out, method = "svd", type_name;
  double budget = 0;
  int64_t rank = 0;
  bool merge = false, json = false;
  LowRankOptions opts;
  app.add_option("input", in, "source GGUF model (f32, f16 or bf16 weights)")->required();
  app.add_option("output", out, "GGUF file to write")->required();
  app.add_option("--method", method, "svd (weights' spectrum) or asvd (activation-aware: whitened by --calib)")
      ->check(CLI::IsMember({"svd", "asvd"}))
      ->capture_default_str();
  auto* bo = app.add_option("--budget", budget,
                            "fraction of the linears' parameters kept, in (0, 1]: ranks chosen per matrix by energy "
                            "per parameter");
  auto* ro = app.add_option("--rank", rank, "a fixed rank for every matrix instead");
  bo->excludes(ro);
  std::string alloc = "relative";
  app.add_option("--alloc", alloc,
                 "budget criterion: energy (sigma^2 gained per parameter, over all matrices) or relative (each "
                 "matrix's sigma^2 as a fraction of its own total, so small-norm matrices are not starved)")
      ->check(CLI::IsMember({"energy", "relative"}))
      ->capture_default_str();
  app.add_flag("--merge", merge, "write B A back as dense matrices of the source's type (llama.cpp loads them)");
  app.add_option("--type", type_name, "storage type of the factors (default: the source's float type): " +
                                           quantize_type_names());
  app.add_option("--calib", opts.calib.text_file, "calibration text (asvd)");
  app.add_option("--calib-tokens", opts.calib.n_tokens, "calibration tokens (from the end of the text)")
      ->capture_default_str();
  app.add_option("--damp", opts.damp, "asvd: fraction of the mean diagonal of H added to it")->capture_default_str();
  app.add_option("-t,--threads", opts.n_threads, "worker threads (default: all cores)")->check(CLI::Range(0, 1024));
  app.add_flag("--json", json, "print the report as one JSON object");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;

  if (bo->count() == 0 && ro->count() == 0) fail("give --budget FRACTION or --rank R");
  if (bo->count() > 0 && !(budget > 0.0 && budget <= 1.0)) fail("--budget ", budget, " is outside (0, 1]");
  if (ro->count() > 0 && rank < 1) fail("--rank must be at least 1");
  opts.method = method == "asvd" ? LowRankMethod::Asvd : LowRankMethod::Svd;
  opts.budget = bo->count() > 0 ? budget : 0.0;
  opts.rank = ro->count() > 0 ? rank : 0;
  opts.merge = merge;
  opts.relative = alloc == "relative";
  if (ro->count() > 0 && app.count("--alloc") > 0) fail("--alloc chooses ranks for --budget; --rank fixes them");
  if (!type_name.empty()) opts.type = parse_quantize_type(type_name);
  if (opts.method == LowRankMethod::Asvd && opts.calib.text_file.empty())
    fail("asvd needs a calibration text: --calib FILE (svd does not)");
  check_output_not_input(out, {in, opts.calib.text_file});
  check_output_path(out);

  StagedProgress progress(!json);
  opts.progress = progress.stage("lowrank");
  const LowRankReport rep = lowrank_model(in, out, opts);

  if (json) {
    nlohmann::json j;
    j["method"] = rep.method;
    j["merged"] = rep.merged;
    j["params_before"] = rep.params_before;
    j["params_after"] = rep.params_after;
    j["param_ratio"] = rep.params_before > 0 ? double(rep.params_after) / double(rep.params_before) : 1.0;
    j["src_bytes"] = rep.src_bytes;
    j["bytes"] = rep.bytes;
    j["seconds"] = rep.seconds;
    j["calib_seconds"] = rep.calib_seconds;
    j["output"] = out;
    nlohmann::json ms = nlohmann::json::array();
    for (const LowRankEntry& e : rep.entries)
      ms.push_back({{"name", e.name},
                    {"n_in", e.n_in},
                    {"n_out", e.n_out},
                    {"rank", e.rank},
                    {"params_before", e.params_before},
                    {"params_after", e.params_after},
                    {"rel_error", e.rel_error},
                    {"type_a", dtype_name(e.type_a)},
                    {"type_b", dtype_name(e.type_b)}});
    j["matrices"] = ms;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("%-28s %11s %6s %12s %12s %9s  %s\n", "tensor", "n_out x n_in", "rank", "params", "after",
              rep.method == "asvd" ? "out.err" : "rel.err", "stored");
  for (const LowRankEntry& e : rep.entries) {
    const std::string shape = str_cat(e.n_out, "x", e.n_in);
    const std::string stored =
        e.rank == 0 ? str_cat("dense ", dtype_name(e.type_a))
                    : rep.merged ? str_cat("merged ", dtype_name(e.type_a))
                                 : str_cat(dtype_name(e.type_a), " + ", dtype_name(e.type_b));
    std::printf("%-28s %11s %6s %12lld %12lld %9.4f  %s\n", e.name.c_str(), shape.c_str(),
                e.rank == 0 ? "-" : std::to_string(e.rank).c_str(), static_cast<long long>(e.params_before),
                static_cast<long long>(e.params_after), e.rel_error, stored.c_str());
  }
  std::printf("\n%s: linears' parameters %lld -> %lld (%.1f%%)%s; tensor data %.2f MB -> %.2f MB; %.1f s%s\n",
              rep.method.c_str(), static_cast<long long>(rep.params_before), static_cast<long long>(rep.params_after),
              rep.params_before > 0 ? 100.0 * double(rep.params_after) / double(rep.params_before) : 100.0,
              rep.merged ? " as factored (merged back to dense)" : "", double(rep.src_bytes) / 1e6,
              double(rep.bytes) / 1e6, rep.seconds,
              rep.calib_seconds > 0 ? str_cat(" (calibration ", rep.calib_seconds, " s)").c_str() : "");
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

}  // namespace tern
