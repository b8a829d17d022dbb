// The jobs that ended, in brief (v1::JobRecord): the newest `capacity` of
// them, kept in the durable state so that ListJobs, GetJob and GetStatus
// answer for them after a restart or a takeover, and so that a restarted
// coordinator's --job that already ran is not run again. The Coordinator
// keeps its last few ended jobs whole (JobRun) besides; this is what is
// left of every one of them.
//
// Thread-compatible: the Coordinator guards it with its mutex.
#ifndef DDP_COORDINATOR_JOB_HISTORY_H_
#define DDP_COORDINATOR_JOB_HISTORY_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ddp/v1/state.pb.h"
#include "ddp/v1/status.pb.h"

namespace ddp {

// --job_history's default.
inline constexpr size_t kDefaultJobHistory = 100;
// The most a coordinator keeps, whatever the flag says.
inline constexpr size_t kMaxJobHistory = 10000;

class JobHistory {
 public:
  struct Entry {
    v1::JobRecord record;
    // Its place among the jobs the coordinator started (ListJobs's order).
    uint64_t start_sequence = 0;
  };

  explicit JobHistory(size_t capacity) : capacity_(capacity) {}

  // Keeps `record` (replacing one of its job id), the newest last; forgets
  // the oldest beyond the capacity.
  void Record(v1::JobRecord record, uint64_t start_sequence);
  const Entry* Find(absl::string_view job_id) const;
  // Oldest first.
  const std::deque<Entry>& entries() const { return entries_; }

  void FillDurable(v1::DurableState* state) const;
  // Takes up the saved records (each checked: one without a job id or
  // state that ended is dropped; at most the capacity, the newest),
  // numbering their start sequences from `*next_start_sequence` on.
  void Restore(const v1::DurableState& state, uint64_t* next_start_sequence);

  // The record of a job cancelled before it started.
  static v1::JobRecord CancelledWhileQueued(const v1::JobSpec& spec, const std::string& owner,
                                            absl::Time submitted_at, absl::string_view reason,
                                            absl::Time now);
  // The record of a job that failed before it started, with `message`.
  static v1::JobRecord FailedWhileQueued(const v1::JobSpec& spec, const std::string& owner,
                                         absl::Time submitted_at, absl::string_view message,
                                         absl::Time now);

  // What operators read of an ended job.
  static v1::JobSummary Summary(const v1::JobRecord& record, absl::Time now);
  static void FillStatus(const v1::JobRecord& record, absl::Time now, v1::JobStatus* status);

 private:
  const size_t capacity_;
  std::deque<Entry> entries_;
};

// Unix microseconds as a Timestamp, unset for 0.
void SetTimestamp(int64_t unix_micros, google::protobuf::Timestamp* out);

}  // namespace ddp

#endif  // DDP_COORDINATOR_JOB_HISTORY_H_
