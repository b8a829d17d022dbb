#include "worker/trainer.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/sampler.h"
#include "worker/dataset.h"
#include "worker/digest.h"
#include "worker/loader.h"
#include "worker/model.h"
#include "worker/reducer.h"

namespace ddp {
namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}

// Names, shapes and dtypes of every parameter and buffer.
uint64_t ModelSignature(Model& model) {
  uint64_t h = kFnvOffset;
  auto add = [&h](const std::vector<NamedTensor>& tensors) {
    for (const auto& [name, t] : tensors) {
      h = Fnv(h, name.data(), name.size());
      for (int64_t d : t.sizes()) h = Fnv(h, &d, sizeof(d));
      const int8_t type = static_cast<int8_t>(t.scalar_type());
      h = Fnv(h, &type, 1);
    }
  };
  add(model.Parameters());
  add(model.Buffers());
  return h;
}

// Packs tensors into one byte buffer, broadcasts it from `root`, unpacks.
absl::Status BroadcastTensors(const std::vector<NamedTensor>& tensors, int root,
                              Communicator* comm) {
  size_t total = 0;
  for (const auto& [name, t] : tensors) total += t.nbytes();
  if (total == 0) return absl::OkStatus();
  std::vector<char> bytes(total);
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    std::memcpy(bytes.data() + offset, t.contiguous().data_ptr(), t.nbytes());
    offset += t.nbytes();
  }
  if (absl::Status s = comm->Broadcast(bytes.data(), total, root); !s.ok()) return s;
  torch::NoGradGuard no_grad;
  offset = 0;
  for (const auto& [name, t] : tensors) {
    std::memcpy(t.data_ptr(), bytes.data() + offset, t.nbytes());
    offset += t.nbytes();
  }
  return absl::OkStatus();
}

// Closes a catch of LibTorch's exceptions into a Status with the message's
// first line, which is the part a person reads.
absl::Status FromException(const std::string& what, const std::exception& e) {
  std::string msg = e.what();
  return absl::InternalError(absl::StrCat(what, ": ", msg.substr(0, msg.find('\n'))));
}

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

class Trainer {
 public:
  Trainer(const v1::Assignment& a, Communicator* comm, TrainingObserver* observer,
          const std::atomic<bool>& abort)
      : a_(a), spec_(a.spec()), comm_(comm), observer_(observer), abort_(abort) {}

  absl::Status Run();

 private:
  absl::Status Setup();
  absl::Status RunEpoch(uint64_t epoch, bool* stop);
  absl::StatusOr<double> TrainMicroBatch(const Batch& batch, double scale, bool sync,
                                         v1::StepTimings* timings);
  v1::EpochResult Evaluate(uint64_t epoch, double train_loss, double seconds);
  at::Tensor Loss(const at::Tensor& out, const at::Tensor& y, bool sum = false);

  const v1::Assignment& a_;
  const v1::JobSpec& spec_;
  Communicator* comm_;
  TrainingObserver* observer_;
  const std::atomic<bool>& abort_;

  std::shared_ptr<const Dataset> data_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Reducer> reducer_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<NamedTensor> buffers_;
  uint64_t step_ = 0;
  int64_t micro_batches_ = 0;
  uint64_t steps_per_epoch_ = 0;
};

absl::Status Trainer::Setup() {
  auto data = LoadDatasetCached(spec_.dataset(), spec_.seed());
  if (!data.ok()) return data.status();
  data_ = *data;
  auto model = MakeModel(spec_.model(), data_->sample_shape(), data_->num_classes, spec_.seed());
  if (!model.ok()) return model.status();
  model_ = std::move(*model);
  if (absl::Status s =
          CheckModelFits(*model_, spec_.model(), data_->sample_shape(), data_->num_classes);
      !s.ok()) {
    return s;
  }
  model_->SetTraining(true);

  // Every rank must hold the same architecture before parameters move.
  uint64_t signature = ModelSignature(*model_);
  uint64_t source_signature = signature;
  if (absl::Status s = comm_->Broadcast(&source_signature, sizeof(source_signature),
                                        static_cast<int>(a_.source_rank()));
      !s.ok()) {
    return s;
  }
  if (source_signature != signature) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "this rank's model (%d parameters, signature %016x) differs from rank %d's (signature "
        "%016x): every rank must load the same model file",
        model_->Parameters().size(), signature, a_.source_rank(), source_signature));
  }
  observer_->OnPhase(v1::STEP_PHASE_SYNC, a_.start_step());
  std::vector<NamedTensor> state = model_->Parameters();
  buffers_ = model_->Buffers();
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  if (absl::Status s = BroadcastTensors(state, static_cast<int>(a_.source_rank()), comm_);
      !s.ok()) {
    return s;
  }

  Reducer::Options options;
  options.bucket_cap_bytes = static_cast<size_t>(spec_.bucket_cap_mb() * (1 << 20));
  options.first_bucket_cap_bytes = std::min(kDefaultFirstBucketBytes, options.bucket_cap_bytes);
  auto reducer = Reducer::Create(model_->Parameters(), comm_, options);
  if (!reducer.ok()) return reducer.status();
  reducer_ = std::move(*reducer);
  std::vector<at::Tensor> params;
  for (auto& [name, t] : model_->Parameters()) params.push_back(t);
  optimizer_ = MakeOptimizer(spec_.optimizer(), std::move(params));

  const uint64_t per_rank = SamplesPerRank(data_->train_size(), a_.world_size(), spec_.drop_last());
  micro_batches_ =
      NumBatches(static_cast<int64_t>(per_rank), spec_.batch_size(), spec_.drop_last());
  const uint64_t k = spec_.gradient_accumulation_steps();
  steps_per_epoch_ = (micro_batches_ + k - 1) / k;
  if (steps_per_epoch_ == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size: ", spec_.batch_size(), " per worker leaves no full batch of the ",
                     per_rank, " samples each of ", a_.world_size(), " ranks gets with drop_last"));
  }
  return absl::OkStatus();
}

