// `tern list` and `tern ps` run as a user runs them: list prints a directory's models (broken
// files as rows with the reason, exit 0; a bad directory or models.json is an error, exit 1);
// ps asks a server for GET /api/ps (here an in-test httplib stub with Ollama's answer) and
// prints NAME / SIZE / CONTEXT / UNTIL, or a clear error when no server answers.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_list_ps {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tern::testing::run_command;

const std::string kTern = TERN_BINARY;

struct Result {
  int rc = -1;
  std::string out, err;
};

Result tern(const std::string& args, const std::string& env = "") {
  Result r;
  r.rc = run_command(env + (env.empty() ? "" : " ") + kTern + " " + args, &r.out, &r.err);
  return r;
}

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// A models directory made of two synth models (no ../shared needed), one in a subdirectory,
// plus files that are not models.
class ListCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = tern::testing::make_temp_dir("tern_list_ps");
    fs::create_directory(dir_ + "/models");
    fs::create_directory(dir_ + "/models/family");
    Result r = tern("synth --shape stories260k --type f32 --seed 3 -o " + dir_ + "/models/alpha.gguf");
    ASSERT_EQ(r.rc, 0) << r.err;
    r = tern("synth --shape stories260k --type q8_0 --seed 4 -o " + dir_ + "/models/family/beta.gguf");
    ASSERT_EQ(r.rc, 0) << r.err;
    write_text(dir_ + "/models/garbage.gguf", std::string(4096, '\x5a'));
    write_text(dir_ + "/models/empty.gguf", "");
    write_text(dir_ + "/models/README.txt", "not a model");
  }
  static void TearDownTestSuite() { tern::testing::remove_temp_dir(dir_); }
  static std::string models() { return dir_ + "/models"; }
  static std::string dir_;
};
std::string ListCli::dir_;

TEST_F(ListCli, DirectoryAsJsonAndTable) {
  Result r = tern("list --models " + models() + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 4u) << r.out;  // README.txt is not listed
  EXPECT_EQ(j[0]["name"], "alpha");
  EXPECT_EQ(j[0]["usable"], true) << j[0].dump();
  EXPECT_EQ(j[0]["type"], "F32");
  EXPECT_EQ(j[0]["architecture"], "llama");
  EXPECT_GT(j[0]["context_length"].get<int64_t>(), 0);
  EXPECT_GT(j[0]["n_params"].get<int64_t>(), 200000);
  EXPECT_EQ(j[0]["digest"].get<std::string>().size(), 64u);
  EXPECT_EQ(j[1]["name"], "beta");
  EXPECT_EQ(j[1]["usable"], true) << j[1].dump();
  EXPECT_EQ(j[1]["type"], "Q8_0");
  EXPECT_EQ(j[1]["path"], models() + "/family/beta.gguf");
  EXPECT_EQ(j[2]["name"], "empty");
  EXPECT_EQ(j[2]["usable"], false);
  EXPECT_TRUE(contains(j[2]["error"], "empty")) << j[2].dump();
  EXPECT_EQ(j[3]["name"], "garbage");
  EXPECT_EQ(j[3]["usable"], false);
  EXPECT_FALSE(j[3]["error"].get<std::string>().empty());

  r = tern("list --models " + models());
  ASSERT_EQ(r.rc, 0) << r.err;
  for (const char* col : {"NAME", "SIZE", "TYPE", "ARCH", "CONTEXT", "PARAMS", "STATUS"})
    EXPECT_TRUE(contains(r.out, col)) << col << "\n" << r.out;
  EXPECT_TRUE(contains(r.out, "Q8_0")) << r.out;
  EXPECT_TRUE(contains(r.out, "unusable: empty file")) << r.out;
  EXPECT_TRUE(contains(r.out, " ok\n")) << r.out;
}

TEST_F(ListCli, NamedFiles) {
  const Result r = tern("list -m first=" + models() + "/alpha.gguf -m " + models() + "/family/beta.gguf --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["name"], "first");
  EXPECT_EQ(j[1]["name"], "beta");
}

TEST_F(ListCli, ErrorsExitNonZeroWithTheReason) {
  Result r = tern("list --models " + dir_ + "/nope");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "no such directory")) << r.err;
  r = tern("list");
  EXPECT_EQ(r.rc, 2) << r.err;
  r = tern("list -m " + dir_ + "/missing.gguf");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "does not exist")) << r.err;
  r = tern("list -m x=" + models() + "/alpha.gguf -m x=" + models() + "/family/beta.gguf");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "two models are named 'x'")) << r.err;

  // A bad models.json stops the listing with its path and the key.
  const std::string d = dir_ + "/with_config";
  fs::create_directory(d);
  fs::copy_file(models() + "/alpha.gguf", d + "/alpha.gguf", fs::copy_options::overwrite_existing);
  write_text(d + "/models.json", R"({"models": {"alpha": {"keep_alive": "soon"}}})");
  r = tern("list --models " + d);
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, d + "/models.json")) << r.err;
  EXPECT_TRUE(contains(r.err, "keep_alive")) << r.err;
  write_text(d + "/models.json", R"({"models": {"alpha": {"aliases": ["a"], "keep_alive": "5m"}}})");
  r = tern("list --models " + d);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "alpha, a")) << r.out;
}

// --- tern ps ------------------------------------------------------------------------------

