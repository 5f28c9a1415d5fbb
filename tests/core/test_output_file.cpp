// core/output_file and core/read_file: outputs replace a regular file atomically (keeping its
// permissions), write through symbolic links, devices and pipes, refuse directories and
// report every write error; inputs refuse directories; an output is never one of the inputs.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "test_util.h"
#include "core/output_file.h"
#include "core/read_file.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tern_output_XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }
  // Every entry's name, to see that no temporary file is left behind.
  std::vector<std::string> entries() const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(path_)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  }

 private:
  std::string path_;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

mode_t mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

using tern::testing::error_of;

// A character device like /dev/full (1, 7) or /dev/null (1, 3) inside `dir` where mknod is
// allowed (root), so that a broken writer replaces a node of the test's own, never the
// system's; else the system's node (which only root could replace).
std::string char_device(const TempDir& dir, const char* name, unsigned minor) {
  const std::string p = dir.file(name);
  if (::mknod(p.c_str(), S_IFCHR | 0666, makedev(1, minor)) == 0) return p;
  return std::string("/dev/") + name;
}

TEST(OutputFile, NewFileGetsItsContentAndTheUmaskMode) {
  TempDir dir;
  const std::string p = dir.file("new.txt");
  write_output_file(p, std::string("hello\0world", 11));
  EXPECT_EQ(slurp(p), std::string("hello\0world", 11));
  const mode_t mask = ::umask(022);
  ::umask(mask);
  EXPECT_EQ(mode_of(p), 0666 & ~mask);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"new.txt"});  // no temporary file left
}

TEST(OutputFile, ReplacedFileKeepsItsPermissions) {
  TempDir dir;
  const std::string p = dir.file("old.txt");
  std::ofstream(p) << "old contents";
  ::chmod(p.c_str(), 0640);
  write_output_file(p, "new");
  EXPECT_EQ(slurp(p), "new");
  EXPECT_EQ(mode_of(p), 0640u);
}

TEST(OutputFile, SymbolicLinkStaysALinkAndItsTargetIsReplaced) {
  TempDir dir;
  const std::string target = dir.file("target.txt"), link = dir.file("link.txt");
  std::ofstream(target) << "old";
  fs::create_symlink("target.txt", link);
  write_output_file(link, "new");
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(slurp(target), "new");
  // A link to nothing yet: the file it names is created, the link kept.
  const std::string dangling = dir.file("dangling.txt");
  fs::create_symlink("sub/made.txt", dangling);
  fs::create_directory(dir.file("sub"));
  write_output_file(dangling, "made");
  EXPECT_TRUE(fs::is_symlink(dangling));
  EXPECT_EQ(slurp(dir.file("sub/made.txt")), "made");
}

TEST(OutputFile, DirectoryIsRefused) {
  TempDir dir;
  const std::string e = error_of([&] { write_output_file(dir.path(), "x"); });
  EXPECT_NE(e.find(dir.path() + ": it is a directory"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { check_output_path(dir.path()); }).find("is a directory"), std::string::npos);
  EXPECT_TRUE(fs::is_directory(dir.path()));
}

TEST(OutputFile, FullDeviceIsWrittenThroughAndReportsNoSpace) {
  TempDir dir;
  const std::string full = char_device(dir, "full", 7);
  const std::string e = error_of([&] { write_output_file(full, std::string(1 << 16, 'x')); });
  EXPECT_NE(e.find("cannot write " + full + ": No space left on device"), std::string::npos) << e;
  struct stat st {};
  ASSERT_EQ(::stat(full.c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << full << " was replaced";
  const std::string null = char_device(dir, "null", 3);
  write_output_file(null, "discarded");
  ASSERT_EQ(::stat(null.c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << null << " was replaced";
}

TEST(OutputFile, FifoIsWrittenThrough) {
  TempDir dir;
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string got;
  std::thread reader([&] { got = slurp(fifo); });
  write_output_file(fifo, "through the pipe");
  reader.join();
  EXPECT_EQ(got, "through the pipe");
  struct stat st {};
  ASSERT_EQ(::stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST(OutputFile, UncommittedOutputLeavesTheOldFile) {
  TempDir dir;
  const std::string p = dir.file("keep.txt");
  std::ofstream(p) << "old";
  {
    OutputFile f(p);
    f.write("half of a new");
  }  // an error before commit(): destroyed unfinished
  EXPECT_EQ(slurp(p), "old");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"keep.txt"});
}

TEST(OutputFile, MissingDirectoryIsAClearError) {
  const std::string e = error_of([] { write_output_file("/nonexistent-dir/x.bin", "x"); });
  EXPECT_NE(e.find("cannot create /nonexistent-dir/x.bin: No such file or directory"), std::string::npos) << e;
  const std::string c = error_of([] { check_output_path("/nonexistent-dir/x.bin"); });
  EXPECT_NE(c.find("/nonexistent-dir"), std::string::npos) << c;
  EXPECT_NE(c.find("No such file or directory"), std::string::npos) << c;
  EXPECT_EQ(error_of([] { check_output_path("relative-new-file.txt"); }), "");
}

TEST(OutputFile, SameFileAsAnInputIsRefusedHoweverItIsSpelled) {
  TempDir dir;
  const std::string in = dir.file("in.bin");
  std::ofstream(in) << "input";
  fs::create_hard_link(in, dir.file("hard.bin"));
  fs::create_symlink(in, dir.file("soft.bin"));
  for (const std::string& out : {in, dir.path() + "/./in.bin", dir.file("hard.bin"), dir.file("soft.bin")}) {
    const std::string e = error_of([&] { check_output_not_input(out, {"", dir.file("other"), in}); });
    EXPECT_NE(e.find("the output " + out + " is the input file " + in), std::string::npos) << e;
  }
  std::ofstream(dir.file("other.bin")) << "other";
  EXPECT_EQ(error_of([&] { check_output_not_input(dir.file("other.bin"), {in}); }), "");
  EXPECT_EQ(error_of([&] { check_output_not_input(dir.file("new.bin"), {in}); }), "");
  EXPECT_EQ(slurp(in), "input");
}

TEST(ReadFileText, ReadsExactBytesAndRefusesDirectories) {
  TempDir dir;
  const std::string p = dir.file("t.txt");
  std::ofstream(p, std::ios::binary) << std::string("a\0b\r\n", 5);
  EXPECT_EQ(read_file_text(p, "text"), std::string("a\0b\r\n", 5));
  const std::string d = error_of([&] { read_file_text(dir.path(), "prompt file"); });
  EXPECT_EQ(d, "cannot read prompt file " + dir.path() + ": Is a directory");
  const std::string m = error_of([&] { read_file_text(dir.file("missing"), "text file"); });
  EXPECT_EQ(m, "cannot open text file " + dir.file("missing") + ": No such file or directory");
}

}  // namespace
}  // namespace tern
