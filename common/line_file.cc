#include "common/line_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace ddp {

absl::StatusOr<LineFile> LineFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("can't open ", path, " for appending: ", std::strerror(errno)));
  }
  LineFile file(fd, path);
  // An unended last line (a writer killed mid-line by an older build, or a
  // full disk) is ended here, not glued to this process's first record.
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    const int reader = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    char last = '\n';
    if (reader >= 0) {
      if (::pread(reader, &last, 1, st.st_size - 1) != 1) last = '\n';
      ::close(reader);
    }
    if (last != '\n') file.Append("");
  }
  return file;
}

LineFile::LineFile(LineFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      complained_(other.complained_) {}

LineFile& LineFile::operator=(LineFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    complained_ = other.complained_;
  }
  return *this;
}

LineFile::~LineFile() {
  if (fd_ >= 0) ::close(fd_);
}

void LineFile::Append(absl::string_view line) {
  if (fd_ < 0) return;
  std::string whole(line);
  whole.push_back('\n');
  // O_APPEND: one write lands at the end, whole but for a full disk or a
  // SIGKILL while it copies (Linux stops between pages): then the line is
  // cut, and the next Open starts a new line after it.
  ssize_t n;
  do {
    n = ::write(fd_, whole.data(), whole.size());
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(whole.size()) && !complained_) {
    complained_ = true;
    DDP_LOG(Warning) << "can't append to " << path_ << ": "
                     << (n < 0 ? std::strerror(errno) : "short write") << " (said once)";
  }
}

}  // namespace ddp
