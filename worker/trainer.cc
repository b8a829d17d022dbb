#include "worker/trainer.h"

#include <algorithm>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/job_kinds.h"
#include "common/logging.h"
#include "common/sampler.h"
#include "worker/api/library_internals.h"
#include "worker/checkpoint.h"
#include "worker/collective/reducer.h"
#include "worker/dataset.h"
#include "worker/elastic/replica_check.h"
#include "worker/elastic/state_transfer.h"
#include "worker/elastic/torch_error.h"
#include "worker/evaluation.h"
#include "worker/generation_trainer.h"
#include "worker/loader.h"
#include "worker/model.h"
#include "worker/training_state.h"

namespace ddp {

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

absl::Status GenerationTrainer::EvaluateEpoch(uint64_t epoch, double seconds) {
  const uint64_t step = state_.progress().step;
  const auto [begin, end] = EvaluationShare(state_.data().test_size(), static_cast<int>(a_.rank()),
                                            static_cast<int>(a_.world_size()));
  const absl::Duration bound = EvaluationBound(spec_, end - begin, forward_seconds_per_sample_);
  observer_->OnBoundedPhase(v1::STEP_PHASE_EVALUATE, step, bound);
  EvaluationInput in;
  in.spec = &spec_;
  in.model = &state_.model();
  in.test_x = state_.data().test_x;
  in.test_source = state_.data().test_source;
  in.loader_threads = static_cast<int>(spec_.dataset().loader_threads());
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
  using Compression = DistributedDataParallel::Options::Compression;
  switch (CompressionOf(spec_)) {
    case v1::COMPRESSION_UNKNOWN:  // refused by the job's check
    case v1::COMPRESSION_NONE:
      options.compression = Compression::kNone;
      break;
    case v1::COMPRESSION_FP16:
      options.compression = Compression::kFloat16;
      break;
    case v1::COMPRESSION_BF16:
      options.compression = Compression::kBFloat16;
      break;
    case v1::COMPRESSION_POWERSGD:
      options.compression = Compression::kPowerSGD;
      options.powersgd_rank = static_cast<int>(spec_.powersgd_rank());
      options.powersgd_start_step = static_cast<int64_t>(spec_.powersgd_start_step());
      break;
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
