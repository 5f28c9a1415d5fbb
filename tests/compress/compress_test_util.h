#pragma once
// Helpers of the compression tests: the tern binary, scratch paths, perplexity via `tern ppl`,
// and the llama.cpp peer.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util.h"

namespace tern::testing {

inline const std::string kTern = TERN_BINARY;

inline std::string stories() { return shared_path("models/stories260K.gguf"); }
inline std::string tinystories_val() { return shared_path("data/tinystories/tinystories_val.txt"); }
inline std::string tinystories_train() { return shared_path("data/tinystories/tinystories_train_prefix_4M.txt"); }

// A path in a per-process scratch folder (tests of one binary run in one process).
inline std::string temp_path(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tern_compress_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

// `tern ppl` on tinystories_val.txt at --ctx 256 (llama.cpp's method), first `chunks` chunks.
inline double ppl_of(const std::string& model, int chunks) {
  std::string out, err;
  const int rc = run_command(kTern + " ppl -m " + model + " -f " + tinystories_val() + " --ctx 256 --chunks " +
                                 std::to_string(chunks) + " --json",
                             &out, &err);
  EXPECT_EQ(rc, 0) << err;
  return rc == 0 ? nlohmann::json::parse(out)["ppl"].get<double>() : 0.0;
}

// llamacpp_bench.mjs of the llama.cpp peer, or "" when it is not installed.
inline std::string peer_script() {
  const char* dir = std::getenv("PEER_DIR");
  const char* home = std::getenv("HOME");
  const std::string peer = dir ? dir : std::string(home ? home : "") + "/.cache/llamacpp-peer";
  if (!std::filesystem::exists(peer + "/node_modules/node-llama-cpp")) return "";
  const std::string script = peer + "/llamacpp_bench.mjs";
  return std::filesystem::exists(script) ? script : "";
}

}  // namespace tern::testing
