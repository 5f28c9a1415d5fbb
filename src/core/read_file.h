#pragma once
// Reading a whole text file the user named (a prompt, a perplexity or calibration text, a
// prompts file). A missing or unreadable file ("cannot open WHAT PATH: REASON"), a directory and
// a failed read ("cannot read WHAT PATH: REASON") are each a tern::Error naming the file.
#include <string>

namespace tern {

// `what` says what the file is for ("prompt file", "perplexity text"). Reads to the end, so
// pipes and /dev/stdin work too.
std::string read_file_text(const std::string& path, const std::string& what);

// Whether something exists at `path`; false too when that cannot be told (never throws).
bool path_exists(const std::string& path);

}  // namespace tern
