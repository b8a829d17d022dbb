// Which workers are attached, what each last said, and which went silent.
// Bounds what one worker can make the coordinator hold: register fields are
// checked (INVALID_ARGUMENT naming the field and its limit), reported text
// is cut, unused-parameter names beyond their limits are only counted.
// It owns each worker's lifecycle: a WorkerRecord's state changes only
// through the transitions below, each named for what happened.
//
// Not thread-safe: the Coordinator calls it under its own lock.
#ifndef DDP_COORDINATOR_WORKER_REGISTRY_H_
#define DDP_COORDINATOR_WORKER_REGISTRY_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/device.h"
#include "common/labels.h"
#include "ddp/v1/worker.pb.h"

namespace ddp {

// RegisterRequest fields, in bytes (INVALID_ARGUMENT beyond). The host is a
// DNS name or an address (printable ASCII, no spaces); the other strings
// may hold no control characters.
inline constexpr size_t kMaxHostBytes = 253;
inline constexpr size_t kMaxWorkerNameBytes = 128;
inline constexpr size_t kMaxDeviceBytes = 64;
inline constexpr size_t kMaxVersionBytes = 64;
inline constexpr size_t kMaxMachineIdBytes = 256;
inline constexpr size_t kMaxBackends = 8;
inline constexpr size_t kMaxBackendBytes = 16;
// Text a worker reports that lands in status (a state's detail, a
// checkpoint's path or error, a probe's backend) is cut to this many bytes.
inline constexpr size_t kMaxReportedTextBytes = 1024;
// Unused-parameter names: longer names, more new names in one report, or
// more names for one worker (in one generation) are counted in
// WorkerRecord::unused_names_dropped instead of stored.
inline constexpr size_t kMaxParameterNameBytes = 256;
inline constexpr size_t kMaxNewUnusedNamesPerReport = 1000;
inline constexpr size_t kMaxUnusedNamesPerWorker = 10000;

// OK when every field of `request` is within its limits.
absl::Status CheckRegisterFields(const v1::RegisterRequest& request);

// One worker, as the coordinator knows it. Its lifecycle (state, detail,
// lost) changes only through WorkerRegistry's transitions, so every change
// of what operators see has one named place; the rest is what the worker
// last reported, written by the registry's Record... methods too.
class WorkerRecord {
 public:
  v1::WorkerState state() const { return state_; }
  // Why it is in its state, for operators: what it said, or why it was lost.
  const std::string& detail() const { return detail_; }
  bool lost() const { return lost_; }

  std::string id;
  std::string host;
  Device device;
  std::string machine_id;
  // What it declared about itself: job selectors pick workers by them.
  Labels labels;
  int64_t pid = 0;
  std::string version;
  v1::Capabilities capabilities;
  // Identifies the stream: a reconnecting worker gets a new session, and
  // messages from its old stream are ignored.
  uint64_t session = 0;
  absl::Time registered_at;
  absl::Time last_seen;

  uint64_t generation = 0;
  uint64_t epoch = 0;
  uint64_t step = 0;
  v1::StepPhase phase = v1::STEP_PHASE_UNSPECIFIED;
  // A bound of the phase's own (an evaluation's), as its heartbeat said;
  // zero: the job's hang threshold.
  absl::Duration phase_bound;
  double last_loss = 0;
  double samples_per_sec = 0;
  v1::ReductionStatus reduction;
  v1::StepTimings timings;  // of its last reported step
  double step_seconds = 0;
  std::set<std::string> unused_parameters;
  // Names not stored for the limits above.
  uint64_t unused_names_dropped = 0;
  uint64_t reports_dropped = 0;
  uint64_t stale_messages = 0;
  v1::ProbeResult probe;
  std::string parameter_digest;
  uint64_t digest_step = 0;
  // The job's training state it holds in memory, as it last said (a
  // ddp-worker is a candidate for a generation only while it holds one).
  std::optional<v1::HeldState> held;
  // The job ("id/spec digest") it was asked to prepare (v1::Prepare), and
  // whether that failed: it is not asked again until it attaches anew.
  std::string prepare_asked;
  bool prepare_failed = false;
  // The coordinator told it to stop (its job ended and the coordinator
  // exits): its stream closing then is not a loss.
  bool told_to_stop = false;
  // When `step` last grew (or its generation started): hang detection.
  absl::Time step_advanced_at;
  // The job the pool gave it (empty: free for any job). Only that job
  // prepares it, forms generations with it and hears what it says.
  std::string job;
  // Let go by its job for this one (a shrink or a preemption), while it
  // finishes its step: the pool keeps it for that job (ScheduleWorker's
  // reserved_for). Empty when not promised.
  std::string promised_to;

 private:
  friend class WorkerRegistry;

