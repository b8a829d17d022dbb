// The coordinator's core: registers workers, forms generations, sends
// assignments, follows progress, and keeps the job alive through faults:
// a lost, hung or failed member ends its generation, and the next one forms
// from the workers still there (plus any that join), starting from the most
// advanced state any of them holds. One class per concern underneath
// (WorkerRegistry, KvStore, JobQueue, and per job a JobRun: its
// JobProgress, GenerationManager, GenerationLifecycle and ChangeLog), and
// every decision is a pure function in reform_policy.h; this class gathers
// their inputs under one lock and carries the answers out. A worker's state
// changes only through WorkerRegistry's transitions, and a job's through
// its JobRun.
//
// Many jobs share the pool, each on workers of its own: the pool gives a
// free worker to one job at a time (WorkerRecord::job, coordinator_pool.cc)
// and takes it back when the job ends. Every private method that acts on a
// job is given its JobRun; the pool's entry points (a worker attaching or
// speaking, the tick, an operator's call) find it (by the worker's job, or
// by job id) and pass it down. Generation numbers are the pool's: no two
// jobs' generations share a number. It knows nothing
// of gRPC: workers are reached through the WorkerChannel interface, and time
// comes from an injected Clock.
//
// Thread-safe: every public method may be called from any thread. Messages
// to workers are sent after the lock is released; nothing here blocks on
// the disk (the durable state is saved on a thread of its own).
#ifndef DDP_COORDINATOR_COORDINATOR_H_
#define DDP_COORDINATOR_COORDINATOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/job_spec.h"
#include "common/kv_store.h"
#include "common/tokens.h"
#include "common/version.h"
#include "coordinator/job_history.h"
#include "coordinator/job_queue.h"
#include "coordinator/job_run.h"
#include "coordinator/pending_changes.h"
#include "coordinator/reform_policy.h"
#include "coordinator/schedule_policy.h"
#include "coordinator/stall_watch.h"
#include "coordinator/state_store.h"
#include "coordinator/state_writer.h"
#include "coordinator/status_summary.h"
#include "coordinator/stream_gate.h"
#include "coordinator/worker_channel.h"
#include "coordinator/worker_registry.h"
#include "ddp/v1/coordinator.pb.h"

namespace ddp {

class Coordinator {
 public:
  struct Options {
    std::string version = kVersion;
    WorkerRegistry::Options registry;
    absl::Duration heartbeat_interval = absl::Seconds(1);
    // The rendezvous store's limits.
    KvStore::Options store;
    // Attach streams: how many may be open, how soon they must register.
    StreamGate::Options streams;
    // Store gets wait this long when the request names no timeout, and at
    // most max_store_wait.
    absl::Duration default_store_wait = absl::Seconds(30);
    absl::Duration max_store_wait = absl::Hours(1);
    // The status snapshot is rebuilt at a Tick after a change, but not more
    // often than snapshot_min_interval (building it takes the lock every
    // stream handler needs), and at least every snapshot_max_age.
    absl::Duration snapshot_min_interval = absl::Milliseconds(200);
    absl::Duration snapshot_max_age = absl::Seconds(1);
    // Workers GetStatus and WatchStatus list in full (the summary counts
    // them all; ListWorkers pages through them).
    uint32_t status_workers = kDefaultStatusWorkers;
    // After a restart, how long the saved generation's members have to come
    // back before it is re-formed without the missing ones.
    absl::Duration adopt_grace = absl::Seconds(10);
    BuildCapabilities build;
    // Where the job, its generation and its progress survive restarts. May
    // be null.
    StateStore* state_store = nullptr;
    // Checks what ValidateJobSpec can't before a job is accepted (its
    // paths; its model loads and fits its data): calls `done` exactly once,
    // from any thread, with INVALID_ARGUMENT naming the problem (or another
    // code: see job_validator.h, helper_check.h), or the spec to accept:
    // the checked one, its input files pinned. Must not block: the slow part
    // runs elsewhere. May be null.
    std::function<void(const v1::JobSpec&, std::function<void(absl::StatusOr<v1::JobSpec>)> done)>
        validate_job;
    // Per owner beside owner_quotas: the most of its jobs queued, the
    // highest priority it may submit (common/tokens.h). An owner named here
    // without a max_queued gets a fair share of the queue among them, and
    // without a max_priority 0. Owners not named here: no limit.
    std::map<std::string, OwnerLimits> owner_limits;
    // The checks a job restored from the state must pass again before any
    // worker takes it up (its paths under the roots, its pinned inputs where
    // they were): the state is input too, and the roots may have changed
    // since the job was accepted. One that fails is failed, with the reason.
    // Quick (stats only): called under the lock. May be null.
    std::function<absl::Status(const v1::JobSpec&)> recheck_restored;
    // Store calls must carry the store token of a member of the generation
    // they name (Assignment.store_token); set when callers authenticate
    // (--tokens_file), so that a worker token alone reaches no store.
    bool require_store_tokens = false;
    // The most workers each owner's jobs may hold together (the tokens
    // file's max_workers): a job over its owner's quota waits.
    OwnerQuotas owner_quotas;
    // How many ended jobs the history keeps (--job_history).
    size_t job_history = kDefaultJobHistory;
    // Whether this coordinator may act now (a leader whose lease is
    // confirmed); null: always. While it may not, what workers say of
    // themselves is held and taken up, in order, at the next Tick (which
    // the caller runs only while it may act), and registrations are refused
    // with UNAVAILABLE.
    std::function<bool()> may_act;
  };
  // The answer to SubmitJob: the spec with its defaults, or why not.
  using SubmitDone = PendingChanges::SubmitAnswer;
  // The answer to CancelJob.
  using CancelDone = PendingChanges::CancelAnswer;

