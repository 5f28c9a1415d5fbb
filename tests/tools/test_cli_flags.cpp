// The command-line conventions every tern command shares, through the built binary: repeated
// options, help (defaults, `tern help CMD`, --version), --kv-memory's one form, the K/V type
// default shared by run and serve, special tokens in run's prompt, the context sized to the
// machine (and refused when it cannot fit), and Ctrl-C in `tern run`.
//
// Models are made with `tern synth` (random weights, stories260K's shape), so nothing here
// needs ../shared.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "core/error.h"
#include "server/http_test_util.h"
#include "test_util.h"
#include "tools/cli_util.h"

extern char** environ;

namespace tern {
namespace {

using namespace std::chrono_literals;
using tern::testing::read_file_bytes;
using tern::testing::run_command;

const std::string kTern = TERN_BINARY;
// `tern serve` where it is expected to refuse to start: bounded, should it start serving.
const std::string kServeOrTimeout = "timeout 60 " + kTern + " serve";

// Per process: ctest runs each test as its own process, several at once with -j.
std::string temp_prefix() { return "tern_cli_flags_" + std::to_string(::getpid()) + "_"; }
std::string temp_path(const std::string& name) { return ::testing::TempDir() + "/" + temp_prefix() + name; }

// A process started in the background, its stdout and stderr going to files; killed (SIGKILL)
// on destruction if it is still running, so that a failed test leaves nothing behind.
class Background {
 public:
  explicit Background(const std::string& args, const std::string& name)
      : out_(temp_path(name + ".out")), err_(temp_path(name + ".err")) {
    // No output of an earlier run may be taken for this one's.
    std::filesystem::remove(out_);
    std::filesystem::remove(err_);
    // `exec`, so that the pid is tern's own and signals reach it, not a shell's.
    const std::string cmd = "exec " + kTern + " " + args + " >" + out_ + " 2>" + err_;
    const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
    if (::posix_spawn(&pid_, "/bin/sh", nullptr, nullptr, const_cast<char* const*>(argv), environ) != 0) pid_ = -1;
  }
  ~Background() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  bool started() const { return pid_ > 0; }
  void signal(int sig) const { ::kill(pid_, sig); }
  std::string out() const { return read_file_bytes(out_); }
  std::string err() const { return read_file_bytes(err_); }

