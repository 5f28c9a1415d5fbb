#pragma once
// Writing a file the user named (-o, --json-out, --chart, a quantized model), so that the CLI
// never loses one:
//  - a regular file or a new path is written to a unique temporary file in the same directory,
//    flushed to disk (fsync) and renamed over the path: a reader sees the old file or the whole
//    new one, and a failed write leaves the old file as it was. A replaced file keeps its
//    permission bits; a new one gets 0666 less the umask, as open(2) would give it;
//  - a symbolic link is followed: its target is replaced that way and the link stays a link;
//  - a character device or FIFO (/dev/null, /dev/full, /dev/stdout on a pipe, a named pipe) is
//    written through, as a shell redirection would (renaming over it would replace the node);
//  - a directory is refused.
// Every failed write, fsync, close or rename (ENOSPC on a full disk or /dev/full) is a
// tern::Error naming the path and the reason, and the temporary file is removed.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace tern {

class OutputFile {
 public:
  // Creates the temporary file (or opens the special file); throws tern::Error when it cannot.
  explicit OutputFile(const std::string& path);
  // Without commit(): removes the temporary file, the path keeps what it had.
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // Flushes, closes and renames the temporary file over the path. Throws on any error.
  void commit();

 private:
  void fail_with(const char* action, int err);

  std::string path_;    // as the user named it (for messages)
  std::string target_;  // the file replaced: path_ with symbolic links resolved
  std::string tmp_;     // the temporary file; empty when writing through a special file
  int fd_ = -1;
};

// The whole of `data` to `path`, as OutputFile writes it.
void write_output_file(const std::string& path, const void* data, size_t n);
inline void write_output_file(const std::string& path, std::string_view text) {
  write_output_file(path, text.data(), text.size());
}

// For checks before slow work: throws tern::Error when `path` could not be written (it is a
// directory, its directory is missing or not writable, a special file is not writable).
void check_output_path(const std::string& path);

// Throws tern::Error when `out` is the same file as one of `inputs` (same device and inode, so
// hard links, symbolic links and other spellings of a path count). Empty inputs are skipped;
// an output that does not exist yet is no input.
void check_output_not_input(const std::string& out, const std::vector<std::string>& inputs);

// A new, empty scratch file for intermediate work toward `out`: created exclusively (mkstemp)
// beside it, or in the system's temporary directory when that directory is not writable (`out`
// a device such as /dev/null), so it never replaces a file that was there. The caller removes it.
std::string make_scratch_file(const std::string& out, const std::string& tag);

}  // namespace tern
