// What a worker sends up its stream, queued so that no training step ever
// waits on the coordinator: control messages (state changes, epoch results)
// are never dropped; step reports go to a bounded queue that drops the
// oldest when full, and are sent in batches.
//
// Thread-safe; Push and PushReport never block.
#ifndef DDP_WORKER_LINK_OUTBOX_H_
#define DDP_WORKER_LINK_OUTBOX_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "ddp/v1/worker.pb.h"

namespace ddp {

class Outbox {
 public:
  struct Options {
    // Step reports kept while the coordinator is slow or away.
    size_t max_reports = 4096;
    // Reports wait at most this long to share a batch.
    absl::Duration batch_delay = absl::Milliseconds(100);
  };
  Outbox(const Clock* clock, Options options) : clock_(clock), options_(options) {}

  void Push(v1::WorkerMessage message);
  void PushReport(v1::StepReport report);

  // Waits until a control message is queued, or reports have waited
  // batch_delay, or `deadline`. Returns everything due in the order it was
  // pushed: reports queued before a control message come before it, as one
  // StepReportBatch.
  std::vector<v1::WorkerMessage> Take(absl::Time deadline);

  // Puts messages taken but not sent back in front of everything queued, in
  // their order (the stream broke while sending them).
  void Requeue(std::vector<v1::WorkerMessage> messages);

  // Makes a waiting Take return now (to end a session).
  void Interrupt();
  // Drops everything queued (a new session starts clean).
  void Clear();

  uint64_t dropped_total() const;
  // Step reports waiting to be sent.
  size_t queued_reports() const;

 private:
  bool ReadyLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::WorkerMessage TakeReportsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* clock_;
  const Options options_;
  mutable absl::Mutex mu_;
  std::deque<v1::WorkerMessage> control_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::StepReport> reports_ ABSL_GUARDED_BY(mu_);
  absl::Time oldest_report_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_total_ ABSL_GUARDED_BY(mu_) = 0;
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ddp

#endif  // DDP_WORKER_LINK_OUTBOX_H_
