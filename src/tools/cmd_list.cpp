// `tern list (--models DIR | -m [NAME=]FILE ...) [--json]`: the models a multi-model server
// would serve, as `ollama list` shows them, with each file's size, weight type, architecture,
// training context and parameter count, and the reason a file cannot be used (never a crash:
// a broken file is one row). Only headers are read.
#include <cstdio>
#include <string>
#include <vector>

#include "server/model_catalog.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace tern {

int cmd_list(int argc, char** argv) {
  CLI::App app{"List the models in a directory (as `tern serve --models DIR` names them) or given files"};
  std::string dir;
  std::vector<std::string> files;
  bool json = false;
  app.add_option("--models", dir, "directory of GGUF files (and an optional models.json)");
  app.add_option("-m,--model", files, "a model file, optionally named: NAME=FILE (repeatable)");
  app.add_flag("--json", json, "print a JSON array");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  if (dir.empty() == files.empty()) {
    std::fprintf(stderr, "tern list: give either --models DIR or one or more -m [NAME=]FILE\n");
    return 2;
  }
  const std::vector<server::ModelEntry> entries =
      dir.empty() ? server::models_from_args(files) : server::scan_models_dir(dir);
  if (json) {
    std::printf("%s\n", server::models_json(entries).dump(2).c_str());
    return 0;
  }
  if (entries.empty()) {
    std::printf("no GGUF files in %s\n", dir.c_str());
    return 0;
  }
  std::fputs(server::models_table(entries).c_str(), stdout);
  return 0;
}

}  // namespace tern
