#include "coordinator/job_progress.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/quote.h"
#include "coordinator/job_history.h"

namespace ddp {
namespace {

constexpr absl::Duration kRateWindow = absl::Seconds(20);
constexpr size_t kStepTimeWindow = 64;
constexpr size_t kMaxBadSamplesKept = 32;
// The newest step's weight in a rank's average share of waiting on data.
constexpr double kDataWaitWeight = 0.2;

}  // namespace

absl::Status JobProgress::Submit(const v1::JobSpec& spec, absl::Time submitted_at) {
  if (active()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", spec_.name(), "\" is still ",
                     state_ == v1::JOB_STATE_WAITING ? "waiting for workers" : "running",
                     "; cancel it first (CancelJob) or wait for it to end"));
  }
  *this = JobProgress(clock_);
  spec_ = spec;
  spec_digest_ = SpecDigest(spec);
  state_ = v1::JOB_STATE_WAITING;
  message_ = absl::StrCat("waiting for ", spec.min_workers(), " worker(s)");
  submitted_at_ = submitted_at;
  return absl::OkStatus();
}

absl::Status JobProgress::Cancel(const std::string& job_id, const std::string& reason) {
  if (state_ == v1::JOB_STATE_UNSPECIFIED || job_id != spec_.name()) {
    return absl::NotFoundError(absl::StrCat("no job ", Quote(job_id),
                                            spec_.name().empty() ? "" : "; the current job is \"",
                                            spec_.name(), spec_.name().empty() ? "" : "\""));
  }
  if (ended()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", Quote(job_id), " already ended (", v1::JobState_Name(state_), ")"));
  }
  state_ = v1::JOB_STATE_CANCELLED;
  message_ = CancelledMessage(reason);
  ended_at_ = clock_->Now();
  return absl::OkStatus();
}

std::string JobProgress::CancelledMessage(absl::string_view reason) {
  return reason.empty() ? "cancelled by an operator" : absl::StrCat("cancelled: ", reason);
}

void JobProgress::OnGenerationStarted(uint32_t world_size, uint64_t start_step, double lr) {
  state_ = v1::JOB_STATE_RUNNING;
  if (!started_at_) started_at_ = clock_->Now();
  message_ = absl::StrCat("training on ", world_size, " worker(s)");
  start_step_ = start_step;
  // The job goes on from here: steps past it (a whole-job restart from a
  // checkpoint dropped them) no longer count as committed.
  committed_step_ = start_step;
  world_size_ = world_size;
  lr_ = lr;
  ranks_.assign(world_size, RankProgress{});
  for (auto& r : ranks_) r.step = start_step_;
  rate_window_.clear();
}

void JobProgress::Recover(const std::string& message) {
  state_ = v1::JOB_STATE_RECOVERING;
  message_ = message;
  ranks_.clear();
  start_step_ = committed_step_;
}

void JobProgress::SetWaitingMessage(const std::string& message) {
  if (!message.empty() && (state_ == v1::JOB_STATE_WAITING || state_ == v1::JOB_STATE_RECOVERING)) {
    message_ = message;
  }
}

void JobProgress::OnStepReport(uint32_t rank, const v1::StepReport& report) {
  if (rank >= ranks_.size()) return;
  RankProgress& r = ranks_[rank];
  r.step = std::max(r.step, report.step());
  r.epoch = report.epoch();
  r.loss = report.loss();
  if (report.step_seconds() > 0) r.samples_per_sec = report.samples() / report.step_seconds();
  if (report.step_seconds() > 0) {
    // Over the last several steps (an exponential average), not the last
    // one alone: one slow batch is not "training waits on data", and the
    // status page's note must not flicker from step to step.
    const double wait = std::min(1.0, report.timings().data_ms() / 1000 / report.step_seconds());
    r.data_wait = r.reported ? (1 - kDataWaitWeight) * r.data_wait + kDataWaitWeight * wait : wait;
  }
  r.reported = true;
  samples_skipped_ += report.samples_skipped();
  NoteBadSamples(report.newly_bad_samples());
  committed_step_ = std::max(committed_step_, report.step());
  steps_per_epoch_ = report.steps_per_epoch();
  if (report.step() >= committed_step_) {
    cursor_ = report.cursor();
    dataset_size_ = report.dataset_size();
    total_steps_ = report.total_steps();
    lr_ = report.lr();
  }
  step_seconds_.push_back(report.step_seconds());
  if (step_seconds_.size() > kStepTimeWindow) step_seconds_.pop_front();
}

