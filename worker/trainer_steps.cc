// The steps of an epoch: the sampler's share, micro-batches through the
// library's DistributedDataParallel, the optimizer step, and its report.
#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/job_spec.h"
#include "common/sampler.h"
#include "worker/dataset.h"
#include "worker/device_placement.h"
#include "worker/digest.h"
#include "worker/evaluation.h"
#include "worker/generation_trainer.h"
#include "worker/model.h"

namespace ddp {

absl::StatusOr<double> GenerationTrainer::TrainMicroBatch(const Batch& batch, double scale,
                                                          bool sync, v1::StepTimings* timings) {
  const uint64_t step = state_.progress().step;
  // Earlier micro-batches of the group only accumulate.
  std::optional<DistributedDataParallel::NoSync> accumulate;
  if (!sync) accumulate.emplace(ddp_->no_sync());
  observer_->OnPhase(v1::STEP_PHASE_FORWARD, step);
  const absl::Time start = absl::Now();
  at::Tensor loss = JobLoss(spec_, state_.model().Forward(batch.x), batch.y);
  const absl::Time forward_done = absl::Now();
  observer_->OnPhase(v1::STEP_PHASE_BACKWARD, step);
  // A synchronized backward returns with the gradients averaged (or the
  // reduction's error in reduced_); its wait for them is told apart below.
  (scale == 1.0 ? loss : loss * scale).backward();
  timings->set_forward_ms(timings->forward_ms() + absl::ToDoubleMilliseconds(forward_done - start));
  timings->set_backward_ms(timings->backward_ms() +
                           absl::ToDoubleMilliseconds(absl::Now() - forward_done));
  return loss.item<double>();
}

GenerationTrainer::EpochPlan GenerationTrainer::PlanEpoch() const {
  EpochPlan plan;
  plan.begin = state_.progress();
  plan.n = static_cast<uint64_t>(state_.data().train_size());
  plan.world = a_.world_size();
  plan.batch = spec_.batch_size();
  plan.drop_last = spec_.drop_last();
  plan.accumulation = spec_.gradient_accumulation_steps();
  SamplerOptions sampler;
  sampler.dataset_size = plan.n;
  sampler.seed = a_.sampler_seed();
  sampler.epoch = plan.begin.epoch;
  sampler.rank = a_.rank();
  sampler.world_size = plan.world;
  sampler.shuffle = spec_.shuffle();
  sampler.drop_last = plan.drop_last;
  plan.indices = ElasticSamplerIndices(sampler, plan.begin.cursor);
  plan.batches = NumBatchesFrom(plan.n, plan.begin.cursor, plan.world, plan.batch, plan.drop_last);
  return plan;
}

absl::Status GenerationTrainer::RunEpoch(bool* left) {
  const absl::Time epoch_start = absl::Now();
  const EpochPlan plan = PlanEpoch();
  if (plan.begin.cursor == 0) {
    epoch_loss_sum_ = 0;
    epoch_loss_steps_ = 0;
  }
  const Dataset& data = state_.data();
  std::unique_ptr<BatchLoader> made;
  if (data.train_source) {
    const auto& d = spec_.dataset();
    made = std::make_unique<BatchLoader>(
        data.train_source, plan.begin.epoch, static_cast<int>(d.loader_threads()), plan.indices,
        static_cast<int64_t>(plan.batch), plan.drop_last, 0,
        std::max<size_t>(1, d.prefetch_batches()), TorchDevice(state_.device()));
  } else {
    made = std::make_unique<BatchLoader>(data.train_x, data.train_y, plan.indices,
                                         static_cast<int64_t>(plan.batch), plan.drop_last, 0,
                                         /*depth=*/4, TorchDevice(state_.device()));
  }
  BatchLoader& loader = *made;
  for (uint64_t done = 0; done < plan.batches;) {
    if (aborted()) return absl::AbortedError("aborted");
    const absl::Time step_start = absl::Now();
    const uint64_t group = std::min(plan.accumulation, plan.batches - done);
    const TrainingProgress before = state_.progress();
    {
      const size_t first = done * plan.batch;
      const size_t last = std::min<size_t>(plan.indices.size(), (done + group) * plan.batch);
      observer_->OnStepIndices(before.step + 1, before.epoch,
                               absl::MakeConstSpan(plan.indices.data() + first, last - first));
    }
    absl::StatusOr<StepOutcome> outcome = TrainStep(loader, group, before.step + 1);
    if (!outcome.ok()) return outcome.status();
    done += group;
    const uint64_t cursor =
        CursorAfterBatches(plan.n, plan.begin.cursor, plan.world, plan.batch, plan.drop_last, done);
    const bool epoch_over = cursor >= plan.n;
    state_.Commit(TrainingProgress{before.step + 1, epoch_over ? before.epoch + 1 : before.epoch,
                                   epoch_over ? 0 : cursor});
    epoch_loss_sum_ += outcome->loss;
    ++epoch_loss_steps_;
    ReportStep(plan, *outcome, before.epoch, done, cursor, absl::Now() - step_start, epoch_over);
    MaybeCheckpoint();
    if (state_.finished()) break;  // max_steps (or the last epoch's end)
    if (outcome->stats.leave_votes > 0) {
      *left = true;
      if (!epoch_over) return absl::OkStatus();
      break;  // evaluate the epoch that just ended first
    }
  }
  if (plan.batches == 0) {
    state_.Commit(TrainingProgress{plan.begin.step, plan.begin.epoch + 1, 0});
  }
  if (!ShouldEvaluate()) return absl::OkStatus();
  return EvaluateEpoch(plan.begin.epoch, absl::ToDoubleSeconds(absl::Now() - epoch_start));
}

absl::StatusOr<GenerationTrainer::StepOutcome> GenerationTrainer::TrainStep(BatchLoader& loader,
                                                                            uint64_t group,
                                                                            uint64_t step) {
  // The group's gradients start from zero; its last backward carries this
  // step's token and this rank's leave vote.
  state_.optimizer().zero_grad();
  control_words_ = ControlWords{StepToken(step), control_.leave};
  reduced_.reset();
  StepOutcome out;
  for (uint64_t m = 0; m < group; ++m) {
    observer_->OnPhase(v1::STEP_PHASE_DATA, step - 1);
    const absl::Time data_start = absl::Now();
    std::optional<Batch> batch = loader.Next();
    if (!batch) {
      return loader.status().ok() ? absl::InternalError("the loader ran out of batches")
                                  : loader.status();
    }
    out.timings.set_data_ms(out.timings.data_ms() +
                            absl::ToDoubleMilliseconds(absl::Now() - data_start));
    out.samples += batch->x.size(0);
    absl::StatusOr<double> loss =
        TrainMicroBatch(*batch, 1.0 / static_cast<double>(group), m + 1 == group, &out.timings);
    if (!loss.ok()) return loss.status();
    out.loss += *loss / static_cast<double>(group);
  }
  if (!reduced_.has_value()) {
    return absl::InternalError("the step's backward reached no parameter, so nothing was reduced");
  }
  absl::StatusOr<ReductionStats> stats = std::move(*reduced_);
  if (!stats.ok()) return stats.status();
  out.timings.set_backward_ms(std::max(0.0, out.timings.backward_ms() - stats->wait_ms));
  const uint64_t token = StepToken(step);
  if (stats->token_sum != token * a_.world_size()) {
    return absl::DataLossError(absl::StrFormat(
        "the ranks did not all complete step %d (step tokens sum to %d, not %d x %d): the step "
        "was torn, and is not applied",
        step, stats->token_sum, token, a_.world_size()));
  }
  out.timings.set_allreduce_wait_ms(stats->wait_ms);
  // Told to leave at once while the step completed: the others discard it.
  if (aborted()) return absl::AbortedError("aborted");
  observer_->OnPhase(v1::STEP_PHASE_OPTIMIZER, step - 1);
  const absl::Time optimizer_start = absl::Now();
  state_.optimizer().step();
  out.timings.set_optimizer_ms(absl::ToDoubleMilliseconds(absl::Now() - optimizer_start));
  if (out.samples > 0) {
    const double per_sample = out.timings.forward_ms() / 1000.0 / static_cast<double>(out.samples);
    forward_seconds_per_sample_ = forward_seconds_per_sample_ == 0
                                      ? per_sample
                                      : 0.9 * forward_seconds_per_sample_ + 0.1 * per_sample;
  }
  out.stats = *std::move(stats);
  return out;
}

void GenerationTrainer::ReportStep(const EpochPlan& plan, const StepOutcome& outcome,
                                   uint64_t epoch, uint64_t done, uint64_t cursor,
                                   absl::Duration took, bool epoch_over) {
  const uint64_t k = plan.accumulation;
  const uint64_t step = state_.progress().step;
  uint64_t remaining = (plan.batches - done + k - 1) / k;
  if (epoch + 1 < spec_.epochs()) remaining += (spec_.epochs() - epoch - 1) * steps_per_epoch_;
  uint64_t total = step + remaining;
  if (spec_.max_steps() > 0) total = std::min<uint64_t>(total, spec_.max_steps());
  v1::StepReport report;
  report.set_generation(a_.generation());
  report.set_epoch(epoch);
  report.set_step(step);
  report.set_step_in_epoch(done / k + (done % k ? 1 : 0));
  report.set_steps_per_epoch(steps_per_epoch_);
  report.set_loss(outcome.loss);
  report.set_samples(outcome.samples);
  report.set_step_seconds(absl::ToDoubleSeconds(took));
  report.set_cursor(cursor);
  report.set_dataset_size(plan.n);
  if (spec_.dataset().skip_bad_samples()) {
    // Names beyond what one report may carry wait for the next.
    SkippingSource::Skipped skipped = state_.data().TakeSkipped(kMaxBadSamplesPerReport);
    report.set_samples_skipped(skipped.replaced);
    for (std::string& bad : skipped.newly_bad) {
      if (bad.size() > kMaxBadSampleBytes) bad.resize(kMaxBadSampleBytes);
      report.add_newly_bad_samples(std::move(bad));
    }
  }
  report.set_lr(state_.learning_rate());
  report.set_world_size(plan.world);
  report.set_total_steps(total);
  v1::ReductionStatus* r = report.mutable_reduction();
  AddReduction(outcome.stats, r);
  r->set_phase(v1::STEP_PHASE_OPTIMIZER);
  // Digests on the first step of a generation (a joiner took up the state
  // correctly) and at each epoch's end (replicas still agree).
  if (first_step_ || epoch_over || state_.finished()) {
    report.set_parameter_digest(ParameterDigest(state_.model()));
  }
  first_step_ = false;
  *report.mutable_timings() = outcome.timings;
  observer_->OnStep(report, state_.progress().epoch, state_.progress().cursor);
}

}  // namespace ddp