  // Polls `ready` every 10 ms until it holds or `timeout` passes.
  template <class Pred>
  bool wait_for(Pred ready, std::chrono::milliseconds timeout) const {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (ready()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return ready();
  }

  // The exit status, or -1 when it did not exit by itself within `timeout` (killed then) or
  // was killed by a signal.
  int wait_exit(std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (std::chrono::steady_clock::now() < end) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  std::string out_, err_;
};

class CliFlags : public ::testing::Test {
 protected:
  // stories260K's shape with a 131072-token training context (as Llama-3.1 files declare),
  // and one with 256.
  static std::string big_ctx_model() { return temp_path("ctx131072.gguf"); }
  static std::string short_ctx_model() { return temp_path("ctx256.gguf"); }

  static void SetUpTestSuite() {
    std::string out, err;
    for (const auto& [path, ctx] : {std::pair{big_ctx_model(), 131072}, std::pair{short_ctx_model(), 256}}) {
      ASSERT_EQ(run_command(kTern + " synth --shape stories260k --type f32 --ctx-train " + std::to_string(ctx) +
                                " -o " + path,
                            &out, &err),
                0)
          << err;
    }
  }

  static void TearDownTestSuite() {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(::testing::TempDir(), ec))
      if (e.path().filename().string().rfind(temp_prefix(), 0) == 0) std::filesystem::remove(e.path(), ec);
  }

  static nlohmann::json run_json(const std::string& args, int want_rc = 0, std::string* err_out = nullptr) {
    std::string out, err;
    const int rc = run_command(kTern + " run " + args + " --json", &out, &err);
    EXPECT_EQ(rc, want_rc) << err;
    if (err_out) *err_out = err;
    try {
      return nlohmann::json::parse(out);
    } catch (const std::exception&) {
      ADD_FAILURE() << "not JSON: " << out << "\n" << err;
      return {};
    }
  }

  static std::string help(const std::string& command) {
    std::string out, err;
    EXPECT_EQ(run_command(kTern + " " + command + " --help", &out, &err), 0) << err;
    return out;
  }
};

// --- repeated options ---------------------------------------------------------------------

TEST_F(CliFlags, RepeatedSingleValueOptionTakesTheLast) {
  const auto j = run_json("-m " + big_ctx_model() + " -p a -n 3 -n 5 --temp 0 -t 1");
  EXPECT_EQ(j["ids"].size(), 5u);
  const auto ctx = run_json("-m " + big_ctx_model() + " -p a -n 2 --temp 0 -t 1 --ctx 64 --ctx 128");
  EXPECT_EQ(ctx["metrics"].value("n_ctx", -1), 128);
  // Another command: tokenize's -f names the last file.
  const std::string a = temp_path("a.txt"), b = temp_path("b.txt");
  std::ofstream(a) << "aaaa";
  std::ofstream(b) << "b";
  std::string out, err;
  const std::string tokenize = kTern + " tokenize -m " + big_ctx_model() + " --no-bos --json";
  ASSERT_EQ(run_command(tokenize + " -f " + a + " -f " + b, &out, &err), 0) << err;
  std::string only_b;
  ASSERT_EQ(run_command(tokenize + " -f " + b, &only_b, &err), 0);
  EXPECT_EQ(out, only_b);
}

TEST_F(CliFlags, RepeatableOptionsKeepEveryValue) {
  // --stop collects: the first of two stop strings still stops the (greedy) text.
  const std::string args = "-m " + big_ctx_model() + " -p a -n 16 --temp 0 -t 1";
  const std::string text = run_json(args)["text"];
  const size_t at = text.find_first_of("abcdefghijklmnopqrstuvwxyz", 1);
  ASSERT_NE(at, std::string::npos) << text;
  const auto j = run_json(args + " --stop " + text.substr(at, 1) + " --stop zzzz");
  EXPECT_EQ(j["finish_reason"], "stop");
  EXPECT_EQ(j["text"], text.substr(0, text.find(text[at])));
}

// --- help ---------------------------------------------------------------------------------

TEST_F(CliFlags, HelpCommandPrintsThatCommandsHelp) {
  std::string out, err;
  ASSERT_EQ(run_command(kTern + " help run", &out, &err), 0) << err;
  EXPECT_NE(out.find("--n-predict"), std::string::npos) << out;
  EXPECT_EQ(out, help("run"));
  ASSERT_EQ(run_command(kTern + " help serve", &out, &err), 0) << err;
  EXPECT_NE(out.find("--parallel"), std::string::npos) << out;
  EXPECT_EQ(run_command(kTern + " help frobnicate", &out, &err), 2);
  EXPECT_NE(err.find("unknown command 'frobnicate'"), std::string::npos) << err;
  // Plain `tern help` is still the general help.
  ASSERT_EQ(run_command(kTern + " help", &out, &err), 0);
  EXPECT_NE(out.find("commands:"), std::string::npos) << out;
}

TEST_F(CliFlags, VersionIsListedAndPrinted) {
  std::string out, err;
  ASSERT_EQ(run_command(kTern + " --help", &out, &err), 0);
  EXPECT_NE(out.find("--version"), std::string::npos) << out;
  for (const char* flag : {" --version", " -v"}) {
    ASSERT_EQ(run_command(kTern + flag, &out, &err), 0) << flag;
    EXPECT_EQ(out.rfind("tern ", 0), 0u) << out;
  }
}

// The line of `option` in a CLI11 help text, with its continuation (the description may wrap
// onto the next line).
std::string option_line(const std::string& help_text, const std::string& option) {
  const size_t at = help_text.find(option);
  if (at == std::string::npos) return "";
  const size_t begin = help_text.rfind('\n', at) + 1;
  return help_text.substr(begin, help_text.find('\n', at) - begin);
}

TEST_F(CliFlags, HelpShowsEveryDefault) {
  const std::string run = help("run");
  for (const char* want : {"-n,--n-predict", "-b,--batch", "--temp", "--top-k", "--repeat-last-n", "-s,--seed",
                           "-c,--ctx", "-t,--threads", "--kv-type"}) {
    const std::string line = option_line(run, want);
    EXPECT_NE(line.find('='), std::string::npos) << want << ": " << line;
  }
  EXPECT_NE(option_line(run, "-n,--n-predict").find("=128"), std::string::npos) << run;
  EXPECT_NE(option_line(run, "-b,--batch").find("=512"), std::string::npos) << run;
  // Every command gets them, including those that set none by hand.
  EXPECT_NE(option_line(help("serve"), "--port").find("=8080"), std::string::npos);
  EXPECT_NE(option_line(help("ppl"), "--chunks").find("=-1"), std::string::npos);
  EXPECT_NE(option_line(help("bench"), "-b,--batch").find("=512"), std::string::npos);
  EXPECT_NE(option_line(help("synth"), "--seed").find("=1234"), std::string::npos);
  // An empty list is no default: --stop shows none.
  EXPECT_EQ(option_line(run, "--stop").find("=[]"), std::string::npos) << run;
}

// --- --kv-memory ----------------------------------------------------------------------------

TEST(CliMemorySize, PlainNumbersAreMiBAndUnitsAreBinary) {
  EXPECT_EQ(parse_memory_size("512"), int64_t(512) << 20);
  EXPECT_EQ(parse_memory_size("512M"), int64_t(512) << 20);
  EXPECT_EQ(parse_memory_size("512MiB"), int64_t(512) << 20);
  EXPECT_EQ(parse_memory_size("2G"), int64_t(2) << 30);
  EXPECT_EQ(parse_memory_size("2gb"), int64_t(2) << 30);
  EXPECT_EQ(parse_memory_size("1.5G"), int64_t(3) << 29);
  EXPECT_EQ(parse_memory_size("150K"), 150 * 1024);
  EXPECT_EQ(parse_memory_size("4096B"), 4096);
  EXPECT_EQ(parse_memory_size("1T"), int64_t(1) << 40);
  EXPECT_EQ(parse_memory_size("0"), 0);
  for (const char* bad : {"12Q", "abc", "", "-1", "1MM", "5 G"}) EXPECT_THROW(parse_memory_size(bad), Error) << bad;
}

// The start-up line "KV 1000.00 KiB (f16) in 100 blocks of 16 tokens" of `tern serve ARGS`.
std::string serve_kv_line(const std::string& args, const std::string& name) {
  Background srv(args + " --port 0 -t 1", name);
  EXPECT_TRUE(srv.started());
  const bool up = srv.wait_for([&] { return srv.err().find("listening on") != std::string::npos; }, 20s);
  EXPECT_TRUE(up) << srv.err();
  std::smatch m;
  const std::string err = srv.err();
  srv.signal(SIGTERM);
  EXPECT_EQ(srv.wait_exit(20s), 0) << srv.err();
  if (!std::regex_search(err, m, std::regex("KV [^\n]* in [0-9]+ blocks"))) return "";
  return m.str();
}

TEST_F(CliFlags, KvMemoryTakesTheSameFormInServeAndBenchServe) {
  const std::string m = " -m " + big_ctx_model();
  const std::string plain = serve_kv_line("serve" + m + " --kv-memory 1", "kvmem_plain");
  EXPECT_NE(plain.find("in 102 blocks"), std::string::npos) << plain;  // 1 MiB / (16 x 640 bytes)
  EXPECT_EQ(serve_kv_line("serve" + m + " --kv-memory 1M", "kvmem_unit"), plain);
  EXPECT_EQ(serve_kv_line("serve" + m + " --kv-memory 1024K", "kvmem_k"), plain);
  for (const char* form : {"1", "1M", "1024KiB"}) {
    std::string out, err;
    ASSERT_EQ(run_command(kTern + " bench-serve" + m + " --kv-memory " + form +
                              " --num-prompts 2 --input-len 8 --max-tokens 4 --warmup 0 -t 1 --json",
                          &out, &err),
              0)
        << form << err;
    EXPECT_EQ(nlohmann::json::parse(out)["kv_blocks_total"], 102) << form;
  }
  std::string out, err;
  EXPECT_EQ(run_command(kServeOrTimeout + m + " --kv-memory 12Q --port 0", &out, &err), 1);
  EXPECT_NE(err.find("unknown size unit"), std::string::npos) << err;
}

// --- the K/V type: one default for run and serve --------------------------------------------

TEST_F(CliFlags, RunAndServeShareTheKvTypeDefaultAndTheSameSeedGivesTheSameText) {
  EXPECT_NE(option_line(help("run"), "--kv-type").find("=f16"), std::string::npos);
  EXPECT_NE(option_line(help("serve"), "--kv-type").find("=f16"), std::string::npos);

  // The server's sampling defaults (OpenAI's: temperature 1, no top-k / top-p / min-p).
  const auto run = run_json("-m " + big_ctx_model() + " -p 'Once upon a time' -n 24 --temp 1 --top-k 0 --top-p 1 "
                            "--min-p 0 --repeat-penalty 1 -s 7 -t 1");
  EXPECT_EQ(run["metrics"]["kv_type"], "f16");

  Background srv("serve -m " + big_ctx_model() + " --port 0 -t 1", "same_seed");
  ASSERT_TRUE(srv.started());
  std::smatch m;
  ASSERT_TRUE(srv.wait_for([&] { return srv.err().find("listening on") != std::string::npos; }, 20s)) << srv.err();
  const std::string log = srv.err();
  ASSERT_TRUE(std::regex_search(log, m, std::regex("listening on http://127\\.0\\.0\\.1:([0-9]+)"))) << log;
  tern::testing::RawConn conn(std::stoi(m[1]));
  ASSERT_TRUE(conn.ok());
  conn.send_all(tern::testing::http_post(
      "/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 24, "seed": 7, "temperature": 1})"));
  const std::string resp = conn.read_all(20s);
  srv.signal(SIGTERM);
  EXPECT_EQ(srv.wait_exit(20s), 0) << srv.err();
  ASSERT_EQ(tern::testing::status_of(resp), 200) << resp;
  const auto body = nlohmann::json::parse(resp.substr(resp.find("\r\n\r\n") + 4));
  EXPECT_EQ(body["choices"][0]["text"], run["text"]);
}

// --- special tokens in run's prompt ----------------------------------------------------------

TEST_F(CliFlags, RunReadsSpecialTokenTextsAsTextUnlessParseSpecial) {
  // </s> is token 2 of the generated vocabulary; as text it is its characters.
  const auto text = run_json("-m " + big_ctx_model() + " -p 'a</s>' -n 1 -t 1");
  const auto ids = text["prompt_ids"].get<std::vector<int>>();
  EXPECT_GT(ids.size(), 3u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 0) << text["prompt_ids"];
  const auto special = run_json("-m " + big_ctx_model() + " -p 'a</s>' -n 1 -t 1 --parse-special");
  EXPECT_EQ(special["prompt_ids"].back(), 2) << special["prompt_ids"];
  EXPECT_EQ(special["prompt_ids"].size(), 3u);
  // The same ids as `tern tokenize`, with and without the flag.
  std::string out, err;
  ASSERT_EQ(run_command(kTern + " tokenize -m " + big_ctx_model() + " --json 'a</s>'", &out, &err), 0);
  EXPECT_EQ(nlohmann::json::parse(out), text["prompt_ids"]);
  ASSERT_EQ(run_command(kTern + " tokenize -m " + big_ctx_model() + " --json --parse-special 'a</s>'", &out, &err), 0);
  EXPECT_EQ(nlohmann::json::parse(out), special["prompt_ids"]);
}

// --- the context: sized to the machine ---------------------------------------------------------

TEST_F(CliFlags, DefaultContextIsCappedNotTheTrainingContext) {
  // A 131072-token header used to allocate all of it for a 1 MiB model: 80 MiB of f16 K/V in
  // run, 320 MiB with serve's --parallel 4.
  const auto j = run_json("-m " + big_ctx_model() + " -p a -n 2 -t 1");
  EXPECT_EQ(j["metrics"].value("n_ctx", -1), 4096);
  EXPECT_EQ(j["metrics"]["kv_bytes"], 4096 * 640);
  // A model trained on less keeps its own.
  EXPECT_EQ(run_json("-m " + short_ctx_model() + " -p a -n 2 -t 1")["metrics"].value("n_ctx", -1), 256);
  // serve: the per-request context, and ctx x parallel tokens of arena.
  Background srv("serve -m " + big_ctx_model() + " --port 0 -t 1 --parallel 4", "default_ctx");
  ASSERT_TRUE(srv.wait_for([&] { return srv.err().find("listening on") != std::string::npos; }, 20s)) << srv.err();
  const std::string log = srv.err();
  srv.signal(SIGTERM);
  EXPECT_EQ(srv.wait_exit(20s), 0);
  EXPECT_NE(log.find("context 4096 tokens, KV 10.00 MiB (f16) in 1024 blocks"), std::string::npos) << log;
}

TEST_F(CliFlags, DefaultContextShrinksToTheMemoryAvailable) {
  // 1.12 MiB of weights in 3 MiB: half of the 1.88 MiB left is 1.5 K tokens of f16 K/V.
  std::string err;
  const auto j = [&] {
    std::string out;
    EXPECT_EQ(run_command("TERN_MEMORY_LIMIT=3M " + kTern + " run -m " + big_ctx_model() + " -p a -n 2 -t 1 --json",
                          &out, &err),
              0)
        << err;
    return nlohmann::json::parse(out);
  }();
  EXPECT_EQ(j["metrics"].value("n_ctx", -1), 1536);
  EXPECT_NE(err.find("context 1536 tokens"), std::string::npos) << err;
}

TEST_F(CliFlags, ContextAboveTheTrainingContextWarns) {
  std::string err;
  run_json("-m " + short_ctx_model() + " -p a -n 2 -t 1 --ctx 512", 0, &err);
  EXPECT_NE(err.find("warning: --ctx 512 is longer than the 256 tokens the model was trained on"), std::string::npos)
      << err;
  run_json("-m " + short_ctx_model() + " -p a -n 2 -t 1 --ctx 256", 0, &err);
  EXPECT_EQ(err.find("warning"), std::string::npos) << err;
}

TEST_F(CliFlags, ContextLargerThanTheMemoryIsRefusedWithWhatToPass) {
  std::string out, err;
  // run: 100000 tokens x 1280 bytes (f32) = 122 MiB in a 64 MiB machine.
  EXPECT_EQ(run_command("TERN_MEMORY_LIMIT=64M " + kTern + " run -m " + big_ctx_model() +
                            " -p a -n 2 --ctx 100000 --kv-type f32",
                        &out, &err),
            1);
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  for (const char* want : {"a context of 100000 tokens needs 122.07 MiB of KV cache (f32",
                           "64.00 MiB of memory is available", "--ctx 51456 or less", "--kv-type f16"})
    EXPECT_NE(err.find(want), std::string::npos) << want << "\n" << err;
  // serve: ctx x parallel, and the flags serve has.
  EXPECT_EQ(run_command("TERN_MEMORY_LIMIT=64M " + kServeOrTimeout + " -m " + big_ctx_model() +
                            " --port 0 --ctx 16384 --parallel 16",
                        &out, &err),
            1);
  for (const char* want : {"16384 tokens x 16 sequences needs 160.00 MiB", "--ctx 6400 or less", "--parallel 6 or less",
                           "--kv-memory 62M or less"})
    EXPECT_NE(err.find(want), std::string::npos) << want << "\n" << err;
  // Whatever the machine: 2^24 tokens x 4096 sequences.
  const std::string m = " -m " + big_ctx_model() + " --port 0";
  EXPECT_EQ(run_command(kServeOrTimeout + m + " --ctx 16777216 --parallel 4096", &out, &err), 1);
  EXPECT_NE(err.find("of memory is available"), std::string::npos) << err;
  // --kv-memory beyond the memory.
  EXPECT_EQ(run_command("TERN_MEMORY_LIMIT=64M " + kServeOrTimeout + m + " --kv-memory 1G", &out, &err), 1);
  EXPECT_NE(err.find("--kv-memory 1.00 GiB needs"), std::string::npos) << err;
  // Weights that leave nothing: the default cannot be sized.
  EXPECT_EQ(run_command("TERN_MEMORY_LIMIT=1M " + kTern + " run -m " + big_ctx_model() + " -p a", &out, &err), 1);
  EXPECT_NE(err.find("the weights take 1.12 MiB"), std::string::npos) << err;
  EXPECT_EQ(run_command("TERN_MEMORY_LIMIT=lots " + kTern + " run -m " + big_ctx_model() + " -p a", &out, &err), 1);
  EXPECT_NE(err.find("TERN_MEMORY_LIMIT"), std::string::npos) << err;
}

// --- Ctrl-C in tern run ----------------------------------------------------------------------

TEST_F(CliFlags, CtrlCStopsRunAndPrintsTheReport) {
  // 65536 tokens to generate: far longer than the test waits.
  Background run("run -m " + big_ctx_model() + " -p a --ctx 65536 -n -1 --ignore-eos -t 1", "sigint");
  ASSERT_TRUE(run.started());
  // The prompt is echoed, then generated text streams: wait for some of it.
  ASSERT_TRUE(run.wait_for([&] { return run.out().size() > 20; }, 20s)) << run.err();
  run.signal(SIGINT);
  EXPECT_EQ(run.wait_exit(20s), 130) << run.err();
  const std::string err = run.err();
  EXPECT_NE(err.find("--- tern run:"), std::string::npos) << err;
  EXPECT_NE(err.find("finish: interrupted"), std::string::npos) << err;
  EXPECT_NE(err.find("decode "), std::string::npos) << err;
  const std::string out = run.out();
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.back(), '\n');  // the text ends its line before the report
}

TEST_F(CliFlags, SecondCtrlCExitsAtOnce) {
  // A prompt of ~15k tokens: its prefill takes seconds, and the first Ctrl-C only stops
  // generation after it; the second must not wait for it.
  const std::string prompt = temp_path("long_prompt.txt");
  {
    std::ofstream f(prompt);
    for (int i = 0; i < 20000; ++i) f << char('a' + (i * 7919) % 16) << (i % 5 == 0 ? " " : "");
  }
  Background run("run -m " + big_ctx_model() + " -f " + prompt + " --ctx 65536 -n 4 -t 1", "sigint2");
  ASSERT_TRUE(run.started());
  ASSERT_TRUE(run.wait_for([&] { return !run.out().empty(); }, 20s)) << run.err();  // the echo: prefill next
  run.signal(SIGINT);
  std::this_thread::sleep_for(100ms);
  run.signal(SIGINT);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(run.wait_exit(20s), 130) << run.err();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_EQ(run.err().find("--- tern run:"), std::string::npos) << run.err();
}

}  // namespace
}  // namespace tern
