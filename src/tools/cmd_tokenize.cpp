// `tern tokenize -m MODEL [--no-bos] [--parse-special] [--json] (TEXT | --file F)`
//
// Prints the token ids of TEXT (or of the exact bytes of file F) as one line of
// space-separated ids, or as a JSON array with --json. Only the tokenizer metadata of MODEL
// is read, so vocabulary-only GGUF files work. BOS is prepended when the model asks for it
// (tokenizer.ggml.add_bos_token) unless --no-bos.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/read_file.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace tern {

int cmd_tokenize(int argc, char** argv) {
  CLI::App app{"Print the token ids of a text"};
  std::string model_path, text, file_path;
  bool no_bos = false, json = false, parse_special = false;
  app.add_option("-m,--model", model_path, "GGUF file with tokenizer metadata")->required();
  app.add_option("text", text, "text to tokenize");
  app.add_option("-f,--file", file_path, "tokenize this file's exact bytes instead of TEXT");
  app.add_flag("--no-bos", no_bos, "do not prepend BOS");
  app.add_flag("--parse-special", parse_special,
               "turn special-token texts such as <|endoftext|> into their tokens");
  app.add_flag("--json", json, "print a JSON array");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;

  const bool has_text = app.count("text") > 0, has_file = app.count("--file") > 0;
  if (has_text == has_file) {
    std::fprintf(stderr, "tern tokenize: give either TEXT or --file FILE\n");
    return 2;
  }
  if (has_file) text = read_file_text(file_path, "text file");

  const GgufFile file = GgufFile::open(model_path);
  const auto tok = Tokenizer::from_gguf(file);
  const std::vector<int32_t> ids = tok->encode(text, !no_bos && tok->add_bos_default(), parse_special);

  if (json) {
    std::printf("%s\n", nlohmann::json(ids).dump().c_str());
  } else {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) line += ' ';
      line += std::to_string(ids[i]);
    }
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

}  // namespace tern