  v1::WorkerState state_ = v1::WORKER_STATE_IDLE;
  std::string detail_;
  bool lost_ = false;
  absl::Time lost_at_;
};

// Whether the worker is attached and in no generation's work (idle, or
// done with or failed out of its last one): free to be assigned.
bool IsFree(const WorkerRecord& w);

// WorkerRegistry::All()'s order: by host, then device (then id).
bool SlotBefore(const WorkerRecord* a, const WorkerRecord* b);

class WorkerRegistry {
 public:
  struct Options {
    // A worker silent this long is lost.
    absl::Duration heartbeat_timeout = absl::Seconds(5);
    // Lost workers stay visible to operators this long.
    absl::Duration lost_retention = absl::Minutes(10);
    // Whether refusing another version names ours. Only when every caller
    // is authenticated (tokens): an anonymous caller learns nothing of the
    // build it might aim at (the coordinator's log and --version say it).
    bool name_version_in_refusals = false;
  };

  WorkerRegistry(const Clock* clock, Options options) : clock_(clock), options_(options) {}

  // Adds an attached worker. INVALID_ARGUMENT for a bad device, an empty
  // host or a field over its limit (CheckRegisterFields), FAILED_PRECONDITION for another version
  // than `version`, ALREADY_EXISTS when an attached worker has the same (host, device) or id. A
  // lost worker with the same id or (host, device) is replaced. The same process (same id, pid and
  // machine) registering on a new stream before its old one was noticed closed takes its record
  // over: `*took_over` is set, and the record keeps its state under the new session.
  absl::StatusOr<WorkerRecord*> Register(const v1::RegisterRequest& request,
                                         const std::string& version, uint64_t session,
                                         bool* took_over);

  // The attached (not lost) worker `id` on stream `session`, or null.
  WorkerRecord* FindAttached(const std::string& id, uint64_t session);
  // Any worker `id`, lost or not, or null.
  WorkerRecord* Find(const std::string& id);
  const WorkerRecord* Find(const std::string& id) const;

  // ---- Transitions (each names what happened; see the table in
  // worker_registry_test.cc). `worker` is one of this registry's records.

  // Assigned rank `rank` of `generation`, starting from `start_step`:
  // RENDEZVOUS until it trains. What it reported of an earlier generation
  // (reduction, timings, unused names, probe, digest) is forgotten, and its
  // hang clock restarts.
  void MarkAssigned(WorkerRecord* worker, uint64_t generation, uint32_t rank, uint64_t start_step);
  // Came back after a coordinator restart claiming its rank of `generation`,
  // which is being adopted: TRAINING again from the step it holds.
  void MarkRejoined(WorkerRecord* worker, uint64_t generation);
  // Said it is in `state` (RENDEZVOUS, TRAINING, FAILED...) in its current
  // generation `generation`, with `detail` (already cut to size) and maybe
  // a probe. Training starts its hang clock: rendezvous and taking up the
  // state are bounded by the collective timeout instead.
  void RecordReportedState(WorkerRecord* worker, const v1::StateChange& change,
                           const std::string& detail);
  // Said it left its generation (or holds none): IDLE.
  void MarkIdle(WorkerRecord* worker, const std::string& detail);
  // Said it finished the job: DONE.
  void MarkDone(WorkerRecord* worker, const std::string& detail);
  // Said it failed outside the current generation (it leaves; its IDLE
  // follows): FAILED.
  void MarkFailed(WorkerRecord* worker, const std::string& detail);
  // Marks the worker lost. False if it is not attached on `session`.
  bool MarkLost(const std::string& id, uint64_t session, const std::string& reason);
  // Marks an attached worker lost whatever its stream (evicted as hung).
  void Evict(WorkerRecord* worker, const std::string& reason) { MarkLostRecord(worker, reason); }
  // It exited once its work was over (its job ended, or the coordinator
  // told it to stop): gone, but DONE with `detail` in the status, not LOST.
  void MarkExited(WorkerRecord* worker, const std::string& detail);

  // ---- What the worker reports (its state does not change, except that a
  // step report says a worker at the rendezvous trains).

