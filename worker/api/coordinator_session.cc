#include "worker/api/coordinator_session.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/device.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "common/store_client.h"
#include "worker/collective/connect.h"

namespace ddp {
namespace {

CoordinatorLink::Options LinkOptions(const CoordinatorSession::Options& options) {
  CoordinatorLink::Options link;
  link.coordinator = options.coordinator;
  link.security = options.security;
  link.find_local_token = options.find_local_token;
  return link;
}

}  // namespace

CoordinatorSession::CoordinatorSession(Options options)
    : options_(std::move(options)),
      outbox_(RealClock::Get(), Outbox::Options{}),
      link_(RealClock::Get(), LinkOptions(options_), this, &outbox_, &board_) {
  link_thread_ = std::thread([this] {
    const int result = link_.Run();
    absl::MutexLock lock(&mu_);
    link_result_ = result;
  });
}

CoordinatorSession::~CoordinatorSession() {
  End("the program is leaving");
  link_.Shutdown();
  link_thread_.join();
}

absl::StatusOr<std::unique_ptr<CoordinatorSession>> CoordinatorSession::Join(
    Options options, absl::Duration timeout) {
  std::unique_ptr<CoordinatorSession> s(new CoordinatorSession(std::move(options)));
  std::shared_ptr<v1::Coordinator::StubInterface> stub;
  {
    absl::MutexLock lock(&s->mu_);
    auto settled = [](CoordinatorSession* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
      return self->assigned_ || self->stopped_ || self->link_result_ >= 0;
    };
    s->mu_.AwaitWithTimeout(absl::Condition(+settled, s.get()), timeout);
    if (s->assigned_) {
      stub = s->stub_;
    } else if (s->link_result_ > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("the coordinator at ", s->options_.coordinator,
                       " refused this program: ", s->link_.last_error()));
    } else if (s->stopped_) {
      return absl::AbortedError(
          absl::StrCat("the coordinator at ", s->options_.coordinator,
                       " stopped this program before assigning it: ", s->ended_));
    } else if (s->link_.ever_attached()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "attached to the coordinator at ", s->options_.coordinator, " but got no rank within ",
          absl::FormatDuration(timeout),
          ": is a job with model.kind \"program\" running there, with min_workers no more than "
          "the ranks started? (ddp-run --nproc N -- PROGRAM submits one)"));
    } else {
      const std::string error = s->link_.last_error();
      return absl::DeadlineExceededError(absl::StrCat(
          "could not attach to the coordinator at ", s->options_.coordinator, " within ",
          absl::FormatDuration(timeout), error.empty() ? "" : absl::StrCat(": ", error)));
    }
  }
  if (absl::Status connected = s->Connect(std::move(stub)); !connected.ok()) {
    s->PushState(s->assignment_.generation(), v1::WORKER_STATE_FAILED,
                 std::string(connected.message()), nullptr, connected.code());
    return connected;
  }
  return s;
}

absl::Status CoordinatorSession::Connect(std::shared_ptr<v1::Coordinator::StubInterface> stub) {
  const v1::Assignment& a = assignment_;
  board_.generation = a.generation();
  board_.rank = a.rank();
  SetLogIdentity(absl::StrCat("worker ", a.worker_id(), " rank ", a.rank()));
  DDP_LOG(Info) << "joined generation " << a.generation() << " of job " << a.job_id() << " as rank "
                << a.rank() << " of " << a.world_size();
  PushState(a.generation(), v1::WORKER_STATE_RENDEZVOUS,
            absl::StrCat("building the communicator with ", a.world_size() - 1, " peer(s)"));
  StoreClient store(std::move(stub), a.job_id(), a.generation(), a.store_token(),
                    link_.stub_factory());
  absl::StatusOr<std::shared_ptr<Communicator>> connected =
      ConnectForAssignment(a, Device{}, options_.host, &store);
  if (!connected.ok()) return connected.status();
  comm_ = *connected;
  {
    absl::MutexLock lock(&mu_);
    live_comm_ = comm_;
    if (!ended_.empty()) comm_->Abort();
  }
  absl::StatusOr<v1::ProbeResult> probe = ProveRing(*comm_);
  if (!probe.ok()) return probe.status();
  PushState(a.generation(), v1::WORKER_STATE_TRAINING, "training in the program", &*probe);
  return absl::OkStatus();
}

void CoordinatorSession::SetCommitted(uint64_t step, uint64_t epoch, uint64_t cursor) {
  absl::MutexLock lock(&mu_);
  board_.step = step;
  board_.epoch = epoch;
  board_.cursor = cursor;
}

v1::HeldState CoordinatorSession::HeldLocked() const {
  v1::HeldState held;
  held.set_job_id(assignment_.job_id());
  held.set_spec_digest(SpecDigest(assignment_.spec()));
  held.set_step(board_.step);
  held.set_epoch(board_.epoch);
  held.set_cursor(board_.cursor);
  held.set_generation(assignment_.generation());
  return held;
}

