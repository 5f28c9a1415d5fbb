// tern sparsify: activation sparsity (issue #31, docs/sparsity.md).
//   tern sparsify --relufy -m MODEL --data TEXT -o OUT [training options]: ReLU-fication. The
//     SwiGLU FFNs become ReGLU (max(gate, 0) * up: a neuron whose gate is <= 0 is exactly zero),
//     a short fine-tune on the text recovers what the change cost, and the result's FFN
//     sparsity is measured on --val (else the training text).
//   tern sparsify --measure -m MODEL --text FILE: the FFN sparsity of any model, per layer.
#include <cstdio>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "compress/activation_sparsity.h"
#include "core/error.h"
#include "core/read_file.h"
#include "models/hparams.h"
#include "models/model.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/progress.h"
#include "tools/train_args.h"

namespace tern {

namespace {

// The table people read and the JSON scripts read.
void report_activity(const FfnActivity& a, const std::string& model, bool json) {
  if (json) {
    nlohmann::json layers = nlohmann::json::array();
    for (int64_t il = 0; il < a.n_layer(); ++il)
      layers.push_back({{"layer", il},
                        {"n_ff", a.n_ff[size_t(il)]},
                        {"sparsity", a.sparsity(il)},
                        {"hot_fraction_90", a.hot_fraction(il, 0.9)}});
    std::printf("%s\n", nlohmann::json{{"model", model},
                                       {"tokens", a.n_tokens},
                                       {"sparsity", a.mean_sparsity()},
                                       {"layers", layers},
                                       {"seconds", a.seconds}}
                            .dump()
                            .c_str());
    return;
  }
  std::printf("FFN activation sparsity of %s over %lld tokens:\n", model.c_str(), static_cast<long long>(a.n_tokens));
  std::printf("  layer   n_ff   zero   neurons for 90%% of activity\n");
  for (int64_t il = 0; il < a.n_layer(); ++il) {
    if (a.n_ff[size_t(il)] == 0) continue;
    std::printf("  %5lld  %5lld  %5.1f%%  %5.1f%%\n", static_cast<long long>(il),
                static_cast<long long>(a.n_ff[size_t(il)]), 100 * a.sparsity(il), 100 * a.hot_fraction(il, 0.9));
  }
  std::printf("  all            %5.1f%%\n", 100 * a.mean_sparsity());
}

CalibOptions measure_options(const std::string& text, int64_t tokens, int64_t seq_len, int threads,
                             StagedProgress& progress) {
  CalibOptions o;
  o.text_file = text;
  o.n_tokens = tokens;
  o.seq_len = seq_len;
  o.from_end = false;
  o.n_threads = threads;
  o.progress = progress.stage("sparsity");
  return o;
}

int sparsify_measure(int argc, char** argv) {
  CLI::App app{"Measure the FFN activation sparsity of a model over a text"};
  app.name("tern sparsify --measure");
  std::string model, text;
  int64_t tokens = 8192, seq_len = 256;
  int threads = 0;
  bool json = false, measure = false;
  app.add_flag("--measure", measure, "measure (this mode)");
  app.add_option("-m,--model", model, "the model (GGUF)")->required();
  app.add_option("--text", text, "the text to run")->required();
  app.add_option("--tokens", tokens, "tokens of the text to run")->capture_default_str();
  app.add_option("--seq-len", seq_len, "tokens per sequence (BOS + text)")->capture_default_str();
  app.add_option("-t,--threads", threads, "threads (default: all cores)");
  app.add_flag("--json", json, "print one JSON object");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  const auto file = open_model_file(model);
  StagedProgress progress(!json);
  const FfnActivity a = measure_ffn_activity(file, measure_options(text, tokens, seq_len, threads, progress));
  report_activity(a, model, json);
  return 0;
}

}  // namespace

int cmd_sparsify(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--measure") == 0) return sparsify_measure(argc, argv);

  CLI::App app{"ReLU-fy a SwiGLU model (--relufy: ReGLU FFNs, then a recovery fine-tune), or measure a model's "
               "FFN activation sparsity (--measure -m MODEL --text FILE)"};
  app.name("tern sparsify");
  TrainArgs a;
  add_train_args(app, a, /*distill=*/false);
  bool relufy = false;
  int64_t sparsity_tokens = 8192;
  float act_l1 = 0.0f;
  app.add_flag("--relufy", relufy, "replace SwiGLU by ReGLU (max(gate, 0) * up) and fine-tune on --data");
  app.add_option("--sparsity-tokens", sparsity_tokens, "tokens of --val (else --data) the result's sparsity is measured on")
      ->capture_default_str();
  app.add_option("--act-l1", act_l1,
                 "weight of an L1 penalty on the FFN activations during the fine-tune (more zeros; ProSparse's "
                 "regularizer): lambda * mean |act| per token and layer")
      ->capture_default_str();
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  if (!relufy) fail("tern sparsify: give --relufy (ReLU-fy a model and fine-tune it) or --measure (a model's sparsity)");
  a.relufy = true;
  if (!(act_l1 >= 0.0f) || !std::isfinite(act_l1))
    fail("--act-l1: the activation L1 weight must be a finite number >= 0 (got ", act_l1, ")");
  const std::string cmd = "tern sparsify";
  TrainSetup s = setup_training(app, a, cmd, false);
  s.trainer->forward_backward().set_activation_l1(act_l1);
  if (const int rc = run_training(s, a, cmd); rc != 0) return rc;

  // The result's sparsity, on the held-out text when there is one, else on what it trained on
  // (--data self: the samples the model wrote).
  std::string text;
  if (!a.val.empty()) text = read_file_text(a.val, "--val");
  else if (a.data == "self") text = s.tokenizer->decode(s.data.tokens);
  else text = read_file_text(a.data, "--data");
  const auto file = open_model_file(a.out);
  const int64_t available = int64_t(s.tokenizer->encode(text, false).size());
  StagedProgress progress(!a.json && !a.quiet);
  CalibOptions opts = measure_options("", std::min(sparsity_tokens, available), a.n_ctx, a.threads, progress);
  opts.text = std::move(text);
  const FfnActivity act = measure_ffn_activity(file, opts);
  report_activity(act, a.out, a.json);
  return 0;
}

}  // namespace tern