at::Tensor Trainer::Loss(const at::Tensor& out, const at::Tensor& y, bool sum) {
  const auto reduction = sum ? at::Reduction::Sum : at::Reduction::Mean;
  if (spec_.loss() == "nll") return torch::nll_loss(out, y, {}, reduction);
  return torch::cross_entropy_loss(out, y, {}, reduction);
}

absl::StatusOr<double> Trainer::TrainMicroBatch(const Batch& batch, double scale, bool sync,
                                                v1::StepTimings* timings) {
  if (!buffers_.empty()) {
    // As DDP's broadcast_buffers: running statistics follow the source rank.
    if (absl::Status s = BroadcastTensors(buffers_, static_cast<int>(a_.source_rank()), comm_);
        !s.ok()) {
      return s;
    }
  }
  reducer_->PrepareBackward(sync);
  observer_->OnPhase(v1::STEP_PHASE_FORWARD, step_);
  const absl::Time start = absl::Now();
  at::Tensor loss = Loss(model_->Forward(batch.x), batch.y);
  const absl::Time forward_done = absl::Now();
  observer_->OnPhase(v1::STEP_PHASE_BACKWARD, step_);
  (scale == 1.0 ? loss : loss * scale).backward();
  timings->set_forward_ms(timings->forward_ms() + absl::ToDoubleMilliseconds(forward_done - start));
  timings->set_backward_ms(timings->backward_ms() +
                           absl::ToDoubleMilliseconds(absl::Now() - forward_done));
  return loss.item<double>();
}

