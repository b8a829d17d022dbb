// The recent past for the status page: each rank's training curve (of the
// job the status describes), and how many workers each job of the pool held
// over time. A snapshot only holds the latest loss, rate and allocation, but
// a person wants to see where they came from.
//
// Bounded: at most Options::max_ranks ranks (higher ranks are not kept) of
// at most Options::max_points_per_rank points each (the oldest go first),
// and the jobs the status lists (at most Options::max_jobs) of at most
// max_points_per_job allocations each, so a long job, a huge world or many
// jobs cost a fixed amount of memory.
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
    size_t max_jobs = 32;
    size_t max_points_per_job = 600;
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

  // What one job held from `unix_seconds` on.
  struct Allocation {
    double unix_seconds = 0;
    uint32_t workers = 0;     // workers it held (members, joiners, preparing)
    uint32_t world_size = 0;  // of its current generation (0: none)
  };

  struct JobAllocations {
    std::string job_id;
    std::vector<Allocation> points;  // oldest first, one per change
  };

  // `clock` is not owned and must outlive this.
  StatusHistory(const Clock* clock, Options options);

  // Adds a point for every member whose step moved since its rank's last
  // point. A new job_id starts over; a rank whose step went back (the job
  // resumed from an older checkpoint) loses its points from that step on,
  // because those steps will be trained again. Each job in status.jobs gets
  // a point when its workers or world size changed; jobs no longer listed
  // are forgotten.
  void Record(const v1::JobStatus& status);

  // Ranks with at least one point, by rank.
  std::vector<RankCurve> Curves() const;
  // The jobs in the order they were first seen.
  std::vector<JobAllocations> Allocations() const;

  // {"job_id":"…","max_points_per_rank":600,"ranks":[{"rank":0,
  // "worker_id":"…","points":[[unix_seconds,step,loss,samples_per_sec],…]}],
  // "jobs":[{"job_id":"…","points":[[unix_seconds,workers,world_size],…]}]}
  // (a non-finite number is null).
  std::string ToJson() const;

 private:
  struct Series {
    std::string worker_id;
    std::deque<Point> points;
  };
  struct JobSeries {
    std::string job_id;
    std::deque<Allocation> points;
  };

  void RecordAllocationsLocked(const v1::JobStatus& status, double now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* clock_;
  const Options options_;
  mutable absl::Mutex mu_;
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  std::vector<Series> ranks_ ABSL_GUARDED_BY(mu_);  // index: rank
  std::vector<JobSeries> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_STATUS_HISTORY_H_
