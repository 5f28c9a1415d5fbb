#pragma once
// Helpers shared by the test binaries: where ../shared is, and skipping when it is absent.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/error.h"

namespace tern::testing {

// The message of the tern::Error that fn() throws; "" when it throws none (other exceptions pass).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const tern::Error& e) {
    return e.what();
  }
  return "";
}

inline std::string shared_path(const std::string& rel) {
  const char* env = std::getenv("TERN_SHARED_DIR");
  const std::string base = env && *env ? env : TERN_SHARED_DIR;
  return base + "/" + rel;
}

// A real trained model for tests that need one but not its particular outputs: stories260K from
// ../shared when it is there, else the repository's own default model (models/tern-stories.gguf,
// trained by tern), so that these tests also run on a machine without ../shared.
inline std::string real_model_path() {
  const std::string shared = shared_path("models/stories260K.gguf");
  if (std::filesystem::exists(shared)) return shared;
  return std::string(TERN_SOURCE_DIR) + "/models/tern-stories.gguf";
}

inline std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs a shell command, returns its exit status and stdout (stderr to `err` if given).
inline int run_command(const std::string& cmd, std::string* out, std::string* err = nullptr) {
  const std::string err_file = std::filesystem::temp_directory_path() / ("tern_test_err_" + std::to_string(::getpid()));
  const std::string full = cmd + " 2>" + err_file;
  FILE* p = ::popen(full.c_str(), "r");
  if (!p) return -1;
  std::string acc;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) acc.append(buf, n);
  const int status = ::pclose(p);
  if (out) *out = acc;
  if (err) *err = read_file_bytes(err_file);
  std::remove(err_file.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#ifdef TERN_BINARY
// `tern ARGS`: its exit status, stdout and stderr (suites that drive the command line).
struct TernResult {
  int rc = -1;
  std::string out, err;
};
inline TernResult run_tern(const std::string& args) {
  TernResult r;
  r.rc = run_command(std::string(TERN_BINARY) + " " + args, &r.out, &r.err);
  return r;
}
#endif

// A new empty folder under the system's temporary directory ("<prefix>_XXXXXX"), for suites
// that write files; remove_temp_dir() deletes it and what it holds.
inline std::string make_temp_dir(const std::string& prefix) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
  return tmpl;
}

inline void remove_temp_dir(const std::string& dir) {
  std::error_code ec;
  if (!dir.empty()) std::filesystem::remove_all(dir, ec);
}

}  // namespace tern::testing

// Skips the current test when a file from ../shared is missing (a user's machine).
#define TERN_REQUIRE_SHARED(rel)                                                         \
  do {                                                                                   \
    if (!std::filesystem::exists(::tern::testing::shared_path(rel)))                     \
      GTEST_SKIP() << "missing " << ::tern::testing::shared_path(rel) << " (../shared absent)"; \
  } while (0)
