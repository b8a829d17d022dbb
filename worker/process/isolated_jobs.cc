#include "worker/process/isolated_jobs.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "worker/link/worker_metrics.h"

namespace ddp {
namespace {

bool EndsGeneration(v1::WorkerState state) {
  return state == v1::WORKER_STATE_IDLE || state == v1::WORKER_STATE_DONE ||
         state == v1::WORKER_STATE_FAILED;
}

}  // namespace

IsolatedJobs::IsolatedJobs(Options options, Outbox* outbox, SharedBoard* board)
    : options_(std::move(options)), outbox_(outbox), board_(board) {
  absl::MutexLock lock(&mu_);
  LaunchSpareLocked();
}

IsolatedJobs::~IsolatedJobs() { EndProcess(/*spare_too=*/true); }

absl::StatusOr<std::shared_ptr<JobProcess>> IsolatedJobs::LaunchLocked(uint64_t* serial) {
  *serial = ++launched_;
  const uint64_t s = *serial;
  absl::StatusOr<std::unique_ptr<JobProcess>> launched = JobProcess::Launch(
      options_.binary, board_->fd(),
      [this, s](v1::FromJobProcess m) { OnMessage(s, std::move(m)); },
      [this, s](const std::string& how) { OnDeath(s, how); });
  if (!launched.ok()) return launched.status();
  return std::shared_ptr<JobProcess>(std::move(*launched));
}

void IsolatedJobs::LaunchSpareLocked() {
  absl::StatusOr<std::shared_ptr<JobProcess>> spare = LaunchLocked(&spare_serial_);
  if (spare.ok()) {
    spare_ = std::move(*spare);
  } else {
    DDP_LOG(Warning) << "no job process kept ready: " << spare.status().message();
  }
}

absl::Status IsolatedJobs::EnsureProcess(const std::string& job_id, const v1::JobSpec& spec) {
  const std::string digest = SpecDigest(spec);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("the worker is stopping");
    if (process_ != nullptr && !dead_ && job_id_ == job_id && spec_digest_ == digest) {
      return absl::OkStatus();
    }
  }
  EndProcess();  // another job's, or a dead one
  v1::JobProcessStart start = options_.settings;
  start.set_job_id(job_id);
  *start.mutable_spec() = spec;
  if (options_.tokens) {
    for (auto& [address, token] : options_.tokens()) (*start.mutable_tokens())[address] = token;
  }
  board_->Reset();
  // Declared before the lock, so that a process dropped here ends after it
  // is released: its reader thread may be waiting for mu_ (OnDeath).
  std::shared_ptr<JobProcess> dead_spare;
  std::shared_ptr<JobProcess> next;
  absl::MutexLock lock(&mu_);
  uint64_t serial = 0;
  if (spare_ != nullptr && !spare_->ended()) {
    next = std::move(spare_);
    serial = spare_serial_;
  } else {
    dead_spare = std::move(spare_);
    absl::StatusOr<std::shared_ptr<JobProcess>> launched = LaunchLocked(&serial);
    if (!launched.ok()) return launched.status();
    next = std::move(*launched);
  }
  if (absl::Status s = next->Start(start); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the job's process (pid ", next->pid(), ") took no start: ", s.message()));
  }
  process_ = std::move(next);
  serial_ = serial;
  pid_ = process_->pid();
  job_id_ = job_id;
  spec_digest_ = digest;
  dead_ = false;
  live_generation_ = 0;
  claim_.Clear();
  // The next job's process loads while this one works.
  LaunchSpareLocked();
  DDP_LOG(Info) << "job " << job_id << " runs in process " << pid_;
  return absl::OkStatus();
}

void IsolatedJobs::EndProcess(bool spare_too) {
  std::shared_ptr<JobProcess> ending;
  std::shared_ptr<JobProcess> spare;
  {
    absl::MutexLock lock(&mu_);
    ending = std::move(process_);
    serial_ = 0;  // its claim and its end no longer count
    claim_.Clear();
    live_generation_ = 0;
    if (spare_too) spare = std::move(spare_);
  }
  ending.reset();  // waits for its last messages (or the last sender does)
  spare.reset();
}

void IsolatedJobs::Send(const v1::ToJobProcess& message) {
  std::shared_ptr<JobProcess> process;
  {
    absl::MutexLock lock(&mu_);
    if (dead_) return;
    process = process_;
  }
  if (process == nullptr) return;
  // One that can't take it is ending: its death is reported as such.
  if (absl::Status s = process->Send(message); !s.ok()) {
    DDP_LOG(Warning) << "the job's process (pid " << process->pid()
                     << ") took no message: " << s.message();
  }
}

void IsolatedJobs::Assign(const v1::Assignment& assignment, const std::string& target,
                          std::shared_ptr<v1::Coordinator::StubInterface> /*stub*/) {
  if (absl::Status s = EnsureProcess(assignment.job_id(), assignment.spec()); !s.ok()) {
    if (s.code() == absl::StatusCode::kCancelled) return;
    DDP_LOG(Error) << s.message();
    PushFailure(assignment.generation(), std::string(s.message()));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    live_generation_ = assignment.generation();
  }
  v1::ToJobProcess message;
  *message.mutable_assignment() = assignment;
  message.set_target(target);
  Send(message);
}