  // One worker's stream.
  struct Session {
    std::string worker_id;
    uint64_t id = 0;
  };

  Coordinator(const Clock* clock, Options options);
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Takes up the state saved before a restart (call before serving):
  // generation numbers continue after the saved one; a generation that was
  // training waits adopt_grace for its members to come back and goes on
  // untouched if they all do; an active job without one re-forms from
  // whatever state the returning workers hold (or its newest checkpoint).
  void Restore(const v1::DurableState& state);

  // Registers the worker behind a new stream and sends it Registered. A
  // worker claiming a generation it can't continue in is told to leave it
  // (an Abort after Registered). INVALID_ARGUMENT, FAILED_PRECONDITION or
  // ALREADY_EXISTS as WorkerRegistry::Register; the caller closes the
  // stream with it.
  absl::StatusOr<Session> Attach(const v1::RegisterRequest& request,
                                 std::shared_ptr<WorkerChannel> channel);
  // Admission of Attach streams (the gRPC layer opens and closes them
  // there); Tick closes those that never registered.
  StreamGate* streams() { return &streams_; }

  // Any message after the first on the stream. Refused messages (stale
  // generation, a second register, a report batch or step over its limit,
  // see report_checks.h) are answered with Rejected; text a worker reports
  // is cut to kMaxReportedTextBytes.
  void OnMessage(const Session& session, const v1::WorkerMessage& message);
  // The stream ended: the worker is lost.
  void OnStreamClosed(const Session& session, const std::string& reason);
  // The most worker events held while the coordinator may not act.
  static constexpr size_t kMaxHeldEvents = 100000;

