// The CLI never loses a file (issue #15), run as a user runs `tern`: outputs replace a file
// atomically and write through symbolic links, devices and pipes; an output is never an input;
// `compare` checks its outputs before any work and prints its table whatever happens to them;
// text inputs refuse directories; ppl refuses figures that mean nothing; a model file is known
// by its magic, not its name; non-finite weights and logits are errors, not token 0.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

#include "gguf/gguf.h"
#include "test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_cli_files {
namespace {

namespace fs = std::filesystem;
using tern::testing::read_file_bytes;
using tern::testing::run_command;
using tern::testing::shared_path;

const std::string kTern = TERN_BINARY;

using Result = tern::testing::TernResult;
Result tern(const std::string& args) { return tern::testing::run_tern(args); }

// A shell command line (for limits set with ulimit before tern runs).
Result tern_in_shell(const std::string& script) {
  Result r;
  r.rc = run_command(script, &r.out, &r.err);
  return r;
}

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

// One temporary folder and one random-weight stories260k model (synth: no ../shared needed)
// for the whole suite.
class CliFiles : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = tern::testing::make_temp_dir("tern_cli_files");
    const Result r = tern("synth --shape stories260k --type f32 --seed 3 -o " + file("model.gguf"));
    ASSERT_EQ(r.rc, 0) << r.err;
    std::string text;
    for (int i = 0; i < 200; ++i) text += "Once upon a time there was a little dog who liked to run in the park. ";
    std::ofstream(file("text.txt")) << text;
  }
  static void TearDownTestSuite() { tern::testing::remove_temp_dir(dir_); }
  static std::string file(const std::string& name) { return dir_ + "/" + name; }
  static std::string model() { return file("model.gguf"); }

  // A character device like /dev/full (1, 7) or /dev/null (1, 3) of the test's own where
  // mknod is allowed (root: a broken tern would replace a system node otherwise); else the
  // system's node, which only root could replace.
  static std::string char_device(const std::string& name, unsigned minor) {
    const std::string p = file(name);
    ::unlink(p.c_str());
    if (::mknod(p.c_str(), S_IFCHR | 0666, makedev(1, minor)) == 0) return p;
    return "/dev/" + name;
  }
  static bool is_char_device(const std::string& p) {
    struct stat st {};
    return ::lstat(p.c_str(), &st) == 0 && S_ISCHR(st.st_mode);
  }
  // Leftover temporary files (NAME.tmp...) in the folder.
  static int temporaries() {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir_)) n += contains(e.path().filename().string(), ".tmp");
    return n;
  }
  // A copy of the model with tensor `name`'s bytes changed by `edit`.
  static std::string edited_model(const std::string& out_name, const std::string& src, const std::string& name,
                                  const std::function<void(std::vector<uint8_t>&)>& edit) {
    const GgufFile f = GgufFile::open(src);
    GgufWriter w(3);
    w.copy_metadata(f);
    std::vector<uint8_t> bytes;
    for (const auto& t : f.tensors()) {
      if (t.name != name) {
        w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
        continue;
      }
      bytes.assign(t.data, t.data + t.n_bytes);
      edit(bytes);
      w.add_tensor(t.name, t.type, t.ne, bytes.data(), bytes.size());
    }
    const std::string out = file(out_name);
    w.write(out);
    return out;
  }

  static std::string dir_;
};

std::string CliFiles::dir_;

// ---- 6: outputs ------------------------------------------------------------------------------

TEST_F(CliFiles, FullDeviceOutputFailsWithNoSpaceAndStaysADevice) {
  const std::string full = char_device("full", 7);
  for (const std::string& cmd : {"synth --shape stories260k -o " + full,
                                 "logits -m " + model() + " --ids \"1 2 3\" -o " + full,
                                 "quantize " + model() + " " + full + " --type q8_0 --json"}) {
    const Result r = tern(cmd);
    EXPECT_EQ(r.rc, 1) << cmd << "\n" << r.err;
    EXPECT_TRUE(contains(r.err, "cannot write " + full + ": No space left on device")) << cmd << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    ASSERT_TRUE(is_char_device(full)) << cmd << " replaced the device node";
  }
}

