#pragma once
// What `tern train` and `tern distill` share: their options, building the model, data and
// trainer from them, and running the loop with the progress bar, the JSON lines, Ctrl-C and the
// final report.
#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "train/qat.h"
#include "train/trainer.h"

namespace tern {

struct TrainArgs {
  std::string model, vocab_from, data, val, out;
  train::ModelShape shape;        // new models: --n-embd ... (n_vocab from --vocab-from)
  int64_t n_ctx = 0;              // --ctx (0: 256, capped by a loaded model's context)
  int64_t tokens = 0;             // --tokens (alternative to --steps)
  bool tied = false, no_shuffle = false, json = false, resume = false, add_eos = false, quiet = false;
  int threads = 0;
  train::TrainConfig cfg;
  float min_lr = -1.0f;           // < 0: lr / 10
  int64_t warmup = -1;            // < 0: steps / 20, at most 1000
  std::string qat;                // --qat TYPE ("" : off)
  std::string qat_out;            // --qat-out (default: default_qat_export_path)
  bool qat_fallback = false;      // --qat-fallback: rows that do not fit TYPE train in tern quantize's substitute
  bool qat_lsq = false;           // --qat-lsq: learned per-block scales
  int64_t self_samples = 1000;    // --data self: samples the model writes (--self-samples)
  int64_t self_sample_len = 0;    // their tokens (0: --ctx)
  DType qat_type = DType::F32;    // parsed --qat
  // tern sparsify --relufy: the loaded model's SwiGLU FFNs become ReGLU (max(gate, 0) * up)
  // before training, which then recovers what the change cost (the checkpoints say "relu").
  bool relufy = false;
};

void add_train_args(CLI::App& app, TrainArgs& a, bool distill);

// --qat, --qat-out, --qat-lsq, --qat-fallback (finetune: their help speaks of the merged model).
void add_qat_options(CLI::App& app, TrainArgs& a, bool finetune);
// Checks the QAT options (the others need --qat) and the export's path (never the checkpoint,
// its .optim or one of `inputs`); sets a.qat_type and the default a.qat_out. Nothing without --qat.
void check_qat_options(TrainArgs& a, const std::string& cmd, const std::vector<std::string>& inputs);
// The plan of `latent` under --qat (tern quantize's type per tensor; rows that do not fit are an
// error naming the tensors, or with --qat-fallback train in the substitute, noted on stderr) and
// its fake-quantized twin.
std::unique_ptr<train::QatModel> make_qat_model(const train::TrainModel& latent, const TrainArgs& a,
                                                const std::string& cmd, ThreadPool* pool);
// --dump-grads under --qat: each quantized tensor's forward weights as NAME.qat_weight and, with
// LSQ, its block scales (f32, before their f16 rounding) and their gradient as NAME.qat_scale and
// NAME.qat_scale_grad. `w` refers to qat's data: write it while qat lives.
void add_qat_dump_tensors(GgufWriter& w, const train::QatModel& qat);

// What the options of the optimizer, the schedule, the data order, validation, checkpoints and
// output that every training command has (tern train, distill, finetune) apply to, in their help.
struct RunOptionsHelp {
  const char* weight_decay;  // "AdamW's decoupled weight decay (matrices only)"
  const char* seed;          // "seed of the initial weights and the data order"
  const char* eos;           // "end every document with EOS (so the model learns to stop)"
};
// --batch --grad-accum --lr --min-lr --warmup --weight-decay --beta1 --beta2 --eps --clip --seed
// --no-shuffle --eos --val-every --val-windows --checkpoint-every --stop-after --resume -t
// --json -q.
void add_run_options(CLI::App& app, TrainArgs& a, const RunOptionsHelp& help);

struct TrainSetup {
  std::unique_ptr<GgufFile> vocab_file;  // tokenizer.* source (and the model, with -m / --resume)
  std::unique_ptr<Tokenizer> tokenizer;
  train::TrainModel model;
  train::TokenStream data, val;
  std::unique_ptr<train::WindowSampler> data_sampler, val_sampler;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<train::Trainer> trainer;
  std::unique_ptr<train::QatModel> qat;  // --qat: the forward's fake-quantized twin of `model`
  std::unique_ptr<train::LoraMerge> merge;  // finetune --qat: the base with the adapter merged in
  std::string qat_source;  // the GGUF whose metadata the --qat export copies (empty: the checkpoint)
};

// Validates the options (clear errors before any slow work), loads or initialises the model,
// tokenizes the data, checks the output paths and, with --resume, restores the checkpoint.
// `extra_text` is more training text (documents separated by blank lines: distill's teacher
// samples), tokenized with the student's tokenizer after --data.
TrainSetup setup_training(const CLI::App& app, TrainArgs& a, const std::string& cmd, bool no_steps_needed,
                          const std::string* extra_text = nullptr);

// Runs the loop; returns the exit code (130 after Ctrl-C, with the checkpoint written).
int run_training(TrainSetup& s, const TrainArgs& a, const std::string& cmd);

}  // namespace tern
