// A ddp::Session's membership in a coordinator's job: the same Attach line
// a ddp-worker holds (CoordinatorLink: registration, heartbeats, reconnects,
// non-blocking reports through an Outbox), registered as a program that
// trains only jobs with model.kind "program".
//
// It takes the first assignment, builds that generation's communicator
// through the coordinator's store, and then follows the coordinator: an
// Abort of its generation, a drop or a Stop breaks the communicator, so the
// program's next collective fails with the coordinator's reason instead of
// waiting for a timeout, and it says it left (with the step it holds, so
// that a re-formed generation can start from it). An elastic program
// (set_elastic) takes the next assignment with Reform(); any other answers
// it FAILED, so the job fails with a clear reason instead of waiting on it.
#ifndef DDP_WORKER_API_COORDINATOR_SESSION_H_
#define DDP_WORKER_API_COORDINATOR_SESSION_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/credentials.h"
#include "ddp/v1/coordinator.grpc.pb.h"
#include "worker/collective/communicator.h"
#include "worker/link/coordinator_link.h"
#include "worker/link/outbox.h"
#include "worker/link/progress_board.h"

namespace ddp {

class CoordinatorSession final : public CoordinatorLink::Handler {
 public:
  struct Options {
    // HOST:PORT, or a comma list of them (the leader is followed).
    std::string coordinator;
    ClientSecurity security;
    // Without a token in `security`: use the one a local coordinator made
    // (common/local_tokens.h), looked up for each address it connects to.
    bool find_local_token = false;
    // Registered as: where peers reach it, device "cpu:N", a name.
    std::string host;
    std::string device;
    std::string name;
    int threads = 0;
  };

  // Attaches (on a thread of its own), waits for an assignment and builds
  // its communicator; proves the ring. FAILED_PRECONDITION with the
  // coordinator's reason when it refuses this program for good;
  // DEADLINE_EXCEEDED when no assignment came within `timeout`, saying
  // whether the coordinator was reached at all.
  static absl::StatusOr<std::unique_ptr<CoordinatorSession>> Join(Options options,
                                                                  absl::Duration timeout);
  ~CoordinatorSession() override;

  // The generation this rank trains in now (changes only in Reform).
  const v1::Assignment& assignment() const { return assignment_; }
  Communicator& communicator() { return *comm_; }

  // Whether a later assignment is taken (Reform) rather than refused.
  void set_elastic(bool elastic) { elastic_ = elastic; }
  // The last step every rank completed, and where the data stood after it:
  // what this rank says it holds when its generation ends.
  void SetCommitted(uint64_t step, uint64_t epoch, uint64_t cursor);
  // After ended_reason() became non-empty: waits (at most `timeout`) for the
  // coordinator's next assignment, then builds and proves its communicator.
  // The old communicator goes. CANCELLED with the coordinator's reason when
  // it stopped this program instead (the job ended); ABORTED when the new
  // generation ended before it formed; DEADLINE_EXCEEDED when no
  // assignment came.
  absl::Status Reform(absl::Duration timeout);
  // A collective failed before the coordinator ended the generation (this
  // rank saw a peer die first): tells the coordinator, and waits (at most
  // `timeout`) for it to end the generation. Whether it did.
  bool AwaitEnd(const absl::Status& failure, absl::Duration timeout);

  // Never blocks: queued for the coordinator.
  void ReportStep(v1::StepReport report);
  // This rank's part is done: says so, then waits (at most `timeout`) until
  // the coordinator ends the job, which it does once every rank is done.
  void Finish(absl::Duration timeout);
  // The program is leaving with an error: the job fails with `why`.
  void Fail(const std::string& why);
  // Set when the coordinator asked this generation to end at a step
  // boundary (to admit a joiner): the next synchronized backward carries
  // it as this rank's leave vote, so that every rank leaves after the same
  // completed step instead of dropping the one in flight.
  const std::atomic<bool>* leave_vote() const { return &leave_vote_; }
  // Every rank completed a step that carried a leave vote: the generation
  // ends here, and this rank says it holds that step.
  void LeaveAtStepBoundary();
  // Why the coordinator ended this rank's generation ("" while it runs).
  std::string ended_reason() const;
  // Once the coordinator stopped this program because its job ended: why,
  // unless the job succeeded ("the job failed: ..."); "" otherwise.
  std::string job_failure() const;
  // Whether it did: cheap enough for every batch.
  bool ended() const { return ended_flag_; }

 private:
  explicit CoordinatorSession(Options options);
  // CoordinatorLink::Handler
  v1::RegisterRequest MakeRegister() override;
  void OnAssignment(const v1::Assignment& assignment,
                    std::shared_ptr<v1::Coordinator::StubInterface> stub) override;
  void OnAbort(const v1::Abort& abort) override;
  void OnDropped(const std::string& why) override;
  void OnStopping(const std::string& reason) override;
  void OnStop(const v1::Stop& stop) override;

  // Ends the generation here: records why and, unless every rank is leaving
  // at the same finished step, breaks the communicator (so a peer waiting in
  // a collective fails now).
  void End(const std::string& why, bool abort_collectives = true);
  void PushState(uint64_t generation, v1::WorkerState state, const std::string& detail,
                 const v1::ProbeResult* probe = nullptr,
                 absl::StatusCode code = absl::StatusCode::kOk,
                 const v1::HeldState* held = nullptr);
  // What Await* wait for: the job's end (or the line's), the generation's.
  bool JobOverLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopped_ || link_result_ >= 0;
  }
  bool GenerationOverLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !ended_.empty() || link_result_ >= 0;
  }
  absl::Status Connect(std::shared_ptr<v1::Coordinator::StubInterface> stub);
  v1::HeldState HeldLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  Outbox outbox_;
  ProgressBoard board_;
  // Written only by Join and Reform, under mu_ (the link thread reads it).
  v1::Assignment assignment_;
  std::shared_ptr<Communicator> comm_;
  std::atomic<bool> elastic_{false};

  mutable absl::Mutex mu_;
  bool assigned_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<v1::Coordinator::StubInterface> stub_ ABSL_GUARDED_BY(mu_);
  // The next generation's assignment, until Reform takes it.
  std::optional<v1::Assignment> next_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // How the job ended, from the Stop.
  v1::JobOutcome outcome_ ABSL_GUARDED_BY(mu_) = v1::JOB_OUTCOME_UNSPECIFIED;
  std::string job_message_ ABSL_GUARDED_BY(mu_);
  std::string ended_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> ended_flag_{false};  // !ended_.empty(), read without the lock
  std::atomic<bool> leave_vote_{false};
  std::string leave_reason_ ABSL_GUARDED_BY(mu_);
  bool left_by_vote_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<Communicator> live_comm_ ABSL_GUARDED_BY(mu_);
  // What the link's Run returned; -1 while it runs.
  int link_result_ ABSL_GUARDED_BY(mu_) = -1;

  CoordinatorLink link_;
  std::thread link_thread_;  // last: it starts once the fields above exist
};

}  // namespace ddp

#endif  // DDP_WORKER_API_COORDINATOR_SESSION_H_