TEST_F(CliFiles, NullDeviceOutputStaysADevice) {
  const std::string null = char_device("null", 3);
  const Result r = tern("synth --shape stories260k -o " + null);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(is_char_device(null)) << "synth replaced the device node";
}

TEST_F(CliFiles, FifoOutputIsWrittenThrough) {
  const std::string fifo = file("model.fifo");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Opened read-write so that neither side blocks in open(); read until 2 s pass without data.
  std::string got;
  std::thread reader([&] {
    const int fd = ::open(fifo.c_str(), O_RDWR);
    if (fd < 0) return;
    char buf[1 << 16];
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, 2000) > 0) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      got.append(buf, size_t(n));
    }
    ::close(fd);
  });
  const std::string synth = "synth --shape stories260k --type q8_0 --seed 5 -o ";
  const Result r = tern(synth + fifo);
  reader.join();
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_EQ(tern(synth + file("model-q8_0.gguf")).rc, 0);
  EXPECT_TRUE(got == read_file_bytes(file("model-q8_0.gguf"))) << got.size() << " bytes came through the FIFO";
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "synth replaced the FIFO";
}

TEST_F(CliFiles, SymlinkOutputReplacesItsTargetAndStaysALink) {
  const std::string target = file("real.gguf"), link = file("link.gguf");
  ::unlink(link.c_str());
  std::ofstream(target) << "old";
  ::chmod(target.c_str(), 0640);
  fs::create_symlink("real.gguf", link);
  const Result r = tern("synth --shape stories260k -o " + link);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(link)) << "the link was replaced by a file";
  EXPECT_EQ(read_file_bytes(target).rfind("GGUF", 0), 0u);
  struct stat st {};
  ASSERT_EQ(::stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u) << "the replaced file lost its permissions";
  EXPECT_EQ(temporaries(), 0);
}

TEST_F(CliFiles, DirectoryOutputIsRefused) {
  const std::string d = file("a-directory");
  fs::create_directories(d);
  const Result r = tern("synth --shape stories260k -o " + d);
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, d + ": it is a directory")) << r.err;
  EXPECT_TRUE(fs::is_directory(d));
  EXPECT_EQ(temporaries(), 0);
}

// A write that fails half-way (here: the file-size limit) keeps the old file and leaves no
// temporary file behind.
TEST_F(CliFiles, FailedWriteKeepsTheOldFileAndNoTemporary) {
  const std::string out = file("limited.gguf");
  std::ofstream(out) << "old contents";
  const Result r = tern_in_shell("trap '' XFSZ; ulimit -f 64; " + kTern + " synth --shape stories260k -o " + out);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "cannot write " + out + ": File too large")) << r.err;
  EXPECT_EQ(read_file_bytes(out), "old contents");
  EXPECT_EQ(temporaries(), 0);
}

// ---- 7: an output is never an input ----------------------------------------------------------

TEST_F(CliFiles, OutputOverAnInputIsRefused) {
  const std::string copy = file("input-copy.gguf"), hard = file("input-hard.gguf");
  fs::copy_file(model(), copy, fs::copy_options::overwrite_existing);
  ::unlink(hard.c_str());
  fs::create_hard_link(copy, hard);
  const std::string before = read_file_bytes(copy);
  const std::string calib = file("calib.txt");
  fs::copy_file(file("text.txt"), calib, fs::copy_options::overwrite_existing);
  for (const std::string& cmd : {"logits -m " + copy + " --ids \"1 2\" -o " + hard,
                                 "logits -m " + copy + " --ids \"1 2\" -o " + dir_ + "/./input-copy.gguf",
                                 "synth --shape stories260k --vocab " + copy + " -o " + hard,
                                 "quantize " + copy + " " + hard + " --type q8_0",
                                 "quantize " + copy + " " + calib + " --method llm.int8 --calib " + calib +
                                     " --calib-tokens 16",
                                 "compare -m " + copy + " --speed-only --methods q8_0 --json-out " + hard,
                                 "compare -m " + copy + " --ppl-file " + calib + " --methods q8_0 --chart " + calib}) {
    const Result r = tern(cmd);
    EXPECT_EQ(r.rc, 1) << cmd << "\n" << r.err;
    EXPECT_TRUE(contains(r.err, "is the input file")) << cmd << "\n" << r.err;
    EXPECT_EQ(r.out, "") << cmd;
  }
  EXPECT_TRUE(read_file_bytes(copy) == before) << "an input was overwritten";
  EXPECT_EQ(read_file_bytes(calib), read_file_bytes(file("text.txt"))) << "the calibration text was overwritten";
}

