// tern quantize: requantize a GGUF model to another storage type, with llama-quantize's default
// per-tensor rules (docs/quantize.md).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "compress/calibrate.h"
#include "compress/methods.h"
#include "compress/quantize.h"
#include "core/error.h"
#include "core/output_file.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/model_args.h"
#include "tools/progress.h"
#include "tools/llm_pruner.h"
#include "tools/run_method.h"
#include "models/model.h"

namespace tern {

int cmd_quantize(int argc, char** argv) {
  CLI::App app{"Requantize a GGUF model (F32/F16/BF16/Q8_0/Q4_0/Q4_K/Q6_K) with llama-quantize's default rules,\n"
               "or compress it with a method (GPTQ, AWQ, LLM.int8(), SmoothQuant, RTN): docs/quantize.md."};
  std::string in, out, type_name, output_type, embd_type, method;
  QuantizeOptions opts;
  MethodOptions mopts;
  CalibOptions copts;
  bool json = false;
  std::string methods;
  for (const auto& m : compression_methods()) methods += std::string(methods.empty() ? "" : ", ") + m.name;
  app.add_option("input", in, "source GGUF model")->required();
  app.add_option("output", out, "GGUF file to write")->required();
  auto* type_opt = app.add_option("--type", type_name, "type of the 2-D weights: " + quantize_type_names());
  auto* method_opt = app.add_option("--method", method, "compression method instead of --type: " + methods);
  type_opt->excludes(method_opt);
  app.add_option("--calib", copts.text_file, "calibration text (methods that need one: gptq, awq, llm.int8, smoothquant)");
  app.add_option("--calib-tokens", copts.n_tokens, "calibration tokens (from the end of the text)")->capture_default_str();
  app.add_option("--threshold", mopts.threshold, "LLM.int8() outlier threshold on calibration max|x|")->capture_default_str();
  app.add_option("--alpha", mopts.alpha, "SmoothQuant migration strength")->capture_default_str();
  app.add_option("--damp", mopts.damp, "GPTQ dampening (fraction of the mean Hessian diagonal)")->capture_default_str();
  app.add_flag("--act-order", mopts.act_order, "GPTQ: quantize columns in order of decreasing Hessian diagonal");
  app.add_option("--group", mopts.group, "GPTQ/AWQ/RTN group size (the row length when smaller)")->capture_default_str();
  app.add_option("--keep", opts.keep, "leave this tensor as it is (glob allowed, repeatable)");
  app.add_flag("--pure", opts.pure, "every 2-D tensor to --type: no output/embedding/mix rules (llama-quantize --pure)");
  app.add_option("--output-type", output_type, "type of output.weight (default: q6_k, or q8_0 when its rows do not fit)");
  app.add_option("--embedding-type", embd_type, "type of token_embd.weight (default: --type)");
  app.add_flag("--allow-requantize", opts.allow_requantize, "allow requantizing tensors that are already quantized");
  app.add_option("-t,--threads", opts.n_threads, "worker threads (default: all cores)")->check(CLI::Range(0, 1024));
  app.add_flag("--json", json, "print the report as one JSON object");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  if (type_name.empty() && method.empty()) fail("give --type TYPE or --method METHOD");
  check_output_not_input(out, {in});
  // Pruning methods calibrate layer by layer through their pruned layers (the others ignore it).
  mopts.sequential = copts;
  copts.n_threads = opts.n_threads;
  enable_llm_pruner(mopts, copts);
  if (!method.empty()) return run_method(in, out, method, mopts, copts, opts.n_threads, json);
  opts.type = parse_quantize_type(type_name);
  if (!output_type.empty()) opts.output_type = parse_quantize_type(output_type);
  if (!embd_type.empty()) opts.embd_type = parse_quantize_type(embd_type);

  Progress progress("quantize", 1, !json);
  int64_t last_total = 1;
  opts.progress = [&](int64_t done, int64_t total, const std::string& note) {
    if (total != last_total) {
      progress = Progress("quantize", total, !json);
      last_total = total;
    }
    progress.update(done, note);
  };
  const QuantizeReport rep = quantize_model(in, out, opts);
  progress.finish();

  if (json) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& t : rep.tensors)
      tensors.push_back({{"name", t.name}, {"ne", t.ne}, {"src_type", dtype_name(t.src_type)},
                         {"requested", dtype_name(t.requested)}, {"type", dtype_name(t.type)},
                         {"fallback", t.type != t.requested}, {"reason", t.reason},
                         {"src_bytes", t.src_bytes}, {"bytes", t.bytes}});
    nlohmann::json j = {{"input", in},          {"output", out},
                        {"type", dtype_name(opts.type)}, {"pure", opts.pure},
                        {"file_type", rep.file_type}, {"src_bytes", rep.src_bytes},
                        {"bytes", rep.bytes},     {"n_fallbacks", rep.n_fallbacks()},
                        {"seconds", rep.seconds}, {"tensors", tensors}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  for (const auto& t : rep.tensors)
    std::printf("%-28s %-14s %5s -> %-5s %10s  %s\n", t.name.c_str(), shape_of(t.ne).c_str(),
                dtype_name(t.src_type), dtype_name(t.type), format_bytes(t.bytes).c_str(), t.reason.c_str());
  std::printf("wrote %s: %s, %s -> %s of tensor data (%.2fx), %d fallback%s, %.2f s\n", out.c_str(),
              dtype_name(opts.type), format_bytes(rep.src_bytes).c_str(), format_bytes(rep.bytes).c_str(),
              rep.bytes > 0 ? double(rep.src_bytes) / double(rep.bytes) : 0.0, rep.n_fallbacks(),
              rep.n_fallbacks() == 1 ? "" : "s", rep.seconds);
  return 0;
}

}  // namespace tern
