// `tern convert MODEL.bin --tokenizer TOK.bin -o OUT.gguf`: llama2.c checkpoint -> GGUF.
#include <cstdio>
#include <string>

#include "core/error.h"
#include "core/output_file.h"
#include "gguf/gguf.h"
#include "models/llama2c_import.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace tern {

int cmd_convert(int argc, char** argv) {
  CLI::App app{"Convert a llama2.c checkpoint (legacy .bin) and its tokenizer.bin to GGUF, "
               "as llama.cpp's convert-llama2c-to-ggml does"};
  std::string in, tokenizer, out;
  Llama2cImportOptions opt;
  app.add_option("model", in, "llama2.c checkpoint (.bin)")->required();
  app.add_option("--tokenizer", tokenizer, "llama2.c tokenizer.bin")->required();
  app.add_option("-o,--output", out, "GGUF file to write")->required();
  app.add_option("--name", opt.name, "general.name to record")->capture_default_str();
  app.add_option("--ctx", opt.context_length,
                 "llama.context_length to record (default: the checkpoint's seq_len)");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  check_output_not_input(out, {in, tokenizer});

  const std::vector<uint8_t> bytes = llama2c_to_gguf_bytes(in, tokenizer, opt);
  // Re-read the image before writing it: a converter bug must not leave a file the reader
  // (or llama.cpp) rejects.
  const GgufFile check = GgufFile::parse(nullptr, bytes.data(), bytes.size(), out);

  GgufWriter::write_bytes(out, bytes);
  std::printf("wrote %s: %zu bytes, %zu tensors (%llu bytes of weights), %zu metadata keys\n", out.c_str(),
              bytes.size(), check.tensors().size(),
              static_cast<unsigned long long>(check.tensor_data_bytes()), check.metadata().size());
  return 0;
}

}  // namespace tern
