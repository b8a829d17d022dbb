// The job: its spec and state, and its progress as a whole (global step,
// epoch, mean loss, throughput, ETA, accuracy per epoch) from the members'
// step reports.
//
// Not thread-safe: the Coordinator calls it under its own lock.
#ifndef DDP_COORDINATOR_JOB_PROGRESS_H_
#define DDP_COORDINATOR_JOB_PROGRESS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "ddp/v1/state.pb.h"
#include "ddp/v1/status.pb.h"
#include "ddp/v1/worker.pb.h"

namespace ddp {

class JobProgress {
 public:
  explicit JobProgress(const Clock* clock) : clock_(clock) {}

  // Takes a validated spec with defaults. FAILED_PRECONDITION while another
  // job is waiting or running.
  absl::Status Submit(const v1::JobSpec& spec);

  // NOT_FOUND for another job id, FAILED_PRECONDITION when it already ended.
  absl::Status Cancel(const std::string& job_id, const std::string& reason);

  // The job is waiting for workers or running.
  bool active() const { return state_ == v1::JOB_STATE_WAITING || state_ == v1::JOB_STATE_RUNNING; }
  bool ended() const {
    return state_ == v1::JOB_STATE_SUCCEEDED || state_ == v1::JOB_STATE_FAILED ||
           state_ == v1::JOB_STATE_CANCELLED;
  }
  v1::JobState state() const { return state_; }
  const v1::JobSpec& spec() const { return spec_; }
  const std::string& id() const { return spec_.name(); }

  // A generation of `world_size` members started from `start_step`.
  void OnGenerationStarted(uint32_t world_size, uint64_t start_step);

  // O(1): called for every report of every rank.
  void OnStepReport(uint32_t rank, const v1::StepReport& report);
  // Records the global step now, for the ETA. Called when status is
  // published, not per report: the global step is O(world size).
  void SampleProgress();
  void OnEpochResult(const v1::EpochResult& result);
  // Rank's parameter digest after `step`. DATA_LOSS naming both ranks when
  // another rank reported a different digest for the same step: the
  // replicas diverged.
  absl::Status OnParameterDigest(uint32_t rank, uint64_t step, const std::string& digest);
  // Rank finished its last step. Returns true when every rank has, and marks
  // the job succeeded.
  bool OnRankDone(uint32_t rank);
  void Fail(const std::string& reason);

  // Takes up a job saved before a coordinator restart: an active job waits
  // for workers again.
  void Restore(const v1::DurableState& state);
  // Fills the job's part of the durable state.
  void FillDurable(v1::DurableState* state) const;

  // Fills the job-level fields of `status`.
  void FillStatus(v1::JobStatus* status) const;

 private:
  struct RankProgress {
    uint64_t step = 0;
    uint64_t epoch = 0;
    double loss = 0;
    double samples_per_sec = 0;
    bool reported = false;
    bool done = false;
  };
  uint64_t GlobalStep() const;

  const Clock* clock_;
  v1::JobSpec spec_;
  v1::JobState state_ = v1::JOB_STATE_UNSPECIFIED;
  std::string message_;
  absl::Time submitted_at_;
  std::vector<RankProgress> ranks_;
  uint64_t steps_per_epoch_ = 0;
  uint64_t start_step_ = 0;
  std::vector<v1::EpochResult> epochs_;
  // step -> (digest, first rank to report it), for recent steps.
  std::map<uint64_t, std::pair<std::string, uint32_t>> digests_;
  // (time, global step) over the recent past, for the ETA.
  std::deque<std::pair<absl::Time, uint64_t>> rate_window_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_JOB_PROGRESS_H_