void JobProgress::SampleProgress() {
  if (state_ != v1::JOB_STATE_RUNNING) return;
  const absl::Time now = clock_->Now();
  rate_window_.emplace_back(now, GlobalStep());
  while (rate_window_.size() > 2 && now - rate_window_.front().first > kRateWindow) {
    rate_window_.pop_front();
  }
  double rate = 0;
  for (const RankProgress& r : ranks_) {
    if (!r.reported) return;
    rate += r.samples_per_sec;
  }
  if (rate > 0) throughput_[world_size_] = rate;
}

void JobProgress::OnEpochResult(const v1::EpochResult& result) {
  // In epoch order: the newest epoch's is the job's accuracy.
  auto at =
      std::lower_bound(epochs_.begin(), epochs_.end(), result.epoch(),
                       [](const v1::EpochResult& e, uint64_t epoch) { return e.epoch() < epoch; });
  if (at != epochs_.end() && at->epoch() == result.epoch()) {
    // Evaluated again (a lost evaluation run again, a restart from
    // scratch). A re-run trained nothing of the epoch: keep what the first
    // said of the training.
    const bool rerun = result.seconds() == 0 && result.train_loss() == 0;
    const v1::EpochResult first = *at;
    *at = result;
    if (rerun) {
      at->set_train_loss(first.train_loss());
      at->set_seconds(first.seconds());
    }
  } else {
    epochs_.insert(at, result);
  }
}

uint64_t JobProgress::evaluated_epochs() const {
  return epochs_.empty() ? 0 : epochs_.back().epoch() + 1;
}

void JobProgress::OnCheckpoint(const v1::CheckpointResult& result) {
  if (!result.error().empty()) {
    checkpoint_error_ = result.error();
    return;
  }
  checkpoint_error_.clear();
  // The newest by (generation, step): after a restart from an older
  // checkpoint, the job's new ones count even at lower steps.
  if (result.generation() > last_checkpoint_generation_ ||
      (result.generation() == last_checkpoint_generation_ &&
       result.step() >= last_checkpoint_step_)) {
    last_checkpoint_step_ = result.step();
    last_checkpoint_generation_ = result.generation();
    last_checkpoint_path_ = result.path();
  }
}

void JobProgress::OnHeldState(const v1::HeldState& held) {
  committed_step_ = std::max(committed_step_, held.step());
}

std::optional<uint64_t> JobProgress::checkpoint_step() const {
  if (last_checkpoint_path_.empty()) return std::nullopt;
  return last_checkpoint_step_;
}

v1::JobOutcome JobProgress::outcome() const {
  switch (state_) {
    case v1::JOB_STATE_SUCCEEDED:
      return v1::JOB_OUTCOME_SUCCEEDED;
    case v1::JOB_STATE_FAILED:
      return v1::JOB_OUTCOME_FAILED;
    case v1::JOB_STATE_CANCELLED:
      return v1::JOB_OUTCOME_CANCELLED;
    default:  // not ended
      return v1::JOB_OUTCOME_UNSPECIFIED;
  }
}

absl::Duration JobProgress::median_step_time() const {
  if (step_seconds_.empty()) return absl::ZeroDuration();
  std::vector<double> sorted(step_seconds_.begin(), step_seconds_.end());
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  return absl::Seconds(sorted[sorted.size() / 2]);
}

