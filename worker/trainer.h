// Trains one generation's share of a job: the sampler's indices for this
// rank, forward and backward, the reducer, the optimizer, evaluation after
// each epoch (rank 0), and a report per step.
#ifndef DDP_WORKER_TRAINER_H_
#define DDP_WORKER_TRAINER_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "ddp/v1/worker.pb.h"
#include "worker/communicator.h"
#include "worker/digest.h"  // ParameterDigest, which used to live here

namespace ddp {

// Where the trainer's news goes. Every method must return at once: nothing
// on the step's critical path may wait on the coordinator.
class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;
  // Entering `phase` with `step` optimizer steps completed.
  virtual void OnPhase(v1::StepPhase phase, uint64_t step) = 0;
  virtual void OnStep(const v1::StepReport& report) = 0;
  virtual void OnEpoch(const v1::EpochResult& result) = 0;
};

// Runs the assignment to its last step on `comm`. `abort` is checked
// between steps (and Communicator::Abort breaks a collective in flight).
// INVALID_ARGUMENT for a job this worker can't load (bad model or data file,
// a model that differs from rank 0's), the communicator's error when a
// collective fails, ABORTED when `abort` was set.
absl::Status Train(const v1::Assignment& assignment, Communicator* comm, TrainingObserver* observer,
                   const std::atomic<bool>& abort);

}  // namespace ddp

#endif  // DDP_WORKER_TRAINER_H_
