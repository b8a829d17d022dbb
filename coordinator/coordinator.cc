// The Coordinator's worker side: attaching workers, their streams and the
// messages they send. What members report as they train is in
// coordinator_reports.cc; forming generations in coordinator_generations.cc;
// faults, hangs and adoption in coordinator_faults.cc; jobs, the store and
// the status snapshot in coordinator_jobs.cc.
#include "coordinator/coordinator.h"

#include <algorithm>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/labels.h"
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
      no_job_(std::make_unique<JobRun>(clock)),
      history_(std::min(options_.job_history, kMaxJobHistory)) {
  if (options_.state_store != nullptr) {
    state_writer_ = std::make_unique<StateWriter>(options_.state_store);
  }
  absl::MutexLock lock(&mu_);
  PublishLocked();
}

void Coordinator::Restore(const v1::DurableState& state) {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    RestoreLocked(state, &fx);
  }
  Apply(fx);
}

void Coordinator::RestoreLocked(const v1::DurableState& state, Effects* fx) {
  // The jobs that ended, before those that run: ListJobs lists them first.
  history_.Restore(state, &next_run_sequence_);
  // The job saved in the state's own fields, then those beside it.
  std::vector<const v1::DurableState*> saved;
  if (state.has_job()) saved.push_back(&state);
  for (const v1::DurableState& beside : state.jobs_beside()) saved.push_back(&beside);
  for (const v1::DurableState* job : saved) {
    auto run = std::make_unique<JobRun>(clock_);
    run->Restore(*job, options_.adopt_grace);
    run->set_start_sequence(next_run_sequence_++);
    runs_.push_back(std::move(run));
  }
  latest_generation_ = std::max(latest_generation_, state.latest_generation());
  queue_.Restore(state);
  RecheckRestoredLocked(fx);
  dirty_ = true;
  PublishLocked();
}

void Coordinator::RecheckRestoredLocked(Effects* fx) {
  if (!options_.recheck_restored) return;
  const std::string why = "restored from the saved state, it failed the submission's checks: ";
  for (const auto& run : runs_) {
    if (!run->active()) continue;
    if (absl::Status s = options_.recheck_restored(run->spec()); !s.ok()) {
      DDP_LOG(Error) << "job " << run->id() << " " << why << s.message();
      FailJobLocked(*run, absl::StrCat(why, s.message()), fx);
    }
  }
  std::vector<std::string> refused;
  for (const QueuedJob& queued : queue_.jobs()) {
    if (absl::Status s = options_.recheck_restored(queued.spec); !s.ok()) {
      DDP_LOG(Error) << "queued job " << queued.spec.name() << " " << why << s.message();
      history_.Record(JobHistory::FailedWhileQueued(queued.spec, queued.owner, queued.submitted_at,
                                                    absl::StrCat(why, s.message()), clock_->Now()),
                      next_run_sequence_++);
      refused.push_back(queued.spec.name());
    }
  }
  for (const std::string& id : refused) queue_.Take(id);
  if (!refused.empty()) PersistLocked(fx);
}

void Coordinator::PersistLocked(Effects* fx) {
  if (state_writer_ == nullptr) return;
  // The job the status is about in the state's own fields (an ended one
  // too: a restarted coordinator still shows how it ended), every other
  // running job beside it.
  RecordEndedLocked();
  const JobRun& primary = PrimaryRunLocked();
  v1::DurableState state;
  if (&primary != no_job_.get()) primary.FillDurable(&state);
  for (const auto& run : runs_) {
    run->NotePersisted();
    if (run.get() != &primary && run->active()) run->FillDurable(state.add_jobs_beside());
  }
  state.set_latest_generation(LatestGenerationLocked());
  queue_.FillDurable(&state);
  history_.FillDurable(&state);
  // What operators were told nothing of yet, as if done: no later write
  // may undo it before they are answered.
  pending_.Overlay(&state, clock_->Now());
  fx->persist.emplace(++persist_sequence_, std::move(state));
}

void Coordinator::Apply(Effects& fx) {
  if (fx.persist) {
    state_writer_->Post(fx.persist->first, std::move(fx.persist->second), std::move(fx.on_durable));
  } else {
    // Nothing is saved (no state store): done at once.
    for (StateWriter::Durable& done : fx.on_durable) done(absl::OkStatus());
  }
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
                                  const std::string& reason, bool at_step_boundary, Effects* fx,
                                  bool checkpoint) {
  v1::CoordinatorMessage message;
  message.mutable_abort()->set_generation(generation);
  message.mutable_abort()->set_reason(Truncated(reason, kMaxReportedTextBytes));
  message.mutable_abort()->set_at_step_boundary(at_step_boundary);
  message.mutable_abort()->set_checkpoint(checkpoint);
  SendLocked(worker_id, std::move(message), fx);
}

