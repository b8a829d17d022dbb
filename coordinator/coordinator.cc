// The Coordinator's worker side: attaching workers and what they say.
// Generations, faults and recovery are in coordinator_generations.cc; jobs,
// the store and the status snapshot in coordinator_jobs.cc.
#include "coordinator/coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/quote.h"
#include "coordinator/report_checks.h"

namespace ddp {
namespace {

// A failure another generation can cure (a peer or the network), as the
// StateChange's code says; any other (a bad model or data file, diverged
// replicas) would happen again.
bool IsRetryable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kAborted ||
         code == absl::StatusCode::kDeadlineExceeded || code == absl::StatusCode::kCancelled;
}

}  // namespace

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
      changes_(clock) {
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
  const absl::Time now = clock_->Now();
  recovering_since_ = now;
  if (state.has_generation()) {
    last_members_.clear();
    for (const auto& m : state.generation().members()) last_members_.push_back(m.worker_id());
    if (job_.active()) {
      generations_.RestoreCurrent(state.generation());
      adoption_ = AdoptionWindow{now + options_.adopt_grace, {}, 0};
      DDP_LOG(Info) << "restored generation " << state.generation().number() << " of job "
                    << job_.id() << "; waiting up to " << options_.adopt_grace
                    << " for its members to come back";
    }
  } else if (job_.state() == v1::JOB_STATE_RECOVERING && !changes_.is_open()) {
    // It had trained, and no generation was running: the next one recovers.
    if (const v1::GenerationChange* latest = changes_.latest()) {
      for (const std::string& id : latest->members()) last_members_.push_back(id);
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
    worker->held.reset();
    return;
  }
  if (held.job_id() == job_.id() && held.spec_digest() == job_.spec_digest()) {
    worker->held = held;
    job_.OnHeldState(held);
    // Its generation was numbered by an earlier coordinator (one without a
    // --state-dir, say): ours must come after it to count as newer.
    if (held.generation() > generations_.latest() &&
        held.generation() - generations_.latest() < (uint64_t{1} << 32)) {
      generations_.RestoreLatest(held.generation());
    }
  } else {
    worker->held.reset();  // another job's, or another spec's: of no use here
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
  if (adoption_ && !adoption_->returned.count(worker.id)) {
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
      case v1::WorkerMessage::kHeartbeat: {
        int rank;
        const auto& hb = message.heartbeat();
        if (hb.generation() != 0 && CheckMemberLocked(*worker, hb.generation(), &rank).ok()) {
          if (absl::Status s = CheckHeartbeat(hb, generations_.current()->source.step); !s.ok()) {
            RejectLocked(worker->id, s, &fx);
            break;
          }
          registry_.NoteStep(worker, hb.step());
          const absl::Duration bound = absl::Seconds(hb.phase_bound_seconds());
          if (worker->phase_bound > absl::ZeroDuration() && bound == absl::ZeroDuration()) {
            EndBoundedPhaseLocked(worker);
          }
          worker->phase = hb.phase();
          worker->phase_bound = bound;
        }
        break;
      }
      case v1::WorkerMessage::kReports:
        OnReportsLocked(worker, message.reports(), &fx);
        break;
      case v1::WorkerMessage::kState:
        OnStateChangeLocked(worker, message.state(), &fx);
        break;
      case v1::WorkerMessage::kEpochResult: {
        int rank;
        const auto& result = message.epoch_result();
        if (absl::Status s = CheckMemberLocked(*worker, result.generation(), &rank); !s.ok()) {
          ++worker->stale_messages;
          RejectLocked(worker->id, s, &fx);
          break;
        }
        // Each epoch is kept in status once: only the job's own.
        if (result.epoch() >= job_.spec().epochs()) {
          RejectLocked(worker->id,
                       absl::InvalidArgumentError(
                           absl::StrCat("epoch result of epoch ", result.epoch(), ": the job has ",
                                        job_.spec().epochs(), " epochs; the message was dropped")),
                       &fx);
          break;
        }
        job_.OnEpochResult(result);
        PersistLocked(&fx);
        DDP_LOG(Info) << "epoch " << result.epoch() << " done: test accuracy "
                      << result.test_accuracy() << ", train loss " << result.train_loss();
        break;
      }
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

void Coordinator::OnReportsLocked(WorkerRecord* worker, const v1::StepReportBatch& batch,
                                  Effects* fx) {
  const Generation* current = generations_.current();
  if (absl::Status s = CheckReportBatch(batch, current ? current->source.step : 0); !s.ok()) {
    RejectLocked(worker->id, s, fx);
    return;
  }
  worker->reports_dropped += batch.dropped();
  double samples = 0, seconds = 0;
  for (const v1::StepReport& report : batch.reports()) {
    int rank;
    if (absl::Status s = CheckMemberLocked(*worker, report.generation(), &rank); !s.ok()) {
      ++worker->stale_messages;
      RejectLocked(worker->id, s, fx);
      return;
    }
    job_.OnStepReport(rank, report);
    // A pause ended: saved, so a restart keeps what it cost.
    if (changes_.OnStep(report.generation())) PersistLocked(fx);
    if (worker->state == v1::WORKER_STATE_RENDEZVOUS) {
      worker->state = v1::WORKER_STATE_TRAINING;  // a step says so, whatever came first
      worker->detail = "training";
    }
    // Reports trail heartbeats: a report of a step the worker's heartbeat
    // already counted says nothing newer about its phase (it may be
    // evaluating by now).
    if (report.step() > worker->step || worker->generation != report.generation()) {
      worker->phase = report.reduction().phase();
      worker->phase_bound = absl::ZeroDuration();
    }
    worker->generation = report.generation();
    worker->epoch = report.epoch();
    registry_.NoteStep(worker, report.step());
    worker->last_loss = report.loss();
    worker->reduction = report.reduction();
    worker->reduction.clear_newly_unused_parameter_names();  // kept once, below
    worker->timings = report.timings();
    worker->step_seconds = report.step_seconds();
    registry_.NoteUnusedParameters(worker, report.reduction().newly_unused_parameter_names());
    samples += report.samples();
    seconds += report.step_seconds();
    if (!report.parameter_digest().empty()) {
      worker->parameter_digest = report.parameter_digest();
      worker->digest_step = report.step();
      absl::Status same = job_.OnParameterDigest(rank, report);
      if (!same.ok()) {
        DDP_LOG(Error) << same.message();
        FailJobLocked(std::string(same.message()), fx);
        return;
      }
    }
  }
  if (seconds > 0) worker->samples_per_sec = samples / seconds;
}

void Coordinator::OnCheckpointLocked(WorkerRecord* worker, const v1::CheckpointResult& result,
                                     Effects* fx) {
  // A write that finishes after its generation ended is still a good
  // checkpoint of the job: only the job matters.
  if (!job_.active() || result.job_id() != job_.id()) {
    ++worker->stale_messages;
    RejectLocked(
        worker->id,
        absl::FailedPreconditionError(absl::StrCat(
            "checkpoint result of job ", Quote(result.job_id()), " dropped: the current job is \"",
            job_.id(), "\"", job_.active() ? "" : ", which is not running")),
        fx);
    return;
  }
  v1::CheckpointResult kept = result;
  kept.set_path(Truncated(result.path(), kMaxReportedTextBytes));
  kept.set_error(Truncated(result.error(), kMaxReportedTextBytes));
  job_.OnCheckpoint(kept);
  if (kept.error().empty()) {
    DDP_LOG(Info) << "checkpoint of step " << result.step() << " written by " << worker->id << ": "
                  << kept.path() << " ("
                  << absl::StrFormat("%.1f MB in %.2fs", result.bytes() / 1e6, result.seconds())
                  << ")";
  } else {
    DDP_LOG(Warning) << "checkpoint of step " << result.step() << " failed on " << worker->id
                     << ": " << kept.error();
  }
  PersistLocked(fx);
}

void Coordinator::OnStateChangeLocked(WorkerRecord* worker, const v1::StateChange& change,
                                      Effects* fx) {
  if (change.has_held()) NoteHeldLocked(worker, change.held());
  // Shown in status, logs and the job's message: cut to a bounded size.
  const std::string detail = Truncated(change.detail(), kMaxReportedTextBytes);
  const Generation* current = generations_.current();
  const int rank = current ? current->RankOf(worker->id) : -1;
  const bool in_current = rank >= 0 && change.generation() == current->number;
  switch (change.state()) {
    case v1::WORKER_STATE_IDLE:
      // IDLE names the generation the worker left (0: none). Never stale: it
      // is a fact about the worker.
      if (in_current && admitting_) {
        worker->state = v1::WORKER_STATE_IDLE;
        worker->detail = detail;
        OnLeftLocked(worker->id, fx);
        return;
      }
      if (in_current && worker->state != v1::WORKER_STATE_DONE) {
        // Free before the fault ends the generation: it is not told to
        // leave what it already left.
        const std::string reason = absl::StrFormat(
            "%s left generation %d: %s", DescribeLocked(*worker, rank), current->number, detail);
        worker->state = v1::WORKER_STATE_IDLE;
        OnFaultLocked(v1::CHANGE_CAUSE_FAILED, reason, {worker->id}, fx);
      } else if (rank >= 0) {
        return;  // about an older generation; it is already assigned to the current one
      }
      worker->state = v1::WORKER_STATE_IDLE;
      worker->detail = detail;
      OnLeftLocked(worker->id, fx);
      // Holding nothing now (its state was dropped): it builds it anew.
      if (!worker->held && !worker->prepare_failed) worker->prepare_asked.clear();
      MaybePrepareLocked(worker, fx);
      MaybeFormGenerationLocked(fx);  // it may complete a quorum
      return;
    case v1::WORKER_STATE_DONE:
      // Also a fact about the worker: a DONE that crossed an abort must not
      // leave it TRAINING forever.
      worker->state = v1::WORKER_STATE_DONE;
      worker->detail = detail;
      if (!in_current) {
        OnLeftLocked(worker->id, fx);
        MaybeFormGenerationLocked(fx);
        return;
      }
      if (job_.OnRankDone(rank)) {
        DDP_LOG(Info) << "job " << job_.id() << " succeeded in generation " << change.generation();
        EndGenerationLocked("", fx);
      }
      return;
    default:
      break;
  }
  if (!in_current) {
    if (change.state() == v1::WORKER_STATE_FAILED) {
      worker->state = v1::WORKER_STATE_FAILED;  // it leaves; its IDLE follows
      worker->detail = detail;
      if (change.generation() == 0) OnPrepareFailedLocked(worker, change, detail, fx);
      return;
    }
    ++worker->stale_messages;
    int unused_rank;  // not a member of the current generation: always an error
    RejectLocked(worker->id, CheckMemberLocked(*worker, change.generation(), &unused_rank), fx);
    return;
  }
  worker->state = change.state();
  worker->detail = detail;
  worker->generation = change.generation();
  if (change.has_probe()) {
    worker->probe = change.probe();
    worker->probe.set_backend(Truncated(change.probe().backend(), kMaxBackendBytes));
  }
  // The hang clock starts when training does: rendezvous and taking up the
  // state are bounded by the collective timeout instead.
  if (change.state() == v1::WORKER_STATE_TRAINING) registry_.RestartHangClock(worker);
  if (change.state() == v1::WORKER_STATE_TRAINING && change.has_held()) {
    changes_.OnStarted(change.generation(), change.held().step(),
                       rank == static_cast<int>(current->source.rank) ? detail : "");
    PersistLocked(fx);
  }
  if (change.state() != v1::WORKER_STATE_FAILED) return;
  const auto code = static_cast<absl::StatusCode>(change.code());
  const std::string reason = absl::StrFormat(
      "%s failed in generation %d: %s", DescribeLocked(*worker, rank), change.generation(), detail);
  if (IsRetryable(code)) {
    OnFaultLocked(v1::CHANGE_CAUSE_FAILED, reason, {}, fx);
    OnLeftLocked(worker->id, fx);
  } else {
    // A bad model or data file, diverged replicas: another generation would
    // fail the same way.
    DDP_LOG(Warning) << reason;
    FailJobLocked(reason, fx);
  }
}

void Coordinator::OnPrepareFailedLocked(WorkerRecord* worker, const v1::StateChange& change,
                                        const std::string& detail, Effects* fx) {
  worker->prepare_failed = true;
  if (!job_.active()) return;
  const std::string reason =
      absl::StrCat("worker ", worker->id, " on ", worker->host, ": ", detail);
  if (IsRetryable(static_cast<absl::StatusCode>(change.code()))) {
    // Not asked again until it attaches anew; the job goes on without it.
    DDP_LOG(Warning) << reason;
    return;
  }
  // A model or data file it can't use: every worker would fail the same way
  // (as a generation failing on it would).
  DDP_LOG(Warning) << "job " << job_.id() << " failed: " << reason;
  FailJobLocked(reason, fx);
}

void Coordinator::EndBoundedPhaseLocked(WorkerRecord* worker) {
  // An evaluation that ended is progress: the next step is measured from
  // now, not from the step before it (the evaluation took its own bound).
  registry_.RestartHangClock(worker);
  // Members asked to leave at a step boundary reach one a step after it.
  if (admitting_) admitting_since_ = std::max(admitting_since_, clock_->Now());
}

std::string Coordinator::DescribeLocked(const WorkerRecord& worker, int rank) const {
  return absl::StrFormat("rank %d (worker %s on %s %s)", rank, worker.id, worker.host,
                         worker.device.ToString());
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
                          before->state == v1::WORKER_STATE_DONE && job_.ended();
    if (!registry_.MarkLost(session.worker_id, session.id, reason)) return;
    dirty_ = true;
    WorkerRecord* worker = registry_.Find(session.worker_id);
    OnWorkerLostLocked(worker, &fx);
    if (finished) {
      worker->state = v1::WORKER_STATE_DONE;
      worker->detail = "done; its program exited after the job ended";
    }
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