absl::Status CoordinatorSession::Reform(absl::Duration timeout) {
  std::shared_ptr<v1::Coordinator::StubInterface> stub;
  {
    absl::MutexLock lock(&mu_);
    auto settled = [](CoordinatorSession* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
      return self->next_.has_value() || self->stopped_ || self->link_result_ >= 0;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(+settled, this), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no new generation within ", absl::FormatDuration(timeout), " after: ", ended_));
    }
    // Stopped (the job ended) or the line is gone: no next generation.
    if (!next_) return absl::CancelledError(ended_);
    assignment_ = *std::move(next_);
    next_.reset();
    stub = stub_;
    ended_.clear();
    ended_flag_ = false;
    leave_vote_ = false;
    left_by_vote_ = false;
    live_comm_.reset();
  }
  comm_.reset();
  if (absl::Status connected = Connect(std::move(stub)); !connected.ok()) {
    // Ended again meanwhile (another rank lost; the store may say so before
    // the coordinator's word comes): the caller waits for the next one.
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(this, &CoordinatorSession::GenerationOverLocked),
                           absl::Seconds(5));
      if (!ended_.empty()) return absl::AbortedError(ended_);
    }
    PushState(assignment_.generation(), v1::WORKER_STATE_FAILED, std::string(connected.message()),
              nullptr, connected.code());
    return connected;
  }
  return absl::OkStatus();
}

bool CoordinatorSession::AwaitEnd(const absl::Status& failure, absl::Duration timeout) {
  if (ended()) return true;
  // Say so: the coordinator ends the generation for every rank (a transient
  // code: it re-forms rather than failing the job). Then free again, saying
  // what it holds; the coordinator sends no abort to a rank that failed, so
  // a new assignment ends the wait below.
  v1::HeldState held;
  {
    absl::MutexLock lock(&mu_);
    held = HeldLocked();
  }
  PushState(assignment_.generation(), v1::WORKER_STATE_FAILED,
            absl::StrCat("a collective failed: ", failure.message()), nullptr,
            absl::StatusCode::kUnavailable);
  PushState(assignment_.generation(), v1::WORKER_STATE_IDLE, "after a failed collective", nullptr,
            absl::StatusCode::kOk, &held);
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(this, &CoordinatorSession::GenerationOverLocked), timeout);
  return !ended_.empty();
}

v1::RegisterRequest CoordinatorSession::MakeRegister() {
  v1::RegisterRequest r;
  r.set_host(options_.host);
  r.set_device(options_.device);
  r.set_name(options_.name);
  v1::Capabilities* caps = r.mutable_capabilities();
  caps->add_backends("gloo");
  caps->set_cpu_threads(options_.threads);
  caps->set_program(true);
  absl::MutexLock lock(&mu_);
  if (!assigned_) return r;
  if (ended_.empty()) {
    // Back after a coordinator outage: claim the generation it trains in.
    r.set_generation(assignment_.generation());
    r.set_rank(assignment_.rank());
  }
  // What it holds, so that a re-formed generation can start from it.
  if (ended_.empty() || elastic_) *r.mutable_held() = HeldLocked();
  return r;
}

void CoordinatorSession::OnAssignment(const v1::Assignment& assignment,
                                      std::shared_ptr<v1::Coordinator::StubInterface> stub) {
  {
    absl::MutexLock lock(&mu_);
    if (!assigned_) {
      assignment_ = assignment;
      stub_ = std::move(stub);
      assigned_ = true;
      return;
    }
    if (elastic_) {
      if (assignment.generation() <= assignment_.generation()) return;  // not news
      // Taken up at the program's next step boundary (Reform).
      DDP_LOG(Info) << "assigned to generation " << assignment.generation() << " as rank "
                    << assignment.rank() << " of " << assignment.world_size();
      next_ = assignment;
      stub_ = std::move(stub);
      if (!ended_.empty()) return;
    }
  }
  if (elastic_) {
    // A newer generation means the current one is over (a rank that said
    // it failed is not sent the abort).
    End(absl::StrCat("the coordinator re-formed the job into generation ",
                     assignment.generation()));
    return;
  }
  // A re-formed generation: this program's state can't follow it.
  DDP_LOG(Warning) << "assigned to generation " << assignment.generation()
                   << ", which a program without elastic state can't join";
  PushState(assignment.generation(), v1::WORKER_STATE_FAILED,
            "this program can't move to a new generation: it registered no elastic state "
            "(ddp::Session::set_elastic_state), so it leaves the job",
            nullptr, absl::StatusCode::kFailedPrecondition);
  End(absl::StrCat("the coordinator re-formed the job into generation ", assignment.generation(),
                   ", which a program without elastic state (set_elastic_state) can't join"));
}

