#pragma once
// The Skeleton-of-Thought options `tern sot` and `tern bench-serve --organize skeleton` share
// (server/skeleton_of_thought.h has the driver; docs/data-level.md the user's view).
#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/chat_template.h"
#include "server/skeleton_of_thought.h"

namespace tern {
class GgufFile;
class Tokenizer;

struct SotArgs {
  std::string skeleton_file;         // --skeleton FILE: the points, one per line
  std::string chat_template;         // --chat-template NAME|FILE (the model's own when empty)
  int64_t skeleton_tokens = 200;     // --skeleton-tokens
  int64_t point_tokens = 128;        // --point-tokens
  int64_t plain_tokens = 512;        // --plain-tokens
  int min_points = 2;                // --min-points
  int max_points = 10;               // --max-points

  // --skeleton, --chat-template (unless without_template), --skeleton-tokens, --point-tokens,
  // --plain-tokens, --min-points, --max-points.
  void add_to(CLI::App& app, bool with_template = true);
  // The driver's options (base request params left default). Throws tern::Error naming the flag
  // for a bad count, an unreadable or empty --skeleton file, or one with over --max-points points.
  server::SkeletonOptions options() const;
};

// The points of a --skeleton FILE: one per line, blank lines skipped, a leading "N." or "N)"
// (or "- ") dropped. Throws tern::Error naming the file when it cannot be read or has no point.
std::vector<std::string> read_skeleton_file(const std::string& path);

// The chat template Skeleton-of-Thought renders with: --chat-template when given, else the
// file's own (ChatTemplate::declared false when it has none: SkeletonPrompts then refuses).
server::ChatTemplate sot_chat_template(const std::string& override_spec, const GgufFile& file, const Tokenizer& tok);

}  // namespace tern
