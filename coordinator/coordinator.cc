// The Coordinator's worker side: attaching workers, their streams and the
// messages they send. What members report as they train is in
// coordinator_reports.cc; forming generations in coordinator_generations.cc;
// faults, hangs and adoption in coordinator_faults.cc; jobs, the store and
// the status snapshot in coordinator_jobs.cc.
#include "coordinator/coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/quote.h"

namespace ddp {

Coordinator::Coordinator(const Clock* clock, Options options)
    : clock_(clock),
      options_(std::move(options)),
      store_(clock, options_.store),
      streams_(clock, options_.streams),
      registry_(clock, options_.registry),
      stall_(StallWatch::ForHeartbeats(options_.registry.heartbeat_timeout,
                                       options_.heartbeat_interval),
             clock->Now()),
      generations_(clock),
      job_(clock),
      changes_(clock),
      lifecycle_(clock) {
  if (options_.state_store != nullptr) {
    state_writer_ = std::make_unique<StateWriter>(options_.state_store);
  }
  absl::MutexLock lock(&mu_);
  PublishLocked();
}

void Coordinator::Restore(const v1::DurableState& state) {
  absl::MutexLock lock(&mu_);
  generations_.RestoreLatest(state.latest_generation());
  job_.Restore(state);
  changes_.Restore(state.generation_changes());
  lifecycle_.BeginRecovery();
  if (state.has_generation()) {
    std::vector<std::string> members;
    for (const auto& m : state.generation().members()) members.push_back(m.worker_id());
    lifecycle_.RememberMembers(std::move(members));
    if (job_.active()) {
      generations_.RestoreCurrent(state.generation());
      lifecycle_.BeginAdoption(clock_->Now() + options_.adopt_grace);
      DDP_LOG(Info) << "restored generation " << state.generation().number() << " of job "
                    << job_.id() << "; waiting up to " << options_.adopt_grace
                    << " for its members to come back";
    }
  } else if (job_.state() == v1::JOB_STATE_RECOVERING && !changes_.is_open()) {
    // It had trained, and no generation was running: the next one recovers.
    if (const v1::GenerationChange* latest = changes_.latest()) {
      lifecycle_.RememberMembers({latest->members().begin(), latest->members().end()});
    }
    changes_.Open(v1::CHANGE_CAUSE_COORDINATOR_RESTART, state.latest_generation(),
                  "the coordinator restarted with no generation running", {});
  }
  dirty_ = true;
  PublishLocked();
}

void Coordinator::PersistLocked(Effects* fx) {
  if (state_writer_ == nullptr) return;
  persisted_at_ = clock_->Now();
  persisted_step_ = job_.committed_step();
  v1::DurableState state;
  job_.FillDurable(&state);
  state.set_latest_generation(generations_.latest());
  if (job_.active() && generations_.current() != nullptr) {
    generations_.FillDurable(state.mutable_generation());
  }
  changes_.Fill(state.mutable_generation_changes());
  fx->persist.emplace(++persist_sequence_, std::move(state));
}

void Coordinator::Apply(Effects& fx) {
  if (fx.persist) state_writer_->Post(fx.persist->first, std::move(fx.persist->second));
  for (auto& [channel, message] : fx.sends) channel->Send(message);
  for (auto& [channel, status] : fx.closes) channel->Close(status);
  for (const auto& ns : fx.dropped_namespaces) {
    store_.DropNamespaces(ns, absl::StrCat("generation ended; store namespace ", ns, " is gone"));
  }
}

void Coordinator::FlushState() {
  if (state_writer_) state_writer_->Flush();
}

void Coordinator::SendLocked(const std::string& worker_id, v1::CoordinatorMessage message,
                             Effects* fx) {
  auto it = channels_.find(worker_id);
  if (it == channels_.end()) return;
  fx->sends.emplace_back(it->second.second, std::move(message));
}

void Coordinator::RejectLocked(const std::string& worker_id, absl::Status why, Effects* fx) {
  v1::CoordinatorMessage message;
  message.mutable_rejected()->set_code(static_cast<int>(why.code()));
  message.mutable_rejected()->set_message(Truncated(why.message(), kMaxReportedTextBytes));
  SendLocked(worker_id, std::move(message), fx);
}

void Coordinator::SendAbortLocked(const std::string& worker_id, uint64_t generation,
                                  const std::string& reason, bool at_step_boundary, Effects* fx) {
  v1::CoordinatorMessage message;
  message.mutable_abort()->set_generation(generation);
  message.mutable_abort()->set_reason(Truncated(reason, kMaxReportedTextBytes));
  message.mutable_abort()->set_at_step_boundary(at_step_boundary);
  SendLocked(worker_id, std::move(message), fx);
}

void Coordinator::NoteHeldLocked(WorkerRecord* worker, const v1::HeldState& held) {
  if (held.job_id().empty()) {
    // It holds nothing (any more): a dropped state, a failed preparation.
    registry_.SetHeld(worker, std::nullopt);
    return;
  }
  if (held.job_id() == job_.id() && held.spec_digest() == job_.spec_digest()) {
    registry_.SetHeld(worker, held);
    job_.OnHeldState(held);
    // Its generation was numbered by an earlier coordinator (one without a
    // --state-dir, say): ours must come after it to count as newer.
    if (held.generation() > generations_.latest() &&
        held.generation() - generations_.latest() < (uint64_t{1} << 32)) {
      generations_.RestoreLatest(held.generation());
    }
  } else {
    registry_.SetHeld(worker, std::nullopt);  // another job's, or another spec's: of no use
  }
}

absl::StatusOr<Coordinator::Session> Coordinator::Attach(const v1::RegisterRequest& request,
                                                         std::shared_ptr<WorkerChannel> channel) {
  Effects fx;
  Session session;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("the coordinator is shutting down");
    const uint64_t id = next_session_++;
    bool took_over = false;
    absl::StatusOr<WorkerRecord*> registered =
        registry_.Register(request, options_.version, id, &took_over);
    if (!registered.ok()) return registered.status();
    WorkerRecord* worker = *registered;
    HeardLocked();
    session = Session{worker->id, id};
    if (auto old = channels_.find(worker->id); took_over && old != channels_.end()) {
      fx.closes.emplace_back(old->second.second,
                             absl::UnavailableError("replaced by a newer stream of this worker"));
    }
    channels_[session.worker_id] = {id, std::move(channel)};
    v1::CoordinatorMessage reply;
    auto* r = reply.mutable_registered();
    r->set_worker_id(session.worker_id);
    r->set_heartbeat_interval_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.heartbeat_interval)));
    r->set_coordinator_version(options_.version);
    SendLocked(session.worker_id, std::move(reply), &fx);
    DDP_LOG(Info) << "worker " << session.worker_id << (took_over ? " reattached (" : " attached (")
                  << request.host() << " " << worker->device.ToString() << ", pid " << request.pid()
                  << ")"
                  << (request.generation() ? absl::StrCat(", in generation ", request.generation(),
                                                          " as rank ", request.rank())
                                           : "")
                  << (request.has_held() && !request.held().job_id().empty()
                          ? absl::StrCat(", holding job ", Quote(request.held().job_id()),
                                         " at step ", request.held().step())
                          : "");
    if (request.has_held()) NoteHeldLocked(worker, request.held());
    OnClaimLocked(worker, request, took_over, &fx);
    MaybePrepareLocked(worker, &fx);
    dirty_ = true;
    MaybeFormGenerationLocked(&fx);
  }
  Apply(fx);
  return session;
}

