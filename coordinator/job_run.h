// One job as the Coordinator runs it: its spec, state and progress
// (JobProgress), its generations (GenerationManager), where it stands
// between them (GenerationLifecycle), the changes operators read
// (ChangeLog), and when its progress was last saved. What is about the pool
// rather than the job (the workers, their streams, the store, the status
// snapshot) stays in the Coordinator.
//
// Methods named for what happens to the job keep its parts in step (a
// generation forming updates all four); anything else reaches a part
// through its accessor. Decisions stay in reform_policy.h: this class holds
// their inputs and records their outcomes.
//
// The Coordinator keeps one JobRun for its whole life, and each job it
// accepts starts it afresh (Start). Generation numbers go on across jobs:
// a worker's claim of a generation names one generation of the pool, never
// two of different jobs.
//
// Not thread-safe: the Coordinator holds it under its own lock.
#ifndef DDP_COORDINATOR_JOB_RUN_H_
#define DDP_COORDINATOR_JOB_RUN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/change_log.h"
#include "coordinator/generation_lifecycle.h"
#include "coordinator/generation_manager.h"
#include "coordinator/job_progress.h"
#include "coordinator/reform_policy.h"
#include "ddp/v1/state.pb.h"
#include "ddp/v1/status.pb.h"
#include "ddp/v1/worker.pb.h"

namespace ddp {

class JobRun {
 public:
  explicit JobRun(const Clock* clock);
  JobRun(const JobRun&) = delete;
  JobRun& operator=(const JobRun&) = delete;

  // ---- The parts.

  JobProgress& progress() { return progress_; }
  const JobProgress& progress() const { return progress_; }
  GenerationManager& generations() { return generations_; }
  const GenerationManager& generations() const { return generations_; }
  GenerationLifecycle& lifecycle() { return lifecycle_; }
  const GenerationLifecycle& lifecycle() const { return lifecycle_; }
  ChangeLog& changes() { return changes_; }
  const ChangeLog& changes() const { return changes_; }

  // The job's name (empty before the first), spec, and whether it waits for
  // workers, runs or recovers.
  const std::string& id() const { return progress_.id(); }
  const v1::JobSpec& spec() const { return progress_.spec(); }
  bool active() const { return progress_.active(); }
  // Who submitted it (the owner= of their token; may be empty).
  const std::string& owner() const { return owner_; }
  // Its place among the jobs the coordinator started (ListJobs pages by it).
  uint64_t start_sequence() const { return start_sequence_; }
  void set_start_sequence(uint64_t sequence) { start_sequence_ = sequence; }

  // ---- The job.

  // Makes `spec` (validated, with defaults) the job: FAILED_PRECONDITION
  // while the one held is active (JobProgress::Submit). Nothing of the last
  // job's changes or lifecycle counts any more.
  absl::Status Start(const v1::JobSpec& spec, const std::string& owner, absl::Time submitted_at);
  // NOT_FOUND for another job id, FAILED_PRECONDITION when it already ended
  // (JobProgress::Cancel). A restored generation is no longer adopted.
  absl::Status Cancel(const std::string& job_id, const std::string& reason);
  // The job fails for `reason`: nothing is adopted or admitted any more.
  // The caller ends its generation.
  void Fail(const std::string& reason);

  // Whether `held` is a state of this job under this spec (one a worker can
  // start a generation from).
  bool IsOwnState(const v1::HeldState& held) const;
  // What a worker asked to prepare this job was asked for (a WorkerRecord's
  // prepare_asked): the job and its spec.
  std::string PrepareKey() const;
  // The store namespace of `generation`: "job/generation/".
  std::string StoreNamespace(uint64_t generation) const;

  // ---- Its generations.

