#include "worker/training_state.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/job_spec.h"
#include "worker/checkpoint.h"
#include "worker/dataset.h"
#include "worker/model.h"

namespace ddp {
namespace {

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const v1::OptimizerSpec& spec,
                                                       std::vector<at::Tensor> params) {
  if (spec.kind() == "adam") {
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

absl::StatusOr<std::unique_ptr<TrainingState>> TrainingState::Create(const v1::JobSpec& spec) {
  std::unique_ptr<TrainingState> state(new TrainingState(spec));
  // Every input as pinned at submission, or the job fails naming the file.
  InputFiles inputs(spec.input_files());
  auto data = LoadDatasetCached(spec.dataset(), spec.seed(), &inputs);
  if (!data.ok()) return data.status();
  state->data_ = *data;
  const Dataset& d = *state->data_;
  auto model = MakeModel(spec.model(), d.sample_shape(), d.num_classes, spec.seed(), &inputs);
  if (!model.ok()) return model.status();
  state->model_ = std::move(*model);
  if (absl::Status s =
          CheckModelFits(*state->model_, spec.model(), d.sample_shape(), d.num_classes);
      !s.ok()) {
    return s;
  }
  state->model_->SetTraining(true);
  std::vector<at::Tensor> params;
  uint64_t param_bytes = 0;
  uint64_t names = 0;
  for (auto& [name, t] : state->model_->Parameters()) {
    params.push_back(t);
    param_bytes += t.nbytes();
    names += name.size();
  }
  uint64_t buffer_bytes = 0;
  for (auto& [name, t] : state->model_->Buffers()) {
    buffer_bytes += t.nbytes();
    names += name.size();
  }
  constexpr uint64_t kSlack = uint64_t{64} << 20;
  state->max_state_bytes_ = 4 * param_bytes + 2 * buffer_bytes + 16 * names + kSlack;
  state->optimizer_ = MakeOptimizer(spec.optimizer(), std::move(params));
  return state;
}

bool TrainingState::finished() const {
  if (spec_.max_steps() > 0 && progress_.step >= spec_.max_steps()) return true;
  return progress_.epoch >= spec_.epochs();
}

void TrainingState::SetLearningRate(double lr) {
  for (auto& group : optimizer_->param_groups()) {
    if (spec_.optimizer().kind() == "adam") {
      static_cast<torch::optim::AdamOptions&>(group.options()).lr(lr);
    } else {
      static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
    }
  }
}

double TrainingState::learning_rate() const {
  const auto& options = optimizer_->param_groups().front().options();
  if (spec_.optimizer().kind() == "adam") {
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
  v1::TrainingStateHeader header;
  header.set_job_id(identity_.job_id);
  header.set_spec_digest(identity_.spec_digest);
  header.set_step(progress_.step);
  header.set_epoch(progress_.epoch);
  header.set_cursor(progress_.cursor);
  header.set_world_size(world_size);
  header.set_generation(generation);
  header.set_created_unix_seconds(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  return EncodeTrainingState(std::move(header), *model_, *optimizer_);
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
  progress_ = TrainingProgress{header->step(), header->epoch(), header->cursor()};
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

}  // namespace ddp
