// The trainer of one generation, TrainGeneration's (worker/trainer.h) work:
// brings every rank to the source's state, then trains epoch after epoch
// through the library's DistributedDataParallel until the job is done, the
// ranks agree to leave, or something fails. Internal to the daemon: its
// state and steps are split over trainer.cc and trainer_steps.cc.
#ifndef DDP_WORKER_GENERATION_TRAINER_H_
#define DDP_WORKER_GENERATION_TRAINER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ddp/v1/worker.pb.h"
#include "worker/api/library_internals.h"
#include "worker/collective/reducer.h"
#include "worker/elastic/state_codec.h"
#include "worker/loader.h"
#include "worker/trainer.h"
#include "worker/training_state.h"

namespace ddp {

class GenerationTrainer {
 public:
  GenerationTrainer(const v1::Assignment& a, TrainingState* state, Communicator* comm,
                    TrainingObserver* observer, const GenerationControl& control)
      : a_(a),
        spec_(a.spec()),
        state_(*state),
        comm_(comm),
        observer_(observer),
        control_(control) {}

  absl::StatusOr<GenerationEnd> Run();

 private:
  // Brings every rank to the source rank's state.
  absl::Status SyncState();
  // The source's own state: in memory, from a checkpoint, or fresh.
  absl::Status PrepareSource(std::string* detail);
  // What is left of the state's current epoch: its sampler's indices for
  // this rank and how many batches they make.
  struct EpochPlan {
    TrainingProgress begin;
    uint64_t n = 0;
    uint32_t world = 0;
    uint64_t batch = 0;
    bool drop_last = false;
    uint64_t accumulation = 1;
    std::vector<int64_t> indices;
    uint64_t batches = 0;
  };
  // One optimizer step's result on this rank.
  struct StepOutcome {
    double loss = 0;
    uint64_t samples = 0;
    v1::StepTimings timings;
    ReductionStats stats;
  };
  EpochPlan PlanEpoch() const;
  // Trains what is left of the state's current epoch. Sets *left when the
  // ranks agreed to leave.
  absl::Status RunEpoch(bool* left);
  // Step `step` over `group` micro-batches of `loader`, up to the optimizer
  // step; ABORTED, DATA_LOSS (a torn step) or the reducer's error otherwise.
  absl::StatusOr<StepOutcome> TrainStep(BatchLoader& loader, uint64_t group, uint64_t step);
  // The StepReport of the step just committed.
  void ReportStep(const EpochPlan& plan, const StepOutcome& outcome, uint64_t epoch, uint64_t done,
                  uint64_t cursor, absl::Duration took, bool epoch_over);
  absl::StatusOr<double> TrainMicroBatch(const Batch& batch, double scale, bool sync,
                                         v1::StepTimings* timings);
  void MaybeCheckpoint();
  bool ShouldEvaluate() const { return spec_.evaluate() && state_.data().has_test(); }
  // Every rank evaluates its share of the test set on the weights after
  // `epoch`; rank 0 reports the result.
  absl::Status EvaluateEpoch(uint64_t epoch, double seconds);
  bool aborted() const { return control_.abort != nullptr && control_.abort->load(); }

  const v1::Assignment& a_;
  const v1::JobSpec& spec_;
  TrainingState& state_;
  Communicator* comm_;
  TrainingObserver* observer_;
  const GenerationControl& control_;

  // The library's, over `comm_`: the same reduction a program gets. The
  // session goes last.
  std::unique_ptr<Session> session_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  // The step's control words, and what its synchronized backward reduced.
  ControlWords control_words_;
  std::optional<absl::StatusOr<ReductionStats>> reduced_;
  uint64_t steps_per_epoch_ = 0;
  bool first_step_ = true;
  absl::Time last_checkpoint_ = absl::Now();
  bool checkpoints_failed_ = false;
  // Loss of this rank's steps in the current epoch (this generation's part).
  double epoch_loss_sum_ = 0;
  uint64_t epoch_loss_steps_ = 0;
  // Forward time per training sample, smoothed over recent steps (0 before
  // the first): what an evaluation's bound is derived from.
  double forward_seconds_per_sample_ = 0;
};

}  // namespace ddp

#endif  // DDP_WORKER_GENERATION_TRAINER_H_
