// A ProgressBoard in memory the daemon shares with its job's process: the
// process writes each step there and the daemon's heartbeats read it, with
// no message per step. Its fields are lock-free atomics, which work across
// processes as within one.
#ifndef DDP_WORKER_PROCESS_SHARED_BOARD_H_
#define DDP_WORKER_PROCESS_SHARED_BOARD_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/link/progress_board.h"

namespace ddp {

class SharedBoard {
 public:
  // A new board (zeroed) in a memory file; fd() is for the job's process.
  static absl::StatusOr<std::unique_ptr<SharedBoard>> Create();
  // The board behind `fd` (a Create's, inherited by the job's process).
  static absl::StatusOr<std::unique_ptr<SharedBoard>> Map(int fd);
  ~SharedBoard();
  SharedBoard(const SharedBoard&) = delete;
  SharedBoard& operator=(const SharedBoard&) = delete;

  ProgressBoard* board() const { return board_; }
  int fd() const { return fd_; }
  // Back to no generation, no phase (its process is gone).
  void Reset();

 private:
  SharedBoard(int fd, ProgressBoard* board) : fd_(fd), board_(board) {}
  const int fd_;
  ProgressBoard* const board_;
};

}  // namespace ddp

#endif  // DDP_WORKER_PROCESS_SHARED_BOARD_H_
