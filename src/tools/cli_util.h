#pragma once
// What the command lines of every tern command have in common.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace tern {

// What `tern --version` prints; part of the server's system_fingerprint.
inline constexpr const char* kVersion = "tern 0.1.0";

// Parses argv into `app`, after giving every option the conventions all tern commands follow:
//  - a single-value option given twice takes the last value (`-n 3 -n 5` is -n 5), as
//    llama.cpp's tools do, so a script can override a flag by appending it; options that
//    collect values (--stop) keep them all;
//  - --help shows each option's default: the value its variable holds before parsing.
// Returns -1 when the command should go on, otherwise the exit code (0 after --help, 2 after a
// usage error, which has been printed).
int parse_cli(CLI::App& app, int argc, char** argv);

// A memory size, the form --kv-memory (serve, bench-serve) and TERN_MEMORY_LIMIT take: a plain
// number is MiB ("512"); with a unit K, M, G or T (binary; "KB", "KiB" and lower case too) or
// B for bytes ("150K", "1.5G", "4096B"). Throws tern::Error naming the text otherwise.
int64_t parse_memory_size(const std::string& text);

}  // namespace tern
