#include "worker/trainer.h"

#include <algorithm>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/sampler.h"
#include "worker/api/library_internals.h"
#include "worker/checkpoint.h"
#include "worker/dataset.h"
#include "worker/evaluation.h"
#include "worker/loader.h"
#include "worker/model.h"
#include "worker/reducer.h"
#include "worker/replica_check.h"
#include "worker/state_transfer.h"
#include "worker/torch_error.h"
#include "worker/training_state.h"

namespace ddp {
namespace {

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
  // Trains what is left of the state's current epoch. Sets *left when the
  // ranks agreed to leave.
  absl::Status RunEpoch(bool* left);
  absl::StatusOr<double> TrainMicroBatch(const Batch& batch, double scale, bool sync,
                                         v1::StepTimings* timings);
  void MaybeCheckpoint();
  bool ShouldEvaluate() const { return spec_.evaluate() && state_.data().test_x.defined(); }
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

absl::Status GenerationTrainer::PrepareSource(std::string* detail) {
  switch (a_.state_source()) {
    case v1::STATE_SOURCE_CHECKPOINT: {
      absl::StatusOr<LoadedCheckpoint> loaded =
          LoadNewestCheckpoint(spec_.checkpoint().dir(), state_.identity(), state_.MaxStateBytes());
      if (!loaded.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("this rank was to resume the job from its newest checkpoint, but: ",
                         loaded.status().message()));
      }
      for (const std::string& skipped : loaded->skipped) {
        DDP_LOG(Warning) << "skipped checkpoint " << skipped;
      }
      absl::StatusOr<v1::TrainingStateHeader> header = state_.Decode(loaded->bytes);
      if (!header.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("can't load checkpoint ", loaded->path, ": ", header.status().message()));
      }
      *detail =
          absl::StrCat("resumed from checkpoint ", loaded->path, " (step ", header->step(), ")");
      if (!loaded->skipped.empty()) {
        absl::StrAppend(detail, "; skipped ", absl::StrJoin(loaded->skipped, "; "));
      }
      return absl::OkStatus();
    }
    case v1::STATE_SOURCE_MEMORY:
      if (state_.progress().step != a_.start_step()) {
        // Another state than the coordinator counted on: it re-forms.
        return absl::UnavailableError(absl::StrFormat(
            "assigned as the source of the state at step %d, but this worker holds step %d",
            a_.start_step(), state_.progress().step));
      }
      *detail = absl::StrCat("from rank ", a_.rank(), "'s memory at step ", a_.start_step());
      return absl::OkStatus();
    default:
      if (state_.progress().step != 0) {
        return absl::UnavailableError(absl::StrFormat(
            "assigned to start the job afresh, but this worker holds its state at step %d",
            state_.progress().step));
      }
      *detail = "fresh weights";
      return absl::OkStatus();
  }
}

absl::Status GenerationTrainer::SyncState() {
  const int source = static_cast<int>(a_.source_rank());
  // Every rank must hold the same architecture before state moves.
  if (absl::Status s =
          CheckSameModel(*comm_, state_.model().Parameters(), state_.model().Buffers(), source);
      !s.ok()) {
    return s;
  }
  observer_->OnPhase(v1::STEP_PHASE_SYNC, state_.progress().step);
  std::string detail;
  absl::Status prepared = absl::OkStatus();
  if (static_cast<int>(a_.rank()) == source) prepared = PrepareSource(&detail);
  absl::StatusOr<std::string> mine = absl::UnavailableError("not the source");
  if (static_cast<int>(a_.rank()) == source) {
    mine = prepared.ok() ? state_.Encode(a_.generation(), a_.world_size())
                         : absl::StatusOr<std::string>(prepared);
  }
  absl::StatusOr<std::string> bytes =
      BroadcastState(*comm_, source, std::move(mine), state_.MaxStateBytes());
  if (!bytes.ok()) return bytes.status();
  if (static_cast<int>(a_.rank()) != source) {
    absl::StatusOr<v1::TrainingStateHeader> header = state_.Decode(*bytes);
    if (!header.ok()) {
      return absl::Status(
          header.status().code(),
          absl::StrCat("can't take up rank ", source, "'s state: ", header.status().message()));
    }
    detail = absl::StrCat("received from rank ", source, " at step ", header->step());
  }
  state_.SetGeneration(a_.generation());
  observer_->OnStarted(state_.Held(), detail);
  return absl::OkStatus();
}

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