TEST_F(CliFiles, ConvertOutputOverItsCheckpointOrTokenizerIsRefused) {
  TERN_REQUIRE_SHARED("models/stories260K-llama2c/stories260K.bin");
  TERN_REQUIRE_SHARED("models/stories260K-llama2c/tok512.bin");
  const std::string bin = file("c.bin"), tok = file("tok.bin");
  fs::copy_file(shared_path("models/stories260K-llama2c/stories260K.bin"), bin, fs::copy_options::overwrite_existing);
  fs::copy_file(shared_path("models/stories260K-llama2c/tok512.bin"), tok, fs::copy_options::overwrite_existing);
  const std::string bin_bytes = read_file_bytes(bin), tok_bytes = read_file_bytes(tok);
  const std::string link = file("c-link.bin");
  ::unlink(link.c_str());
  fs::create_symlink(bin, link);
  for (const std::string& out : {bin, dir_ + "/./c.bin", link, tok}) {
    const Result r = tern("convert " + bin + " --tokenizer " + tok + " -o " + out);
    EXPECT_EQ(r.rc, 1) << out << "\n" << r.err;
    EXPECT_TRUE(contains(r.err, "is the input file")) << r.err;
  }
  EXPECT_TRUE(read_file_bytes(bin) == bin_bytes) << "the checkpoint was overwritten";
  EXPECT_TRUE(read_file_bytes(tok) == tok_bytes) << "the tokenizer was overwritten";
}

// ---- 8: compare's outputs --------------------------------------------------------------------

const std::string kQuickCompare = " --speed-only --methods q8_0 --gen-tokens 2 --prompt-tokens 4 -t 1";

