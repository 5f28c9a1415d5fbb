#pragma once
#include <CLI/CLI.hpp>

namespace tern {

// Parses argv into `app`. Returns -1 when the command should go on, otherwise the exit code
// (0 after --help, 2 after a usage error, which has been printed).
inline int parse_cli(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return -1;
}

}  // namespace tern
