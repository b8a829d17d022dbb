#include "worker/training_state.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "common/job_kinds.h"
#include "common/job_spec.h"
#include "worker/checkpoint.h"
#include "worker/dataset.h"
#include "worker/device_placement.h"
#include "worker/model.h"
#include "worker/model_state.h"

namespace ddp {
namespace {

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const v1::OptimizerSpec& spec,
                                                       std::vector<at::Tensor> params) {
  if (OptimizerKindOf(spec) == v1::OPTIMIZER_KIND_ADAM) {
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(spec.lr())
                                                            .betas({spec.beta1(), spec.beta2()})
                                                            .eps(spec.eps())
                                                            .weight_decay(spec.weight_decay()));
  }
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(spec.lr())
                                                         .momentum(spec.momentum())
                                                         .weight_decay(spec.weight_decay())
                                                         .nesterov(spec.nesterov()));
}

}  // namespace

TrainingState::TrainingState(const v1::JobSpec& spec)
    : spec_(spec), identity_{spec.name(), SpecDigest(spec)} {}

TrainingState::~TrainingState() = default;

absl::StatusOr<std::unique_ptr<TrainingState>> TrainingState::Create(const v1::JobSpec& spec,
                                                                     const Device& device) {
  if (absl::Status s = CheckDeviceUsable(device); !s.ok()) return s;
  std::unique_ptr<TrainingState> state(new TrainingState(spec));
  state->device_ = device;
  // Every input as pinned at submission, or the job fails naming the file.
  InputFiles inputs(spec.input_files());
  auto data = LoadDatasetCached(spec.dataset(), spec.seed(), &inputs);
  if (!data.ok()) return data.status();
  state->data_ = *data;
  const Dataset& d = *state->data_;
  auto model = MakeModel(spec.model(), d.sample_shape(), d.num_classes, spec.seed(), &inputs);
  if (!model.ok()) return model.status();
  state->model_ = std::move(*model);
  // Before the optimizer: its state is made where the parameters are.
  state->model_->To(TorchDevice(device));
  if (absl::Status s =
          CheckModelFits(*state->model_, spec.model(), d.sample_shape(), d.num_classes);
      !s.ok()) {
    return s;
  }
  state->model_->SetTraining(true);
  std::vector<at::Tensor> params;
  for (auto& [name, t] : state->model_->Parameters()) params.push_back(t);
  state->optimizer_ = MakeOptimizer(spec.optimizer(), std::move(params));
  state->max_state_bytes_ = MaxEncodedStateBytes(PartsOf(*state->model_, *state->optimizer_));
  return state;
}

bool TrainingState::finished() const {
  if (spec_.max_steps() > 0 && progress_.step >= spec_.max_steps()) return true;
  return progress_.epoch >= spec_.epochs();
}

void TrainingState::SetLearningRate(double lr) {
  for (auto& group : optimizer_->param_groups()) {
    if (OptimizerKindOf(spec_.optimizer()) == v1::OPTIMIZER_KIND_ADAM) {
      static_cast<torch::optim::AdamOptions&>(group.options()).lr(lr);
    } else {
      static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
    }
  }
}

double TrainingState::learning_rate() const {
  const auto& options = optimizer_->param_groups().front().options();
  if (OptimizerKindOf(spec_.optimizer()) == v1::OPTIMIZER_KIND_ADAM) {
    return static_cast<const torch::optim::AdamOptions&>(options).lr();
  }
  return static_cast<const torch::optim::SGDOptions&>(options).lr();
}

v1::HeldState TrainingState::Held() const {
  v1::HeldState held;
  held.set_job_id(identity_.job_id);
  held.set_spec_digest(identity_.spec_digest);
  held.set_step(progress_.step);
  held.set_epoch(progress_.epoch);
  held.set_cursor(progress_.cursor);
  held.set_generation(generation_);
  return held;
}

absl::StatusOr<std::string> TrainingState::Encode(uint64_t generation, uint32_t world_size) {
  return EncodeTrainingState(StateHeader(identity_, progress_, generation, world_size), *model_,
                             *optimizer_);
}

absl::StatusOr<v1::TrainingStateHeader> TrainingState::Decode(absl::string_view bytes) {
  // The framing, identity and shapes are checked before anything changes;
  // a failure past that point leaves a half-applied state.
  absl::StatusOr<v1::TrainingStateHeader> header = ReadTrainingStateHeader(bytes);
  if (!header.ok()) return header.status();
  header = DecodeTrainingState(bytes, identity_, *model_, *optimizer_);
  if (!header.ok()) {
    if (absl::IsInternal(header.status())) usable_ = false;
    return header.status();
  }
  progress_ = ProgressOf(*header);
  return header;
}

absl::StatusOr<CheckpointWriter*> TrainingState::Checkpoints(
    const std::function<void(const v1::CheckpointResult&)>& on_done) {
  if (spec_.checkpoint().dir().empty()) return nullptr;
  if (!checkpoints_) {
    CheckpointWriter::Options options;
    options.dir = spec_.checkpoint().dir();
    options.keep = spec_.checkpoint().keep();
    options.on_done = on_done;
    auto writer = CheckpointWriter::Create(std::move(options));
    if (!writer.ok()) return writer.status();
    checkpoints_ = std::move(*writer);
  }
  return checkpoints_.get();
}

void TrainingState::CheckpointNow(uint64_t generation, uint32_t world_size,
                                  const std::function<void(const v1::CheckpointResult&)>& on_done) {
  auto fail = [&](absl::string_view why) {
    v1::CheckpointResult result;
    result.set_generation(generation);
    result.set_step(progress_.step);
    result.set_epoch(progress_.epoch);
    result.set_error(std::string(why));
    if (on_done) on_done(result);
  };
  if (spec_.checkpoint().dir().empty()) return fail("the job has no checkpoint.dir");
  absl::StatusOr<CheckpointWriter*> writer = Checkpoints(on_done);
  if (!writer.ok()) return fail(writer.status().message());
  absl::StatusOr<std::string> bytes = Encode(generation, world_size);
  if (!bytes.ok()) return fail(absl::StrCat("can't encode the state: ", bytes.status().message()));
  if (!(*writer)->SubmitWhenIdle(generation, progress_.step, progress_.epoch, std::move(*bytes))) {
    fail("the checkpoint writer is stopping");
  }
}

}  // namespace ddp