  // A generation formed of `members` (rank order) from `source` with
  // learning rate `lr`: it is current, the job trains, the change log says
  // who left and joined, and the next quorum is counted afresh.
  const Generation& FormGeneration(const std::vector<Candidate>& members,
                                   const SourceChoice& source, double lr);
  // Every member of the restored generation came back: it goes on from
  // `step` as if formed now.
  void AdoptGeneration(uint64_t step);
  // The running generation's members were asked to leave at the next step
  // boundary (a leave vote: nothing is lost), for `why`: to admit joiners
  // (CHANGE_CAUSE_JOINED), or to give the workers in `giving` to another
  // job (CHANGE_CAUSE_SHRUNK).
  void BeginLeaveVote(v1::ChangeCause cause, const std::string& why,
                      const std::vector<std::string>& giving = {});
  // Preempted whole for job `for_job`: every member was asked to leave at
  // the next step boundary, rank 0 to checkpoint that step first
  // (CHANGE_CAUSE_PREEMPTED, open until the job resumes). The Coordinator
  // puts it back in the queue once both are done.
  void BeginPreemption(const std::string& for_job, const std::string& why);
  bool preempting() const { return preempted_at_.has_value(); }
  // When the preemption began (needs preempting()).
  absl::Time preempted_at() const { return *preempted_at_; }
  // Its sequence in the queue it started from (0 if it never waited): a
  // preempted job goes back in its old place.
  uint64_t queue_sequence() const { return queue_sequence_; }
  void set_queue_sequence(uint64_t sequence) { queue_sequence_ = sequence; }
  // Why the members were last asked to leave at a step boundary.
  const std::string& leave_vote_why() const { return leave_vote_why_; }
  // The current generation is lost to a fault (`cause`, with `reason`, the
  // workers in `left` gone): nothing is admitted or adopted any more and a
  // change opens. Needs a current generation. The caller counts the fault.
  void LoseGeneration(v1::ChangeCause cause, const std::string& reason,
                      const std::vector<std::string>& left);
  // The current generation ended (needs one): its members are remembered
  // as the last, and its store namespace is returned, to be dropped.
  std::string EndGeneration();
  // Between generations, re-forming from now: `message` says why.
  void Recover(const std::string& message);

  // ---- Durable state and status.

  // Takes up the state saved before a restart: an active job's saved
  // generation is current again, waiting `adopt_grace` for its members to
  // come back.
  void Restore(const v1::DurableState& state, absl::Duration adopt_grace);
  // The job, its generation (while active) and its changes.
  void FillDurable(v1::DurableState* state) const;
  // The job in brief, for the history once it ended.
  v1::JobRecord Record() const;
  // Whether its Record() is in the Coordinator's history (once it ended).
  bool recorded() const { return recorded_; }
  void set_recorded() { recorded_ = true; }
  // The durable state was just saved, with the progress it held.
  void NotePersisted();
  // The job is active, its committed step moved since the last save, and
  // that save is at least `interval` old: progress worth saving, so that a
  // whole-job restart knows how far the job had come.
  bool ProgressUnsaved(absl::Duration interval) const;
  // The job, its changes, the latest generation and the world that trains
  // now (none while recovering or after the end). Call
  // progress().SampleProgress() first.
  void FillStatus(v1::JobStatus* status) const;
  // The job in brief, with its generation (not its spec, nor the workers
  // the pool gave it, which the pool counts).
  v1::JobSummary Summary(absl::Time now) const;

 private:
  const Clock* clock_;
  JobProgress progress_;
  std::string owner_;
  uint64_t start_sequence_ = 0;
  uint64_t queue_sequence_ = 0;
  bool recorded_ = false;
  std::optional<absl::Time> preempted_at_;
  std::string leave_vote_why_;
  GenerationManager generations_;
  ChangeLog changes_;
  // Leaving members, admitting joiners, adopting after a restart, the
  // quorum and recovery clocks, the last generation's members.
  GenerationLifecycle lifecycle_;
  // The latest save, and the committed step it held.
  absl::Time persisted_at_;
  uint64_t persisted_step_ = 0;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_JOB_RUN_H_