  // Validates (INVALID_ARGUMENT names the field), runs validate_job, and
  // starts the job, or queues it (JobQueue) while other jobs are active
  // (also one accepted while this one was being checked). A queued job
  // starts, highest priority first, once min_workers free workers fit it
  // (gang scheduling), beside the jobs running; the head of the queue
  // waits for the workers running jobs hold, which don't grow meanwhile. A job the coordinator
  // already holds or queues, under the same name with the same spec, is a no-op (it is not checked
  // or run again); FAILED_PRECONDITION for the same name with another spec; RESOURCE_EXHAUSTED when
  // the queue is full. `owner`: who submits it (the owner= of the caller's token). `done` gets the
  // spec with defaults, once, only after the job is durable (saved as queued, see
  // pending_changes.h); UNAVAILABLE, with nothing changed, when that save fails. On the caller's
  // thread when there is nothing to save or check, else on the thread the state writer or
  // validate_job answers on. Never blocks.
  void SubmitJob(const v1::JobSpec& spec, SubmitDone done, const std::string& owner = "");
  // How many jobs that ended the coordinator keeps whole (their workers,
  // changes and epochs in GetStatus); of every other ended job, the newest
  // Options::job_history, it keeps a record (JobHistory).
  static constexpr size_t kKeptEndedJobs = 16;
  // Cancels a running job, or takes a queued one off the queue, once that
  // is durable: `done` gets OK after the save (UNAVAILABLE, nothing
  // changed, when it fails), NOT_FOUND for a job that is neither running
  // nor queued, FAILED_PRECONDITION if it already ended. Threads as
  // SubmitJob's `done`. Never blocks.
  // Who makes a call: the owner its token names, and whether it may act on
  // every owner's jobs (scope=all, local tokens, no tokens at all).
  struct Caller {
    std::string owner;
    bool all = true;
  };
  // PERMISSION_DENIED for a caller that may not act on the job's owner's
  // jobs (a job of no owner, --job's, any admin may cancel). The caller and
  // the reason are in the job's message, its history and the log.
  void CancelJob(const std::string& job_id, const std::string& reason, CancelDone done,
                 const Caller& caller);
  // As any caller may (an operator's own, a test's).
  void CancelJob(const std::string& job_id, const std::string& reason, CancelDone done) {
    CancelJob(job_id, reason, std::move(done), Caller());
  }
  // A job that started (running, or ended lately) or a queued one, with its
  // spec; NOT_FOUND otherwise.
  absl::StatusOr<v1::JobSummary> GetJob(const std::string& job_id) const;
  // One page of the jobs that started (in start order) and the queued ones
  // (in the order they will start): see ListJobsRequest. The page token names the last job handed
  // out, so jobs queued or started between two calls neither repeat nor shift the rest;
  // INVALID_ARGUMENT for a token this coordinator did not give.
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request) const;

  // Store operations, fenced: FAILED_PRECONDITION unless (job, generation)
  // is a running job's generation in progress; INVALID_ARGUMENT for an empty or too
  // long key; RESOURCE_EXHAUSTED, OUT_OF_RANGE as KvStore says. With
  // Options::require_store_tokens, PERMISSION_DENIED unless `store_token`
  // is the store token of one of that generation's members (compared in
  // constant time); tokens of older generations are never valid again.
  absl::Status StoreSet(const v1::StoreSetRequest& request, absl::string_view store_token = {});
  // Returns the waiter's id for CancelStoreGet, or 0 when `done` was
  // already called. INVALID_ARGUMENT for a negative or NaN timeout.
  KvStore::WaiterId StoreGet(const v1::StoreGetRequest& request, KvStore::GetCallback done,
                             absl::string_view store_token = {});
  // The caller of a waiting StoreGet went away: `done` runs at once with
  // CANCELLED, and nothing of the wait is held any longer.
  void CancelStoreGet(KvStore::WaiterId waiter) { store_.Cancel(waiter); }
  absl::StatusOr<int64_t> StoreAdd(const v1::StoreAddRequest& request,
                                   absl::string_view store_token = {});
  // Gets waiting in the store (tests, and operators' limits).
  size_t store_waiters() const { return store_.num_waiters(); }
  // Keys, and bytes of keys and values, in the store (metrics).
  size_t store_keys() const { return store_.num_keys(); }
  size_t store_bytes() const { return store_.num_bytes(); }

  // Periodic work: marks silent workers lost, evicts hung members, ends an
  // adoption window, forms a generation when the policy says so, fails
  // store gets past their deadline, closes streams that never registered,
  // republishes the status snapshot.
  void Tick();

