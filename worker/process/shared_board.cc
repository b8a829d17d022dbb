#include "worker/process/shared_board.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<int>::is_always_lock_free && std::atomic<double>::is_always_lock_free,
              "a shared board needs lock-free atomics (address-free across processes)");

absl::StatusOr<ProgressBoard*> MapBoard(int fd) {
  void* p = ::mmap(nullptr, sizeof(ProgressBoard), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mmap of the progress board: ", std::strerror(errno)));
  }
  return static_cast<ProgressBoard*>(p);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedBoard>> SharedBoard::Create() {
  const int fd = ::memfd_create("ddp-progress-board", MFD_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  if (::ftruncate(fd, sizeof(ProgressBoard)) != 0) {
    const int e = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("ftruncate of the progress board: ", std::strerror(e)));
  }
  absl::StatusOr<ProgressBoard*> mapped = MapBoard(fd);
  if (!mapped.ok()) {
    ::close(fd);
    return mapped.status();
  }
  new (*mapped) ProgressBoard();
  return std::unique_ptr<SharedBoard>(new SharedBoard(fd, *mapped));
}

absl::StatusOr<std::unique_ptr<SharedBoard>> SharedBoard::Map(int fd) {
  absl::StatusOr<ProgressBoard*> mapped = MapBoard(fd);
  if (!mapped.ok()) return mapped.status();
  return std::unique_ptr<SharedBoard>(new SharedBoard(fd, *mapped));
}

SharedBoard::~SharedBoard() {
  ::munmap(board_, sizeof(ProgressBoard));
  ::close(fd_);
}

void SharedBoard::Reset() {
  board_->generation = 0;
  board_->phase = 0;
  board_->phase_bound_seconds = 0;
}

}  // namespace ddp
