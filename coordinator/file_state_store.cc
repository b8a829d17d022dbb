#include "coordinator/file_state_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<FileStateStore>> FileStateStore::Open(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return Errno(absl::StrCat("can't create state directory ", dir));
  }
  if (::access(dir.c_str(), W_OK) != 0) return Errno(absl::StrCat("can't write to ", dir));
  return std::unique_ptr<FileStateStore>(
      new FileStateStore(absl::StrCat(dir, "/coordinator.state")));
}

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
  saved_sequence_ = sequence;
  return absl::OkStatus();
}

}  // namespace ddp
