// One assignment, run on its own thread: take up the job's training state
// (kept by the worker across generations, or made fresh), build the
// communicator through the store, prove the ring with a probe all-reduce,
// train, give the state back, and say how it ended and what it holds.
#ifndef DDP_WORKER_GENERATION_RUN_H_
#define DDP_WORKER_GENERATION_RUN_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/device.h"
#include "common/store_client.h"
#include "ddp/v1/coordinator.grpc.pb.h"
#include "worker/collective/communicator.h"
#include "worker/confinement.h"
#include "worker/link/outbox.h"
#include "worker/link/progress_board.h"

namespace ddp {

class TrainingState;

// The worker's training state for its current job, between generations.
struct StateSlot {
  absl::Mutex mu;
  std::shared_ptr<TrainingState> state ABSL_GUARDED_BY(mu);
  // A StatePreparer is building the next state: a run waits for it rather
  // than build the same again.
  bool preparing ABSL_GUARDED_BY(mu) = false;
};

class GenerationRun {
 public:
  struct Environment {
    std::shared_ptr<v1::Coordinator::StubInterface> stub;
    // Stubs for the leader a standby names, so the store follows it.
    StoreClient::StubFactory leader_stubs;
    // Address peers reach this worker at.
    std::string host;
    Device device;
    // When set, one JSON line per step is appended here.
    std::string metrics_file;
    // When set, called with every committed step and the rank (the
    // daemon's Prometheus series).
    std::function<void(const v1::StepReport&, uint32_t rank)> on_step;
    // When set, one JSON line per step with the step's dataset indices is
    // appended here (and flushed) before the step's forward.
    std::string index_log;
    // Step reports to the coordinator (off only to measure what they cost).
    bool send_reports = true;
    // Keep the per-bucket detail in them (for a job process's daemon, whose
    // metrics read it; the coordinator has no use for it).
    bool report_buckets = false;
    // Fault injection for tests: while this file exists, the training
    // thread stalls before its next step (heartbeats go on), as a rank stuck
    // in its data pipeline would.
    std::string debug_hang_file;
    // How the run's thread confines itself before it touches the job.
    JobConfinementOptions confinement;
  };

  // Starts the run's thread. `outbox`, `board` and `slot` outlive the run.
  GenerationRun(v1::Assignment assignment, Environment env, Outbox* outbox, ProgressBoard* board,
                StateSlot* slot);
  // Aborts and joins.
  ~GenerationRun();

  // Leaves the generation as soon as possible: breaks a collective in
  // flight; the step in flight is discarded. Thread-safe.
  void Abort(const std::string& reason);
  // Leaves after the step in flight, at the same step as every rank.
  // Thread-safe.
  void LeaveAtStepBoundary(const std::string& reason);
  // As LeaveAtStepBoundary, and rank 0 then checkpoints the step it left
  // at (the job is preempted, to resume from it): before it says it is
  // idle, or at once when it already left at a step boundary. Thread-safe.
  void LeaveAndCheckpoint(const std::string& reason);
  uint64_t generation() const { return assignment_.generation(); }
  const v1::Assignment& assignment() const { return assignment_; }
  bool finished() const { return finished_; }
  // Finished, with the job's last step done (not left or failed).
  bool done() const { return done_; }

 private:
  void Run();
  // Sets up the communicator and the probe, then trains.
  absl::Status RunSteps(TrainingState* state, bool* left);
  // The run left at a step boundary holding `state`: checkpoints it if
  // asked to (LeaveAndCheckpoint).
  void LeftWith(std::shared_ptr<TrainingState> state);
  // Rank 0 writes `state` to the job's checkpoint folder.
  void CheckpointLeftState(TrainingState& state);
  void PushState(v1::WorkerState state, const std::string& detail,
                 const v1::HeldState* held = nullptr, const v1::ProbeResult* probe = nullptr,
                 absl::StatusCode code = absl::StatusCode::kOk);

  const v1::Assignment assignment_;
  const Environment env_;
  Outbox* outbox_;
  ProgressBoard* board_;
  StateSlot* slot_;
  std::atomic<bool> abort_{false};
  std::atomic<bool> leave_{false};
  std::atomic<bool> finished_{false};
  std::atomic<bool> done_{false};

  absl::Mutex mu_;
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  // LeaveAndCheckpoint was called; the state left with (once it left at a
  // step boundary); whether it was checkpointed.
  bool checkpoint_on_leave_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<TrainingState> left_with_ ABSL_GUARDED_BY(mu_);
  bool checkpointed_ ABSL_GUARDED_BY(mu_) = false;
  // Set once built; Abort reaches it through here.
  std::shared_ptr<Communicator> comm_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ddp

#endif  // DDP_WORKER_GENERATION_RUN_H_