void GenerationTrainer::MaybeCheckpoint() {
  const auto& c = spec_.checkpoint();
  if (a_.rank() != 0 || c.dir().empty()) return;
  const uint64_t step = state_.progress().step;
  const bool by_steps = c.every_steps() > 0 && step % c.every_steps() == 0;
  const bool by_time =
      c.every_seconds() > 0 && absl::Now() - last_checkpoint_ >= absl::Seconds(c.every_seconds());
  if ((!by_steps && !by_time) || checkpoints_failed_) return;
  absl::StatusOr<CheckpointWriter*> writer = state_.Checkpoints(control_.on_checkpoint);
  if (!writer.ok()) {
    // Said once per generation; training goes on without checkpoints.
    checkpoints_failed_ = true;
    DDP_LOG(Warning) << "no checkpoints: " << writer.status().message();
    if (control_.on_checkpoint) {
      v1::CheckpointResult result;
      result.set_generation(a_.generation());
      result.set_step(step);
      result.set_error(std::string(writer.status().message()));
      control_.on_checkpoint(result);
    }
    return;
  }
  last_checkpoint_ = absl::Now();
  absl::StatusOr<std::string> bytes = state_.Encode(a_.generation(), a_.world_size());
  if (!bytes.ok()) {
    DDP_LOG(Warning) << "can't encode a checkpoint: " << bytes.status().message();
    return;
  }
  if (!(*writer)->Submit(a_.generation(), step, state_.progress().epoch, std::move(*bytes))) {
    DDP_LOG(Warning) << "checkpoint of step " << step
                     << " skipped: the previous one is still being written";
  }
}

absl::Status GenerationTrainer::RunEpoch(bool* left) {
  const absl::Time epoch_start = absl::Now();
  const TrainingProgress begin = state_.progress();
  const uint64_t n = static_cast<uint64_t>(state_.data().train_size());
  const uint32_t world = a_.world_size();
  const uint64_t b = spec_.batch_size();
  const bool drop_last = spec_.drop_last();
  SamplerOptions sampler;
  sampler.dataset_size = n;
  sampler.seed = a_.sampler_seed();
  sampler.epoch = begin.epoch;
  sampler.rank = a_.rank();
  sampler.world_size = world;
  sampler.shuffle = spec_.shuffle();
  sampler.drop_last = drop_last;
  const std::vector<int64_t> indices = ElasticSamplerIndices(sampler, begin.cursor);
  const uint64_t batches = NumBatchesFrom(n, begin.cursor, world, b, drop_last);
  const uint64_t k = spec_.gradient_accumulation_steps();
  if (begin.cursor == 0) {
    epoch_loss_sum_ = 0;
    epoch_loss_steps_ = 0;
  }
  BatchLoader loader(state_.data().train_x, state_.data().train_y, indices, static_cast<int64_t>(b),
                     drop_last, 0);
  for (uint64_t done = 0; done < batches;) {
    if (aborted()) return absl::AbortedError("aborted");
    const absl::Time step_start = absl::Now();
    const uint64_t group = std::min(k, batches - done);
    const TrainingProgress before = state_.progress();
    {
      const size_t first = done * b;
      const size_t last = std::min<size_t>(indices.size(), (done + group) * b);
      observer_->OnStepIndices(before.step + 1, before.epoch,
                               absl::MakeConstSpan(indices.data() + first, last - first));
    }
    // The group's gradients start from zero; its last backward carries
    // this step's token and this rank's leave vote.
    state_.optimizer().zero_grad();
    control_words_ = ControlWords{StepToken(before.step + 1), control_.leave};
    reduced_.reset();
    double step_loss = 0;
    uint64_t samples = 0;
    v1::StepTimings timings;
    for (uint64_t m = 0; m < group; ++m) {
      observer_->OnPhase(v1::STEP_PHASE_DATA, before.step);
      const absl::Time data_start = absl::Now();
      std::optional<Batch> batch = loader.Next();
      timings.set_data_ms(timings.data_ms() + absl::ToDoubleMilliseconds(absl::Now() - data_start));
      samples += batch->x.size(0);
      absl::StatusOr<double> loss =
          TrainMicroBatch(*batch, 1.0 / static_cast<double>(group), m + 1 == group, &timings);
      if (!loss.ok()) return loss.status();
      step_loss += *loss / static_cast<double>(group);
    }
    if (!reduced_.has_value()) {
      return absl::InternalError(
          "the step's backward reached no parameter, so nothing was reduced");
    }
    absl::StatusOr<ReductionStats> stats = std::move(*reduced_);
    if (!stats.ok()) return stats.status();
    timings.set_backward_ms(std::max(0.0, timings.backward_ms() - stats->wait_ms));
    const uint64_t token = StepToken(before.step + 1);
    if (stats->token_sum != token * world) {
      return absl::DataLossError(absl::StrFormat(
          "the ranks did not all complete step %d (step tokens sum to %d, not %d x %d): the step "
          "was torn, and is not applied",
          before.step + 1, stats->token_sum, token, world));
    }
    timings.set_allreduce_wait_ms(stats->wait_ms);
    // Told to leave at once while the step completed: the others discard it.
    if (aborted()) return absl::AbortedError("aborted");
    observer_->OnPhase(v1::STEP_PHASE_OPTIMIZER, before.step);
    const absl::Time optimizer_start = absl::Now();
    state_.optimizer().step();
    timings.set_optimizer_ms(absl::ToDoubleMilliseconds(absl::Now() - optimizer_start));
    done += group;
    const uint64_t cursor = CursorAfterBatches(n, begin.cursor, world, b, drop_last, done);
    const bool epoch_over = cursor >= n;
    state_.Commit(TrainingProgress{before.step + 1, epoch_over ? before.epoch + 1 : before.epoch,
                                   epoch_over ? 0 : cursor});
    const uint64_t step = before.step + 1;
    epoch_loss_sum_ += step_loss;
    ++epoch_loss_steps_;
    if (samples > 0) {
      const double per_sample = timings.forward_ms() / 1000.0 / static_cast<double>(samples);
      forward_seconds_per_sample_ = forward_seconds_per_sample_ == 0
                                        ? per_sample
                                        : 0.9 * forward_seconds_per_sample_ + 0.1 * per_sample;
    }

    uint64_t remaining = (batches - done + k - 1) / k;
    if (before.epoch + 1 < spec_.epochs()) {
      remaining += (spec_.epochs() - before.epoch - 1) * steps_per_epoch_;
    }
    uint64_t total = step + remaining;
    if (spec_.max_steps() > 0) total = std::min<uint64_t>(total, spec_.max_steps());
    v1::StepReport report;
    report.set_generation(a_.generation());
    report.set_epoch(before.epoch);
    report.set_step(step);
    report.set_step_in_epoch(done / k + (done % k ? 1 : 0));
    report.set_steps_per_epoch(steps_per_epoch_);
    report.set_loss(step_loss);
    report.set_samples(samples);
    report.set_step_seconds(absl::ToDoubleSeconds(absl::Now() - step_start));
    report.set_cursor(cursor);
    report.set_dataset_size(n);
    report.set_lr(state_.learning_rate());
    report.set_world_size(world);
    report.set_total_steps(total);
    v1::ReductionStatus* r = report.mutable_reduction();
    AddReduction(*stats, r);
    r->set_phase(v1::STEP_PHASE_OPTIMIZER);
    // Digests on the first step of a generation (a joiner took up the state
    // correctly) and at each epoch's end (replicas still agree).
    if (first_step_ || epoch_over || state_.finished()) {
      report.set_parameter_digest(ParameterDigest(state_.model()));
    }
    first_step_ = false;
    *report.mutable_timings() = timings;
    observer_->OnStep(report, state_.progress().epoch, state_.progress().cursor);
    MaybeCheckpoint();
    if (state_.finished()) break;  // max_steps (or the last epoch's end)
    if (stats->leave_votes > 0) {
      *left = true;
      if (!epoch_over) return absl::OkStatus();
      break;  // evaluate the epoch that just ended first
    }
  }
  if (batches == 0) state_.Commit(TrainingProgress{begin.step, begin.epoch + 1, 0});
  if (!ShouldEvaluate()) return absl::OkStatus();
  return EvaluateEpoch(begin.epoch, absl::ToDoubleSeconds(absl::Now() - epoch_start));
}