  // The latest status snapshot, every worker in it: never waits behind
  // stream handlers.
  std::shared_ptr<const v1::JobStatus> Snapshot() const;
  // The same snapshot as GetStatus answers it: a summary of the workers and
  // at most options.status_workers of them.
  std::shared_ptr<const v1::JobStatus> StatusView() const;
  // GetStatus of one job: StatusView() for the job it is about by default
  // (or for an empty id), else that job's status with its own workers,
  // built now. NOT_FOUND for a job that never started (or was forgotten),
  // FAILED_PRECONDITION for a queued one.
  absl::StatusOr<std::shared_ptr<const v1::JobStatus>> JobStatusView(const std::string& job_id);
  // The state of the job the status is about by default (see JobStatus).
  v1::JobState job_state() const;

  // Tells every attached worker to exit.
  void StopAllWorkers(const std::string& reason);
  // The coordinator is stopping: from now on it decides nothing (closing
  // streams are not lost workers, nothing more is saved), so the durable
  // state keeps the running generation for the next start to adopt.
  void BeginShutdown();
  // Returns once every state change so far is on disk (tests, shutdown).
  void FlushState();

 private:
  // What a locked section decided to do once the lock is released.
  struct Effects {
    std::vector<std::pair<std::shared_ptr<WorkerChannel>, v1::CoordinatorMessage>> sends;
    std::vector<std::pair<std::shared_ptr<WorkerChannel>, absl::Status>> closes;
    std::vector<std::string> dropped_namespaces;
    // (sequence, state) to save, when the durable state changed.
    std::optional<std::pair<uint64_t, v1::DurableState>> persist;
    // Run once that state is saved (or could not be).
    std::vector<StateWriter::Durable> on_durable;
  };
  // A worker's message, or its stream closing, held while the coordinator
  // may not act (Options::may_act).
  struct HeldEvent {
    Session session;
    std::optional<v1::WorkerMessage> message;  // none: the stream closed
    std::string closed_reason;
  };
  // Holds the event (true) while the coordinator may not act, or while
  // events held before it are not taken up yet.
  bool HoldWhilePaused(const Session& session, const v1::WorkerMessage* message,
                       const std::string& closed_reason);
  // Takes up the held events, oldest first.
  void ReplayHeldEvents();
  void OnMessageNow(const Session& session, const v1::WorkerMessage& message);
  void OnStreamClosedNow(const Session& session, const std::string& reason);

  // A StateChange as the coordinator reads it.
  struct ReportedState {
    const v1::StateChange& change;
    // Shown in status, logs and the job's message: cut to a bounded size.
    std::string detail;
    // The worker's rank in the current generation, or -1.
    int rank = -1;
    // It is about the current generation, and the worker is its member.
    bool in_current = false;
  };

