// Saves the coordinator's durable state on a thread of its own, so that no
// gRPC thread waits for the disk (an fsync can take a long time) or for
// etcd. The newest state wins: one queued behind a write in progress
// replaces any older one still queued, so concurrent changes are saved
// together in one write.
//
// What a client is told succeeded must be durable first: Post takes a
// callback that runs once the state of that version (or a newer one, which
// holds it too) is saved, with OK, or with UNAVAILABLE naming why the save
// failed.
//
// Thread-safe. Callbacks run on the writer's thread, without its lock held;
// they may Post again.
#ifndef DDP_COORDINATOR_STATE_WRITER_H_
#define DDP_COORDINATOR_STATE_WRITER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/state_store.h"

namespace ddp {

class StateWriter {
 public:
  // Runs once the state it was posted with is saved, or could not be.
  using Durable = std::function<void(absl::Status)>;

  // `store` outlives the writer.
  explicit StateWriter(StateStore* store);
  // Writes what is queued, then stops.
  ~StateWriter();
  StateWriter(const StateWriter&) = delete;
  StateWriter& operator=(const StateWriter&) = delete;

  // Queues `state` as version `sequence`; never blocks on the disk. Each of
  // `done` runs once version `sequence` or a later one was saved (OK), or
  // the save that would have held it failed (UNAVAILABLE).
  void Post(uint64_t sequence, v1::DurableState state, std::vector<Durable> done = {});
  // Returns once everything posted before the call is on disk.
  void Flush();

 private:
  void Loop();

  StateStore* const store_;
  absl::Mutex mu_;
  std::optional<std::pair<uint64_t, v1::DurableState>> queued_ ABSL_GUARDED_BY(mu_);
  uint64_t posted_ ABSL_GUARDED_BY(mu_) = 0;
  // The newest version a save was tried for, and the newest one saved.
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t saved_ ABSL_GUARDED_BY(mu_) = 0;
  // Why the last failed save failed.
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  // Callbacks waiting for a save, by the version they need.
  std::multimap<uint64_t, Durable> waiting_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_STATE_WRITER_H_
