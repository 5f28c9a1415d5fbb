// tern train: trains a Llama-architecture model on text, from a new shape (--vocab-from plus
// --n-embd ...) or from a GGUF (-m); checkpoints are GGUF files that `tern run` and llama.cpp load.
// docs/training.md has the options, the data packing and the figures.
#include <cstdio>
#include <string>
#include <vector>

#include "core/output_file.h"
#include "gguf/gguf.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/train_args.h"
#include "train/trainer.h"

namespace tern {

int cmd_train(int argc, char** argv) {
  CLI::App app{"Train a Llama-architecture model on text (a new shape, or continue a GGUF)"};
  TrainArgs a;
  add_train_args(app, a, /*distill=*/false);
  std::string dump_grads;
  app.add_option("--dump-grads", dump_grads,
                 "write the gradients of the first micro-batch at the initial weights to this GGUF and exit "
                 "(tensor names of the model, plus train.loss)");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;

  TrainSetup s = setup_training(app, a, "tern train", !dump_grads.empty());
  if (!dump_grads.empty()) {
    check_output_not_input(dump_grads, {a.model, a.vocab_from, a.data});
    train::ForwardBackward& fb = s.trainer->forward_backward();
    std::vector<float> g(size_t(s.model.n_params()), 0.0f);
    std::vector<int32_t> batch(size_t(a.cfg.n_seq * (a.cfg.n_ctx + 1)));
    s.data_sampler->batch(0, a.cfg.n_seq, batch.data());
    // --qat: the gradients reaching the latent weights (through the clipped straight-through
    // estimator), and each quantized tensor's forward weights as NAME.qat_weight.
    const train::TrainModel& fm = s.qat ? s.qat->quantized() : s.model;
    fb.prepare(fm);
    const float loss = float(fb.forward_backward(fm, batch.data(), g.data(), 1.0f));
    if (s.qat) s.qat->straight_through(g.data());
    GgufWriter w(3);
    w.set("general.architecture", GgufValue::string("tern-gradients"));
    for (const auto& p : s.model.params)
      w.add_tensor(p.name, DType::F32, p.ne, g.data() + p.offset, uint64_t(p.size) * 4);
    if (s.qat) add_qat_dump_tensors(w, *s.qat);
    w.add_tensor("train.loss", DType::F32, {1}, &loss, 4);
    w.write(dump_grads);
    std::fprintf(stderr, "tern train: loss %.6f; gradients of %lld parameters written to %s\n", double(loss),
                 static_cast<long long>(s.model.n_params()), dump_grads.c_str());
    return 0;
  }
  return run_training(s, a, "tern train");
}

}  // namespace tern
