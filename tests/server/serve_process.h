#pragma once
// `tern serve ARGS --port 0 -t 1 -c 256` as a child process (its stderr in a temporary file),
// for the server tests that need the real command line: started by the constructor, which waits
// for the "listening on" line (port() is -1 when the server exited first: log() says why), and
// stopped with SIGTERM by the destructor.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace tern::testing {

class ServeProcess {
 public:
  explicit ServeProcess(const std::vector<std::string>& extra) {
    const std::string dir = make_temp_dir("tern_serve");
    log_ = dir + "/serve.log";
    std::vector<std::string> args = {TERN_BINARY, "serve"};
    args.insert(args.end(), extra.begin(), extra.end());
    for (const char* a : {"--port", "0", "-t", "1", "-c", "256"}) args.push_back(a);
    pid_ = ::fork();
    if (pid_ == 0) {
      if (!std::freopen(log_.c_str(), "w", stderr)) std::_Exit(126);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      std::_Exit(127);
    }
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    const std::regex listening("listening on http://127\\.0\\.0\\.1:([0-9]+)");
    while (std::chrono::steady_clock::now() < give_up) {
      std::smatch m;
      const std::string text = log();
      if (std::regex_search(text, m, listening)) {
        port_ = std::stoi(m[1]);
        return;
      }
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~ServeProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    remove_temp_dir(std::filesystem::path(log_).parent_path().string());
  }
  int port() const { return port_; }
  std::string log() const { return read_file_bytes(log_); }

 private:
  std::string log_;
  pid_t pid_ = -1;
  int port_ = -1;
};

// POSTs a JSON body to a test server and expects `want` as the status; the answer's JSON
// (discarded on a parse error, null when the request failed).
inline nlohmann::json post_json(httplib::Client& c, const std::string& path, const nlohmann::json& body, int want) {
  auto r = c.Post(path, body.dump(), "application/json");
  EXPECT_TRUE(r);
  if (!r) return nlohmann::json();
  EXPECT_EQ(r->status, want) << body.dump() << " -> " << r->body;
  return nlohmann::json::parse(r->body, nullptr, false);
}

}  // namespace tern::testing
