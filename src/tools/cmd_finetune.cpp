// tern finetune --lora: trains a LoRA adapter on a frozen Llama-architecture base (any GGUF
// type tern reads; f16, bf16 and quantized matrices stay in their encoding and are dequantized a
// tile at a time: QLoRA), from plain text or JSONL prompt/completion examples,
// and writes it in llama.cpp's adapter format (models/lora.h). docs/lora.md has the options,
// the data formats and the figures.
// With --qat TYPE (train/qat_lora.h) the forward runs the base with the adapter merged in,
// quantized as `tern quantize --type TYPE` stores it, and the end also writes that merged,
// quantized model (docs/training.md).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/read_file.h"
#include "core/output_file.h"
#include "gguf/gguf.h"
#include "models/lora.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/finetune_chat.h"
#include "tools/train_args.h"
#include "train/lora.h"
#include "train/lora_data.h"
#include "train/rng.h"
#include "train/trainer.h"

namespace tern {
namespace {

const char* format_name(train::DataFormat f) { return f == train::DataFormat::Jsonl ? "JSONL prompt/completion" : "text"; }

}  // namespace

int cmd_finetune(int argc, char** argv) {
  CLI::App app{"Fine-tune a LoRA adapter on a frozen llama-architecture base model (llama.cpp's adapter GGUF)"};
  TrainArgs a;
  a.cfg.opt.lr = 1e-3f;
  a.cfg.opt.weight_decay = 0.0f;
  a.cfg.opt.beta2 = 0.999f;
  bool lora_flag = false;
  int64_t rank = 8;
  float alpha = 16.0f, dropout = 0.0f;
  std::string targets = "q,k,v,o";
  app.add_flag("--lora", lora_flag, "train a LoRA adapter (the only kind of fine-tuning tern finetune does)");
  app.add_option("-m,--model", a.model,
                 "the base model GGUF (llama architecture; f32, f16, bf16 or quantized: f16/bf16/quantized "
                 "matrices stay in the file's encoding, dequantized a tile at a time (QLoRA))")
      ->required();
  bool base_f32 = false;
  app.add_flag("--base-f32", base_f32,
               "dequantize the whole base to f32 at load instead (the same results; more memory, for comparison)");
  app.add_option("--data", a.data,
                 "training data: text (documents separated by blank lines) or JSONL lines "
                 "{\"prompt\": ..., \"completion\": ...} (loss on the completion only) or {\"messages\": [...]} "
                 "(the model's chat template; loss on the last, assistant message)")
      ->required();
  app.add_option("--val", a.val, "held-out validation data (either format)");
  app.add_option("-o,--output", a.out, "the adapter GGUF (the optimizer state goes to OUT.optim)")->required();
  app.add_option("--rank", rank, "LoRA rank r")->capture_default_str();
  app.add_option("--alpha", alpha, "LoRA alpha (the update is scaled by alpha / rank)")->capture_default_str();
  app.add_option("--targets", targets,
                 "adapted linears, comma-separated: q, k, v, o, gate, up, down, output (untied output only)")
      ->capture_default_str();
  app.add_option("--dropout", dropout, "dropout on the adapters' input while training (0: off)")->capture_default_str();
  app.add_option("--steps", a.cfg.steps, "optimizer steps (required)");
  app.add_option("--ctx", a.n_ctx, "tokens per training sequence (default: 256, at most the base's context)");
  add_run_options(app, a, RunOptionsHelp{"AdamW's decoupled weight decay on A and B",
                                         "seed of A's initialisation, the data order and the dropout",
                                         "end every document / example with EOS (so the model learns to stop)"});
  std::string chat_template;
  app.add_option("--chat-template", chat_template,
                 "for {\"messages\"} data: a built-in template (chatml, llama2, llama3, mistral, phi3, zephyr, "
                 "gemma) or a Jinja file (default: the model's, as tern serve picks it)");
  add_qat_options(app, a, /*finetune=*/true);
  std::string dump_grads;
  app.add_option("--dump-grads", dump_grads,
                 "write the adapter's gradients on the first micro-batch (at the new adapter, or at -o OUT's with "
                 "--resume) to this GGUF and exit (the adapter's tensor names, plus train.loss and the "
                 "micro-batch's window entries as train.windows; with --qat also NAME.qat_weight, the forward's "
                 "weights of each quantized matrix, NAME.qat_merged, W0 + s B A of each adapted one, and with "
                 "--qat-lsq NAME.qat_scale / .qat_scale_grad)");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;

  // Options first: clear errors before any slow work.
  const std::string cmd = "tern finetune";
  if (!lora_flag) fail(cmd, ": give --lora (tern finetune trains LoRA adapters; full training is `tern train -m`)");
  if (rank < 1) fail("--rank must be at least 1 (got ", rank, ")");
  if (!std::isfinite(alpha)) fail("--alpha must be a finite number (got ", alpha, ")");
  if (!(dropout >= 0.0f && dropout < 1.0f)) fail("--dropout must be in [0, 1) (got ", dropout, ")");
  const std::vector<train::LoraKind> kinds = train::parse_lora_targets(targets);
  if (!app.count("--steps") && dump_grads.empty()) fail(cmd, ": give --steps N (how long to train)");
  if (a.cfg.steps < 0) fail("--steps must not be negative (got ", a.cfg.steps, ")");
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
  check_output_path(a.out);
  check_output_path(train::optimizer_state_path(a.out));
  check_output_not_input(a.out, {a.model, a.data, a.val});
  check_output_not_input(train::optimizer_state_path(a.out), {a.model, a.data, a.val});
  check_qat_options(a, cmd, {a.model, a.data, a.val});
  const bool qat = !a.qat.empty();
  if (qat && dropout > 0.0f)
    fail(cmd, ": --qat merges the adapter into the weights, where dropout on its input has no place (give --dropout 0)");
  if (a.resume) {
    if (!path_exists(a.out)) fail("--resume: ", a.out, " does not exist (nothing to resume)");
    if (!path_exists(train::optimizer_state_path(a.out)))
      fail("--resume: ", train::optimizer_state_path(a.out), " (the optimizer state) does not exist");
  }

  // The base.
  TrainSetup s;
  s.vocab_file = std::make_unique<GgufFile>(GgufFile::open(a.model));
  const std::string arch = s.vocab_file->get_string("general.architecture", "");
  if (arch != "llama" && arch != "deci")
    fail(cmd, ": ", a.model, " is a \"", arch.empty() ? "(none)" : arch,
         "\" model; the training engine trains the llama architecture only (and deci, llama with per-layer shapes)");
  // The file (s.vocab_file) outlives the model, whose encoded matrices point into its mapping.
  // --qat merges the adapter into W0, so W0 is f32 in memory: a quantized base's decoded values
  // (the forward then uses Q(W0 + s B A), which the export stores exactly).
  s.model = base_f32 || qat ? train::load_model(*s.vocab_file) : train::load_frozen_base(*s.vocab_file);
  s.tokenizer = Tokenizer::from_gguf(*s.vocab_file);
  if (s.tokenizer->n_vocab() != s.model.shape.n_vocab)
    fail(a.model, ": the tokenizer has ", s.tokenizer->n_vocab(), " tokens but the model's vocabulary is ",
         s.model.shape.n_vocab);
  if (a.n_ctx == 0) a.n_ctx = std::min<int64_t>(256, s.model.shape.n_ctx_train > 0 ? s.model.shape.n_ctx_train : 256);
  a.cfg.n_ctx = a.n_ctx;
  train::LoraWeights lora = train::make_lora(s.model.shape, kinds, rank, alpha, dropout);

  // The data ({"messages"} lines through the model's chat template, as tern serve renders them).
  std::string template_note;
  const train::MessagesRenderer chat = make_chat_renderer(*s.vocab_file, *s.tokenizer, chat_template, &template_note);
  train::DataFormat fmt{}, val_fmt{};
  train::ExampleStats st, val_st;
  s.data = train::read_finetune_data(a.data, *s.tokenizer, a.n_ctx, a.add_eos, "--data", &chat, &fmt, &st);
  s.data_sampler = std::make_unique<train::WindowSampler>(&s.data.tokens, a.n_ctx, !a.no_shuffle, a.cfg.seed,
                                                          "--data " + a.data);
  if (!a.val.empty()) {
    s.val = train::read_finetune_data(a.val, *s.tokenizer, a.n_ctx, a.add_eos, "--val", &chat, &val_fmt, &val_st);
    s.val_sampler = std::make_unique<train::WindowSampler>(&s.val.tokens, a.n_ctx, false, 0, "--val " + a.val);
  }

  // The schedule.
  a.cfg.shuffle = !a.no_shuffle;
  a.cfg.opt.min_lr = a.min_lr >= 0.0f ? a.min_lr : a.cfg.opt.lr / 10.0f;
  a.cfg.opt.warmup = a.warmup >= 0 ? a.warmup : std::min<int64_t>(1000, a.cfg.steps / 20);
  if (a.cfg.val_every == 0 && !app.count("--val-every")) a.cfg.val_every = std::max<int64_t>(1, a.cfg.steps / 10);
  a.cfg.out_path = a.out;

  // The adapter: new, or the checkpoint's.
  const std::string base_name = std::filesystem::path(a.model).filename().string();
  int64_t resume_step = 0;
  if (a.resume) {
    const auto ad = LoraAdapter::load(a.out);
    if (ad->architecture() != arch) fail("--resume: ", a.out, " is an adapter for \"", ad->architecture(), "\"");
    const GgufFile f = GgufFile::open(a.out);
    const std::string was_targets = f.get_string("tern.lora.targets", "");
    if (was_targets != train::lora_targets_string(kinds))
      fail("--resume: ", a.out, " was trained with --targets ", was_targets.empty() ? "(unknown)" : was_targets,
           ", not ", train::lora_targets_string(kinds), " (give the same)");
    const float was_dropout = float(f.get_float("tern.lora.dropout", -1.0));
    if (was_dropout != dropout)
      fail("--resume: ", a.out, " was trained with --dropout ", was_dropout, ", not ", dropout, " (give the same)");
    train::load_lora_weights(lora, *ad);
    resume_step = int64_t(f.get_uint("tern.train.step", 0));
  } else {
    train::init_lora(lora, a.cfg.seed);
  }
  std::vector<std::pair<std::string, GgufValue>> keys = {
      {"general.name", GgufValue::string("tern-finetune")},
      {"tern.lora.base", GgufValue::string(base_name)},
      {"tern.lora.targets", GgufValue::string(train::lora_targets_string(kinds))},
      {"tern.lora.dropout", GgufValue::f32(dropout)},
  };
  s.pool = std::make_unique<ThreadPool>(a.threads > 0 ? a.threads : default_thread_count());
  s.trainer = std::make_unique<train::Trainer>(s.model, lora, *s.vocab_file, a.cfg, s.pool.get(), keys);
  if (qat) {
    s.merge = std::make_unique<train::LoraMerge>(s.model, lora, s.pool.get());
    s.qat = make_qat_model(s.merge->merged(), a, cmd, s.pool.get());
    s.trainer->set_qat(s.qat.get(), s.merge.get());
    s.qat_source = a.model;
  }
  if (a.resume) {
    const GgufFile optim = GgufFile::open(train::optimizer_state_path(a.out));
    s.trainer->resume(optim, resume_step);
    if (s.trainer->step() >= a.cfg.steps && dump_grads.empty())
      fail("--resume: ", a.out, " is already at step ", s.trainer->step(), " of --steps ", a.cfg.steps,
           " (give a larger --steps to train on)");
  }

  if (!dump_grads.empty()) {
    check_output_not_input(dump_grads, {a.model, a.data, a.out});
    std::vector<float> g(size_t(lora.n_params()), 0.0f);
    std::vector<int32_t> batch(size_t(a.cfg.n_seq * (a.cfg.n_ctx + 1)));
    s.data_sampler->batch(0, a.cfg.n_seq, batch.data());
    // As the trainer's first micro-batch (dropout seed included).
    const float loss = float(s.trainer->gradient(batch.data(), train::mix_seed(a.cfg.seed, 7, 0), g.data()));
    GgufWriter w(3);
    w.set("general.architecture", GgufValue::string("tern-gradients"));
    for (const auto& p : lora.params) w.add_tensor(p.name, DType::F32, p.ne, g.data() + p.offset, uint64_t(p.size) * 4);
    if (qat) {
      add_qat_dump_tensors(w, *s.qat);
      const train::TrainModel& merged = s.merge->merged();
      for (const train::LoraSlot& sl : lora.slots) {
        const train::ParamInfo* p = merged.find(sl.target);
        w.add_tensor(sl.target + ".qat_merged", DType::F32, p->ne, merged.data.data() + p->offset, uint64_t(p->size) * 4);
      }
    }
    w.add_tensor("train.loss", DType::F32, {1}, &loss, 4);
    // The micro-batch's window entries (exact as f32: |entry| < 2^24), for an oracle to replay.
    std::vector<float> windows(batch.begin(), batch.end());
    w.add_tensor("train.windows", DType::F32, {a.cfg.n_ctx + 1, a.cfg.n_seq}, windows.data(), windows.size() * 4);
    w.write(dump_grads);
    std::fprintf(stderr, "%s: loss %.6f; gradients of %lld adapter parameters written to %s\n", cmd.c_str(),
                 double(loss), static_cast<long long>(lora.n_params()), dump_grads.c_str());
    return 0;
  }
  std::fprintf(stderr, "%s: LoRA rank %lld, alpha %g (scale %g), targets %s, dropout %g: %zu adapted linears, %lld "
               "trainable parameters (base %s frozen: %lld parameters)\n",
               cmd.c_str(), static_cast<long long>(rank), double(alpha), double(lora.scale()),
               train::lora_targets_string(kinds).c_str(), double(dropout), lora.slots.size(),
               static_cast<long long>(lora.n_params()), base_name.c_str(), static_cast<long long>(s.model.n_elements()));
  if (qat) {
    // A quantized base's W0 is its decoded values; Q(W0) re-quantizes them, which need not give
    // the file's own bytes back (q4_0 picks its scale from the block's largest magnitude).
    bool encoded = false;
    for (const GgufTensorInfo& t : s.vocab_file->tensors()) encoded |= t.type != DType::F32;
    std::fprintf(stderr, "%s: --qat %s: the forward runs Q(W0 + s B A) of the adapted matrices and Q(W0) of the rest%s\n",
                 cmd.c_str(), a.qat.c_str(),
                 encoded ? "; W0 = the base's decoded values (f16/bf16/quantized), re-quantized to the plan's types"
                         : "");
  }
  std::fprintf(stderr, "%s: base: %s%s\n", cmd.c_str(), train::describe_base_memory(s.model).c_str(),
               base_f32 ? " (--base-f32)" : "");
  for (int which = 0; which < 2; ++which) {
    const train::DataFormat f = which == 0 ? fmt : val_fmt;
    const train::ExampleStats& e = which == 0 ? st : val_st;
    if (f != train::DataFormat::Jsonl || (which == 1 && a.val.empty())) continue;
    if (which == 0 || fmt != train::DataFormat::Jsonl) std::fprintf(stderr, "%s: %s\n", cmd.c_str(), template_note.c_str());
    std::fprintf(stderr, "%s: %s %s: %s, %lld examples in %lld windows of %lld, %lld completion tokens scored; "
                 "%lld truncated, %lld dropped (prompt fills --ctx)\n",
                 cmd.c_str(), which == 0 ? "--data" : "--val", (which == 0 ? a.data : a.val).c_str(), format_name(f),
                 static_cast<long long>(e.n_examples), static_cast<long long>(e.n_blocks),
                 static_cast<long long>(a.n_ctx), static_cast<long long>(e.n_scored),
                 static_cast<long long>(e.n_truncated), static_cast<long long>(e.n_dropped));
  }
  if (s.val_sampler && !a.resume) {
    const double v = s.trainer->validate(*s.val_sampler);
    std::fprintf(stderr, "%s: validation loss of the base%s %.4f (ppl %.4f)\n", cmd.c_str(),
                 qat ? str_cat(" quantized to ", a.qat).c_str() : "", v, std::exp(v));
    if (a.json) {
      const nlohmann::json j{{"start", true}, {"val_loss", v}, {"val_ppl", std::exp(v)}};
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  }
  return run_training(s, a, cmd);
}

}  // namespace tern
