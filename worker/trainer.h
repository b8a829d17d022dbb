// Trains one generation's share of a job on a TrainingState that outlives
// it: agree with the other ranks on the state to start from (the source rank
// broadcasts it), then step through the epochs from the state's cursor with
// the sampler's indices for this rank and world size, the reducer and the
// optimizer, evaluating after each epoch (every rank its share of the test
// set) and reporting every step.
// A step is applied only once every rank has completed it (the step token
// in its last bucket), so a generation that ends by a fault leaves the
// state at its last committed step.
#ifndef DDP_WORKER_TRAINER_H_
#define DDP_WORKER_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "ddp/v1/worker.pb.h"
#include "worker/collective/communicator.h"
#include "worker/digest.h"

namespace ddp {

class Model;
class TrainingState;

// Where the trainer's news goes. Every method must return at once: nothing
// on the step's critical path may wait on the coordinator.
class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;
  // Entering `phase` with `step` optimizer steps completed.
  virtual void OnPhase(v1::StepPhase phase, uint64_t step) = 0;
  // The same for a phase with a bound of its own (evaluating): past
  // `bound` from its start, this rank counts as hung.
  virtual void OnBoundedPhase(v1::StepPhase phase, uint64_t step, absl::Duration bound) = 0;
  // The state the generation starts from is in place on this rank;
  // `detail` says where it came from.
  virtual void OnStarted(const v1::HeldState& held, const std::string& detail) = 0;
  // Before the forward of the step that will complete step `step`: the
  // dataset indices this rank trains in it.
  virtual void OnStepIndices(uint64_t step, uint64_t epoch, absl::Span<const int64_t> indices) = 0;
  // A committed step (the state moved), with its report.
  virtual void OnStep(const v1::StepReport& report, uint64_t epoch, uint64_t cursor) = 0;
  virtual void OnEpoch(const v1::EpochResult& result) = 0;
};

// How a generation can be ended from outside.
struct GenerationControl {
  // Leave at once; Communicator::Abort breaks a collective in flight.
  const std::atomic<bool>* abort = nullptr;
  // Leave after the step in flight, at the same boundary as every rank.
  const std::atomic<bool>* leave = nullptr;
  // Hears of every checkpoint write (rank 0), on the writer's thread; must
  // outlive the state's checkpoint writer.
  std::function<void(const v1::CheckpointResult&)> on_checkpoint;
};

// How a generation ended without an error.
enum class GenerationEnd {
  // The job's last step is done.
  kFinished,
  // Every rank left at the same step boundary, as asked.
  kLeft,
};

// Trains the assignment on `state` over `comm` until the job is done, the
// ranks agree to leave, or something fails. INVALID_ARGUMENT for a model
// that differs from the source rank's, FAILED_PRECONDITION when the source
// can't produce the state it was assigned (no usable checkpoint), the
// communicator's error when a collective fails, ABORTED when told to abort,
// DATA_LOSS when the ranks disagree on the step they completed.
absl::StatusOr<GenerationEnd> TrainGeneration(const v1::Assignment& assignment,
                                              TrainingState* state, Communicator* comm,
                                              TrainingObserver* observer,
                                              const GenerationControl& control);

}  // namespace ddp

#endif  // DDP_WORKER_TRAINER_H_
