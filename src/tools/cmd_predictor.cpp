// tern predictor train: a low-rank predictor of each layer's active FFN neurons for a ReLU-fied
// model (Deja Vu; issue #31, docs/sparsity.md "Predictor"), trained on a calibration text and
// written into a copy of the model (models/ffn_predictor_format.h).
// tern predictor eval: the stored predictor's recall and predicted-active fraction on a text.
// tern predictor bundle: each dense layer's neuron bundles (models/ffn_bundle_format.h) written
// into a copy of the model, which --ram-budget reads cold neurons from.
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "compress/ffn_predictor.h"
#include "core/error.h"
#include "core/output_file.h"
#include "models/ffn_bundle_format.h"
#include "models/model.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/progress.h"

namespace tern {

namespace {

nlohmann::json layers_json(const std::vector<PredictorLayerReport>& layers) {
  nlohmann::json j = nlohmann::json::array();
  for (const PredictorLayerReport& l : layers)
    j.push_back({{"layer", l.layer},
                 {"n_ff", l.n_ff},
                 {"threshold", l.threshold},
                 {"recall", l.recall},
                 {"predicted_active", l.predicted_active},
                 {"true_active", l.true_active},
                 {"sparsity", 1.0 - l.true_active},
                 {"loss_init", l.loss_init},
                 {"loss", l.loss},
                 {"predictor_bytes", l.predictor_bytes},
                 {"ffn_bytes", l.ffn_bytes}});
  return j;
}

// Per layer: recall, the fraction predicted active (the rows a sparse FFN computes), the truly
// active fraction, and the predictor's size against the FFN's; the held-out loss when trained.
void print_layers(const std::vector<PredictorLayerReport>& layers, bool trained) {
  std::printf("  layer   n_ff  recall  predicted  true active  sparsity  size/FFN%s\n",
              trained ? "  loss init -> trained" : "");
  double pred = 0, truly = 0, cells = 0;
  int64_t pbytes = 0, fbytes = 0;
  for (const PredictorLayerReport& l : layers) {
    std::printf("  %5lld  %5lld  %6.4f  %8.1f%%  %10.1f%%  %7.1f%%  %7.1f%%", static_cast<long long>(l.layer),
                static_cast<long long>(l.n_ff), l.recall, 100 * l.predicted_active, 100 * l.true_active,
                100 * (1 - l.true_active), l.ffn_bytes > 0 ? 100.0 * double(l.predictor_bytes) / double(l.ffn_bytes) : 0.0);
    if (trained) std::printf("  %9.4f -> %7.4f", l.loss_init, l.loss);
    std::printf("\n");
    pred += l.predicted_active * double(l.n_ff);
    truly += l.true_active * double(l.n_ff);
    cells += double(l.n_ff);
    pbytes += l.predictor_bytes;
    fbytes += l.ffn_bytes;
  }
  if (cells > 0)
    std::printf("  all                    %8.1f%%  %10.1f%%  %7.1f%%  %7.1f%%\n", 100 * pred / cells, 100 * truly / cells,
                100 * (1 - truly / cells), fbytes > 0 ? 100.0 * double(pbytes) / double(fbytes) : 0.0);
}

void print_report(const PredictorTrainReport& rep, const std::string& out, double want, bool json) {
  if (json) {
    std::printf("%s\n", nlohmann::json{{"output", out},
                                       {"rank", rep.rank},
                                       {"recall_target", want},
                                       {"train_tokens", rep.n_train},
                                       {"eval_tokens", rep.n_eval},
                                       {"fingerprint", rep.fingerprint},
                                       {"layers", layers_json(rep.layers)},
                                       {"calib_seconds", rep.calib_seconds},
                                       {"train_seconds", rep.train_seconds}}
                            .dump()
                            .c_str());
    return;
  }
  std::printf("predictor rank %lld, %lld training tokens, %lld held out (recall asked %.4f):\n",
              static_cast<long long>(rep.rank), static_cast<long long>(rep.n_train), static_cast<long long>(rep.n_eval),
              want);
  print_layers(rep.layers, true);
  std::printf("calibration %.1f s, training %.1f s; wrote %s\n", rep.calib_seconds, rep.train_seconds, out.c_str());
}

int predictor_eval(int argc, char** argv) {
  CLI::App app{"Measure a model's stored sparsity predictor on a text: per layer, the recall and the fraction "
               "predicted active at its thresholds"};
  app.name("tern predictor eval");
  std::string model;
  bool json = false;
  CalibOptions o;
  o.n_tokens = 8192;
  o.seq_len = 256;
  o.from_end = false;
  app.add_option("-m,--model", model, "a model with a predictor (tern predictor train's output)")->required();
  app.add_option("--text", o.text_file, "the text to run")->required();
  app.add_option("--tokens", o.n_tokens, "tokens of the text to run")->capture_default_str();
  app.add_option("--seq-len", o.seq_len, "tokens per sequence (BOS + text)")->capture_default_str();
  app.add_option("--from-end", o.from_end, "take the text's last tokens (true) or its first (false)")
      ->capture_default_str();
  app.add_option("-t,--threads", o.n_threads, "threads (default: all cores)")->check(CLI::Range(0, 1024));
  app.add_flag("--json", json, "print one JSON object");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  const auto file = open_model_file(model);
  StagedProgress progress(!json);
  o.progress = progress.stage("predictor eval");
  const std::vector<PredictorLayerReport> layers = evaluate_ffn_predictor(file, o);
  if (json) {
    std::printf("%s\n", nlohmann::json{{"model", model}, {"text", o.text_file}, {"layers", layers_json(layers)}}.dump().c_str());
    return 0;
  }
  std::printf("sparsity predictor of %s on %s:\n", model.c_str(), o.text_file.c_str());
  print_layers(layers, false);
  return 0;
}

int predictor_train(int argc, char** argv) {
  CLI::App app{"Train a low-rank predictor of each layer's active FFN neurons (Deja Vu) for a ReLU-fied model and "
               "write the model with it (docs/sparsity.md)"};
  app.name("tern predictor train");
  std::string model, out;
  bool json = false;
  PredictorTrainOptions o;
  o.calib.n_tokens = 16384;
  o.calib.seq_len = 256;
  o.calib.from_end = false;
  app.add_option("-m,--model", model, "the ReLU-fied model (GGUF, tern.ffn_activation relu)")->required();
  app.add_option("--calib", o.calib.text_file, "calibration text")->required();
  app.add_option("-o,--output", out, "GGUF to write: the model, unchanged, plus the predictor")->required();
  app.add_option("--rank", o.rank, "rank of the predictor (1 .. n_embd)")->capture_default_str();
  app.add_option("--calib-tokens", o.calib.n_tokens, "tokens of the text to run (every 10th held out)")
      ->capture_default_str();
  app.add_option("--seq-len", o.calib.seq_len, "tokens per calibration sequence (BOS + text)")->capture_default_str();
  app.add_option("--recall", o.recall, "recall each layer's threshold keeps on held-out tokens, in (0, 1]")
      ->capture_default_str();
  app.add_option("--epochs", o.epochs, "passes of Adam over the training tokens (0: the gate factorisation alone)")
      ->capture_default_str();
  app.add_option("--lr", o.lr, "Adam's learning rate")->capture_default_str();
  app.add_option("--batch", o.batch, "tokens per minibatch")->capture_default_str();
  app.add_option("--pos-weight", o.pos_weight,
                 "loss weight of active neurons, times the balanced weight (1 - rate) / rate (more: recall favoured)")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "minibatch order")->capture_default_str();
  app.add_option("-t,--threads", o.calib.n_threads, "threads (default: all cores)")->check(CLI::Range(0, 1024));
  app.add_flag("--json", json, "print one JSON object");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  if (o.rank < 1) fail("--rank ", o.rank, " must be at least 1");
  if (!(o.recall > 0.0 && o.recall <= 1.0)) fail("--recall ", o.recall, " is outside (0, 1]");
  if (o.batch < 1) fail("--batch ", o.batch, " must be at least 1");
  check_output_not_input(out, {model, o.calib.text_file});
  check_output_path(out);

