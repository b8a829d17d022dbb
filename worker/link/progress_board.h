// What a worker's heartbeats say while a step is in flight, and what it
// claims when it registers again after a lost stream.
#ifndef DDP_WORKER_LINK_PROGRESS_BOARD_H_
#define DDP_WORKER_LINK_PROGRESS_BOARD_H_

#include <atomic>
#include <cstdint>

namespace ddp {

struct ProgressBoard {
  std::atomic<uint64_t> generation{0};
  std::atomic<uint32_t> rank{0};
  std::atomic<uint64_t> step{0};
  std::atomic<uint64_t> epoch{0};
  std::atomic<uint64_t> cursor{0};
  std::atomic<int> phase{0};
  // The phase's own bound, in seconds (0: none).
  std::atomic<double> phase_bound_seconds{0};
};

}  // namespace ddp

#endif  // DDP_WORKER_LINK_PROGRESS_BOARD_H_