void Coordinator::NoteHeldLocked(JobRun& run, WorkerRecord* worker, const v1::HeldState& held) {
  if (held.job_id().empty()) {
    // It holds nothing (any more): a dropped state, a failed preparation.
    registry_.SetHeld(worker, std::nullopt);
    return;
  }
  if (run.IsOwnState(held)) {
    registry_.SetHeld(worker, held);
    run.progress().OnHeldState(held);
    // Its generation was numbered by an earlier coordinator (one without a
    // --state-dir, say): ours must come after it to count as newer.
    GenerationManager& generations = run.generations();
    if (held.generation() > generations.latest() &&
        held.generation() - generations.latest() < (uint64_t{1} << 32)) {
      generations.RestoreLatest(held.generation());
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
    if (options_.may_act && !options_.may_act()) {
      return absl::UnavailableError(
          "the coordinator's leadership is unconfirmed for a moment (etcd answers late); attach "
          "again");
    }
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
                  << (worker->labels.empty() ? "" : ", labels " + FormatLabels(worker->labels))
                  << ")"
                  << (request.generation() ? absl::StrCat(", in generation ", request.generation(),
                                                          " as rank ", request.rank())
                                           : "")
                  << (request.has_held() && !request.held().job_id().empty()
                          ? absl::StrCat(", holding job ", Quote(request.held().job_id()),
                                         " at step ", request.held().step())
                          : "");
    // A member of a running job's generation (back after a coordinator
    // restart, or on a new stream) belongs to that job again.
    if (JobRun* claimed = RunOfGenerationLocked(request.generation());
        claimed != nullptr && claimed->generations().current()->RankOf(worker->id) >= 0) {
      registry_.Reserve(worker, claimed->id());
    }
    // The job its claim and held state are about: its own, else the running
    // job its held state names (the pool gives it back there first).
    JobRun* run = &RunOfLocked(*worker);
    if (run == no_job_.get() && request.has_held()) {
      if (JobRun* named = FindRunLocked(request.held().job_id()); named && named->active()) {
        run = named;
      }
    }
    // A member of a generation being adopted, back as a new process (no
    // generation, nothing held): its job must hear it, since it proves
    // that generation can't go on.
    if (run == no_job_.get() && request.generation() == 0) {
      if (JobRun* adopting = AdoptingRunOfLocked(worker->id)) run = adopting;
    }
    if (request.has_held()) NoteHeldLocked(*run, worker, request.held());
    OnClaimLocked(*run, worker, request, took_over, &fx);
    dirty_ = true;
    AllocateLocked(&fx);
    MaybePrepareLocked(RunOfLocked(*worker), worker, &fx);
    MaybeFormGenerationLocked(RunOfLocked(*worker), &fx);
  }
  Apply(fx);
  return session;
}

absl::Status Coordinator::CheckMemberLocked(const JobRun& run, const WorkerRecord& worker,
                                            uint64_t generation, int* rank) {
  const Generation* current = run.generations().current();
  if (current == nullptr || current->number != generation) {
    return absl::FailedPreconditionError(
        absl::StrCat("stale generation ", generation, ": ",
                     run.id().empty() ? absl::StrCat("worker ", worker.id, " is in no running job")
                     : current        ? absl::StrCat("the job is in generation ", current->number)
                                      : absl::StrCat("the job is not running a generation (latest ",
                                                     run.generations().latest(), ")"),
                     "; the message was dropped"));
  }
  *rank = current->RankOf(worker.id);
  if (*rank < 0) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", worker.id,
                                                      " is not a member of generation ", generation,
                                                      "; the message was dropped"));
  }
  if (run.lifecycle().AwaitingReturn(worker.id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker.id, " has not re-attached to generation ", generation,
                     " after the coordinator restarted; the message was dropped"));
  }
  return absl::OkStatus();
}

