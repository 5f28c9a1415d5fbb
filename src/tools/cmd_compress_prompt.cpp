// `tern compress-prompt -m SCORER --ratio R (-p TEXT | -f FILE)`: the prompt with about 1/R of its
// tokens, chosen by a small scorer model (prompt/compress.h), on stdout; a report on stderr, or
// with --json one JSON object with the text and the report on stdout. docs/data-level.md.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/read_file.h"
#include "models/model.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/model_args.h"
#include "tools/prompt_compression.h"

namespace tern {

int cmd_compress_prompt(int argc, char** argv) {
  CLI::App app{"Compress a prompt: keep the tokens a small scorer model finds most informative"};
  app.name("tern compress-prompt");
  ModelArgs margs;
  margs.add_to(app);
  PromptCompressArgs cargs;
  cargs.add_to(app);
  double ratio = 2.0;
  std::string text, file_path, instruction, question, target;
  bool json = false;
  app.add_option("--ratio", ratio, "keep about 1/R of the prompt's tokens (2 keeps half; >= 1)")->required();
  app.add_option("-p,--prompt", text, "the prompt (its context part); <keep>...</keep> spans are never dropped");
  app.add_option("-f,--file", file_path, "read the prompt from this file instead");
  app.add_option("--instruction", instruction, "text before the prompt, kept whole by llmlingua");
  app.add_option("--question", question, "text after the prompt, kept whole by llmlingua (longllmlingua ranks by it)");
  app.add_option("--target", target,
                 "the model the compressed prompt is for: its vocabulary must be the scorer's; the report "
                 "adds the target's token counts");
  app.add_flag("--json", json, "print one JSON object: the compressed prompt and the report");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  if ((app.count("--prompt") > 0) == (app.count("--file") > 0)) {
    std::fprintf(stderr, "tern compress-prompt: give either -p TEXT or -f FILE\n");
    return 2;
  }
  if (!file_path.empty()) text = read_file_text(file_path, "prompt file");
  const prompt::CompressOptions opts = cargs.options(ratio);
  const prompt::PromptParts parts{instruction, text, question};

  auto file = open_model_file(margs.model, margs.tokenizer_bin);
  const auto tok = Tokenizer::from_gguf(*file);
  std::unique_ptr<Tokenizer> target_tok;
  std::shared_ptr<const GgufFile> target_file;
  if (!target.empty()) {
    target_file = open_model_file(target);
    target_tok = Tokenizer::from_gguf(*target_file);
    check_same_vocabulary(*tok, margs.model, *target_tok, target);
  }
  // The scorer's context: the whole prompt, plus the question again before it (longllmlingua).
  const prompt::PromptTokens probe = prompt::tokenize_prompt(*tok, parts, cargs.prompt_options());
  if (!margs.ctx_given()) {
    const int64_t n_question = int64_t(tok->encode(question, false, true).size());
    margs.ctx = std::max<int64_t>(64, probe.size() + n_question + 8);
  }
  LoadedSession ls = open_session(margs, file);
  const CompressedPrompt c = compress_with_session(*ls.session, *tok, parts, opts, cargs.prompt_options());

  nlohmann::json report = c.report(opts);
  if (target_tok) {
    report["target_tokens"] = int64_t(target_tok->encode(c.text, target_tok->add_bos_default(), true).size());
    report["target_tokens_original"] = probe.size();
  }
  if (json) {
    report["compressed"] = c.text;
    std::printf("%s\n", report.dump(2).c_str());
  } else {
    std::printf("%s\n", c.text.c_str());
    std::fprintf(stderr, "compress-prompt: %s\n", c.summary(opts).c_str());
  }
  return 0;
}

}  // namespace tern
