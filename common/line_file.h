// A file of lines that a killed process can't corrupt: each line is
// appended with one write(2) of the whole line and its newline (O_APPEND),
// so lines never interleave and at most the last line is cut (a SIGKILL
// while its write copies it, or a full disk); a process that finds the
// last line unended ends it first, so that its own first line starts on a
// line of its own.
#ifndef DDP_COMMON_LINE_FILE_H_
#define DDP_COMMON_LINE_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ddp {

class LineFile {
 public:
  // Opens (creates) `path` for appending. The error says which file and why.
  static absl::StatusOr<LineFile> Open(const std::string& path);
  LineFile(LineFile&& other) noexcept;
  LineFile& operator=(LineFile&& other) noexcept;
  ~LineFile();

  // Appends `line` (without its newline) and a newline, in one write.
  // Best effort: an error is logged once, and the line is dropped.
  void Append(absl::string_view line);

 private:
  explicit LineFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
  bool complained_ = false;
};

}  // namespace ddp

#endif  // DDP_COMMON_LINE_FILE_H_