absl::Status Trainer::RunEpoch(uint64_t epoch, bool* stop) {
  const absl::Time epoch_start = absl::Now();
  SamplerOptions sampler;
  sampler.dataset_size = data_->train_size();
  sampler.seed = a_.sampler_seed();
  sampler.epoch = epoch;
  sampler.rank = a_.rank();
  sampler.world_size = a_.world_size();
  sampler.shuffle = spec_.shuffle();
  sampler.drop_last = spec_.drop_last();
  const uint64_t k = spec_.gradient_accumulation_steps();
  // Resuming inside an epoch skips the micro-batches of completed steps.
  const uint64_t done_in_epoch = step_ - epoch * steps_per_epoch_;
  BatchLoader loader(data_->train_x, data_->train_y, DistributedSamplerIndices(sampler),
                     spec_.batch_size(), spec_.drop_last(),
                     static_cast<int64_t>(done_in_epoch * k));
  double loss_sum = 0;
  uint64_t loss_steps = 0;
  for (int64_t first = done_in_epoch * k; first < micro_batches_; first += k) {
    if (abort_) return absl::AbortedError("aborted");
    const absl::Time step_start = absl::Now();
    const int64_t group = std::min<int64_t>(k, micro_batches_ - first);
    if (absl::Status s = reducer_->StartGroup(); !s.ok()) return s;
    double step_loss = 0;
    uint64_t samples = 0;
    v1::StepTimings timings;
    for (int64_t m = 0; m < group; ++m) {
      observer_->OnPhase(v1::STEP_PHASE_DATA, step_);
      const absl::Time data_start = absl::Now();
      std::optional<Batch> batch = loader.Next();
      timings.set_data_ms(timings.data_ms() + absl::ToDoubleMilliseconds(absl::Now() - data_start));
      samples += batch->x.size(0);
      absl::StatusOr<double> loss = TrainMicroBatch(*batch, 1.0 / group, m == group - 1, &timings);
      if (!loss.ok()) return loss.status();
      step_loss += *loss / group;
    }
    observer_->OnPhase(v1::STEP_PHASE_ALLREDUCE_WAIT, step_);
    absl::StatusOr<ReductionStats> stats = reducer_->FinishBackward();
    if (!stats.ok()) return stats.status();
    timings.set_allreduce_wait_ms(stats->wait_ms);
    observer_->OnPhase(v1::STEP_PHASE_OPTIMIZER, step_);
    const absl::Time optimizer_start = absl::Now();
    optimizer_->step();
    timings.set_optimizer_ms(absl::ToDoubleMilliseconds(absl::Now() - optimizer_start));
    ++step_;
    loss_sum += step_loss;
    ++loss_steps;

    const uint64_t in_epoch = step_ - epoch * steps_per_epoch_;
    const bool last = in_epoch == steps_per_epoch_ || step_ == spec_.max_steps();
    v1::StepReport report;
    report.set_generation(a_.generation());
    report.set_epoch(epoch);
    report.set_step(step_);
    report.set_step_in_epoch(in_epoch);
    report.set_steps_per_epoch(steps_per_epoch_);
    report.set_loss(step_loss);
    report.set_samples(samples);
    report.set_step_seconds(absl::ToDoubleSeconds(absl::Now() - step_start));
    v1::ReductionStatus* r = report.mutable_reduction();
    r->set_buckets_reduced(stats->buckets_reduced);
    r->set_buckets_total(stats->buckets_total);
    r->set_bytes(stats->bytes);
    r->set_allreduce_ms(stats->allreduce_ms);
    r->set_wait_ms(stats->wait_ms);
    r->set_unused_parameters(stats->unused);
    r->set_globally_unused_parameters(stats->globally_unused);
    for (auto& name : stats->newly_unused) r->add_newly_unused_parameter_names(name);
    r->set_phase(v1::STEP_PHASE_OPTIMIZER);
    if (last) report.set_parameter_digest(ParameterDigest(*model_));
    *report.mutable_timings() = timings;
    observer_->OnStep(report);
    if (step_ == spec_.max_steps()) {
      *stop = true;
      break;
    }
  }
  if (a_.rank() == 0 && spec_.evaluate() && data_->test_x.defined()) {
    observer_->OnPhase(v1::STEP_PHASE_EVALUATE, step_);
    observer_->OnEpoch(Evaluate(epoch, loss_steps ? loss_sum / loss_steps : 0,
                                absl::ToDoubleSeconds(absl::Now() - epoch_start)));
  }
  return absl::OkStatus();
}

v1::EpochResult Trainer::Evaluate(uint64_t epoch, double train_loss, double seconds) {
  torch::NoGradGuard no_grad;
  model_->SetTraining(false);
  int64_t correct = 0;
  double loss = 0;
  const int64_t n = data_->test_x.size(0);
  for (int64_t begin = 0; begin < n; begin += 1000) {
    const int64_t len = std::min<int64_t>(1000, n - begin);
    at::Tensor out = model_->Forward(data_->test_x.narrow(0, begin, len));
    at::Tensor y = data_->test_y.narrow(0, begin, len);
    correct += out.argmax(1).eq(y).sum().item<int64_t>();
    loss += Loss(out, y, /*sum=*/true).item<double>();
  }
  model_->SetTraining(true);
  v1::EpochResult result;
  result.set_generation(a_.generation());
  result.set_epoch(epoch);
  result.set_test_accuracy(n ? static_cast<double>(correct) / n : 0);
  result.set_test_loss(n ? loss / n : 0);
  result.set_train_loss(train_loss);
  result.set_seconds(seconds);
  DDP_LOG(Info) << absl::StrFormat("epoch %d: test accuracy %.4f, test loss %.4f, train loss %.4f",
                                   epoch, result.test_accuracy(), result.test_loss(), train_loss);
  return result;
}

absl::Status Trainer::Run() {
  step_ = a_.start_step();
  if (absl::Status s = Setup(); !s.ok()) return s;
  DDP_LOG(Info) << "training " << spec_.model().kind() << " on " << spec_.dataset().kind() << ": "
                << steps_per_epoch_ << " steps per epoch, " << spec_.epochs() << " epoch(s)";
  bool stop = spec_.max_steps() > 0 && step_ >= spec_.max_steps();
  for (uint64_t epoch = step_ / steps_per_epoch_; epoch < spec_.epochs() && !stop; ++epoch) {
    if (absl::Status s = RunEpoch(epoch, &stop); !s.ok()) return s;
  }
  if (a_.rank() == 0 && !spec_.output_path().empty()) {
    if (absl::Status s = model_->Save(spec_.output_path()); !s.ok()) return s;
    DDP_LOG(Info) << "wrote the trained model to " << spec_.output_path();
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Train(const v1::Assignment& assignment, Communicator* comm, TrainingObserver* observer,
                   const std::atomic<bool>& abort) {
  try {
    Trainer trainer(assignment, comm, observer, abort);
    return trainer.Run();
  } catch (const std::exception& e) {
    if (abort) return absl::AbortedError("aborted");
    return FromException("training failed", e);
  }
}

}  // namespace ddp