absl::Status GenerationTrainer::EvaluateEpoch(uint64_t epoch, double seconds) {
  const uint64_t step = state_.progress().step;
  const auto [begin, end] = EvaluationShare(
      state_.data().test_x.size(0), static_cast<int>(a_.rank()), static_cast<int>(a_.world_size()));
  const absl::Duration bound = EvaluationBound(spec_, end - begin, forward_seconds_per_sample_);
  observer_->OnBoundedPhase(v1::STEP_PHASE_EVALUATE, step, bound);
  EvaluationInput in;
  in.spec = &spec_;
  in.model = &state_.model();
  in.test_x = state_.data().test_x;
  in.test_y = state_.data().test_y;
  in.train_loss_sum = epoch_loss_sum_;
  in.train_steps = epoch_loss_steps_;
  in.aborted = [this] { return aborted(); };
  in.share_done = [this, step, bound] {
    observer_->OnBoundedPhase(v1::STEP_PHASE_EVALUATE_WAIT, step, bound);
  };
  absl::StatusOr<EvaluationTotals> totals = EvaluateTogether(in, comm_);
  if (!totals.ok()) return totals.status();
  if (a_.rank() != 0) return absl::OkStatus();
  v1::EpochResult result;
  result.set_generation(a_.generation());
  result.set_epoch(epoch);
  result.set_test_accuracy(totals->test_accuracy);
  result.set_test_loss(totals->test_loss);
  result.set_train_loss(totals->train_loss);
  result.set_seconds(seconds);
  DDP_LOG(Info) << absl::StrFormat("epoch %d: test accuracy %.4f, test loss %.4f, train loss %.4f",
                                   epoch, result.test_accuracy(), result.test_loss(),
                                   result.train_loss());
  observer_->OnEpoch(result);
  return absl::OkStatus();
}

