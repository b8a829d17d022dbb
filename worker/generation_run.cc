#include "worker/generation_run.h"

#include <unistd.h>

#include <functional>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/job_spec.h"
#include "common/line_file.h"
#include "common/logging.h"
#include "common/store_client.h"
#include "google/protobuf/util/json_util.h"
#include "worker/collective/connect.h"
#include "worker/trainer.h"
#include "worker/training_state.h"

namespace ddp {
namespace {

// The metrics file's lines (v1::StepRecord): every field printed, so a line
// always has the same keys, under the proto's names.
google::protobuf::util::JsonPrintOptions RecordJsonOptions() {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  return options;
}

// `path` opened for whole lines; none when empty or unopenable (said).
std::optional<LineFile> OpenLines(const std::string& path) {
  if (path.empty()) return std::nullopt;
  absl::StatusOr<LineFile> file = LineFile::Open(path);
  if (!file.ok()) {
    DDP_LOG(Warning) << file.status().message();
    return std::nullopt;
  }
  return std::move(*file);
}

// Forwards the trainer's news to the outbox, the heartbeat board, the
// metrics file and the index log.
class OutboxObserver final : public TrainingObserver {
 public:
  using StartedCallback = std::function<void(const v1::HeldState&, const std::string&)>;
  OutboxObserver(const v1::Assignment& a, Outbox* outbox, ProgressBoard* board,
                 const GenerationRun::Environment& env, const std::atomic<bool>* abort,
                 StartedCallback on_started)
      : a_(a),
        outbox_(outbox),
        board_(board),
        send_reports_(env.send_reports),
        report_buckets_(env.report_buckets),
        on_step_(env.on_step),
        hang_file_(env.debug_hang_file),
        abort_(abort),
        on_started_(std::move(on_started)) {
    metrics_ = OpenLines(env.metrics_file);
    indices_ = OpenLines(env.index_log);
  }
  void OnPhase(v1::StepPhase phase, uint64_t step) override {
    board_->phase_bound_seconds = 0;
    board_->phase = phase;
    board_->step = step;
  }
  void OnBoundedPhase(v1::StepPhase phase, uint64_t step, absl::Duration bound) override {
    board_->phase_bound_seconds = absl::ToDoubleSeconds(bound);
    board_->phase = phase;
    board_->step = step;
  }
  void OnStarted(const v1::HeldState& held, const std::string& detail) override {
    board_->step = held.step();
    board_->epoch = held.epoch();
    board_->cursor = held.cursor();
    if (indices_) {
      // A reader of the log sees where this generation goes on from: lines
      // of steps after it, from an earlier generation, were undone.
      indices_->Append(absl::StrFormat(
          "{\"job\": \"%s\", \"generation\": %d, \"rank\": %d, \"world_size\": %d, "
          "\"starts_after_step\": %d, \"note\": \"generation start: earlier lines of steps "
          "after %d were not committed\"}",
          a_.job_id(), a_.generation(), a_.rank(), a_.world_size(), held.step(), held.step()));
    }
    on_started_(held, detail);
  }
  void OnStepIndices(uint64_t step, uint64_t epoch, absl::Span<const int64_t> indices) override {
    if (!hang_file_.empty() && ::access(hang_file_.c_str(), F_OK) == 0) {
      DDP_LOG(Warning) << "stalling before step " << step << " while " << hang_file_ << " exists";
      board_->phase = v1::STEP_PHASE_DATA;
      while (::access(hang_file_.c_str(), F_OK) == 0 && !*abort_) {
        absl::SleepFor(absl::Milliseconds(20));
      }
    }
    if (!indices_) return;
    // Written before the step runs, so that a rank killed in the step still
    // leaves its line: a test decides from the next generation's start
    // which steps were committed.
    indices_->Append(
        absl::StrFormat("{\"job\": \"%s\", \"generation\": %d, \"rank\": %d, \"world_size\": %d, "
                        "\"step\": %d, \"epoch\": %d, \"indices\": [%s]}",
                        a_.job_id(), a_.generation(), a_.rank(), a_.world_size(), step, epoch,
                        absl::StrJoin(indices, ",")));
  }
  void OnStep(const v1::StepReport& report, uint64_t epoch, uint64_t cursor) override {
    board_->step = report.step();
    board_->epoch = epoch;
    board_->cursor = cursor;
    if (send_reports_) {
      // Per-bucket detail stays on the worker: the coordinator has no use
      // for it, and every report crosses the network.
      v1::StepReport sent = report;
      if (!report_buckets_) sent.mutable_reduction()->clear_buckets();
      outbox_->PushReport(std::move(sent));
    }
    if (on_step_) on_step_(report, a_.rank());
    if (metrics_) {
      // One whole line per step, written at once: a rank killed at any
      // point leaves whole records (a reader sees every step it finished).
      v1::StepRecord record;
      record.set_time(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
      record.set_rank(a_.rank());
      *record.mutable_report() = report;
      std::string line;
      if (google::protobuf::util::MessageToJsonString(record, &line, RecordJsonOptions()).ok()) {
        metrics_->Append(line);
      }
    }
  }
  void OnEpoch(const v1::EpochResult& result) override {
    v1::WorkerMessage message;
    *message.mutable_epoch_result() = result;
    outbox_->Push(std::move(message));
  }

 private:
  const v1::Assignment& a_;
  Outbox* outbox_;
  ProgressBoard* board_;
  const bool send_reports_;
  const bool report_buckets_;
  const std::function<void(const v1::StepReport&, uint32_t)> on_step_;
  const std::string hang_file_;
  const std::atomic<bool>* abort_;
  std::optional<LineFile> metrics_;
  std::optional<LineFile> indices_;
  StartedCallback on_started_;
};

// Sends each checkpoint's outcome to the coordinator as job `job`'s.
std::function<void(const v1::CheckpointResult&)> CheckpointReporter(Outbox* outbox,
                                                                    const std::string& job) {
  return [outbox, job](const v1::CheckpointResult& result) {
    v1::WorkerMessage message;
    *message.mutable_checkpoint() = result;
    message.mutable_checkpoint()->set_job_id(job);
    outbox->Push(std::move(message));
  };
}

}  // namespace

GenerationRun::GenerationRun(v1::Assignment assignment, Environment env, Outbox* outbox,
                             ProgressBoard* board, StateSlot* slot)
    : assignment_(std::move(assignment)),
      env_(std::move(env)),
      outbox_(outbox),
      board_(board),
      slot_(slot) {
  thread_ = std::thread([this] { Run(); });
}

GenerationRun::~GenerationRun() {
  Abort("the worker is leaving the generation");
  thread_.join();
}

void GenerationRun::Abort(const std::string& reason) {
  std::shared_ptr<Communicator> comm;
  {
    absl::MutexLock lock(&mu_);
    if (abort_.exchange(true)) return;
    abort_reason_ = reason;
    comm = comm_;
  }
  if (comm) comm->Abort();
}

void GenerationRun::LeaveAtStepBoundary(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (!leave_.exchange(true)) abort_reason_ = reason;
}

void GenerationRun::LeaveAndCheckpoint(const std::string& reason) {
  std::shared_ptr<TrainingState> state;
  {
    absl::MutexLock lock(&mu_);
    if (!leave_.exchange(true)) abort_reason_ = reason;
    checkpoint_on_leave_ = true;
    if (left_with_ == nullptr || checkpointed_) return;
    // It left at a step boundary before the request came (another rank's
    // vote carried it out): the state it left with is still that step's.
    checkpointed_ = true;
    state = left_with_;
  }
  CheckpointLeftState(*state);
}

void GenerationRun::LeftWith(std::shared_ptr<TrainingState> state) {
  {
    absl::MutexLock lock(&mu_);
    left_with_ = state;
    if (!checkpoint_on_leave_ || checkpointed_) return;
    checkpointed_ = true;
  }
  CheckpointLeftState(*state);
}

void GenerationRun::CheckpointLeftState(TrainingState& state) {
  if (assignment_.rank() != 0) return;
  DDP_LOG(Info) << "checkpointing step " << state.progress().step
                << " before going idle: the job is preempted and resumes from it";
  state.CheckpointNow(assignment_.generation(), assignment_.world_size(),
                      CheckpointReporter(outbox_, assignment_.job_id()));
}

void GenerationRun::PushState(v1::WorkerState state, const std::string& detail,
                              const v1::HeldState* held, const v1::ProbeResult* probe,
                              absl::StatusCode code) {
  v1::WorkerMessage message;
  v1::StateChange* change = message.mutable_state();
  change->set_generation(assignment_.generation());
  change->set_state(state);
  change->set_detail(detail);
  if (held) *change->mutable_held() = *held;
  if (probe) *change->mutable_probe() = *probe;
  change->set_code(static_cast<int>(code));
  outbox_->Push(std::move(message));
}

absl::Status GenerationRun::RunSteps(TrainingState* state, bool* left) {
  const v1::Assignment& a = assignment_;
  PushState(v1::WORKER_STATE_RENDEZVOUS,
            absl::StrCat("building the communicator with ", a.world_size() - 1, " peer(s)"));
  StoreClient store(env_.stub, a.job_id(), a.generation(), a.store_token(), env_.leader_stubs);
  absl::StatusOr<std::shared_ptr<Communicator>> connected =
      ConnectForAssignment(a, env_.device, env_.host, &store);
  if (!connected.ok()) return connected.status();
  std::shared_ptr<Communicator> comm = *connected;
  {
    absl::MutexLock lock(&mu_);
    comm_ = comm;
    if (abort_) comm->Abort();
  }

  absl::StatusOr<v1::ProbeResult> proved = ProveRing(*comm);
  if (!proved.ok()) return proved.status();
  const v1::ProbeResult probe = *proved;

  // The probe goes up with the TRAINING state, once the state is in place.
  OutboxObserver observer(a, outbox_, board_, env_, &abort_,
                          [this, &probe](const v1::HeldState& held, const std::string& detail) {
                            PushState(v1::WORKER_STATE_TRAINING, detail, &held, &probe);
                          });
  Outbox* outbox = outbox_;
  GenerationControl control;
  control.abort = &abort_;
  control.leave = &leave_;
  control.on_checkpoint = CheckpointReporter(outbox, a.job_id());
  absl::StatusOr<GenerationEnd> end = TrainGeneration(a, state, comm.get(), &observer, control);
  if (!end.ok()) return end.status();
  *left = *end == GenerationEnd::kLeft;
  return absl::OkStatus();
}

void GenerationRun::Run() {
  const v1::Assignment& a = assignment_;
  board_->generation = a.generation();
  board_->rank = a.rank();
  SetLogIdentity(absl::StrCat("worker ", a.worker_id(), " rank ", a.rank()));
  DDP_LOG(Info) << "joined generation " << a.generation() << " of job " << a.job_id() << " as rank "
                << a.rank() << " of " << a.world_size();
  // Before anything of the job's runs here: its model's code, its files.
  absl::Status status = ConfineJobThread(a.spec(), env_.confinement);
  // The job's state, kept from an earlier generation, or made now.
  std::shared_ptr<TrainingState> state;
  {
    absl::MutexLock lock(&slot_->mu);
    slot_->mu.Await(absl::Condition(
        +[](StateSlot* slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot->mu) { return !slot->preparing; },
        slot_));
    if (slot_->state && slot_->state->identity().job_id == a.job_id() &&
        slot_->state->identity().spec_digest == SpecDigest(a.spec())) {
      state = slot_->state;
    }
  }
  if (status.ok() && state == nullptr) {
    absl::StatusOr<std::unique_ptr<TrainingState>> created =
        TrainingState::Create(a.spec(), env_.device);
    if (created.ok()) {
      state = std::move(*created);
      absl::MutexLock lock(&slot_->mu);
      slot_->state = state;  // another job's state, if any, is dropped
    } else {
      status = created.status();
    }
  }
  bool left = false;
  if (status.ok()) {
    board_->step = state->progress().step;
    board_->epoch = state->progress().epoch;
    board_->cursor = state->progress().cursor;
    status = RunSteps(state.get(), &left);
    if (!state->usable()) {
      DDP_LOG(Warning) << "the training state was left half-applied; dropping it";
      absl::MutexLock lock(&slot_->mu);
      slot_->state.reset();
      state.reset();
    }
  }
  v1::HeldState held;
  if (state) held = state->Held();
  std::string reason;
  {
    absl::MutexLock lock(&mu_);
    reason = abort_reason_;
  }
  if (status.ok() && !left) {
    DDP_LOG(Info) << "finished generation " << a.generation();
    PushState(v1::WORKER_STATE_DONE, absl::StrCat("finished at step ", held.step()), &held);
    done_ = true;
  } else if (status.ok()) {
    LeftWith(state);  // before IDLE: a preempted job's checkpoint is asked for first
    DDP_LOG(Info) << "left generation " << a.generation() << " after step " << held.step() << ": "
                  << reason;
    PushState(v1::WORKER_STATE_IDLE, absl::StrCat("left after step ", held.step(), ": ", reason),
              &held);
  } else if (abort_) {
    DDP_LOG(Info) << "left generation " << a.generation() << ": " << reason;
    PushState(v1::WORKER_STATE_IDLE, absl::StrCat("left: ", reason), &held);
  } else {
    const std::string why = ExplainRefusal(std::string(status.message()));
    DDP_LOG(Error) << "generation " << a.generation() << " failed: " << why;
    PushState(v1::WORKER_STATE_FAILED, why, &held, nullptr, status.code());
    // Free again whatever the coordinator made of the failure.
    PushState(v1::WORKER_STATE_IDLE, "after a failure", &held);
  }
  board_->generation = 0;
  board_->phase = v1::STEP_PHASE_UNSPECIFIED;
  board_->phase_bound_seconds = 0;
  finished_ = true;
}

}  // namespace ddp