// Go's time.Time JSON form of now + `in`, at a fixed zone offset (Ollama writes local time).
std::string go_time(std::chrono::seconds in, int offset_minutes) {
  const auto t = std::chrono::system_clock::now() + in + std::chrono::minutes(offset_minutes);
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::string s = std::string(buf) + ".123456789";
  if (offset_minutes == 0) return s + "Z";
  const int a = std::abs(offset_minutes);
  std::snprintf(buf, sizeof buf, "%c%02d:%02d", offset_minutes < 0 ? '-' : '+', a / 60, a % 60);
  return s + buf;
}

// An /api/ps stub on a free loopback port, serving `body` with `status` (and 401 without
// "Authorization: Bearer KEY" when a key is set).
class StubServer {
 public:
  StubServer(std::string body, int status = 200, std::string key = "")
      : body_(std::move(body)), status_(status), key_(std::move(key)) {
    server_.Get("/api/ps", [this](const httplib::Request& req, httplib::Response& res) {
      if (!key_.empty() && req.get_header_value("Authorization") != "Bearer " + key_) {
        res.status = 401;
        res.set_content(R"({"error":"invalid API key"})", "application/json");
        return;
      }
      res.status = status_;
      res.set_content(body_, "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    for (int i = 0; i < 200 && !server_.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ~StubServer() {
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }

 private:
  httplib::Server server_;
  std::string body_;
  int status_;
  std::string key_;
  int port_ = 0;
  std::thread thread_;
};

json ps_body() {
  json m1 = {{"name", "alpha"},
             {"model", "alpha"},
             {"size", 3 * 1024 * 1024},
             {"digest", std::string(64, 'a')},
             {"details", {{"format", "gguf"}, {"family", "llama"}, {"parameter_size", "293K"}}},
             {"expires_at", go_time(std::chrono::seconds(4 * 60 + 20), 0)},
             {"size_vram", 0},
             {"context_length", 2048}};
  json m2 = m1;
  m2["name"] = m2["model"] = "kept";
  m2["expires_at"] = "2318-01-01T00:00:00Z";
  m2["context_length"] = 512;
  json m3 = m1;
  m3["name"] = m3["model"] = "zoned";
  m3["expires_at"] = go_time(std::chrono::seconds(2 * 3600 + 60), -7 * 60);
  return json{{"models", {m1, m2, m3}}};
}

TEST(PsCli, TableFromTheServersAnswer) {
  const json body = ps_body();
  StubServer stub(body.dump());
  ASSERT_GT(stub.port(), 0);
  Result r = tern("ps --port " + std::to_string(stub.port()));
  ASSERT_EQ(r.rc, 0) << r.err;
  for (const char* col : {"NAME", "SIZE", "CONTEXT", "UNTIL"}) EXPECT_TRUE(contains(r.out, col)) << r.out;
  EXPECT_TRUE(contains(r.out, "alpha")) << r.out;
  EXPECT_TRUE(contains(r.out, "3.00 MiB")) << r.out;
  EXPECT_TRUE(contains(r.out, "2048")) << r.out;
  EXPECT_TRUE(contains(r.out, "in 4 minutes")) << r.out;
  EXPECT_TRUE(contains(r.out, "forever")) << r.out;
  EXPECT_TRUE(contains(r.out, "in 2 hours")) << r.out;  // -07:00 offset read as such

  // --json: the server's answer as it came; --host takes a URL too.
  r = tern("ps --host http://127.0.0.1:" + std::to_string(stub.port()) + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json::parse(r.out), body);
}

TEST(PsCli, EmptyListPrintsTheHeader) {
  StubServer stub(R"({"models":[]})");
  const Result r = tern("ps --port " + std::to_string(stub.port()));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "NAME")) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

TEST(PsCli, ApiKey) {
  StubServer stub(ps_body().dump(), 200, "sekrit");
  const std::string port = std::to_string(stub.port());
  Result r = tern("ps --port " + port, "env -u TERN_API_KEY");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "needs an API key")) << r.err;
  r = tern("ps --port " + port + " --api-key sekrit");
  EXPECT_EQ(r.rc, 0) << r.err;
  r = tern("ps --port " + port, "env TERN_API_KEY=sekrit");
  EXPECT_EQ(r.rc, 0) << r.err;
}

TEST(PsCli, ServerErrorsAreShown) {
  {
    StubServer stub(R"({"error":"boom"})", 500);
    const Result r = tern("ps --port " + std::to_string(stub.port()));
    EXPECT_EQ(r.rc, 1);
    EXPECT_TRUE(contains(r.err, "HTTP 500: boom")) << r.err;
  }
  {
    StubServer stub("this is not json");
    const Result r = tern("ps --port " + std::to_string(stub.port()));
    EXPECT_EQ(r.rc, 1);
    EXPECT_TRUE(contains(r.err, "not JSON")) << r.err;
  }
}

TEST(PsCli, NoServerIsAClearError) {
  int port = 0;
  {
    StubServer stub("{}");  // a port that was free a moment ago, and is again
    port = stub.port();
  }
  const Result r = tern("ps --port " + std::to_string(port));
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "no server at http://127.0.0.1:" + std::to_string(port))) << r.err;
  EXPECT_TRUE(contains(r.err, "connection refused")) << r.err;
  EXPECT_TRUE(contains(r.err, "tern serve")) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

}  // namespace
}  // namespace tern::test_list_ps
