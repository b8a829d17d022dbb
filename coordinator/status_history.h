// The recent past of each rank's training curve, for the status page: a
// snapshot only holds the latest loss and rate, but a person wants to see
// where they came from.
//
// Bounded: at most Options::max_ranks ranks (higher ranks are not kept) of
// at most Options::max_points_per_rank points each (the oldest go first), so
// a long job or a huge world costs a fixed amount of memory.
//
// Thread-safe: Record() is called by the coordinator's ticker, ToJson() by
// HTTP handler threads; each holds the lock only to copy a few vectors.
#ifndef DDP_COORDINATOR_STATUS_HISTORY_H_
#define DDP_COORDINATOR_STATUS_HISTORY_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "ddp/v1/status.pb.h"

namespace ddp {

class StatusHistory {
 public:
  struct Options {
    size_t max_points_per_rank = 600;
    size_t max_ranks = 64;
  };

  // One reported step of one rank.
  struct Point {
    double unix_seconds = 0;  // when the coordinator first saw this step
    uint64_t step = 0;
    double loss = 0;
    double samples_per_sec = 0;
  };

  struct RankCurve {
    uint32_t rank = 0;
    std::string worker_id;      // who held the rank at its newest point
    std::vector<Point> points;  // oldest first, steps increasing
  };

  // `clock` is not owned and must outlive this.
  StatusHistory(const Clock* clock, Options options);

  // Adds a point for every member whose step moved since its rank's last
  // point. A new job_id starts over; a rank whose step went back (the job
  // resumed from an older checkpoint) loses its points from that step on,
  // because those steps will be trained again.
  void Record(const v1::JobStatus& status);

  // Ranks with at least one point, by rank.
  std::vector<RankCurve> Curves() const;

  // {"job_id":"…","max_points_per_rank":600,"ranks":[{"rank":0,
  // "worker_id":"…","points":[[unix_seconds,step,loss,samples_per_sec],…]}]}
  // (a non-finite number is null).
  std::string ToJson() const;

 private:
  struct Series {
    std::string worker_id;
    std::deque<Point> points;
  };

  const Clock* clock_;
  const Options options_;
  mutable absl::Mutex mu_;
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  std::vector<Series> ranks_ ABSL_GUARDED_BY(mu_);  // index: rank
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_STATUS_HISTORY_H_