  const auto file = open_model_file(model);
  StagedProgress progress(!json);
  o.progress = progress.stage("predictor");
  o.calib.progress = progress.stage("calibration");
  const TrainedPredictor p = train_ffn_predictor(file, o);
  write_with_ffn_predictor(*file, p, out);
  print_report(p.report, out, o.recall, json);
  return 0;
}

int predictor_bundle(int argc, char** argv) {
  CLI::App app{"Write a copy of the model with each dense FFN layer's neuron bundles (neuron j's gate, up and "
               "transposed down rows side by side), which --ram-budget reads cold neurons from (docs/sparsity.md)"};
  app.name("tern predictor bundle");
  std::string model, out, down_type;
  bool json = false;
  app.add_option("-m,--model", model, "the model (a ReLU-fied one, usually with its predictor)")->required();
  app.add_option("-o,--output", out, "GGUF to write: the model, unchanged, plus the bundles")->required();
  app.add_option("--down-type", down_type,
                 "type of the transposed ffn_down rows: f32, f16, q8_0 or q4_0 (default: ffn_down's, q8_0 for q4_0)")
      ->check(CLI::IsMember({"f32", "f16", "q8_0", "q4_0"}));
  app.add_flag("--json", json, "print one JSON object");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  check_output_not_input(out, {model});
  check_output_path(out);
  const auto file = open_model_file(model);
  DType dt = DType::Q8_0;
  if (!down_type.empty()) {
    dt = *dtype_from_name(down_type);
  } else {
    const GgufTensorInfo* d = nullptr;
    for (const GgufTensorInfo& t : file->tensors())
      if (t.name.size() > 16 && t.name.compare(t.name.size() - 16, 16, ".ffn_down.weight") == 0) {
        d = &t;
        break;
      }
    if (!d) fail(model, ": no dense FFN layer (blk.N.ffn_down.weight) to bundle");
    dt = default_down_t_type(d->type);
  }
  const FfnBundleReport rep = write_with_ffn_bundles(*file, dt, out);
  if (json) {
    std::printf("%s\n", nlohmann::json{{"output", out},
                                       {"layers", rep.layers},
                                       {"neurons", rep.n_ff_total},
                                       {"bundle_bytes", rep.bundle_bytes},
                                       {"down_t_type", dtype_name(rep.down_t_type)},
                                       {"model_weight_bytes", model_weight_bytes(*file)}}
                            .dump()
                            .c_str());
  } else {
    std::printf("bundled %lld neurons of %lld layers (down_t %s): %.1f MiB of bundles beside %.1f MiB of weights; "
                "wrote %s\n",
                static_cast<long long>(rep.n_ff_total), static_cast<long long>(rep.layers), dtype_name(rep.down_t_type),
                double(rep.bundle_bytes) / (1 << 20), double(model_weight_bytes(*file)) / (1 << 20), out.c_str());
  }
  return 0;
}

}  // namespace

