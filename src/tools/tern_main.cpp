#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/error.h"
#include "dist/comm.h"
#include "dist/parallel_model.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace tern {

const std::vector<Command>& commands() {
  static const std::vector<Command> kCommands = {
      {"run", "generate text from a prompt and report TTFT/TBT/throughput/memory", cmd_run},
      {"chat", "chat with a model in the terminal through its chat template (/save, /load)", cmd_chat},
      {"tokenize", "print the token ids of a text", cmd_tokenize},
      {"compress-prompt", "shorten a prompt by a scorer model's token information (Selective Context, LLMLingua)",
       cmd_compress_prompt},
      {"sot", "Skeleton-of-Thought: a skeleton of the answer, then every point expanded at once", cmd_sot},
      {"vocab", "write a vocabulary-only GGUF from a Hugging Face tokenizer.json", cmd_vocab},
      {"inspect", "print a GGUF file's metadata, hyper-parameters and tensors", cmd_inspect},
      {"convert", "convert a llama2.c checkpoint + tokenizer to GGUF", cmd_convert},
      {"ppl", "perplexity of a text, computed as llama.cpp's llama-perplexity does", cmd_ppl},
      {"logits", "print or save the logits of every position of a prompt", cmd_logits},
      {"embed", "embeddings of texts: pooled, normalised final hidden states (batched)", cmd_embed},
      {"synth", "write a random-weight model with a real architecture shape", cmd_synth},
      {"bench", "prompt-processing and generation throughput with the decode roofline", cmd_bench},
      {"quantize", "requantize a GGUF model (f16, q8_0, q4_0, q4_k, ...) as llama-quantize does", cmd_quantize},
      {"prune", "prune a model's linear layers: magnitude, Wanda, SparseGPT; unstructured, N:M or OWL", cmd_prune},
      {"sparsify", "activation sparsity: ReLU-fy a SwiGLU model with a recovery fine-tune, or measure FFN sparsity",
       cmd_sparsify},
      {"predictor", "train a low-rank predictor of a ReLU-fied model's active FFN neurons (Deja Vu)", cmd_predictor},
      {"lowrank", "low-rank (truncated SVD / activation-aware SVD) factorization of the linear layers", cmd_lowrank},
      {"compare", "quantize with each compression method and tabulate memory, speed and perplexity", cmd_compare},
      {"serve", "serve a model over the OpenAI API, with metrics and a chat page", cmd_serve},
      {"list", "list the models in a directory: size, type, architecture, context, or why one is unusable", cmd_list},
      {"ps", "show the models a running tern serve has loaded and when each is unloaded", cmd_ps},
      {"train", "train a model on text: a new shape or continue a GGUF (checkpoints, resume)", cmd_train},
      {"finetune", "fine-tune a LoRA adapter on a frozen (or quantized) base: text, prompt/completion or chat JSONL", cmd_finetune},
      {"eval", "base-model replacement: retrain a suite's LoRA adapters on a candidate base, three-way gate", cmd_eval},
      {"lora", "LoRA adapters: merge them into a base model (tern lora merge)", cmd_lora},
      {"distill", "knowledge distillation from a teacher GGUF (token-level KL, sequence-level samples)", cmd_distill},
      {"bench-serve", "serving benchmark: concurrent requests through the batching engine", cmd_bench_serve},
      {"batch", "completions for a file of prompts; data-parallel over the ranks under mpirun", cmd_batch},
  };
  return kCommands;
}

namespace {


void print_usage(FILE* out) {
  std::fprintf(out,
               "tern - LLM inference on CPUs\n\n"
               "usage: tern COMMAND [options]     (tern COMMAND --help, or tern help COMMAND, for its options)\n"
               "       tern --version | -v        print the version\n\n"
               "commands:\n");
  for (const auto& c : commands()) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out,
               "\nenvironment:\n"
               "  TERN_FORCE_ISA=VARIANT           force a kernel variant (default: the best the CPU has):\n"
               "                                   ref, avx2, avx512 on x86-64; ref, neon, dotprod, i8mm on ARM64\n"
               "  TERN_MEMORY_LIMIT=SIZE           use at most SIZE of memory for weights and KV cache\n"
               "                                   (MiB, or 512M, 8G; default: what the machine has available)\n");
}

const Command* find_command(const std::string& name) {
  for (const auto& c : commands())
    if (name == c.name) return &c;
  return nullptr;
}

int run_command(const Command& c, int argc, char** argv) {
  std::string prog = std::string("tern ") + c.name;
  std::vector<char*> args(argv, argv + argc);
  args[0] = prog.data();
  try {
    return c.main(static_cast<int>(args.size()), args.data());
  } catch (const CLI::CallForHelp& e) {
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "tern %s: %s\n", c.name, e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "tern %s: error: %s\n", c.name, e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "tern %s: error: out of memory\n", c.name);
    return 1;
  }
}

}  // namespace

int tern_command(int argc, char** argv);

int tern_main(int argc, char** argv) {
  // Under mpirun every rank starts here: rank 0 runs the command, the others serve its parallel
  // model (dist/parallel_model.h) until it is done.
  register_batch_job();
  dist::init(&argc, &argv);
  if (dist::world().rank() != 0) {
    const int rc = dist::worker_main();
    dist::finalize();
    return rc;
  }
  const int rc = tern_command(argc, argv);
  dist::release_workers();
  dist::finalize();
  return rc;
}

int tern_command(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "help" && argc >= 3) {
    // `tern help CMD` is `tern CMD --help`.
    const Command* c = find_command(argv[2]);
    if (!c) {
      std::fprintf(stderr, "tern help: unknown command '%s'\n\n", argv[2]);
      print_usage(stderr);
      return 2;
    }
    char help_flag[] = "--help";
    char* help_argv[] = {argv[2], help_flag};
    return run_command(*c, 2, help_argv);
  }
  if (name == "--help" || name == "-h" || name == "help") {
    print_usage(stdout);
    return 0;
  }
  if (name == "--version" || name == "-v") {
    std::printf("%s\n", kVersion);
    return 0;
  }
  if (const Command* c = find_command(name)) return run_command(*c, argc - 1, argv + 1);
  std::fprintf(stderr, "tern: unknown command '%s'\n\n", name.c_str());
  print_usage(stderr);
  return 2;
}

}  // namespace tern
