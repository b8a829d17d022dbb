// The job: its spec and state, and its progress as a whole (global step,
// epoch and cursor, mean loss, throughput, ETA, accuracy per epoch, the
// newest checkpoint) from the members' step reports.
//
// Not thread-safe: the Coordinator calls it under its own lock.
#ifndef DDP_COORDINATOR_JOB_PROGRESS_H_
#define DDP_COORDINATOR_JOB_PROGRESS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "ddp/v1/state.pb.h"
#include "ddp/v1/status.pb.h"
#include "ddp/v1/worker.pb.h"

namespace ddp {

class JobProgress {
 public:
  explicit JobProgress(const Clock* clock) : clock_(clock) {}

  // Takes a validated spec with defaults, submitted at `submitted_at`.
  // FAILED_PRECONDITION while another job is waiting, running or
  // recovering.
  absl::Status Submit(const v1::JobSpec& spec, absl::Time submitted_at);

  // NOT_FOUND for another job id, FAILED_PRECONDITION when it already ended.
  absl::Status Cancel(const std::string& job_id, const std::string& reason);
  // What a job cancelled for `reason` says of itself.
  static std::string CancelledMessage(absl::string_view reason);

  // The job is waiting for workers, running or recovering.
  bool active() const {
    return state_ == v1::JOB_STATE_WAITING || state_ == v1::JOB_STATE_RUNNING ||
           state_ == v1::JOB_STATE_RECOVERING;
  }
  bool ended() const {
    return state_ == v1::JOB_STATE_SUCCEEDED || state_ == v1::JOB_STATE_FAILED ||
           state_ == v1::JOB_STATE_CANCELLED;
  }
  v1::JobState state() const { return state_; }
  // How the job ended, as its programs are told (UNSPECIFIED until it has).
  v1::JobOutcome outcome() const;
  // What the job is doing, or how it ended (why it failed).
  const std::string& message() const { return message_; }
  const v1::JobSpec& spec() const { return spec_; }
  const std::string& id() const { return spec_.name(); }
  absl::Time submitted_at() const { return submitted_at_; }
  // From its submission to its end (or now).
  double ElapsedSeconds() const;
  // Submitted, first generation formed, ended: each set once it happened.
  void FillTimes(google::protobuf::Timestamp* submitted, google::protobuf::Timestamp* started,
                 google::protobuf::Timestamp* ended) const;
  // The spec's fingerprint (SpecDigest), computed once.
  const std::string& spec_digest() const { return spec_digest_; }

  // A generation of `world_size` members started from `start_step` with
  // learning rate `lr`.
  void OnGenerationStarted(uint32_t world_size, uint64_t start_step, double lr);
  // Between generations: `message` says what the job waits for.
  void Recover(const std::string& message);
  // While waiting or recovering: what the job waits for now.
  void SetWaitingMessage(const std::string& message);

  // O(1): called for every report of every rank.
  void OnStepReport(uint32_t rank, const v1::StepReport& report);
  // Records the global step now, for the ETA, and the job's samples/s at
  // its world size once every rank reported. Called when status is
  // published, not per report: both are O(world size).
  void SampleProgress();
  // The newest measured samples/s (every rank's, summed) at each world size
  // the job trained at: what the pool's growth weighs (ThroughputModel).
  // At most one entry per world size, so bounded by max_workers.
  const std::map<uint32_t, double>& throughput() const { return throughput_; }
  void OnEpochResult(const v1::EpochResult& result);
  // 1 + the newest epoch evaluated (0: none yet).
  uint64_t evaluated_epochs() const;
  void OnCheckpoint(const v1::CheckpointResult& result);
  // A worker holds this job's state at `held.step`: that step was committed.
  void OnHeldState(const v1::HeldState& held);
  // Rank's parameter digest after the step of `report` (a checked report
  // with parameter_digest set). DATA_LOSS naming both ranks when another
  // rank reported a different digest for the same step of the same
  // generation: the replicas diverged; where both sent per-parameter digests, it names the
  // parameters that differ (by the names the last report that had them
  // gave, else by position).
  absl::Status OnParameterDigest(uint32_t rank, const v1::StepReport& report);
  // Rank finished its last step. Returns true when every rank has, and marks
  // the job succeeded.
  bool OnRankDone(uint32_t rank);
  void Fail(const std::string& reason);
  // Counts a generation lost to a fault; returns the faults so far, this
  // one included (DecideFault weighs them against the budget).
  uint32_t CountFault() { return ++faults_; }