absl::Status JobProgress::OnParameterDigest(uint32_t rank, const v1::StepReport& report) {
  const auto& per_parameter = report.parameter_digests();
  if (!report.parameter_digest_names().empty() &&
      report.parameter_digest_names_size() == per_parameter.size()) {
    digest_names_.assign(report.parameter_digest_names().begin(),
                         report.parameter_digest_names().end());
  }
  const std::string& digest = report.parameter_digest();
  // Within a generation: a later one may train a step number again from
  // other weights (the step in flight at a fault, or every step when no
  // state survived it).
  auto [it, inserted] = digests_.try_emplace({report.generation(), report.step()});
  StepDigests& first = it->second;
  if (inserted) {
    first.digest = digest;
    first.rank = rank;
    first.per_parameter.assign(per_parameter.begin(), per_parameter.end());
    while (digests_.size() > 16) digests_.erase(digests_.begin());
    return absl::OkStatus();
  }
  if (first.digest == digest) return absl::OkStatus();
  std::string message =
      absl::StrCat("replicas diverged: after step ", report.step(), " rank ", first.rank,
                   " has parameter digest ", first.digest, " but rank ", rank, " has ", digest);
  if (!per_parameter.empty() &&
      per_parameter.size() == static_cast<int>(first.per_parameter.size())) {
    const bool named = digest_names_.size() == first.per_parameter.size();
    constexpr size_t kShown = 8;
    std::vector<std::string> differ;
    size_t count = 0;
    for (int i = 0; i < per_parameter.size(); ++i) {
      if (per_parameter[i] == first.per_parameter[i]) continue;
      if (++count <= kShown) differ.push_back(named ? digest_names_[i] : absl::StrCat("#", i));
    }
    absl::StrAppend(&message, "; the parameters that differ: ", absl::StrJoin(differ, ", "),
                    count > kShown ? absl::StrCat(" and ", count - kShown, " more") : "", " (",
                    count, " of ", per_parameter.size(), ")");
  }
  return absl::DataLossError(message);
}

bool JobProgress::OnRankDone(uint32_t rank) {
  if (rank >= ranks_.size() || state_ != v1::JOB_STATE_RUNNING) return false;
  ranks_[rank].done = true;
  for (const auto& r : ranks_) {
    if (!r.done) return false;
  }
  state_ = v1::JOB_STATE_SUCCEEDED;
  ended_at_ = clock_->Now();
  message_ = absl::StrCat("finished ", GlobalStep(), " steps");
  if (!epochs_.empty() && spec_.evaluate()) {
    absl::StrAppend(&message_, "; test accuracy ", epochs_.back().test_accuracy());
  }
  return true;
}

void JobProgress::NoteBadSamples(const google::protobuf::RepeatedPtrField<std::string>& names) {
  for (const std::string& bad : names) {
    if (bad_samples_.size() < kMaxBadSamplesKept &&
        std::find(bad_samples_.begin(), bad_samples_.end(), bad) == bad_samples_.end()) {
      bad_samples_.push_back(bad);
    }
  }
}

void JobProgress::Fail(const std::string& reason) {
  state_ = v1::JOB_STATE_FAILED;
  message_ = reason;
  ended_at_ = clock_->Now();
}

