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
#include "models/model.h"

namespace tern {
namespace {

std::string shape_of(const std::vector<int64_t>& ne) {
  std::string s;
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? " x " : "") + std::to_string(ne[i]);
  return s;
}

int quantize_with_method(const std::string& in, const std::string& out, const std::string& method,
                         MethodOptions mopts, CalibOptions copts, int n_threads, bool json) {
  const MethodInfo& info = find_method(method);
  check_output_not_input(out, {in, copts.text_file});
  mopts.n_threads = n_threads;
  copts.n_threads = n_threads;
  Progress progress("quantize", 1, !json);
  // A fresh bar whenever a new piece of work starts (its total changes or its count restarts).
  int64_t last_done = 0, last_total = 0;
  auto draw = [&](const std::string& label) {
    return [&, label](int64_t done, int64_t total, const std::string& note) {
      if (total != last_total || done < last_done) progress = Progress(label, total, !json);
      last_done = done;
      last_total = total;
      progress.update(done, note);
      if (done == total) progress.finish();
    };
  };
  CalibStats calib;
  const bool uses_calib = info.needs_calib;
  if (uses_calib) {
    if (copts.text_file.empty()) fail(info.name, " needs a calibration text: --calib FILE");
    copts.hessian = info.needs_hessian;
    copts.progress = draw("calibrate");
    calib = calibrate(open_model_file(in), copts);
  }
  mopts.progress = draw(info.name);
  const MethodReport rep = apply_method(method, in, out, uses_calib ? &calib : nullptr, mopts);
  if (json) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& t : rep.quant.tensors)
      tensors.push_back({{"name", t.name}, {"type", dtype_name(t.type)}, {"requested", dtype_name(t.requested)},
                         {"fallback", t.type != t.requested}, {"reason", t.reason}, {"bytes", t.bytes}});
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& l : rep.layers) {
      nlohmann::json j = {{"name", l.name}};
      if (l.err >= 0) j["err"] = l.err, j["err_rtn"] = l.err_rtn;
      if (l.outliers >= 0) j["outliers"] = l.outliers;
      if (l.alpha >= 0) j["alpha"] = l.alpha;
      layers.push_back(j);
    }
    std::printf("%s\n", nlohmann::json{{"input", in}, {"output", out}, {"method", rep.method},
                                       {"src_bytes", rep.quant.src_bytes}, {"bytes", rep.quant.bytes},
                                       {"n_fallbacks", rep.quant.n_fallbacks()}, {"seconds", rep.seconds},
                                       {"calib_tokens", uses_calib ? calib.n_tokens : 0}, {"tensors", tensors},
                                       {"layers", layers}}
                                .dump()
                                .c_str());
    return 0;
  }
  for (const auto& t : rep.quant.tensors)
    std::printf("%-28s %-14s %5s -> %-8s %10s  %s\n", t.name.c_str(), shape_of(t.ne).c_str(), dtype_name(t.src_type),
                dtype_name(t.type), format_bytes(t.bytes).c_str(), t.reason.c_str());
  for (const auto& l : rep.layers)
    if (l.err >= 0)
      std::printf("%-28s output error %.4g (round-to-nearest %.4g, %.1f%%)%s\n", l.name.c_str(), l.err, l.err_rtn,
                  l.err_rtn > 0 ? 100.0 * l.err / l.err_rtn : 0.0,
                  l.alpha >= 0 ? str_cat(", alpha ", l.alpha).c_str() : "");
  for (const auto& n : rep.notes) std::printf("note: %s\n", n.c_str());
  std::printf("wrote %s: %s, %s -> %s of tensor data (%.2fx), %d fallback%s, %.2f s\n", out.c_str(),
              rep.method.c_str(), format_bytes(rep.quant.src_bytes).c_str(), format_bytes(rep.quant.bytes).c_str(),
              rep.quant.bytes > 0 ? double(rep.quant.src_bytes) / double(rep.quant.bytes) : 0.0,
              rep.quant.n_fallbacks(), rep.quant.n_fallbacks() == 1 ? "" : "s", rep.seconds);
  return 0;
}

}  // namespace

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
  if (!method.empty()) return quantize_with_method(in, out, method, mopts, copts, opts.n_threads, json);
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