  // The answer to a submission that needs no check (a job of that name
  // held already, or queued, or a full queue), if there is one.
  std::optional<absl::StatusOr<v1::JobSpec>> AnswerWithoutCheckLocked(const v1::JobSpec& spec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same job is being submitted already (waiting for its write): `done`
  // is answered with it. False, leaving `done` alone, otherwise.
  bool JoinAdmissionLocked(const v1::JobSpec& spec, SubmitDone& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a checked spec: once it is saved as queued, starts or queues it
  // and answers `done` (OnAdmissionSaved).
  void AcceptJob(const v1::JobSpec& spec, const std::string& owner, SubmitDone done);
  // The write holding the admission of job `id` came back with `saved`.
  void OnAdmissionSaved(const std::string& id, const absl::Status& saved);
  // The write holding the cancellation of job `id` came back with `saved`.
  void OnCancellationSaved(const std::string& id, const absl::Status& saved);
  // OK when job `id` is queued or active; NOT_FOUND or FAILED_PRECONDITION
  // as CancelJob answers.
  absl::Status CanCancelLocked(const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancels job `id` (queued or active) now.
  absl::Status CancelNowLocked(const std::string& job_id, const std::string& reason, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts `spec` as a job of its own and offers it the pool; `queued`: the
  // queue's entry it starts from (its place, and where a preempted job
  // stood: it resumes from there).
  // `workers`: exactly these (free) workers; else the pool gives it what
  // fits, up to max_workers.
  absl::Status StartJobLocked(const v1::JobSpec& spec, const std::string& owner, Effects* fx,
                              const QueuedJob* queued = nullptr,
                              const std::vector<std::string>* workers = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Saves the durable state: every running job's, and the queue.
  void PersistLocked(Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- The pool (coordinator_pool.cc).

  // The job named `job_id` that started (running or ended), or null.
  JobRun* FindRunLocked(absl::string_view job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job the worker belongs to (or, given up by it, the job whose
  // generation it has not left yet), or no_job_.
  JobRun& RunOfLocked(const WorkerRecord& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job adopting a generation (after a restart) that `worker_id` is a
  // member of, or null.
  JobRun* AdoptingRunOfLocked(const std::string& worker_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The running job whose current generation is `generation`, or null.
  JobRun* RunOfGenerationLocked(uint64_t generation) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job GetStatus is about by default: the first running one to have
  // started, else the last to start, else no_job_.
  const JobRun& PrimaryRunLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AnyActiveLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The running jobs' ids, quoted, in start order ("none").
  std::string RunningJobsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Free, and in no running job (a job that ended keeps its workers' ranks
  // on show until another job takes them).
  bool InPoolLocked(const WorkerRecord& w) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pool's latest generation number (of any job).
  uint64_t LatestGenerationLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Shares out the free workers (those of jobs that ended too): to running
  // jobs that need them to form, then to queued jobs that fit, then to
  // running jobs that can grow (see coordinator_pool.cc), each asked to
  // prepare the job it now belongs to.
  void AllocateLocked(Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The running jobs, highest priority first, then in start order.
  std::vector<JobRun*> RunningByPriorityLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The workers InPoolLocked, in the registry's order.
  std::vector<const WorkerRecord*> PoolLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How many live workers the job holds (members, joiners, preparing).
  uint32_t HeldCountLocked(const JobRun& run) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How many more workers `owner`'s jobs may take (no quota: no limit).
  uint32_t QuotaLeftLocked(const std::string& owner) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why a job of `owner` needing `spec.min_workers()` can't start now for
  // its owner's quota ("": it can).
  std::string OverQuotaLocked(const v1::JobSpec& spec, const std::string& owner) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why queued job `index` waits ("": the queue's own words).
  absl::string_view QueueWhyLocked(size_t index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives free workers of the pool that fit `run` to it, up to `want`;
  // returns how many.
  uint32_t GiveWorkersLocked(JobRun& run, uint32_t want, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pool gives `w` to `run`, which prepares it if it holds not the job.
  void GiveWorkerLocked(JobRun& run, WorkerRecord* w, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With no job running: the queue's first job its owner's quota lets
  // start starts at once (and waits for workers, as a lone job always has).
  void StartAloneLocked(Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AnyPreemptingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- Scheduling jobs that contend (coordinator_schedule.cc).

  // DecideSchedule's input: every running and queued job, every attached
  // worker, the owners' quotas.
  ScheduleInput ScheduleInputLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Decides with DecideSchedule and carries the plan out.
  void ScheduleLocked(Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `run` lets the workers `removed` go to `for_job`: joiners at once,
  // members by a leave vote at the next step boundary (nothing is lost).
  void ShrinkLocked(JobRun& run, const std::vector<std::string>& removed, const SchedJob& for_job,
                    Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- Preemption (coordinator_preemption.cc).

  // Preempts `run` for `for_job`: its workers are kept for that job once
  // they leave at the next step boundary, rank 0 checkpointing that step
  // first.
  void PreemptLocked(JobRun& run, const SchedJob& for_job, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts each preempted job whose members all left back in the queue, once
  // its checkpoint of their last step is written (or kPreemptCheckpointWait
  // passed without it). Only between handlers: it drops JobRuns.
  void RequeuePreemptedLocked(Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the oldest ended jobs beyond kKeptEndedJobs (their records
  // stay in the history).
  void PruneEndedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records every job that ended in the history, once.
  void RecordEndedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status MayActOnLocked(const std::string& job_id, const Caller& caller) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The owner's limits on a job it submits: its priority class, its share
  // of the queue.
  absl::Status CheckOwnerLimitsLocked(const v1::JobSpec& spec, const std::string& owner) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RestoreLocked(const v1::DurableState& state, Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Options::recheck_restored over the jobs Restore took up.
  void RecheckRestoredLocked(Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Apply(Effects& fx);
  void SendLocked(const std::string& worker_id, v1::CoordinatorMessage message, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RejectLocked(const std::string& worker_id, absl::Status why, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendAbortLocked(const std::string& worker_id, uint64_t generation, const std::string& reason,
                       bool at_step_boundary, Effects* fx, bool checkpoint = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A worker registering says which generation it trains in: continue it,
  // or tell it to leave.
  void OnClaimLocked(JobRun& run, WorkerRecord* worker, const v1::RegisterRequest& request,
                     bool took_over, Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckAdoptionLocked(JobRun& run, Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker spoke: if the coordinator had been deaf, the silence was its
  // own, and every worker gets a fresh grace.
  void HeardLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The coordinator did not run or did not hear for `paused`: no worker is
  // lost or hung for it, and no deadline of its own (nor of any job's) runs
  // out for it.
  void GraceLocked(absl::Duration paused) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckHungLocked(JobRun& run, Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckLeavingLocked(JobRun& run, Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A member is in a phase with a bound of its own (an evaluation), within
  // it: members can't reach a step boundary before it ends.
  bool EvaluatingLocked(const JobRun& run) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Forms the job's generation if the policy says so. `at_tick`: from the
  // periodic tick, which always weighs it (between ticks a job of thousands
  // of workers is weighed at most every few milliseconds).
  void MaybeFormGenerationLocked(JobRun& run, Effects* fx, bool at_tick = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FormGenerationLocked(JobRun& run, std::vector<Candidate> candidates, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the members to leave at the next step boundary, to admit joiners.
  void AdmitJoinersLocked(JobRun& run, const std::string& why, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Free workers that can run the job and hold its state; counts in
  // `*preparing` those still building it.
  std::vector<const WorkerRecord*> FreeCandidatesLocked(const JobRun& run,
                                                        uint32_t* preparing = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks a free ddp-worker that can run the job but holds none of its state
  // to build it (v1::Prepare), once: it becomes a candidate when it has.
  void MaybePrepareLocked(const JobRun& run, WorkerRecord* worker, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A generation is lost to a fault: it ends (members still in it are told
  // to leave at once, keeping their state), and the job recovers, or fails
  // once its fault budget is spent.
  void OnFaultLocked(JobRun& run, v1::ChangeCause cause, const std::string& reason,
                     const std::vector<std::string>& left, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the current generation; with an `abort_reason`, members still in it
  // are told to leave and counted as leaving until they say they have.
  void EndGenerationLocked(JobRun& run, const std::string& abort_reason, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailJobLocked(JobRun& run, const std::string& reason, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job ended: the programs on the library that trained it leave (a
  // ddp-worker stays for the next job).
  void StopProgramsLocked(const JobRun& run, Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnWorkerLostLocked(JobRun& run, WorkerRecord* worker, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A member of the generation that just ended is gone too (lost or
  // evicted before the next one formed): the open change names it.
  void NoteDepartureLocked(JobRun& run, const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictLocked(JobRun& run, WorkerRecord* worker, const std::string& reason, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker is no longer in the generation it was told to leave.
  void OnLeftLocked(JobRun& run, const std::string& worker_id, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // OK when `generation` is current and the worker is one of its members.
  absl::Status CheckMemberLocked(const JobRun& run, const WorkerRecord& worker, uint64_t generation,
                                 int* rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::string> StoreNamespace(const std::string& job_id, uint64_t generation,
                                             const std::string& key, absl::string_view store_token);
  void OnHeartbeatLocked(JobRun& run, WorkerRecord* worker, const v1::Heartbeat& heartbeat,
                         Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnEpochResultLocked(JobRun& run, WorkerRecord* worker, const v1::EpochResult& result,
                           Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnStateChangeLocked(JobRun& run, WorkerRecord* worker, const v1::StateChange& change,
                           Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker left a generation (IDLE names which; 0: none).
  void OnIdleLocked(JobRun& run, WorkerRecord* worker, const ReportedState& s, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnDoneLocked(JobRun& run, WorkerRecord* worker, const ReportedState& s, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Any other state, of a member in the current generation: it trains, or
  // fails (a fault, or fatal for the job).
  void OnMemberStateLocked(JobRun& run, WorkerRecord* worker, const ReportedState& s, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Any other state, not about the current generation: a failure outside it
  // (preparing the job, leaving), else a stale message.
  void OnOutsideStateLocked(JobRun& run, WorkerRecord* worker, const ReportedState& s, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnReportsLocked(JobRun& run, WorkerRecord* worker, const v1::StepReportBatch& batch,
                       Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnCheckpointLocked(JobRun& run, WorkerRecord* worker, const v1::CheckpointResult& result,
                          Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker could not build the job's state (FAILED in generation 0): the
  // job fails for a bad model or data file, else goes on without it.
  void OnPrepareFailedLocked(JobRun& run, WorkerRecord* worker, const v1::StateChange& change,
                             const std::string& detail, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps a worker's held state if it is this job's.
  void NoteHeldLocked(JobRun& run, WorkerRecord* worker, const v1::HeldState& held)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string DescribeLocked(const WorkerRecord& worker, int rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillWorkerLocked(const WorkerRecord& worker, absl::Time now, v1::WorkerStatus* ws)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* clock_;
  const Options options_;
  KvStore store_;
  StreamGate streams_;
  std::unique_ptr<StateWriter> state_writer_;

  mutable absl::Mutex mu_;
  WorkerRegistry registry_ ABSL_GUARDED_BY(mu_);
  StallWatch stall_ ABSL_GUARDED_BY(mu_);
  // Deafness was logged (once per spell).
  bool deaf_logged_ ABSL_GUARDED_BY(mu_) = false;
  // The jobs that started, in start order: those running, and the last
  // kKeptEndedJobs to end.
  std::vector<std::unique_ptr<JobRun>> runs_ ABSL_GUARDED_BY(mu_);
  // Where workers in no job are heard: a JobRun that never holds a job, so
  // whatever they say of a generation is stale.
  std::unique_ptr<JobRun> no_job_ ABSL_GUARDED_BY(mu_) ABSL_PT_GUARDED_BY(mu_);
  // The pool's latest generation number, kept here too for jobs forgotten.
  uint64_t latest_generation_ ABSL_GUARDED_BY(mu_) = 0;
  // The start_sequence the next job to start gets.
  uint64_t next_run_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  // Jobs accepted while others were active, waiting for workers.
  JobQueue queue_ ABSL_GUARDED_BY(mu_);
  // Submissions and cancellations waiting for the write that makes them
  // durable.
  PendingChanges pending_ ABSL_GUARDED_BY(mu_);
  // Every job that ended lately, in brief.
  JobHistory history_ ABSL_GUARDED_BY(mu_);
  // Why queued jobs wait, by job id, in the scheduling policy's words (or
  // the quota's, when no job runs).
  std::map<std::string, std::string> queue_waits_ ABSL_GUARDED_BY(mu_);
  // The stream of each attached worker, with its session id.
  std::map<std::string, std::pair<uint64_t, std::shared_ptr<WorkerChannel>>> channels_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_session_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t persist_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  bool dirty_ ABSL_GUARDED_BY(mu_) = true;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time published_at_ ABSL_GUARDED_BY(mu_);

  absl::Mutex held_mu_;
  std::deque<HeldEvent> held_ ABSL_GUARDED_BY(held_mu_);

  mutable absl::Mutex snapshot_mu_;
  std::shared_ptr<const v1::JobStatus> snapshot_ ABSL_GUARDED_BY(snapshot_mu_);
  std::shared_ptr<const v1::JobStatus> view_ ABSL_GUARDED_BY(snapshot_mu_);
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_COORDINATOR_H_
