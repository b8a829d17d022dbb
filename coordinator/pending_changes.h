// What operators asked for that waits for the write that makes it durable,
// before it takes effect and before they are answered: a job submitted
// (saved as queued), a job cancelled (saved as cancelled). Acknowledged
// means durable: a coordinator killed right after an answer still has the
// change when it (or the next leader) starts. A write that fails drops the
// change, so nothing happened, and the callers hear UNAVAILABLE.
//
// Until then a submitted job is inert (it holds no worker and is in no
// queue), and a cancelled one trains on; but every state saved meanwhile
// shows both as done (Overlay), so that no later write undoes them.
//
// Thread-compatible: the Coordinator guards it with its mutex.
#ifndef DDP_COORDINATOR_PENDING_CHANGES_H_
#define DDP_COORDINATOR_PENDING_CHANGES_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/job_queue.h"
#include "ddp/v1/state.pb.h"

namespace ddp {

class PendingChanges {
 public:
  using SubmitAnswer = std::function<void(absl::StatusOr<v1::JobSpec>)>;
  using CancelAnswer = std::function<void(absl::Status)>;

  struct Admission {
    QueuedJob job;
    // Everyone who submitted it meanwhile (the same spec, again).
    std::vector<SubmitAnswer> answers;
  };
  struct Cancellation {
    std::string reason;
    std::vector<CancelAnswer> answers;
  };

  // ---- Jobs submitted.

  // The job submitted as `id` waiting for its write, or null.
  Admission* FindAdmission(absl::string_view id);
  // How many of `owner`'s jobs wait to be saved as queued.
  size_t AdmissionsOf(absl::string_view owner) const;
  void AddAdmission(QueuedJob job, SubmitAnswer answer);
  // Takes it out (its write came back, either way).
  std::optional<Admission> TakeAdmission(absl::string_view id);
  size_t admissions() const { return admissions_.size(); }

  // ---- Jobs cancelled.

  Cancellation* FindCancellation(absl::string_view id);
  void AddCancellation(const std::string& id, std::string reason, CancelAnswer answer);
  std::optional<Cancellation> TakeCancellation(absl::string_view id);

  // Writes what is pending into `state` (the coordinator's, as it is in
  // memory, at `now`): submitted jobs as queued, cancelled jobs ended
  // CANCELLED with no generation to adopt (running) or off the queue and in
  // the history (queued).
  void Overlay(v1::DurableState* state, absl::Time now) const;

 private:
  // Submission order: the queue keeps its own order by sequence.
  std::vector<Admission> admissions_;
  std::map<std::string, Cancellation, std::less<>> cancellations_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_PENDING_CHANGES_H_