  // Records that the worker spoke now.
  void Touch(WorkerRecord* worker) { worker->last_seen = clock_->Now(); }
  // A heartbeat of a member of the current generation: its step and phase.
  // Returns whether a phase with a bound of its own (an evaluation) ended;
  // that is progress, so its hang clock restarts.
  bool RecordHeartbeat(WorkerRecord* worker, const v1::Heartbeat& heartbeat);
  // One step report of a member: its step, loss, reduction, timings, unused
  // parameters (within the limits above) and parameter digest. A worker at
  // the rendezvous that reports a step is TRAINING, whatever came first.
  void RecordStepReport(WorkerRecord* worker, const v1::StepReport& report);
  // A batch of reports: `dropped` the worker's queue dropped, and its
  // throughput over the reports taken (none when `seconds` is 0).
  void CountDroppedReports(WorkerRecord* worker, uint64_t dropped) {
    worker->reports_dropped += dropped;
  }
  void RecordThroughput(WorkerRecord* worker, double samples, double seconds);
  // A message refused as stale (of another generation or job).
  void CountStale(WorkerRecord* worker) { ++worker->stale_messages; }
  // Records names of parameters the worker saw unused, within the limits
  // above.
  void NoteUnusedParameters(WorkerRecord* worker,
                            const google::protobuf::RepeatedPtrField<std::string>& names);
  // Records a step the worker reported; a larger one restarts its hang clock.
  void NoteStep(WorkerRecord* worker, uint64_t step);
  // Its generation (re)started: the hang clock restarts from now.
  void RestartHangClock(WorkerRecord* worker) { worker->step_advanced_at = clock_->Now(); }

  // ---- The job's state it holds, and its preparation.

  // Holds `held` of the current job, or (nullopt) nothing of use.
  void SetHeld(WorkerRecord* worker, std::optional<v1::HeldState> held) {
    worker->held = std::move(held);
  }
  // Asked to prepare `job` ("id/spec digest").
  void MarkPrepareAsked(WorkerRecord* worker, const std::string& job) {
    worker->prepare_asked = job;
    worker->prepare_failed = false;  // a failure for another job says nothing of this one
  }
  // Could not prepare: not asked again (for that job) until it attaches
  // anew.
  void MarkPrepareFailed(WorkerRecord* worker) { worker->prepare_failed = true; }
  // Left a generation holding nothing (its state was dropped): unless its
  // preparation failed, it may be asked to build the state anew.
  void AllowPrepareAgain(WorkerRecord* worker);
  // ---- Which job it belongs to.

  // The pool gives it to job `job_id`.
  void Reserve(WorkerRecord* worker, const std::string& job_id) {
    MoveToJob(worker, job_id);
    worker->promised_to.clear();
  }
  // It goes back to the pool (its job ended or let it go), kept for job
  // `promised_to` if one is named.
  void Release(WorkerRecord* worker, const std::string& promised_to = "") {
    MoveToJob(worker, "");
    worker->promised_to = promised_to;
  }
  // The workers job `job_id` holds ("": those in no job), in All()'s order:
  // what allocation walks, so that a registration costs what it changes,
  // not a walk over every worker. Valid until the next change of jobs.
  const std::vector<const WorkerRecord*>& OfJob(absl::string_view job_id) const;
  // The jobs that hold workers (lost ones too), and "" when some are in none.
  std::vector<std::string> JobsHolding() const;

  // Marks lost every attached worker silent for longer than the heartbeat
  // timeout, and returns their ids. Also forgets long-lost workers.
  std::vector<std::string> ExpireSilent();
  // The coordinator was not running, or not hearing, for `paused`: every
  // attached worker counts as heard now (a fresh heartbeat timeout), and
  // the pause does not count against its step either (hang detection).
  void Grace(absl::Duration paused);

  // Every known worker, ordered by host, then device: kept in order as
  // workers come and go, so O(1) however often a decision walks them. Valid
  // until the next Register or ExpireSilent.
  const std::vector<const WorkerRecord*>& All() const { return ordered_; }
  size_t num_attached() const { return num_attached_; }

  const Options& options() const { return options_; }

 private:
  // Forgets a worker.
  void Erase(const std::string& id);
  void MarkLostRecord(WorkerRecord* w, const std::string& reason);
  void SetState(WorkerRecord* w, v1::WorkerState state, std::string detail);

  const Clock* clock_;
  Options options_;
  std::map<std::string, std::unique_ptr<WorkerRecord>> by_id_;
  // "host/device" -> worker id, so registration stays O(log n) with
  // thousands attached.
  std::map<std::string, std::string> by_slot_;
  // by_id_'s records in All()'s order (SlotBefore).
  std::vector<const WorkerRecord*> ordered_;
  // The same by the job each is in (WorkerRecord::job), each in that order.
  std::map<std::string, std::vector<const WorkerRecord*>, std::less<>> by_job_;
  static void InsertInOrder(std::vector<const WorkerRecord*>* v, const WorkerRecord* w);
  static void RemoveInOrder(std::vector<const WorkerRecord*>* v, const WorkerRecord* w);
  // Takes `w` out of by_job_ (before its job changes, or it goes).
  void UnindexJob(const WorkerRecord* w);
  void MoveToJob(WorkerRecord* worker, const std::string& job_id);
  size_t num_attached_ = 0;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_WORKER_REGISTRY_H_