bool Coordinator::HoldWhilePaused(const Session& session, const v1::WorkerMessage* message,
                                  const std::string& closed_reason) {
  // A coordinator that never pauses (no leadership) never holds anything:
  // no lock on the stream handlers' path.
  if (!options_.may_act) return false;
  absl::MutexLock lock(&held_mu_);
  if (held_.empty() && options_.may_act()) return false;
  // Heartbeats and reports come again, newer: not held. What happened to a
  // worker (its state, a checkpoint, an epoch's result, its stream closing)
  // is, in order, up to a bound.
  if (message != nullptr && (message->has_heartbeat() || message->has_reports())) return true;
  if (held_.size() >= kMaxHeldEvents) {
    DDP_LOG(Error) << "paused with " << held_.size() << " worker events held: dropping one of "
                   << session.worker_id;
    return true;
  }
  held_.push_back(HeldEvent{
      session, message ? std::optional<v1::WorkerMessage>(*message) : std::nullopt, closed_reason});
  return true;
}

void Coordinator::ReplayHeldEvents() {
  while (true) {
    HeldEvent event;
    {
      absl::MutexLock lock(&held_mu_);
      if (held_.empty()) return;
      event = std::move(held_.front());
      held_.pop_front();
    }
    if (event.message) {
      OnMessageNow(event.session, *event.message);
    } else {
      OnStreamClosedNow(event.session, event.closed_reason);
    }
  }
}

void Coordinator::OnMessage(const Session& session, const v1::WorkerMessage& message) {
  if (HoldWhilePaused(session, &message, "")) return;
  OnMessageNow(session, message);
}

void Coordinator::OnMessageNow(const Session& session, const v1::WorkerMessage& message) {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    WorkerRecord* worker = registry_.FindAttached(session.worker_id, session.id);
    if (worker == nullptr) return;  // an old stream of a worker that came back
    registry_.Touch(worker);
    HeardLocked();
    dirty_ = true;
    JobRun& run = RunOfLocked(*worker);  // the job the worker's message is about
    switch (message.kind_case()) {
      case v1::WorkerMessage::kHeartbeat:
        OnHeartbeatLocked(run, worker, message.heartbeat(), &fx);
        break;
      case v1::WorkerMessage::kReports:
        OnReportsLocked(run, worker, message.reports(), &fx);
        break;
      case v1::WorkerMessage::kState:
        OnStateChangeLocked(run, worker, message.state(), &fx);
        break;
      case v1::WorkerMessage::kEpochResult:
        OnEpochResultLocked(run, worker, message.epoch_result(), &fx);
        break;
      case v1::WorkerMessage::kCheckpoint: {
        // It may come after the worker left the job's generation (a
        // preempted job's last checkpoint): the job it names is the one, if
        // the worker was a member of its latest generation.
        JobRun* named = FindRunLocked(message.checkpoint().job_id());
        const bool was_member =
            named != nullptr && named->active() &&
            absl::c_linear_search(named->lifecycle().last_members(), worker->id);
        OnCheckpointLocked(was_member ? *named : run, worker, message.checkpoint(), &fx);
        break;
      }
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
    // It may have left its generation, or its job ended: the pool shares
    // out whoever is free.
    if (message.has_state() || message.has_checkpoint()) AllocateLocked(&fx);
  }
  Apply(fx);
}

void Coordinator::OnStreamClosed(const Session& session, const std::string& reason) {
  if (HoldWhilePaused(session, nullptr, reason)) return;
  OnStreamClosedNow(session, reason);
}

void Coordinator::OnStreamClosedNow(const Session& session, const std::string& reason) {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    // A worker whose work was over (it finished its job's last step and the
    // job ended, or the coordinator told it to stop), leaving: gone, but
    // DONE in the status, not lost.
    const WorkerRecord* before = registry_.FindAttached(session.worker_id, session.id);
    if (before == nullptr) return;
    JobRun& run = RunOfLocked(*before);  // the job the worker was in
    const bool finished = before->state() == v1::WORKER_STATE_DONE && run.progress().ended();
    const bool stopped = before->told_to_stop;
    if (!registry_.MarkLost(session.worker_id, session.id, reason)) return;
    dirty_ = true;
    WorkerRecord* worker = registry_.Find(session.worker_id);
    OnWorkerLostLocked(run, worker, &fx);
    if (finished || stopped) {
      registry_.MarkExited(
          worker, stopped ? "exited: the coordinator stopped it" : "exited after its job ended");
    }
    AllocateLocked(&fx);
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
      if (WorkerRecord* w = registry_.Find(id)) w->told_to_stop = true;
    }
  }
  Apply(fx);
}

}  // namespace ddp