TEST_F(CliFiles, CompareRefusesABadOutputPathBeforeAnyWork) {
  const std::string d = file("compare-dir");
  fs::create_directories(d);
  for (const std::string& opt : {std::string(" --chart /nonexistent/c.svg"), std::string(" --json-out /nonexistent/c.json"),
                                 " --json-out " + d,
                                 " --chart " + file("same.out") + " --json-out " + file("same.out")}) {
    const Result r = tern("compare -m " + model() + kQuickCompare + opt);
    EXPECT_EQ(r.rc, 1) << opt << "\n" << r.err;
    EXPECT_EQ(r.out, "") << opt;
    EXPECT_FALSE(contains(r.err, "generating")) << opt << ": the error came after the work\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// The table comes first; a file that then cannot be written is an error, but what was measured
// is on stdout. Fallbacks are said: stories260k's ffn_down rows (172) do not fit q8_0's blocks.
TEST_F(CliFiles, CompareTableSurvivesAFailedWriteAndNamesFallbacks) {
  const std::string full = char_device("full", 7);
  const Result r = tern("compare -m " + model() + kQuickCompare + " --chart " + full);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "cannot write " + full + ": No space left on device")) << r.err;
  EXPECT_TRUE(contains(r.out, "| q8_0 |")) << r.out;
  EXPECT_TRUE(contains(r.out, "| fallbacks |")) << r.out;
  EXPECT_TRUE(contains(r.out, "| 5/37 to f16 |")) << r.out;
  EXPECT_TRUE(contains(r.out, "note: q8_0: 5 of 37 tensors fell back from q8_0 to f16 (rows of 172 are not a "
                              "multiple of 32)"))
      << r.out;
  EXPECT_TRUE(is_char_device(full));

  const std::string json_out = file("compare.json");
  const Result j = tern("compare -m " + model() + kQuickCompare + " --json --json-out " + json_out);
  ASSERT_EQ(j.rc, 0) << j.err;
  const auto rows = nlohmann::json::parse(j.out);
  EXPECT_EQ(nlohmann::json::parse(read_file_bytes(json_out)), rows);
  ASSERT_EQ(rows.size(), 1u);
  const auto& row = rows[0];
  for (const char* k : {"n_fallbacks", "n_converted", "fallbacks", "notes"}) ASSERT_TRUE(row.contains(k)) << k;
  EXPECT_EQ(row["n_fallbacks"], 5);
  EXPECT_EQ(row["n_converted"], 37);  // 5 layers x 7, token_embd, output
  ASSERT_EQ(row["fallbacks"].size(), 1u);
  EXPECT_EQ(row["fallbacks"][0]["requested"], "q8_0");
  EXPECT_EQ(row["fallbacks"][0]["type"], "f16");
  EXPECT_EQ(row["fallbacks"][0]["n_tensors"], 5);
  EXPECT_EQ(row["fallbacks"][0]["row_lengths"], nlohmann::json({172}));
  EXPECT_TRUE(contains(row["notes"].get<std::string>(), "5 of 37 tensors fell back")) << row;
}

// ---- 9: text inputs --------------------------------------------------------------------------

TEST_F(CliFiles, DirectoryOrMissingTextFileIsAnError) {
  const std::string d = file("text-dir");
  fs::create_directories(d);
  const std::string m = "-m " + model() + " ";
  for (const std::string& what : {d, file("missing.txt")}) {
    const std::string why = what == d ? ": Is a directory" : ": No such file or directory";
    for (const std::string& cmd : {"tokenize " + m + "-f " + what, "run " + m + "-f " + what + " -n 2",
                                   "ppl " + m + "-f " + what, "compare " + m + "--methods q8_0 --ppl-file " + what,
                                   "bench-serve " + m + "--prompts " + what + " --num-prompts 1",
                                   "quantize " + model() + " " + file("q.gguf") + " --method llm.int8 --calib " + what}) {
      const Result r = tern(cmd);
      EXPECT_EQ(r.rc, 1) << cmd << "\n" << r.err;
      EXPECT_TRUE(contains(r.err, what + why)) << cmd << "\n" << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << cmd << "\n" << r.err;
    }
  }
}

// ---- 10: perplexity figures that mean nothing ------------------------------------------------

TEST_F(CliFiles, PplRefusesZeroChunksALongerContextAndAShortText) {
  const std::string m = "ppl -m " + model() + " ";
  Result r = tern(m + "-f " + file("text.txt") + " --ctx 64 --chunks 0");
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--chunks")) << r.err;
  r = tern(m + "-f " + file("text.txt") + " --ctx 1024");  // the synth shape's context is 512
  EXPECT_EQ(r.rc, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "training context of 512")) << r.err;
  EXPECT_TRUE(contains(r.err, "--ctx 512")) << r.err;
  std::ofstream(file("short.txt")) << "Once upon a time.";
  r = tern(m + "-f " + file("short.txt") + " --ctx 64");
  EXPECT_EQ(r.rc, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "too short")) << r.err;
  EXPECT_FALSE(contains(r.out + r.err, "nan"));
  r = tern(m + "-f " + file("text.txt") + " --ctx 64 --chunks 2 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(std::isfinite(nlohmann::json::parse(r.out)["ppl"].get<double>()));
}

// ---- 13: model files -------------------------------------------------------------------------

