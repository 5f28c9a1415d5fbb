#include "tools/cli_util.h"

#include <cctype>

#include "core/error.h"

namespace tern {
namespace {

// Applied to the options the command has added, just before parsing: one place, so that no
// command can forget them.
void apply_conventions(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    // Flags already take the last value; vector options (expected > 1) keep every value.
    if (!opt->get_positional() && opt->get_items_expected_max() == 1)
      opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    opt->capture_default_str();
    if (opt->get_default_str() == "[]") opt->default_str("");  // an empty list is no default to show
  }
}

}  // namespace

int parse_cli(CLI::App& app, int argc, char** argv) {
  apply_conventions(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return -1;
}

int64_t parse_memory_size(const std::string& text) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (const std::exception&) {
    fail("cannot read '", text, "' as a memory size (e.g. 512 for MiB, 512M, 2G)");
  }
  std::string unit = text.substr(pos);
  for (auto& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() == 3 && unit.substr(1) == "IB") unit.resize(1);       // KiB, MiB, ...
  else if (unit.size() == 2 && unit[1] == 'B') unit.resize(1);          // KB, MB, ...
  double mult = 0;
  if (unit.empty() || unit == "M") mult = 1024.0 * 1024;  // a plain number is MiB
  else if (unit == "B") mult = 1;
  else if (unit == "K") mult = 1024.0;
  else if (unit == "G") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T") mult = 1024.0 * 1024 * 1024 * 1024;
  else fail("unknown size unit in '", text, "' (a number of MiB, or one with K, M, G, T or B)");
  if (!(v >= 0) || v * mult > 9e18) fail("size '", text, "' is out of range");
  return int64_t(v * mult);
}

}  // namespace tern