void IsolatedJobs::Abort(const v1::Abort& abort) {
  v1::ToJobProcess message;
  *message.mutable_abort() = abort;
  Send(message);
}

void IsolatedJobs::AbortAny(const std::string& reason) {
  v1::ToJobProcess message;
  message.set_abort_any(reason);
  Send(message);
}

void IsolatedJobs::Prepare(const v1::Prepare& prepare) {
  if (absl::Status s = EnsureProcess(prepare.job_id(), prepare.spec()); !s.ok()) {
    if (s.code() == absl::StatusCode::kCancelled) return;
    DDP_LOG(Error) << s.message();
    PushFailure(0, std::string(s.message()));
    return;
  }
  v1::ToJobProcess message;
  *message.mutable_prepare() = prepare;
  Send(message);
}

void IsolatedJobs::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  EndProcess(/*spare_too=*/true);
}

void IsolatedJobs::Claim(v1::RegisterRequest* request) {
  absl::MutexLock lock(&mu_);
  if (claim_.generation() != 0) {
    request->set_generation(claim_.generation());
    request->set_rank(claim_.rank());
    v1::HeldState* held = request->mutable_held();
    *held = claim_.held();
    // The process's claim is as of its last message; the board is live.
    const ProgressBoard& board = *board_->board();
    held->set_step(board.step);
    held->set_epoch(board.epoch);
    held->set_cursor(board.cursor);
    held->set_generation(claim_.generation());
  } else if (claim_.has_held()) {
    *request->mutable_held() = claim_.held();
  }
}

void IsolatedJobs::OnMessage(uint64_t serial, v1::FromJobProcess message) {
  switch (message.kind_case()) {
    case v1::FromJobProcess::kClaim: {
      absl::MutexLock lock(&mu_);
      if (serial == serial_ && !dead_) claim_ = std::move(*message.mutable_claim());
      return;
    }
    case v1::FromJobProcess::kMessage:
      break;
    default:
      return;
  }
  v1::WorkerMessage& m = *message.mutable_message();
  switch (m.kind_case()) {
    case v1::WorkerMessage::kReports: {
      const uint32_t rank = board_->board()->rank;
      for (v1::StepReport& report : *m.mutable_reports()->mutable_reports()) {
        if (options_.metrics != nullptr) options_.metrics->OnStep(report, rank);
        if (!options_.send_reports) continue;
        // Per-bucket detail stays on the worker: the coordinator has no use
        // for it, and every report crosses the network.
        report.mutable_reduction()->clear_buckets();
        outbox_->PushReport(std::move(report));
      }
      return;
    }
    case v1::WorkerMessage::kState: {
      absl::MutexLock lock(&mu_);
      if (serial == serial_ && EndsGeneration(m.state().state()) &&
          m.state().generation() == live_generation_) {
        live_generation_ = 0;
      }
      break;
    }
    case v1::WorkerMessage::kEpochResult:
    case v1::WorkerMessage::kCheckpoint:
      break;
    default:
      // A register or a heartbeat is the daemon's to send, not the job's.
      DDP_LOG(Warning) << "dropped a message of kind " << m.kind_case()
                       << " from the job's process";
      return;
  }
  outbox_->Push(std::move(m));
}

void IsolatedJobs::OnDeath(uint64_t serial, const std::string& how) {
  uint64_t generation;
  {
    absl::MutexLock lock(&mu_);
    if (serial != serial_) return;
    dead_ = true;
    claim_.Clear();
    generation = live_generation_;
    live_generation_ = 0;
    DDP_LOG(Error) << "the process of job " << job_id_ << " (pid " << pid_ << ") " << how
                   << (generation != 0 ? absl::StrCat(": this rank of generation ", generation,
                                                      " is lost; the job goes on without it")
                                       : std::string(": it held the job's state"));
  }
  board_->Reset();
  PushFailure(generation, absl::StrCat("the job's process ", how));
}

void IsolatedJobs::PushFailure(uint64_t generation, const std::string& detail) {
  v1::WorkerMessage failed;
  v1::StateChange* change = failed.mutable_state();
  change->set_generation(generation);
  change->set_state(v1::WORKER_STATE_FAILED);
  change->set_detail(detail);
  change->set_code(static_cast<int>(absl::StatusCode::kUnavailable));
  outbox_->Push(std::move(failed));
  // Free again, holding nothing: its state went with the process.
  v1::WorkerMessage idle;
  idle.mutable_state()->set_generation(generation);
  idle.mutable_state()->set_state(v1::WORKER_STATE_IDLE);
  idle.mutable_state()->set_detail("after its job's process ended");
  outbox_->Push(std::move(idle));
}

}  // namespace ddp
