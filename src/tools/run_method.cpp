// tern quantize --method / tern prune: one compression method, run and reported.
#include "tools/run_method.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/output_file.h"
#include "models/model.h"
#include "tools/cli_util.h"
#include "tools/model_args.h"
#include "tools/progress.h"

namespace tern {

std::string shape_of(const std::vector<int64_t>& ne) {
  std::string s;
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? " x " : "") + std::to_string(ne[i]);
  return s;
}

int run_method(const std::string& in, const std::string& out_path, const std::string& method, MethodOptions mopts,
               CalibOptions copts, int n_threads, bool json, const MethodPostStep& post) {
  const MethodInfo& info = find_method(method);
  check_output_not_input(out_path, {in, copts.text_file});
  check_method_source(method, *open_model_file(in));  // before calibration, which can take long
  mopts.n_threads = n_threads;
  copts.n_threads = n_threads;
  StagedProgress progress(!json);
  auto draw = [&](const std::string& label) { return progress.stage(label); };
  CalibStats calib;
  const bool uses_calib = info.needs_calib;
  if (uses_calib) {
    if (copts.text_file.empty()) fail(info.name, " needs a calibration text: --calib FILE");
    copts.hessian = info.needs_hessian;
    copts.progress = draw("calibrate");
    calib = calibrate(open_model_file(in), copts);
  }
  mopts.progress = draw(info.name);
  MethodReport rep = apply_method(method, in, out_path, uses_calib ? &calib : nullptr, mopts);
  const std::string out = post ? post(rep) : out_path;
  if (json) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& t : rep.quant.tensors)
      tensors.push_back({{"name", t.name}, {"type", dtype_name(t.type)}, {"requested", dtype_name(t.requested)},
                         {"fallback", t.type != t.requested}, {"reason", t.reason}, {"bytes", t.bytes}});
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& l : rep.layers) {
      nlohmann::json j = {{"name", l.name}};
      if (l.err >= 0) j["err"] = l.err;
      if (l.err_rtn >= 0) j["err_rtn"] = l.err_rtn;
      if (l.outliers >= 0) j["outliers"] = l.outliers;
      if (l.alpha >= 0) j["alpha"] = l.alpha;
      if (l.sparsity >= 0) j["sparsity"] = l.sparsity;
      layers.push_back(j);
    }
    std::printf("%s\n", nlohmann::json{{"input", in}, {"output", out}, {"method", rep.method},
                                       {"src_bytes", rep.quant.src_bytes}, {"bytes", rep.quant.bytes},
                                       {"n_fallbacks", rep.quant.n_fallbacks()}, {"seconds", rep.seconds},
                                       {"calib_tokens", uses_calib ? calib.n_tokens : 0}, {"tensors", tensors},
                                       {"layers", layers}, {"notes", rep.notes}}
                                .dump()
                                .c_str());
    return 0;
  }
  for (const auto& t : rep.quant.tensors)
    std::printf("%-28s %-14s %5s -> %-8s %10s  %s\n", t.name.c_str(), shape_of(t.ne).c_str(), dtype_name(t.src_type),
                dtype_name(t.type), format_bytes(t.bytes).c_str(), t.reason.c_str());
  for (const auto& l : rep.layers)
    if (l.sparsity >= 0)
      std::printf("%-28s %5.1f%% zeros%s\n", l.name.c_str(), 100.0 * l.sparsity,
                  l.err >= 0 ? str_cat(", output error ", l.err).c_str() : "");
    else if (l.err >= 0)
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

}  // namespace tern
