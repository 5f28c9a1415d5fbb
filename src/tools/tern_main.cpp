#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/error.h"
#include "tools/commands.h"

namespace tern {

const std::vector<Command>& commands() {
  static const std::vector<Command> kCommands = {
      {"run", "generate text from a prompt and report TTFT/TBT/throughput/memory", cmd_run},
      {"tokenize", "print the token ids of a text", cmd_tokenize},
      {"inspect", "print a GGUF file's metadata, hyper-parameters and tensors", cmd_inspect},
      {"convert", "convert a llama2.c checkpoint + tokenizer to GGUF", cmd_convert},
      {"ppl", "perplexity of a text, computed as llama.cpp's llama-perplexity does", cmd_ppl},
      {"logits", "print or save the logits of every position of a prompt", cmd_logits},
      {"synth", "write a random-weight model with a real architecture shape", cmd_synth},
      {"bench", "prompt-processing and generation throughput with the decode roofline", cmd_bench},
      {"quantize", "requantize a GGUF model (f16, q8_0, q4_0, q4_k, ...) as llama-quantize does", cmd_quantize},
      {"compare", "quantize with each compression method and tabulate memory, speed and perplexity", cmd_compare},
      {"serve", "serve a model over the OpenAI API, with metrics and a chat page", cmd_serve},
      {"bench-serve", "serving benchmark: concurrent requests through the batching engine", cmd_bench_serve},
  };
  return kCommands;
}

namespace {

void print_usage(FILE* out) {
  std::fprintf(out,
               "tern - LLM inference on CPUs\n\n"
               "usage: tern COMMAND [options]     (tern COMMAND --help for its options)\n\n"
               "commands:\n");
  for (const auto& c : commands()) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out,
               "\nenvironment:\n"
               "  TERN_FORCE_ISA=ref|avx2|avx512   force a kernel variant (default: best the CPU has)\n");
}

}  // namespace

int tern_main(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    print_usage(stdout);
    return 0;
  }
  if (name == "--version") {
    std::printf("tern 0.1.0\n");
    return 0;
  }
  for (const auto& c : commands()) {
    if (name != c.name) continue;
    std::string prog = std::string("tern ") + c.name;
    std::vector<char*> args(argv + 1, argv + argc);
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
  std::fprintf(stderr, "tern: unknown command '%s'\n\n", name.c_str());
  print_usage(stderr);
  return 2;
}

}  // namespace tern
