// What a worker trains for a job, kept for the life of the job rather than
// of one generation: the data, the model (parameters and buffers), the
// optimizer and its state, and where in the job it stands (step, epoch,
// epoch cursor). A generation borrows it; when a generation ends by a
// fault, the state after the last committed step is still here, so the
// next generation continues from it without restarting anything.
//
// Progress moves only with the state itself: there is no way to set a step
// apart from the parameters it belongs to. A fresh state is at step 0;
// Decode takes step, epoch and cursor from the bytes it applies.
//
// Not thread-safe: one generation's training thread uses it at a time.
#ifndef DDP_WORKER_TRAINING_STATE_H_
#define DDP_WORKER_TRAINING_STATE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/device.h"
#include "ddp/v1/checkpoint.pb.h"
#include "ddp/v1/job.pb.h"
#include "ddp/v1/worker.pb.h"
#include "worker/elastic/state_codec.h"

namespace torch::optim {
class Optimizer;
}

namespace ddp {

class CheckpointWriter;
struct Dataset;
class Model;

class TrainingState {
 public:
  // Loads the data (cached for the process, in host memory), builds the
  // model (built-in ones from the spec's seed) on `device` and a new
  // optimizer there: step 0. INVALID_ARGUMENT names a model or data file
  // that can't be used.
  static absl::StatusOr<std::unique_ptr<TrainingState>> Create(const v1::JobSpec& spec,
                                                               const Device& device = {});
  ~TrainingState();
  TrainingState(const TrainingState&) = delete;
  TrainingState& operator=(const TrainingState&) = delete;

  const v1::JobSpec& spec() const { return spec_; }
  const StateIdentity& identity() const { return identity_; }
  const Dataset& data() const { return *data_; }
  // Where the model, its optimizer's state and every batch live.
  const Device& device() const { return device_; }
  Model& model() { return *model_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  const TrainingProgress& progress() const { return progress_; }
  // Whether the job is over for this state: every epoch trained, or
  // max_steps reached.
  bool finished() const;

  // A step completed on every rank and was applied here.
  void Commit(const TrainingProgress& progress) { progress_ = progress; }
  // The state is now generation `g`'s (every member of it holds the same).
  void SetGeneration(uint64_t g) { generation_ = g; }
  void SetLearningRate(double lr);
  double learning_rate() const;

  // What the coordinator is told this worker holds.
  v1::HeldState Held() const;

  // The whole state as bytes (state_codec.h), for the other ranks or a
  // checkpoint.
  absl::StatusOr<std::string> Encode(uint64_t generation, uint32_t world_size);
  // Applies `bytes` (another rank's state, or a checkpoint): all or nothing
  // as far as it can be checked first. On an error after that (the
  // optimizer's own loader failed) the state is unusable and must be
  // dropped: see usable().
  absl::StatusOr<v1::TrainingStateHeader> Decode(absl::string_view bytes);
  bool usable() const { return usable_; }
  // The most bytes an encoded state of this model and optimizer can take
  // (MaxEncodedStateBytes). A peer's or a checkpoint's length over it is
  // refused before anything is allocated.
  uint64_t MaxStateBytes() const { return max_state_bytes_; }

  // The checkpoint writer, created on first use with the job's checkpoint
  // folder; `on_done` hears of every write. FAILED_PRECONDITION when the
  // folder can't be made or written. Null when the job has no checkpoints.
  absl::StatusOr<CheckpointWriter*> Checkpoints(
      const std::function<void(const v1::CheckpointResult&)>& on_done);
  // Checkpoints the state as it stands now, after the write in progress if
  // any (a preempted job resumes from it): `on_done` hears of the write, or
  // of why there is none (no folder, can't encode). Call only while nothing
  // trains on the state.
  void CheckpointNow(uint64_t generation, uint32_t world_size,
                     const std::function<void(const v1::CheckpointResult&)>& on_done);

 private:
  explicit TrainingState(const v1::JobSpec& spec);

  const v1::JobSpec spec_;
  const StateIdentity identity_;
  Device device_;
  std::shared_ptr<const Dataset> data_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  TrainingProgress progress_;
  uint64_t generation_ = 0;
  bool usable_ = true;
  uint64_t max_state_bytes_ = 0;
  std::unique_ptr<CheckpointWriter> checkpoints_;
};

}  // namespace ddp

#endif  // DDP_WORKER_TRAINING_STATE_H_