int cmd_predictor(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "train") == 0) return predictor_train(argc - 1, argv + 1);
  if (argc >= 2 && std::strcmp(argv[1], "eval") == 0) return predictor_eval(argc - 1, argv + 1);
  if (argc >= 2 && std::strcmp(argv[1], "bundle") == 0) return predictor_bundle(argc - 1, argv + 1);
  if (argc >= 2 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0)) {
    std::printf("tern predictor train -m MODEL --calib TEXT -o OUT [--rank 32] [--calib-tokens 16384] [--recall 0.99]\n"
                "  [--epochs N] [--lr X] [-t N] [--json]\n"
                "tern predictor eval -m MODEL_WITH_PREDICTOR --text FILE [--tokens 8192] [--from-end B] [--json]\n"
                "tern predictor bundle -m MODEL -o OUT [--down-type q8_0] [--json]\n"
                "A low-rank predictor of each layer's active FFN neurons (Deja Vu) for a ReLU-fied model, written\n"
                "into a copy of it, and its recall on another text (docs/sparsity.md). `tern predictor train --help`\n"
                "lists every option. `tern predictor bundle` adds the neuron bundles --ram-budget reads from.\n");
    return 0;
  }
  fail("give a subcommand: train, eval or bundle (tern predictor --help)");
}

}  // namespace tern