void JobProgress::Restore(const v1::DurableState& state) {
  if (!state.has_job()) return;
  // A state saved by an older build lacks the defaults of newer fields (a
  // fault_budget of 0 would fail the job at its first fault).
  spec_ = WithDefaults(state.job());
  spec_digest_ = SpecDigest(spec_);
  state_ = state.job_state();
  message_ = state.job_message();
  // Ages count from the submission, not from the restart.
  submitted_at_ = state.submitted_unix_micros() != 0
                      ? absl::FromUnixMicros(state.submitted_unix_micros())
                      : clock_->Now();
  started_at_.reset();
  if (state.started_unix_micros() != 0) {
    started_at_ = absl::FromUnixMicros(state.started_unix_micros());
  }
  ended_at_.reset();
  if (ended() && state.ended_unix_micros() != 0) {
    ended_at_ = absl::FromUnixMicros(state.ended_unix_micros());
  }
  epochs_.clear();
  for (const v1::EpochResult& e : state.epoch_results()) OnEpochResult(e);
  committed_step_ = state.global_step();
  start_step_ = committed_step_;
  last_checkpoint_step_ = state.last_checkpoint_step();
  last_checkpoint_path_ = state.last_checkpoint_path();
  last_checkpoint_generation_ = state.last_checkpoint_generation();
  faults_ = state.faults();
  throughput_ = {state.samples_per_sec_by_world_size().begin(),
                 state.samples_per_sec_by_world_size().end()};
  samples_skipped_ = state.samples_skipped();
  bad_samples_.clear();
  NoteBadSamples(state.bad_samples());
  if (!active()) return;
  if (state.has_generation()) {
    state_ = v1::JOB_STATE_RECOVERING;
    message_ = absl::StrCat("the coordinator restarted; waiting for generation ",
                            state.generation().number(), "'s members to come back");
  } else if (committed_step_ > 0 || state_ == v1::JOB_STATE_RECOVERING) {
    state_ = v1::JOB_STATE_RECOVERING;
    message_ = absl::StrCat("the coordinator restarted; waiting for ", spec_.min_workers(),
                            " worker(s) to go on from step ", committed_step_);
  } else {
    state_ = v1::JOB_STATE_WAITING;
    message_ = absl::StrCat("restored after a coordinator restart; waiting for ",
                            spec_.min_workers(), " worker(s)");
  }
}

void JobProgress::FillDurable(v1::DurableState* state) const {
  if (state_ == v1::JOB_STATE_UNSPECIFIED) return;
  *state->mutable_job() = spec_;
  state->set_job_state(state_);
  state->set_job_message(message_);
  for (const auto& e : epochs_) *state->add_epoch_results() = e;
  state->set_global_step(committed_step_);
  state->set_last_checkpoint_step(last_checkpoint_step_);
  state->set_last_checkpoint_path(last_checkpoint_path_);
  state->set_last_checkpoint_generation(last_checkpoint_generation_);
  state->set_faults(faults_);
  state->mutable_samples_per_sec_by_world_size()->insert(throughput_.begin(), throughput_.end());
  state->set_samples_skipped(samples_skipped_);
  for (const std::string& bad : bad_samples_) state->add_bad_samples(bad);
  state->set_submitted_unix_micros(absl::ToUnixMicros(submitted_at_));
  if (started_at_) state->set_started_unix_micros(absl::ToUnixMicros(*started_at_));
  if (ended_at_) state->set_ended_unix_micros(absl::ToUnixMicros(*ended_at_));
}

void JobProgress::FillRecord(v1::JobRecord* record) const {
  record->set_job_id(spec_.name());
  record->set_submission_digest(SubmissionDigest(spec_));
  record->set_priority(spec_.priority());
  record->set_submitted_unix_micros(absl::ToUnixMicros(submitted_at_));
  if (started_at_) record->set_started_unix_micros(absl::ToUnixMicros(*started_at_));
  if (ended_at_) record->set_ended_unix_micros(absl::ToUnixMicros(*ended_at_));
  record->set_state(state_);
  record->set_message(message_);
  record->set_global_step(std::max(committed_step_, GlobalStep()));
  if (!epochs_.empty()) record->set_test_accuracy(epochs_.back().test_accuracy());
  record->set_epochs_evaluated(evaluated_epochs());
  record->set_faults(faults_);
}

void JobProgress::FillTimes(google::protobuf::Timestamp* submitted,
                            google::protobuf::Timestamp* started,
                            google::protobuf::Timestamp* ended) const {
  SetTimestamp(absl::ToUnixMicros(submitted_at_), submitted);
  if (started_at_) SetTimestamp(absl::ToUnixMicros(*started_at_), started);
  if (ended_at_) SetTimestamp(absl::ToUnixMicros(*ended_at_), ended);
}

double JobProgress::ElapsedSeconds() const {
  return absl::ToDoubleSeconds(ended_at_.value_or(clock_->Now()) - submitted_at_);
}