void CoordinatorSession::OnAbort(const v1::Abort& abort) {
  v1::HeldState held;
  {
    absl::MutexLock lock(&mu_);
    held = HeldLocked();
    if (next_ && next_->generation() == abort.generation()) {
      // Ended before this rank took it up: free again, holding what it held.
      next_.reset();
      PushState(abort.generation(), v1::WORKER_STATE_IDLE,
                absl::StrCat("left before joining: ", abort.reason()), nullptr,
                absl::StatusCode::kOk, &held);
      return;
    }
    if (!assigned_ || abort.generation() != assignment_.generation()) return;
    // Left already, by another rank's vote, and said so.
    if (left_by_vote_) return;
    if (abort.at_step_boundary() && elastic_ && ended_.empty()) {
      // Ended at the next step boundary, by every rank's vote.
      leave_reason_ = abort.reason();
      leave_vote_ = true;
      DDP_LOG(Info) << "leaving generation " << abort.generation()
                    << " after the step in flight: " << abort.reason();
      return;
    }
  }
  DDP_LOG(Warning) << "the coordinator ended generation " << abort.generation() << ": "
                   << abort.reason();
  End(absl::StrCat("the coordinator ended generation ", abort.generation(), ": ", abort.reason()));
  PushState(abort.generation(), v1::WORKER_STATE_IDLE,
            absl::StrCat("left after step ", held.step(), ": ", abort.reason()), nullptr,
            absl::StatusCode::kOk, elastic_ ? &held : nullptr);
}

void CoordinatorSession::LeaveAtStepBoundary() {
  v1::HeldState held;
  std::string reason;
  uint64_t generation;
  {
    absl::MutexLock lock(&mu_);
    if (!ended_.empty()) return;
    held = HeldLocked();
    reason = leave_reason_.empty() ? "another rank asked to" : leave_reason_;
    generation = assignment_.generation();
    left_by_vote_ = true;
  }
  // Every rank saw the vote in the same finished collective and leaves
  // here: none waits in one. Aborting would fail a peer still finishing that
  // collective (shared memory counts a collective only if no rank aborted),
  // and it would drop the step this rank keeps.
  End(absl::StrCat("generation ", generation, " ended after step ", held.step(), ": ", reason),
      /*abort_collectives=*/false);
  PushState(generation, v1::WORKER_STATE_IDLE,
            absl::StrCat("left after step ", held.step(), ": ", reason), nullptr,
            absl::StatusCode::kOk, &held);
}

void CoordinatorSession::OnDropped(const std::string& why) {
  End(absl::StrCat("the coordinator dropped this rank: ", why));
}

void CoordinatorSession::OnStopping(const std::string& reason) {
  v1::Stop stop;
  stop.set_reason(reason);
  OnStop(stop);
}

void CoordinatorSession::OnStop(const v1::Stop& stop) {
  End(absl::StrCat("stopped by the coordinator: ", stop.reason()));
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  outcome_ = stop.outcome();
  job_message_ = stop.job_message();
}

std::string CoordinatorSession::job_failure() const {
  absl::MutexLock lock(&mu_);
  switch (outcome_) {
    case v1::JOB_OUTCOME_FAILED:
      return absl::StrCat("the job failed: ", job_message_);
    case v1::JOB_OUTCOME_CANCELLED:
      return absl::StrCat("the job was cancelled: ", job_message_);
    case v1::JOB_OUTCOME_SUCCEEDED:
    case v1::JOB_OUTCOME_UNSPECIFIED:
    default:  // a newer coordinator's outcome
      return "";
  }
}

void CoordinatorSession::End(const std::string& why, bool abort_collectives) {
  std::shared_ptr<Communicator> comm;
  {
    absl::MutexLock lock(&mu_);
    if (!ended_.empty()) return;
    ended_ = why;
    ended_flag_ = true;
    comm = live_comm_;
  }
  if (comm && abort_collectives) comm->Abort();
}

std::string CoordinatorSession::ended_reason() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

void CoordinatorSession::PushState(uint64_t generation, v1::WorkerState state,
                                   const std::string& detail, const v1::ProbeResult* probe,
                                   absl::StatusCode code, const v1::HeldState* held) {
  v1::WorkerMessage message;
  v1::StateChange* change = message.mutable_state();
  change->set_generation(generation);
  change->set_state(state);
  change->set_detail(detail);
  if (probe) *change->mutable_probe() = *probe;
  if (held) *change->mutable_held() = *held;
  change->set_code(static_cast<int>(code));
  outbox_.Push(std::move(message));
}

void CoordinatorSession::ReportStep(v1::StepReport report) {
  board_.step = report.step();
  board_.epoch = report.epoch();
  outbox_.PushReport(std::move(report));
}

void CoordinatorSession::Finish(absl::Duration timeout) {
  PushState(assignment_.generation(), v1::WORKER_STATE_DONE,
            absl::StrCat("finished at step ", board_.step.load()));
  // The job ends once every rank is done; until then this rank's stream
  // must stay, or the coordinator would count it lost.
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(this, &CoordinatorSession::JobOverLocked), timeout)) {
    DDP_LOG(Warning) << "the coordinator did not end the job within "
                     << absl::FormatDuration(timeout) << " of this rank finishing; leaving";
  }
}

void CoordinatorSession::Fail(const std::string& why) {
  PushState(assignment_.generation(), v1::WORKER_STATE_FAILED, why, nullptr,
            absl::StatusCode::kUnknown);
  // Long enough for the word to go up; the job's end then stops the rest.
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(this, &CoordinatorSession::JobOverLocked), absl::Seconds(5));
}

}  // namespace ddp
