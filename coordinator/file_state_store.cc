#include "coordinator/file_state_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Takes `dir`'s lock for this process, writing its pid there; the
// descriptor, or FAILED_PRECONDITION naming the holder.
absl::StatusOr<int> LockDir(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/coordinator.lock");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Errno(absl::StrCat("can't open ", path));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char pid[32] = {};
    const ssize_t n = ::pread(fd, pid, sizeof(pid) - 1, 0);
    ::close(fd);
    if (error != EWOULDBLOCK) {
      errno = error;
      return Errno(absl::StrCat("can't lock ", path));
    }
    const std::string holder(pid, n > 0 ? static_cast<size_t>(n) : 0);
    return absl::FailedPreconditionError(absl::StrCat(
        "state directory ", dir, " is in use by another coordinator",
        holder.empty() ? "" : absl::StrCat(" (pid ", absl::StripAsciiWhitespace(holder), ")"),
        ": one coordinator per state directory; stop that one, or give this one another "
        "--state_dir"));
  }
  const std::string mine = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, mine.data(), mine.size(), 0) < 0) {
    ::close(fd);
    return Errno(absl::StrCat("can't write ", path));
  }
  return fd;
}

// The folder's entry for a file renamed into it reaches the disk too.
absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno(absl::StrCat("can't open ", dir));
  const int synced = ::fsync(fd);
  ::close(fd);
  if (synced != 0) return Errno(absl::StrCat("can't fsync ", dir));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<FileStateStore>> FileStateStore::Open(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return Errno(absl::StrCat("can't create state directory ", dir));
  }
  if (::access(dir.c_str(), W_OK) != 0) return Errno(absl::StrCat("can't write to ", dir));
  absl::StatusOr<int> lock = LockDir(dir);
  if (!lock.ok()) return lock.status();
  return std::unique_ptr<FileStateStore>(
      new FileStateStore(dir, absl::StrCat(dir, "/coordinator.state"), *lock));
}

FileStateStore::~FileStateStore() { ::close(lock_fd_); }

absl::StatusOr<std::optional<v1::DurableState>> FileStateStore::Load() const {
  std::ifstream in(path_, std::ios::binary);
  if (!in) return std::optional<v1::DurableState>();
  v1::DurableState state;
  if (!state.ParseFromIstream(&in)) {
    return absl::DataLossError(absl::StrCat(path_, " is corrupt; move it away to start fresh"));
  }
  return std::optional<v1::DurableState>(std::move(state));
}

absl::Status FileStateStore::Save(const v1::DurableState& state, uint64_t sequence) {
  absl::MutexLock lock(&mu_);
  if (sequence < saved_sequence_) return absl::OkStatus();
  const std::string tmp = path_ + ".tmp";
  const std::string bytes = state.SerializeAsString();
  // Owner only: it holds the running generation's store tokens.
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno(absl::StrCat("can't write ", tmp));
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return Errno(absl::StrCat("can't write ", tmp));
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    return Errno(absl::StrCat("can't fsync ", tmp));
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path_.c_str()) != 0)
    return Errno(absl::StrCat("can't replace ", path_));
  // Acknowledged means durable: the rename itself must survive a crash.
  if (absl::Status s = SyncDir(dir_); !s.ok()) return s;
  saved_sequence_ = sequence;
  return absl::OkStatus();
}

}  // namespace ddp