absl::StatusOr<GenerationEnd> GenerationTrainer::Run() {
  if (absl::Status s = SyncState(); !s.ok()) return s;
  state_.SetLearningRate(a_.lr() > 0 ? a_.lr() : spec_.optimizer().lr());
  StepDriver driver;
  driver.control = [this] { return control_words_; };
  driver.waiting = [this] {
    observer_->OnPhase(v1::STEP_PHASE_ALLREDUCE_WAIT, state_.progress().step);
  };
  driver.reduced = [this](absl::StatusOr<ReductionStats> r) { reduced_ = std::move(r); };
  session_ = LibraryInternals::SessionOver(comm_, std::move(driver));
  DistributedDataParallel::Options options;
  options.bucket_cap_mb = spec_.bucket_cap_mb();
  if (spec_.compression() == "fp16") {
    options.compression = DistributedDataParallel::Options::Compression::kFloat16;
  } else if (spec_.compression() == "bf16") {
    options.compression = DistributedDataParallel::Options::Compression::kBFloat16;
  } else if (spec_.compression() == "powersgd") {
    options.compression = DistributedDataParallel::Options::Compression::kPowerSGD;
    options.powersgd_rank = static_cast<int>(spec_.powersgd_rank());
    options.powersgd_start_step = static_cast<int64_t>(spec_.powersgd_start_step());
  }
  // Every rank holds the source's state now; buffers follow rank 0, as in
  // PyTorch.
  options.broadcast_from = 0;
  auto ddp = LibraryInternals::DataParallelOver(*session_, state_.model().Parameters(),
                                                state_.model().Buffers(), options);
  if (!ddp.ok()) return ddp.status();
  ddp_ = std::move(*ddp);

  const uint64_t n = static_cast<uint64_t>(state_.data().train_size());
  const uint64_t k = spec_.gradient_accumulation_steps();
  steps_per_epoch_ =
      (NumBatchesFrom(n, 0, a_.world_size(), spec_.batch_size(), spec_.drop_last()) + k - 1) / k;
  if (steps_per_epoch_ == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size: ", spec_.batch_size(), " per worker leaves no full batch of the ",
                     SamplesPerRank(n, a_.world_size(), spec_.drop_last()), " samples each of ",
                     a_.world_size(), " ranks gets with drop_last"));
  }
  const TrainingProgress& p = state_.progress();
  if (std::optional<uint64_t> lost =
          EpochToEvaluateFirst(p.epoch, p.cursor, state_.finished(), a_.evaluated_epochs());
      lost && ShouldEvaluate()) {
    DDP_LOG(Info) << "evaluating epoch " << *lost
                  << " first: its result was lost with a rank of the last generation";
    if (absl::Status s = EvaluateEpoch(*lost, 0); !s.ok()) return s;
  }
  DDP_LOG(Info) << "training " << spec_.model().kind() << " on " << spec_.dataset().kind()
                << " from step " << p.step << " (epoch " << p.epoch << ", cursor " << p.cursor
                << " of " << n << "): " << steps_per_epoch_ << " steps per epoch at world size "
                << a_.world_size() << ", lr " << state_.learning_rate();
  bool left = false;
  while (!state_.finished() && !left) {
    if (absl::Status s = RunEpoch(&left); !s.ok()) return s;
  }
  if (left && !state_.finished()) return GenerationEnd::kLeft;
  if (a_.rank() == 0 && !spec_.output_path().empty()) {
    if (absl::Status s = SaveOutput(state_.model(), spec_.output_path(), spec_.overwrite_output());
        !s.ok()) {
      return s;
    }
    DDP_LOG(Info) << "wrote the trained model to " << spec_.output_path();
  }
  return GenerationEnd::kFinished;
}

}  // namespace

absl::StatusOr<GenerationEnd> TrainGeneration(const v1::Assignment& assignment,
                                              TrainingState* state, Communicator* comm,
                                              TrainingObserver* observer,
                                              const GenerationControl& control) {
  try {
    GenerationTrainer trainer(assignment, state, comm, observer, control);
    return trainer.Run();
  } catch (const std::exception& e) {
    if (control.abort != nullptr && control.abort->load()) return absl::AbortedError("aborted");
    return TorchErrorStatus(absl::StatusCode::kInternal, "training failed", e);
  }
}

}  // namespace ddp
