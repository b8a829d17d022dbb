// Tells when silence is the coordinator's own doing, not the workers': the
// process did not run for a while (SIGSTOP, a frozen VM, a swap storm, a
// cgroup freeze, a clock jump), or it ran but heard nobody (its gRPC threads
// starved, its network cut). Heartbeats that waited on the streams meanwhile
// are no evidence against their workers, so no worker may be counted lost or
// hung for that time: the Coordinator skips its sweeps while deaf and gives
// every worker a fresh grace once it runs and hears again.
//
// Not thread-safe: the Coordinator calls it under its own lock.
#ifndef DDP_COORDINATOR_STALL_WATCH_H_
#define DDP_COORDINATOR_STALL_WATCH_H_

#include <cstddef>

#include "absl/time/time.h"

namespace ddp {

class StallWatch {
 public:
  struct Options {
    // Two ticks further apart than this: the coordinator did not run in
    // between.
    absl::Duration max_tick_gap = absl::Seconds(1);
    // No worker heard for this long while some are attached: the
    // coordinator is deaf, not every worker dead at once (a lone dead
    // worker's stream is still closed by the transport's keepalive).
    absl::Duration deaf_after = absl::Milliseconds(2500);
  };

  // The options for a heartbeat timeout and interval: a gap of a quarter of
  // the timeout, deaf after half of it, but never before two heartbeats
  // could have come (nor after the timeout itself).
  static Options ForHeartbeats(absl::Duration timeout, absl::Duration interval);

  StallWatch(Options options, absl::Time now) : options_(options), last_tick_(now), heard_(now) {}

  // At every tick, with `attached` workers: how long the coordinator did
  // not run before this tick (zero when the gap was within max_tick_gap).
  absl::Duration OnTick(absl::Time now, size_t attached);
  // A worker said something (or attached); `attached` counts it. Returns
  // how long the coordinator had been deaf, if it was (zero otherwise).
  absl::Duration OnHeard(absl::Time now, size_t attached);
  // Whether silence now says nothing about the workers: `attached` workers,
  // and none heard for deaf_after.
  bool Deaf(absl::Time now, size_t attached) const;

 private:
  const Options options_;
  absl::Time last_tick_;
  absl::Time heard_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_STALL_WATCH_H_