absl::Status Coordinator::CheckMemberLocked(const WorkerRecord& worker, uint64_t generation,
                                            int* rank) {
  const Generation* current = generations_.current();
  if (current == nullptr || current->number != generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stale generation ", generation, ": the job is ",
        current ? absl::StrCat("in generation ", current->number)
                : absl::StrCat("not running a generation (latest ", generations_.latest(), ")"),
        "; the message was dropped"));
  }
  *rank = current->RankOf(worker.id);
  if (*rank < 0) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", worker.id,
                                                      " is not a member of generation ", generation,
                                                      "; the message was dropped"));
  }
  if (lifecycle_.AwaitingReturn(worker.id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker.id, " has not re-attached to generation ", generation,
                     " after the coordinator restarted; the message was dropped"));
  }
  return absl::OkStatus();
}

void Coordinator::OnMessage(const Session& session, const v1::WorkerMessage& message) {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    WorkerRecord* worker = registry_.FindAttached(session.worker_id, session.id);
    if (worker == nullptr) return;  // an old stream of a worker that came back
    registry_.Touch(worker);
    HeardLocked();
    dirty_ = true;
    switch (message.kind_case()) {
      case v1::WorkerMessage::kHeartbeat:
        OnHeartbeatLocked(worker, message.heartbeat(), &fx);
        break;
      case v1::WorkerMessage::kReports:
        OnReportsLocked(worker, message.reports(), &fx);
        break;
      case v1::WorkerMessage::kState:
        OnStateChangeLocked(worker, message.state(), &fx);
        break;
      case v1::WorkerMessage::kEpochResult:
        OnEpochResultLocked(worker, message.epoch_result(), &fx);
        break;
      case v1::WorkerMessage::kCheckpoint:
        OnCheckpointLocked(worker, message.checkpoint(), &fx);
        break;
      case v1::WorkerMessage::kRegister:
        RejectLocked(worker->id,
                     absl::InvalidArgumentError("already registered on this stream; a worker "
                                                "registers once per stream"),
                     &fx);
        break;
      case v1::WorkerMessage::KIND_NOT_SET:
        RejectLocked(worker->id, absl::InvalidArgumentError("empty WorkerMessage"), &fx);
        break;
    }
  }
  Apply(fx);
}

void Coordinator::OnStreamClosed(const Session& session, const std::string& reason) {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    // A program that said it was done, leaving as told once its job ended:
    // gone, but DONE in the status, not lost.
    const WorkerRecord* before = registry_.FindAttached(session.worker_id, session.id);
    const bool finished = before != nullptr && before->capabilities.program() &&
                          before->state() == v1::WORKER_STATE_DONE && job_.ended();
    if (!registry_.MarkLost(session.worker_id, session.id, reason)) return;
    dirty_ = true;
    WorkerRecord* worker = registry_.Find(session.worker_id);
    OnWorkerLostLocked(worker, &fx);
    if (finished) registry_.MarkProgramExited(worker);
  }
  Apply(fx);
}

void Coordinator::BeginShutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
}

void Coordinator::StopAllWorkers(const std::string& reason) {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, channel] : channels_) {
      v1::CoordinatorMessage message;
      message.mutable_stop()->set_reason(reason);
      fx.sends.emplace_back(channel.second, std::move(message));
    }
  }
  Apply(fx);
}

}  // namespace ddp
