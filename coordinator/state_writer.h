// Saves the coordinator's durable state on a thread of its own, so that no
// gRPC thread waits for the disk (an fsync can take a long time). The newest
// state wins: one queued behind a write in progress replaces any older one
// still queued.
//
// Thread-safe.
#ifndef DDP_COORDINATOR_STATE_WRITER_H_
#define DDP_COORDINATOR_STATE_WRITER_H_

#include <cstdint>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/state_store.h"

namespace ddp {

class StateWriter {
 public:
  // `store` outlives the writer.
  explicit StateWriter(StateStore* store);
  // Writes what is queued, then stops.
  ~StateWriter();
  StateWriter(const StateWriter&) = delete;
  StateWriter& operator=(const StateWriter&) = delete;

  // Queues `state` as version `sequence`; never blocks on the disk.
  void Post(uint64_t sequence, v1::DurableState state);
  // Returns once everything posted before the call is on disk.
  void Flush();

 private:
  void Loop();

  StateStore* const store_;
  absl::Mutex mu_;
  std::optional<std::pair<uint64_t, v1::DurableState>> queued_ ABSL_GUARDED_BY(mu_);
  uint64_t posted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_STATE_WRITER_H_