TEST_F(CliFiles, ModelFileIsKnownByItsMagicNotItsName) {
  const std::string as_bin = file("gguf-named.bin");
  fs::copy_file(model(), as_bin, fs::copy_options::overwrite_existing);
  Result r = tern("run -m " + as_bin + " -p hi -n 2 --temp 0");
  EXPECT_EQ(r.rc, 0) << r.err;
  r = tern("run -m " + model() + " --tokenizer " + file("text.txt") + " -p hi -n 2");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "is a GGUF file")) << r.err;
  const std::string not_gguf = file("text-named.gguf");
  fs::copy_file(file("text.txt"), not_gguf, fs::copy_options::overwrite_existing);
  r = tern("run -m " + not_gguf + " -p hi");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, not_gguf + ": not a GGUF file")) << r.err;
}

TEST_F(CliFiles, Llama2cCheckpointNamedGgufLoadsWithItsTokenizer) {
  TERN_REQUIRE_SHARED("models/stories260K-llama2c/stories260K.bin");
  TERN_REQUIRE_SHARED("models/stories260K-llama2c/tok512.bin");
  const std::string as_gguf = file("llama2c-named.gguf");
  fs::copy_file(shared_path("models/stories260K-llama2c/stories260K.bin"), as_gguf, fs::copy_options::overwrite_existing);
  Result r = tern("run -m " + as_gguf + " --tokenizer " + shared_path("models/stories260K-llama2c/tok512.bin") +
                  " -p \"Once upon a time\" -n 4 --temp 0");
  EXPECT_EQ(r.rc, 0) << r.err;
  r = tern("run -m " + as_gguf + " -p hi");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "not a GGUF file")) << r.err;
}

TEST_F(CliFiles, NonFiniteWeightIsAnErrorNamingFileTensorAndShape) {
  const std::string bad = edited_model("nan-f32.gguf", model(), "blk.1.ffn_up.weight", [](std::vector<uint8_t>& b) {
    const float nan = std::nanf("");
    std::memcpy(b.data() + 4 * 1000, &nan, 4);
  });
  Result r = tern("run -m " + bad + " -p hi -n 2 --temp 0");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_TRUE(contains(r.err, bad + ": tensor blk.1.ffn_up.weight (f32, 64 x 172) holds a non-finite value")) << r.err;

  // Quantized: a block scale (Q8_0's d, the first two bytes of each 34-byte block) set to Inf.
  ASSERT_EQ(tern("quantize " + model() + " " + file("q8.gguf") + " --type q8_0").rc, 0);
  const std::string bad_q = edited_model("inf-q8_0.gguf", file("q8.gguf"), "blk.2.attn_q.weight", [](std::vector<uint8_t>& b) {
    const uint16_t inf = 0x7C00;
    std::memcpy(b.data() + 34 * 7, &inf, 2);
  });
  r = tern("run -m " + bad_q + " -p hi -n 2 --temp 0");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_TRUE(contains(r.err, bad_q + ": tensor blk.2.attn_q.weight (q8_0, 64 x 64) holds a non-finite value")) << r.err;
  EXPECT_TRUE(contains(r.err, "block 7")) << r.err;
}

// Finite weights whose activations overflow make every logit NaN (here the final norm's weight
// is the largest float: normalised values past 1 become +-Inf, and the output projection adds
// Infs of both signs): an error, not token 0 as the answer.
TEST_F(CliFiles, NanLogitsDuringGenerationAreAnError) {
  const std::string bad = edited_model("overflow.gguf", model(), "output_norm.weight", [](std::vector<uint8_t>& b) {
    for (size_t i = 0; i + 4 <= b.size(); i += 4) {
      const float big = std::numeric_limits<float>::max();
      std::memcpy(b.data() + i, &big, 4);
    }
  });
  const Result r = tern("run -m " + bad + " -p hi -n 4 --temp 0 --json");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_TRUE(contains(r.err, "NaN")) << r.err;
}

}  // namespace
}  // namespace tern::test_cli_files