  // The most advanced step any rank committed.
  uint64_t committed_step() const { return committed_step_; }
  // The newest good checkpoint's step, if one was written, and the
  // generation that wrote it.
  std::optional<uint64_t> checkpoint_step() const;
  uint64_t checkpoint_generation() const { return last_checkpoint_generation_; }
  // Median wall time of recent steps (zero before any).
  absl::Duration median_step_time() const;

  // Takes up a job saved before a coordinator restart. An active job waits
  // for workers again (RECOVERING once it had trained).
  void Restore(const v1::DurableState& state);
  // Fills the job's part of the durable state.
  void FillDurable(v1::DurableState* state) const;
  // The job in brief, as the history keeps it once it ended (but owner and
  // generation, which are the JobRun's).
  void FillRecord(v1::JobRecord* record) const;

  // Fills the job-level fields of `status`.
  // How far it has come, in brief: its global step and samples/s.
  void FillSummary(v1::JobSummary* summary) const;
  void FillStatus(v1::JobStatus* status) const;

 private:
  struct RankProgress {
    uint64_t step = 0;
    uint64_t epoch = 0;
    double loss = 0;
    double samples_per_sec = 0;
    // Share of its last step spent waiting for data (0 to 1).
    double data_wait = 0;
    bool reported = false;
    bool done = false;
  };
  uint64_t GlobalStep() const;
  // Keeps the bad samples not named yet, up to kMaxBadSamplesKept.
  void NoteBadSamples(const google::protobuf::RepeatedPtrField<std::string>& names);

  const Clock* clock_;
  v1::JobSpec spec_;
  std::string spec_digest_;
  v1::JobState state_ = v1::JOB_STATE_UNSPECIFIED;
  std::string message_;
  absl::Time submitted_at_;
  std::optional<absl::Time> started_at_;
  std::optional<absl::Time> ended_at_;
  std::vector<RankProgress> ranks_;
  uint64_t start_step_ = 0;
  uint64_t committed_step_ = 0;
  uint32_t faults_ = 0;
  // From the newest report: the epoch's cursor and size, the projected
  // total, steps per epoch at this world size, the learning rate.
  uint64_t cursor_ = 0;
  uint64_t dataset_size_ = 0;
  uint64_t total_steps_ = 0;
  uint64_t steps_per_epoch_ = 0;
  uint32_t world_size_ = 0;
  double lr_ = 0;
  uint64_t last_checkpoint_step_ = 0;
  uint64_t last_checkpoint_generation_ = 0;
  std::string last_checkpoint_path_;
  std::string checkpoint_error_;
  std::vector<v1::EpochResult> epochs_;
  // Recent steps' digests, as the first rank to report each gave them, by
  // (generation, step).
  struct StepDigests {
    std::string digest;
    uint32_t rank = 0;
    std::vector<uint64_t> per_parameter;
  };
  std::map<std::pair<uint64_t, uint64_t>, StepDigests> digests_;
  // What each per-parameter digest covers (bounded by the report checks).
  std::vector<std::string> digest_names_;
  // (time, global step) over the recent past, for the ETA.
  std::deque<std::pair<absl::Time, uint64_t>> rate_window_;
  // Wall times of recent steps, for the hang threshold.
  std::deque<double> step_seconds_;
  std::map<uint32_t, double> throughput_;
  // dataset.skip_bad_samples: samples replaced, every rank's, and the bad
  // samples named (the first kMaxBadSamplesKept, each once).
  uint64_t samples_skipped_ = 0;
  std::vector<std::string> bad_samples_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_JOB_PROGRESS_H_
