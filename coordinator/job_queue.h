// Jobs accepted while others hold the pool: they start one at a time, as
// workers free up, highest priority first and, among equal priorities, in
// the order they were submitted. Each keeps the spec its check returned (input files pinned), so
// it starts as it was accepted, however long it waited.
//
// Thread-compatible: the Coordinator guards it with its mutex.
#ifndef DDP_COORDINATOR_JOB_QUEUE_H_
#define DDP_COORDINATOR_JOB_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ddp/v1/state.pb.h"
#include "ddp/v1/status.pb.h"

namespace ddp {

// A client can make the coordinator hold this many queued jobs, no more.
inline constexpr size_t kMaxQueuedJobs = 100;
// JobStatus.queue lists this many (ListJobs pages through the rest).
inline constexpr size_t kQueueInStatus = 100;

struct QueuedJob {
  v1::JobSpec spec;
  std::string owner;
  uint64_t sequence = 0;
  absl::Time submitted_at;
  // Set when it ran and was preempted: where it stood (JobRun::FillDurable);
  // it resumes from there, from its checkpoint.
  std::shared_ptr<const v1::DurableState> preempted;
};

class JobQueue {
 public:
  // The sequence the next job submitted gets (Add), taken now: a job waiting
  // to be saved before it is queued keeps its place.
  uint64_t ReserveSequence() { return next_sequence_++; }
  // RESOURCE_EXHAUSTED when kMaxQueuedJobs (less `reserved` places) are
  // queued; ALREADY_EXISTS when a job of that name is (the caller decides
  // whether it is the same job). `job.sequence` from ReserveSequence.
  absl::Status Add(QueuedJob job, size_t reserved = 0);
  // Puts a preempted job back with its own sequence (its place among its
  // priority), over kMaxQueuedJobs if need be: it was accepted already.
  void Requeue(QueuedJob job);
  // OK to add one more beside `reserved` others (RESOURCE_EXHAUSTED as Add
  // says it).
  absl::Status CheckRoom(size_t reserved = 0) const;
  // The job named `id`, or nullptr.
  const QueuedJob* Find(absl::string_view id) const;
  // Where job `id` stands in start order (0: next), if it is queued.
  std::optional<size_t> IndexOf(absl::string_view id) const;
  // Takes job `id` off the queue; false when it isn't queued.
  bool Remove(absl::string_view id);
  // Takes job `id` off the queue to start it; nullopt when it isn't queued.
  std::optional<QueuedJob> Take(absl::string_view id);

  // In the order they will start.
  const std::vector<QueuedJob>& jobs() const { return jobs_; }
  bool empty() const { return jobs_.empty(); }
  size_t size() const { return jobs_.size(); }

  // What operators see of jobs()[index] (no spec; its position counts from
  // 1). `why`: why it waits, in the pool's words (empty: the jobs ahead of
  // it, or, for the first, that it starts next).
  v1::JobSummary Summary(size_t index, absl::Time now, absl::string_view why) const;

  void FillDurable(v1::DurableState* state) const;
  // One queued job as the durable state keeps it.
  static void FillDurableJob(const QueuedJob& job, v1::DurableQueuedJob* d);
  void Restore(const v1::DurableState& state);

 private:
  // Keeps jobs_ in start order.
  void Insert(QueuedJob job);

  std::vector<QueuedJob> jobs_;
  uint64_t next_sequence_ = 1;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_JOB_QUEUE_H_
