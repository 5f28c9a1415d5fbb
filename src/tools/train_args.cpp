#include "tools/train_args.h"

#include <sys/stat.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/output_file.h"
#include "core/stats.h"
#include "tools/progress.h"
#include "tools/qat_export.h"
#include "tools/self_samples.h"

namespace tern {
namespace {

std::atomic<bool> g_stop{false};

void on_sigint(int) {
  g_stop.store(true);
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}

bool file_exists(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0;
}

}  // namespace

void add_run_options(CLI::App& app, TrainArgs& a, const RunOptionsHelp& help) {
  app.add_option("--batch", a.cfg.n_seq, "sequences per micro-batch")->capture_default_str();
  app.add_option("--grad-accum", a.cfg.grad_accum, "micro-batches per optimizer step")->capture_default_str();
  app.add_option("--lr", a.cfg.opt.lr, "peak learning rate")->capture_default_str();
  app.add_option("--min-lr", a.min_lr, "learning rate at the end of the cosine (default: lr / 10)");
  app.add_option("--warmup", a.warmup, "steps of linear warm-up (default: steps / 20, at most 1000)");
  app.add_option("--weight-decay", a.cfg.opt.weight_decay, help.weight_decay)
      ->capture_default_str();
  app.add_option("--beta1", a.cfg.opt.beta1, "AdamW beta1")->capture_default_str();
  app.add_option("--beta2", a.cfg.opt.beta2, "AdamW beta2")->capture_default_str();
  app.add_option("--eps", a.cfg.opt.eps, "AdamW epsilon")->capture_default_str();
  app.add_option("--clip", a.cfg.opt.clip, "clip the gradient's global L2 norm to this (0: off)")->capture_default_str();
  app.add_option("--seed", a.cfg.seed, help.seed)->capture_default_str();
  app.add_flag("--no-shuffle", a.no_shuffle, "take the windows in file order (default: a seeded shuffle per epoch)");
  app.add_flag("--eos", a.add_eos, help.eos);
  app.add_option("--val-every", a.cfg.val_every, "steps between validations (default: steps / 10)");
  app.add_option("--val-windows", a.cfg.val_windows, "validation windows of --ctx tokens used (0: all)")
      ->capture_default_str();
  app.add_option("--checkpoint-every", a.cfg.checkpoint_every, "steps between checkpoints (0: at the end only)")
      ->capture_default_str();
  app.add_option("--stop-after", a.cfg.stop_after, "stop after this many steps of this run (checkpoint written)");
  app.add_flag("--resume", a.resume, "continue the run checkpointed in -o OUT (OUT and OUT.optim)");
  app.add_option("-t,--threads", a.threads, "threads (default: all cores)");
  app.add_flag("--json", a.json, "print one JSON object per step (step, loss, lr, grad_norm, tok_s, val_loss)");
  app.add_flag("-q,--quiet", a.quiet, "no progress bar");
}

void add_train_args(CLI::App& app, TrainArgs& a, bool distill) {
  const char* model_help = distill ? "start the student from this GGUF (instead of a new shape)"
                                   : "continue training this GGUF model (instead of a new shape)";
  app.add_option("-m,--model", a.model, model_help);
  app.add_option("--vocab-from", a.vocab_from, "new model: take the vocabulary (tokenizer) from this GGUF");
  app.add_option("--n-embd", a.shape.n_embd, "new model: embedding width");
  app.add_option("--n-layer", a.shape.n_layer, "new model: layers");
  app.add_option("--n-head", a.shape.n_head, "new model: attention heads");
  app.add_option("--n-head-kv", a.shape.n_head_kv, "new model: key/value heads (default: --n-head)");
  app.add_option("--n-ff", a.shape.n_ff, "new model: feed-forward width");
  app.add_option("--rope-base", a.shape.rope_freq_base, "new model: RoPE frequency base")->capture_default_str();
  app.add_flag("--tied", a.tied, "new model: the output projection shares token_embd");
  app.add_option("--ctx", a.n_ctx, "tokens per training sequence (new model: also its context length; default 256)");
  app.add_option("--data", a.data,
                 "training text (documents separated by blank lines); 'self' with -m: texts the model writes "
                 "itself (LLM-QAT's data-free training; --self-samples, --self-sample-len)")
      ->required();
  app.add_option("--self-samples", a.self_samples, "with --data self: texts the model writes")->capture_default_str();
  app.add_option("--self-sample-len", a.self_sample_len, "with --data self: tokens per text (default: --ctx)");
  app.add_option("--val", a.val, "held-out validation text");
  app.add_option("--steps", a.cfg.steps, "optimizer steps");
  app.add_option("--tokens", a.tokens, "train on this many tokens (sets --steps)");
  add_run_options(app, a, RunOptionsHelp{"AdamW's decoupled weight decay (matrices only)",
                                         "seed of the initial weights and the data order",
                                         "end every document with EOS (so the model learns to stop)"});
  app.add_flag("--keep-zeros", a.cfg.keep_zeros,
               "with -m: the model's matrix entries that are exactly 0 stay 0 (sparse fine-tuning after tern prune)");
  add_qat_options(app, a, /*finetune=*/false);
  app.add_option("-o,--output", a.out, "checkpoint GGUF (the optimizer state goes to OUT.optim)")->required();
}

void add_qat_options(CLI::App& app, TrainArgs& a, bool finetune) {
  app.add_option("--qat", a.qat,
                 finetune ? "quantization-aware LoRA fine-tune: the forward uses every matrix of the base with the "
                            "adapter merged in, W0 + s B A, as `tern quantize --type TYPE` would store it "
                            "(straight-through gradients to A and B), and the end writes that merged, quantized model "
                            "(the product: the adapter alone on a quantized base is not lossless); TYPE: a quantize "
                            "type or 'ternary' (BitNet absmean, stored as tq2_0)"
                          : "quantization-aware training: the forward uses each matrix as `tern quantize --type TYPE` "
                            "would store it (straight-through gradients), and the end writes that quantized file; "
                            "TYPE: a quantize type or 'ternary' (BitNet absmean, stored as tq2_0)");
  app.add_option("--qat-out", a.qat_out,
                 finetune ? "with --qat: the merged, quantized model's path (default: OUT-TYPE.gguf)"
                          : "with --qat: the quantized model's path (default: OUT-TYPE.gguf)");
  app.add_flag("--qat-lsq", a.qat_lsq,
               finetune ? "with --qat: learn each block's scale (LSQ) for the q4_0, q8_0 and ternary tensors of the "
                          "plan (every such matrix of the base, adapted or not)"
                        : "with --qat: learn each block's scale (LSQ) for the q4_0, q8_0 and ternary tensors of the plan");
  app.add_flag("--qat-fallback", a.qat_fallback,
               "with --qat: tensors whose rows do not fit TYPE's blocks train (and are stored) in the substitute "
               "`tern quantize` would use, instead of an error");
}

void check_qat_options(TrainArgs& a, const std::string& cmd, const std::vector<std::string>& inputs) {
  if ((!a.qat_out.empty() || a.qat_lsq || a.qat_fallback) && a.qat.empty())
    fail(cmd, ": --qat-out, --qat-lsq and --qat-fallback go with --qat TYPE");
  if (a.qat.empty()) return;
  a.qat_type = parse_qat_type(a.qat);
  if (a.qat_out.empty()) a.qat_out = default_qat_export_path(a.out, a.qat_type);
  check_output_path(a.qat_out);
  if (a.qat_out == a.out || a.qat_out == train::optimizer_state_path(a.out))
    fail("--qat-out ", a.qat_out, " is the checkpoint's own path: give another");
  check_output_not_input(a.qat_out, inputs);
}

std::unique_ptr<train::QatModel> make_qat_model(const train::TrainModel& latent, const TrainArgs& a,
                                                const std::string& cmd, ThreadPool* pool) {
  std::vector<std::string> notes;
  std::vector<DType> types = plan_qat_types(latent, a.qat_type, &notes);
  if (!notes.empty() && !a.qat_fallback) {
    std::string list;
    for (size_t i = 0; i < notes.size() && i < 6; ++i) list += "\n  " + notes[i];
    if (notes.size() > 6) list += str_cat("\n  ... and ", notes.size() - 6, " more");
    fail("--qat ", a.qat, ": ", notes.size(), " tensor", notes.size() == 1 ? "" : "s", " cannot take it:", list,
         "\n(pass --qat-fallback to train those in the substitute type instead)");
  }
  for (const std::string& n : notes) std::fprintf(stderr, "%s: --qat %s: %s\n", cmd.c_str(), a.qat.c_str(), n.c_str());
  return std::make_unique<train::QatModel>(latent, std::move(types), pool, a.qat_lsq);
}

TrainSetup setup_training(const CLI::App& app, TrainArgs& a, const std::string& cmd, bool no_steps_needed,
                          const std::string* extra_text) {
  TrainSetup s;
  if (a.cfg.keep_zeros && a.model.empty())
    fail(cmd, ": --keep-zeros keeps the zeros of a pruned model: give it with -m MODEL");
  const bool new_shape = app.count("--n-embd") + app.count("--n-layer") + app.count("--n-head") +
                             app.count("--n-ff") + app.count("--n-head-kv") > 0;
  if (a.resume) {
    if (!file_exists(a.out)) fail("--resume: ", a.out, " does not exist (nothing to resume)");
    if (!file_exists(train::optimizer_state_path(a.out)))
      fail("--resume: ", train::optimizer_state_path(a.out), " (the optimizer state) does not exist");
  } else if (!a.model.empty() == !a.vocab_from.empty()) {
    fail(cmd, ": give -m MODEL (continue training it) or --vocab-from GGUF with the new shape (--n-embd, "
              "--n-layer, --n-head, --n-ff)");
  }
  if (!a.model.empty() && new_shape && !a.resume)
    fail(cmd, ": -m takes the shape from the model; --n-embd / --n-layer / --n-head / --n-ff are for new models");
  if (!a.vocab_from.empty() && !a.resume && (a.shape.n_embd <= 0 || a.shape.n_layer <= 0 || a.shape.n_head <= 0 || a.shape.n_ff <= 0))
    fail(cmd, ": a new model needs --n-embd, --n-layer, --n-head and --n-ff");
  if (a.cfg.n_seq < 1) fail("--batch must be at least 1 (got ", a.cfg.n_seq, ")");
  if (a.cfg.grad_accum < 1) fail("--grad-accum must be at least 1 (got ", a.cfg.grad_accum, ")");
  if (a.n_ctx < 0 || a.n_ctx > 65536) fail("--ctx must be in 1..65536 (got ", a.n_ctx, ")");
  if (!(a.cfg.opt.lr > 0.0f) || !std::isfinite(a.cfg.opt.lr)) fail("--lr must be positive");
  if (a.cfg.opt.clip < 0.0f) fail("--clip must not be negative");
  if (!(a.cfg.opt.beta1 >= 0.0f && a.cfg.opt.beta1 < 1.0f) || !(a.cfg.opt.beta2 >= 0.0f && a.cfg.opt.beta2 < 1.0f))
    fail("--beta1 and --beta2 must be in [0, 1)");
  if (!(a.cfg.opt.eps > 0.0f)) fail("--eps must be positive");
  if (a.cfg.opt.weight_decay < 0.0f) fail("--weight-decay must not be negative");
  if (a.threads < 0) fail("--threads must be positive");
  if (app.count("--steps") && app.count("--tokens")) fail(cmd, ": give --steps or --tokens, not both");
  if (!no_steps_needed && !app.count("--steps") && !app.count("--tokens"))
    fail(cmd, ": give --steps N or --tokens N (how long to train)");
  if (a.cfg.steps < 0 || a.tokens < 0) fail("--steps / --tokens must not be negative");

  // Outputs before any slow work, and never over an input.
  check_output_path(a.out);
  check_qat_options(a, cmd, {a.model, a.vocab_from, a.data, a.val});
  check_output_path(train::optimizer_state_path(a.out));
  if (!a.resume) check_output_not_input(a.out, {a.model, a.vocab_from, a.data, a.val});

  // The model.
  if (a.resume) {
    s.vocab_file = std::make_unique<GgufFile>(GgufFile::open(a.out));
    s.model = train::load_model(*s.vocab_file);
    if (new_shape) {
      const train::ModelShape& have = s.model.shape;
      auto differs = [&](const char* flag, int64_t want, int64_t got) {
        if (app.count(flag) && want != got)
          fail("--resume: ", a.out, " has ", std::string(flag).substr(2), " ", got, ", not ", want,
               " (a checkpoint resumes with its own shape: ", have.describe(), ")");
      };
      differs("--n-embd", a.shape.n_embd, have.n_embd);
      differs("--n-layer", a.shape.n_layer, have.n_layer);
      differs("--n-head", a.shape.n_head, have.n_head);
      differs("--n-head-kv", a.shape.n_head_kv, have.n_head_kv);
      differs("--n-ff", a.shape.n_ff, have.n_ff);
    }
  } else if (!a.model.empty()) {
    s.vocab_file = std::make_unique<GgufFile>(GgufFile::open(a.model));
    s.model = train::load_model(*s.vocab_file);
  } else {
    s.vocab_file = std::make_unique<GgufFile>(GgufFile::open(a.vocab_from));
    train::ModelShape sh = a.shape;
    if (sh.n_head_kv <= 0) sh.n_head_kv = sh.n_head;
    sh.tied_output = a.tied;
    const GgufValue* toks = s.vocab_file->find("tokenizer.ggml.tokens");
    if (toks == nullptr) fail(a.vocab_from, ": no tokenizer (tokenizer.ggml.tokens) to take the vocabulary from");
    sh.n_vocab = int64_t(toks->as_array("tokenizer.ggml.tokens").items.size());
    sh.n_ctx_train = a.n_ctx > 0 ? a.n_ctx : 256;
    sh.validate("the new model's shape");
    s.model = train::init_model(sh, a.cfg.seed);
  }
  if (a.relufy) {
    if (a.model.empty() && !a.resume) fail(cmd, ": --relufy changes a trained model's FFN: give it with -m MODEL");
    s.model.shape.ffn_relu = true;
  }
  s.tokenizer = Tokenizer::from_gguf(*s.vocab_file);
  if (s.tokenizer->n_vocab() != s.model.shape.n_vocab)
    fail(s.vocab_file->path(), ": the tokenizer has ", s.tokenizer->n_vocab(), " tokens but the model's vocabulary is ",
         s.model.shape.n_vocab);
  if (a.n_ctx == 0) a.n_ctx = std::min<int64_t>(256, s.model.shape.n_ctx_train > 0 ? s.model.shape.n_ctx_train : 256);
  a.cfg.n_ctx = a.n_ctx;

  // The data: a file, or (--data self) texts the starting model writes by pure sampling from BOS,
  // a function of --seed, so a resumed run regenerates the same ones.
  if (a.data == "self") {
    if (a.model.empty())
      fail(cmd, ": --data self samples the model given with -m (with --resume too: the original model)");
    if (a.self_samples < 1) fail("--self-samples must be at least 1 (got ", a.self_samples, ")");
    if (a.self_sample_len < 0) fail("--self-sample-len must not be negative");
    SampleOptions so;
    so.n_samples = a.self_samples;
    so.sample_len = a.self_sample_len > 0 ? a.self_sample_len : a.n_ctx;
    so.seed = a.cfg.seed;
    so.threads = a.threads;
    so.progress = !a.quiet && !a.json;
    int64_t n_tokens = 0;
    const std::string text = sample_documents(a.model, nullptr, so, "self samples", &n_tokens);
    std::fprintf(stderr, "%s: --data self: %lld texts of %s, %lld tokens\n", cmd.c_str(),
                 static_cast<long long>(so.n_samples), a.model.c_str(), static_cast<long long>(n_tokens));
    s.data = train::tokenize_text(text, *s.tokenizer, a.add_eos);
  } else {
    s.data = train::tokenize_file(a.data, *s.tokenizer, a.add_eos, "--data");
  }
  if (extra_text != nullptr) {
    const train::TokenStream extra = train::tokenize_text(*extra_text, *s.tokenizer, a.add_eos);
    s.data.tokens.insert(s.data.tokens.end(), extra.tokens.begin(), extra.tokens.end());
    s.data.n_documents += extra.n_documents;
  }
  s.data_sampler = std::make_unique<train::WindowSampler>(&s.data.tokens, a.n_ctx, !a.no_shuffle, a.cfg.seed,
                                                          "--data " + a.data);
  if (!a.val.empty()) {
    s.val = train::tokenize_file(a.val, *s.tokenizer, a.add_eos, "--val");
    s.val_sampler = std::make_unique<train::WindowSampler>(&s.val.tokens, a.n_ctx, false, 0, "--val " + a.val);
  }

  // The schedule.
  const int64_t tokens_per_step = a.cfg.grad_accum * a.cfg.n_seq * a.n_ctx;
  if (a.tokens > 0) a.cfg.steps = (a.tokens + tokens_per_step - 1) / tokens_per_step;
  a.cfg.shuffle = !a.no_shuffle;
  a.cfg.opt.min_lr = a.min_lr >= 0.0f ? a.min_lr : a.cfg.opt.lr / 10.0f;
  a.cfg.opt.warmup = a.warmup >= 0 ? a.warmup : std::min<int64_t>(1000, a.cfg.steps / 20);
  if (a.cfg.val_every == 0 && !app.count("--val-every")) a.cfg.val_every = std::max<int64_t>(1, a.cfg.steps / 10);
  a.cfg.out_path = a.out;

  s.pool = std::make_unique<ThreadPool>(a.threads > 0 ? a.threads : default_thread_count());
  s.trainer = std::make_unique<train::Trainer>(s.model, *s.vocab_file, a.cfg, s.pool.get());
  if (!a.qat.empty()) {
    s.qat = make_qat_model(s.model, a, cmd, s.pool.get());
    s.trainer->set_qat(s.qat.get());
  }
  if (a.resume) {
    const GgufFile st = GgufFile::open(train::optimizer_state_path(a.out));
    s.trainer->resume(st, int64_t(s.vocab_file->get_uint("tern.train.step", 0)));
    if (s.trainer->step() >= a.cfg.steps)
      fail("--resume: ", a.out, " is already at step ", s.trainer->step(), " of --steps ", a.cfg.steps,
           " (give a larger --steps to train on)");
  }
  return s;
}

int run_training(TrainSetup& s, const TrainArgs& a, const std::string& cmd) {
  const train::ModelShape& sh = s.model.shape;
  if (!s.trainer->lora())  // tern finetune prints its adapter's line
    std::fprintf(stderr, "%s: %s, %lld parameters (%.2f MB f32)\n", cmd.c_str(), sh.describe().c_str(),
                 static_cast<long long>(s.model.n_params()), double(s.model.n_params()) * 4.0 / 1e6);
  std::fprintf(stderr, "%s: data %s: %lld documents, %lld tokens, %lld windows of %lld; ", cmd.c_str(), a.data.c_str(),
               static_cast<long long>(s.data.n_documents), static_cast<long long>(s.data.tokens.size()),
               static_cast<long long>(s.data_sampler->n_windows()), static_cast<long long>(a.cfg.n_ctx));
  std::fprintf(stderr, "%lld steps of %lld x %lld x %lld tokens, %d threads\n", static_cast<long long>(a.cfg.steps),
               static_cast<long long>(a.cfg.grad_accum), static_cast<long long>(a.cfg.n_seq),
               static_cast<long long>(a.cfg.n_ctx), s.pool->size());
  if (a.cfg.keep_zeros)
    std::fprintf(stderr, "%s: --keep-zeros: %lld matrix entries (%.1f%% of the parameters) stay 0\n", cmd.c_str(),
                 static_cast<long long>(s.trainer->n_frozen()),
                 100.0 * double(s.trainer->n_frozen()) / double(std::max<int64_t>(1, s.model.n_params())));
  if (s.qat)
    std::fprintf(stderr, "%s: --qat %s: %s; %lld weights quantized, %.2f%% of them clipped at the start\n",
                 cmd.c_str(), a.qat.c_str(), s.qat->describe().c_str(), static_cast<long long>(s.qat->n_quantized()),
                 100.0 * double(s.qat->n_clipped()) / double(std::max<int64_t>(1, s.qat->n_quantized())));
  if (a.resume)
    std::fprintf(stderr, "%s: resuming %s at step %lld\n", cmd.c_str(), a.out.c_str(),
                 static_cast<long long>(s.trainer->step()));

  g_stop.store(false);
  auto old_handler = std::signal(SIGINT, on_sigint);
  Progress progress(cmd, a.cfg.steps, !a.quiet && !a.json);
  std::optional<double> last_val;
  const double flops_per_step = s.trainer->forward_backward().flops_per_batch() * double(a.cfg.grad_accum);
  auto on_step = [&](const train::StepLog& l) {
    if (l.val_loss) last_val = l.val_loss;
    if (a.json) {
      nlohmann::json j{{"step", l.step}, {"loss", l.loss}, {"lr", l.lr}, {"grad_norm", l.grad_norm},
                       {"tok_s", l.tok_s}, {"gflop_s", flops_per_step / (double(a.cfg.grad_accum * a.cfg.n_seq * a.cfg.n_ctx) / l.tok_s) / 1e9},
                       {"elapsed_s", l.elapsed_s}};
      if (l.val_loss) j["val_loss"] = *l.val_loss;
      if (l.checkpointed) j["checkpoint"] = a.out;
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
    char note[160];
    std::snprintf(note, sizeof note, "loss %.4f%s tok/s %.0f", l.loss,
                  last_val ? (" val " + std::to_string(*last_val).substr(0, 6)).c_str() : "", l.tok_s);
    progress.update(l.step, note);
  };
  train::TrainResult r;
  try {
    r = s.trainer->run(*s.data_sampler, s.val_sampler.get(), on_step, &g_stop);
  } catch (...) {
    progress.finish();
    std::signal(SIGINT, old_handler);
    throw;
  }
  progress.finish();
  std::signal(SIGINT, old_handler);

  const double tok_s = r.train_seconds > 0 ? r.tokens / r.train_seconds : 0.0;
  // --qat: the quantized model, once the run is complete (an interrupted run resumes from the
  // latent checkpoint and exports at its end).
  std::optional<QuantizeReport> exported;
  // QAT of an adapter exports the merged model, with the base file's metadata and tensor order.
  if (s.qat && !r.interrupted)
    exported = export_qat_model(s.trainer->qat_latent(), *s.qat, s.qat_source.empty() ? a.out : s.qat_source,
                                a.qat_out, a.qat_type, *s.pool);
  if (a.json) {
    nlohmann::json j{{"final", true}, {"steps", r.last_step}, {"steps_this_run", r.last_step - r.first_step},
                     {"tokens", r.tokens}, {"seconds", r.seconds}, {"tok_s", tok_s}, {"output", a.out},
                     {"n_params", s.trainer->n_trainable()}, {"peak_rss_bytes", peak_rss_bytes()},
                     {"interrupted", r.interrupted}};
    if (r.final_val_loss) {
      j["val_loss"] = *r.final_val_loss;
      j["val_ppl"] = std::exp(*r.final_val_loss);
    }
    if (exported) {
      j["qat_output"] = a.qat_out;
      j["qat_type"] = a.qat;
      j["qat_bytes"] = exported->bytes;
      j["qat_clipped"] = s.qat->n_clipped();
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("steps       %lld (this run %lld)\n", static_cast<long long>(r.last_step),
                static_cast<long long>(r.last_step - r.first_step));
    std::printf("tokens      %.0f in %.1f s (%.0f tok/s while training)\n", r.tokens, r.seconds, tok_s);
    if (r.final_val_loss)
      std::printf("val loss    %.4f (ppl %.4f)\n", *r.final_val_loss, std::exp(*r.final_val_loss));
    std::printf("peak RSS    %.1f MiB\n", double(peak_rss_bytes()) / 1048576.0);
    std::printf("%s  %s (+ %s)\n", s.trainer->lora() ? "adapter   " : "checkpoint", a.out.c_str(),
                train::optimizer_state_path(a.out).c_str());
    if (exported)
      std::printf("quantized   %s (%s%s, %.2f MB of tensors; %.2f%% of the quantized weights clipped at the end)\n",
                  a.qat_out.c_str(), s.trainer->lora() ? "the base with the adapter merged in: " : "",
                  s.qat->describe().c_str(), double(exported->bytes) / 1e6,
                  100.0 * double(s.qat->n_clipped()) / double(std::max<int64_t>(1, s.qat->n_quantized())));
  }
  if (r.interrupted) {
    std::fprintf(stderr, "%s: interrupted after step %lld; checkpoint written to %s (continue with --resume)\n",
                 cmd.c_str(), static_cast<long long>(r.last_step), a.out.c_str());
    return 130;
  }
  return 0;
}

void add_qat_dump_tensors(GgufWriter& w, const train::QatModel& qat) {
  const train::TrainModel& fm = qat.quantized();
  for (size_t i = 0; i < fm.params.size(); ++i) {
    if (qat.types()[i] == DType::F32) continue;
    const auto& p = fm.params[i];
    w.add_tensor(p.name + ".qat_weight", DType::F32, p.ne, fm.data.data() + p.offset, uint64_t(p.size) * 4);
    if (const int64_t so = qat.scale_offset(i); so >= 0) {
      const int64_t n_blocks = qat.scale_count(i);
      w.add_tensor(p.name + ".qat_scale", DType::F32, {n_blocks}, qat.scales().data() + so, uint64_t(n_blocks) * 4);
      w.add_tensor(p.name + ".qat_scale_grad", DType::F32, {n_blocks}, qat.scale_grads().data() + so,
                   uint64_t(n_blocks) * 4);
    }
  }
}

}  // namespace tern
