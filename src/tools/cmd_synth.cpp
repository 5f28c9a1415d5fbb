// tern synth: a random-weight model with a real architecture shape, in a chosen type.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/output_file.h"
#include "models/synth.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/model_args.h"

namespace tern {

int cmd_synth(int argc, char** argv) {
  CLI::App app{"Write a random-weight model with a real architecture shape (benchmarks without downloads)."};
  SynthOptions opts;
  std::string type_name = "f32", out;
  bool json = false;
  std::string shapes;
  for (const auto& s : synth_shapes()) shapes += std::string(shapes.empty() ? "" : ", ") + s.name;
  app.add_option("--shape", opts.shape, "architecture shape: " + shapes)->capture_default_str();
  app.add_option("--type", type_name, "type of the 2-D weights (f32, f16, bf16, q8_0, q4_0, ...)")->capture_default_str();
  app.add_option("--vocab", opts.vocab_gguf, "copy the vocabulary from this GGUF (default: a generated one)");
  app.add_option("--seed", opts.seed, "random seed")->capture_default_str();
  app.add_option("-t,--threads", opts.n_threads, "threads (default: all cores)");
  app.add_option("--ctx-train", opts.n_ctx_train, "training context written to the header (0: the shape's)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  app.add_option("--layers", opts.n_layer, "layers to write (0: the shape's): the shape's layers, fewer of them")
      ->check(CLI::Range(int64_t(0), int64_t(4096)));
  app.add_option("-o,--output", out, "output GGUF file")->required();
  app.add_flag("--relu", opts.relu_ffn,
               "a ReLU-fied model: its FFN is ReGLU (tern.ffn_activation relu; sparse-FFN benchmarks, docs/sparsity.md)");
  app.add_flag("--json", json, "print the report as JSON");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  const auto type = dtype_from_name(type_name);
  if (!type) fail("unknown type '", type_name, "'");
  opts.type = *type;
  check_output_not_input(out, {opts.vocab_gguf});
  const SynthReport rep = synth_model(opts, out);
  if (json) {
    nlohmann::json fb = nlohmann::json::array();
    for (const auto& [name, t] : rep.fallbacks) fb.push_back({{"tensor", name}, {"type", dtype_name(t)}});
    std::printf("%s\n", nlohmann::json{{"output", out}, {"shape", opts.shape}, {"type", dtype_name(opts.type)},
                                       {"n_params", rep.n_params}, {"weight_bytes", rep.weight_bytes},
                                       {"n_vocab", rep.n_vocab}, {"fallbacks", fb}}.dump().c_str());
  } else {
    std::printf("wrote %s: shape %s, type %s, %.2fM parameters, %s of weights, vocab %lld\n", out.c_str(),
                opts.shape.c_str(), dtype_name(opts.type), double(rep.n_params) / 1e6,
                format_bytes(rep.weight_bytes).c_str(), static_cast<long long>(rep.n_vocab));
    for (const auto& [name, t] : rep.fallbacks)
      std::printf("  %s: rows do not fit the %s block size, stored as %s\n", name.c_str(), dtype_name(opts.type),
                  dtype_name(t));
  }
  return 0;
}

}  // namespace tern