uint64_t JobProgress::GlobalStep() const {
  if (ranks_.empty()) return start_step_;
  uint64_t step = std::numeric_limits<uint64_t>::max();
  for (const auto& r : ranks_) step = std::min(step, r.step);
  return step;
}

void JobProgress::FillSummary(v1::JobSummary* summary) const {
  summary->set_global_step(GlobalStep());
  double rate = 0;
  for (const auto& r : ranks_) rate += r.reported ? r.samples_per_sec : 0;
  summary->set_samples_per_sec(state_ == v1::JOB_STATE_RUNNING ? rate : 0);
  summary->mutable_samples_per_sec_by_world_size()->insert(throughput_.begin(), throughput_.end());
  FillTimes(summary->mutable_submitted_at(), summary->mutable_started_at(),
            summary->mutable_ended_at());
  if (ended() && !epochs_.empty()) summary->set_test_accuracy(epochs_.back().test_accuracy());
}

void JobProgress::FillStatus(v1::JobStatus* status) const {
  status->set_job_id(spec_.name());
  status->set_state(state_);
  status->set_message(message_);
  if (state_ == v1::JOB_STATE_UNSPECIFIED) return;
  *status->mutable_spec() = spec_;
  status->set_epochs(spec_.epochs());
  status->set_elapsed_seconds(ElapsedSeconds());
  FillTimes(status->mutable_submitted_at(), status->mutable_started_at(),
            status->mutable_ended_at());
  const uint64_t global = GlobalStep();
  status->set_global_step(global);
  status->set_steps_per_epoch(steps_per_epoch_);
  uint64_t total = total_steps_;
  if (spec_.max_steps() > 0)
    total = total == 0 ? spec_.max_steps() : std::min(total, spec_.max_steps());
  status->set_total_steps(total);
  uint64_t epoch = std::numeric_limits<uint64_t>::max();
  double loss = 0, rate = 0;
  int reported = 0;
  for (const auto& r : ranks_) {
    epoch = std::min(epoch, r.epoch);
    if (!r.reported) continue;
    loss += r.loss;
    rate += r.samples_per_sec;
    ++reported;
  }
  status->set_epoch(ranks_.empty() ? 0 : epoch);
  status->set_loss(reported ? loss / reported : 0);
  status->set_samples_per_sec(state_ == v1::JOB_STATE_RUNNING ? rate : 0);
  if (state_ == v1::JOB_STATE_RUNNING && rate_window_.size() >= 2 && total > global) {
    const auto& [t0, s0] = rate_window_.front();
    const auto& [t1, s1] = rate_window_.back();
    const double seconds = absl::ToDoubleSeconds(t1 - t0);
    if (s1 > s0 && seconds > 0) status->set_eta_seconds((total - global) * seconds / (s1 - s0));
  }
  for (const auto& e : epochs_) *status->add_epoch_results() = e;
  if (!epochs_.empty()) status->set_test_accuracy(epochs_.back().test_accuracy());
  status->set_last_checkpoint_step(last_checkpoint_step_);
  status->set_last_checkpoint_path(last_checkpoint_path_);
  status->set_checkpoint_error(checkpoint_error_);
  if (state_ == v1::JOB_STATE_RUNNING) {
    status->set_global_batch(uint64_t{spec_.batch_size()} * world_size_ *
                             spec_.gradient_accumulation_steps());
  }
  status->set_lr(lr_);
  status->set_faults(faults_);
  status->set_epoch_cursor(cursor_);
  status->set_dataset_size(dataset_size_);
  if (state_ == v1::JOB_STATE_RUNNING) {
    for (uint32_t rank = 0; rank < ranks_.size(); ++rank) {
      if (ranks_[rank].reported && ranks_[rank].data_wait > status->data_wait_fraction()) {
        status->set_data_wait_fraction(ranks_[rank].data_wait);
        status->set_data_wait_rank(rank);
      }
    }
  }
  status->set_samples_skipped(samples_skipped_);
  for (const std::string& bad : bad_samples_) status->add_bad_samples(bad);
}

}  // namespace ddp
