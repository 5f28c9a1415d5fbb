#pragma once
// Sub-commands of the `tern` tool. Each parses its own arguments (CLI11), prints its report,
// and returns the process exit code; errors are thrown as tern::Error and printed by main().
#include <string>
#include <vector>

namespace tern {

struct Command {
  const char* name;
  const char* summary;
  int (*main)(int argc, char** argv);  // argv[0] is "tern NAME"
};

// All sub-commands, in the order `tern --help` lists them.
const std::vector<Command>& commands();

int cmd_run(int argc, char** argv);
int cmd_chat(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_compress_prompt(int argc, char** argv);
int cmd_sot(int argc, char** argv);
int cmd_sparsify(int argc, char** argv);
int cmd_predictor(int argc, char** argv);
int cmd_vocab(int argc, char** argv);
int cmd_inspect(int argc, char** argv);
int cmd_convert(int argc, char** argv);
int cmd_ppl(int argc, char** argv);
int cmd_logits(int argc, char** argv);
int cmd_embed(int argc, char** argv);
int cmd_synth(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_quantize(int argc, char** argv);
int cmd_compare(int argc, char** argv);
int cmd_prune(int argc, char** argv);
int cmd_lowrank(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_list(int argc, char** argv);
int cmd_ps(int argc, char** argv);
int cmd_bench_serve(int argc, char** argv);
int cmd_batch(int argc, char** argv);
// Registers tern batch's data-parallel job (dist/jobs.h) before the ranks start serving.
void register_batch_job();
int cmd_train(int argc, char** argv);
int cmd_finetune(int argc, char** argv);
int cmd_eval(int argc, char** argv);
int cmd_distill(int argc, char** argv);
int cmd_lora(int argc, char** argv);

// Entry point shared by main() and tests: dispatches argv[1] to its command.
int tern_main(int argc, char** argv);

}  // namespace tern
