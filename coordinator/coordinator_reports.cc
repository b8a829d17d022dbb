// The Coordinator's side of what a member says as it trains: heartbeats,
// step reports, epoch results, checkpoints and changes of its state.
// Attaching is in coordinator.cc; what a change means for the generation
// (a fault, the job failing) is carried out in coordinator_faults.cc.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/quote.h"
#include "coordinator/coordinator.h"
#include "coordinator/report_checks.h"

namespace ddp {

void Coordinator::OnHeartbeatLocked(JobRun& run, WorkerRecord* worker,
                                    const v1::Heartbeat& heartbeat, Effects* fx) {
  int rank;
  if (heartbeat.generation() == 0 ||
      !CheckMemberLocked(run, *worker, heartbeat.generation(), &rank).ok()) {
    return;
  }
  if (absl::Status s = CheckHeartbeat(heartbeat, run.generations().current()->source.step);
      !s.ok()) {
    RejectLocked(worker->id, s, fx);
    return;
  }
  if (registry_.RecordHeartbeat(worker, heartbeat)) run.lifecycle().BoundedPhaseEnded();
}

void Coordinator::OnEpochResultLocked(JobRun& run, WorkerRecord* worker,
                                      const v1::EpochResult& result, Effects* fx) {
  int rank;
  if (absl::Status s = CheckMemberLocked(run, *worker, result.generation(), &rank); !s.ok()) {
    registry_.CountStale(worker);
    RejectLocked(worker->id, s, fx);
    return;
  }
  // Each epoch is kept in status once: only the job's own.
  if (result.epoch() >= run.spec().epochs()) {
    RejectLocked(worker->id,
                 absl::InvalidArgumentError(absl::StrCat("epoch result of epoch ", result.epoch(),
                                                         ": the job has ", run.spec().epochs(),
                                                         " epochs; the message was dropped")),
                 fx);
    return;
  }
  run.progress().OnEpochResult(result);
  PersistLocked(fx);
  DDP_LOG(Info) << "epoch " << result.epoch() << " done: test accuracy " << result.test_accuracy()
                << ", train loss " << result.train_loss();
}

void Coordinator::OnReportsLocked(JobRun& run, WorkerRecord* worker,
                                  const v1::StepReportBatch& batch, Effects* fx) {
  const Generation* current = run.generations().current();
  if (absl::Status s = CheckReportBatch(batch, current ? current->source.step : 0); !s.ok()) {
    RejectLocked(worker->id, s, fx);
    return;
  }
  registry_.CountDroppedReports(worker, batch.dropped());
  double samples = 0, seconds = 0;
  for (const v1::StepReport& report : batch.reports()) {
    int rank;
    if (absl::Status s = CheckMemberLocked(run, *worker, report.generation(), &rank); !s.ok()) {
      registry_.CountStale(worker);
      RejectLocked(worker->id, s, fx);
      return;
    }
    run.progress().OnStepReport(rank, report);
    // A pause ended: saved, so a restart keeps what it cost.
    if (run.changes().OnStep(report.generation())) PersistLocked(fx);
    registry_.RecordStepReport(worker, report);
    samples += report.samples();
    seconds += report.step_seconds();
    if (!report.parameter_digest().empty()) {
      absl::Status same = run.progress().OnParameterDigest(rank, report);
      if (!same.ok()) {
        DDP_LOG(Error) << same.message();
        FailJobLocked(run, std::string(same.message()), fx);
        return;
      }
    }
  }
  registry_.RecordThroughput(worker, samples, seconds);
}

void Coordinator::OnCheckpointLocked(JobRun& run, WorkerRecord* worker,
                                     const v1::CheckpointResult& result, Effects* fx) {
  // A write that finishes after its generation ended is still a good
  // checkpoint of the job: only the job matters.
  if (!run.active() || result.job_id() != run.id()) {
    registry_.CountStale(worker);
    RejectLocked(
        worker->id,
        absl::FailedPreconditionError(absl::StrCat(
            "checkpoint result of job ", Quote(result.job_id()), " dropped: the current job is \"",
            run.id(), "\"", run.active() ? "" : ", which is not running")),
        fx);
    return;
  }
  v1::CheckpointResult kept = result;
  kept.set_path(Truncated(result.path(), kMaxReportedTextBytes));
  kept.set_error(Truncated(result.error(), kMaxReportedTextBytes));
  run.progress().OnCheckpoint(kept);
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

void Coordinator::OnStateChangeLocked(JobRun& run, WorkerRecord* worker,
                                      const v1::StateChange& change, Effects* fx) {
  if (change.has_held()) NoteHeldLocked(run, worker, change.held());
  const Generation* current = run.generations().current();
  ReportedState s{change, Truncated(change.detail(), kMaxReportedTextBytes)};
  s.rank = current ? current->RankOf(worker->id) : -1;
  s.in_current = s.rank >= 0 && change.generation() == current->number;
  switch (change.state()) {
    case v1::WORKER_STATE_IDLE:
      return OnIdleLocked(run, worker, s, fx);
    case v1::WORKER_STATE_DONE:
      return OnDoneLocked(run, worker, s, fx);
    default:
      break;
  }
  if (!s.in_current) return OnOutsideStateLocked(run, worker, s, fx);
  OnMemberStateLocked(run, worker, s, fx);
}

void Coordinator::OnIdleLocked(JobRun& run, WorkerRecord* worker, const ReportedState& s,
                               Effects* fx) {
  // Never stale: it is a fact about the worker.
  if (s.in_current && run.lifecycle().admitting()) {
    registry_.MarkIdle(worker, s.detail);
    OnLeftLocked(run, worker->id, fx);
    return;
  }
  if (s.in_current && worker->state() != v1::WORKER_STATE_DONE) {
    // Free before the fault ends the generation: it is not told to leave
    // what it already left.
    registry_.MarkIdle(worker, s.detail);
    OnFaultLocked(run, v1::CHANGE_CAUSE_FAILED,
                  absl::StrFormat("%s left generation %d: %s", DescribeLocked(*worker, s.rank),
                                  s.change.generation(), s.detail),
                  {worker->id}, fx);
  } else if (s.rank >= 0) {
    return;  // about an older generation; it is already assigned to the current one
  }
  registry_.MarkIdle(worker, s.detail);
  OnLeftLocked(run, worker->id, fx);
  // Holding nothing now (its state was dropped): it builds it anew.
  registry_.AllowPrepareAgain(worker);
  MaybePrepareLocked(run, worker, fx);
  MaybeFormGenerationLocked(run, fx);  // it may complete a quorum
}

void Coordinator::OnDoneLocked(JobRun& run, WorkerRecord* worker, const ReportedState& s,
                               Effects* fx) {
  // Also a fact about the worker: a DONE that crossed an abort must not
  // leave it TRAINING forever.
  registry_.MarkDone(worker, s.detail);
  if (!s.in_current) {
    OnLeftLocked(run, worker->id, fx);
    MaybeFormGenerationLocked(run, fx);
    return;
  }
  if (run.progress().OnRankDone(s.rank)) {
    DDP_LOG(Info) << "job " << run.id() << " succeeded in generation " << s.change.generation();
    EndGenerationLocked(run, "", fx);
  }
}

void Coordinator::OnOutsideStateLocked(JobRun& run, WorkerRecord* worker, const ReportedState& s,
                                       Effects* fx) {
  if (s.change.state() == v1::WORKER_STATE_FAILED) {
    registry_.MarkFailed(worker, s.detail);  // it leaves; its IDLE follows
    if (s.change.generation() == 0) OnPrepareFailedLocked(run, worker, s.change, s.detail, fx);
    return;
  }
  registry_.CountStale(worker);
  int unused_rank;  // not a member of the current generation: always an error
  RejectLocked(worker->id, CheckMemberLocked(run, *worker, s.change.generation(), &unused_rank),
               fx);
}

void Coordinator::OnMemberStateLocked(JobRun& run, WorkerRecord* worker, const ReportedState& s,
                                      Effects* fx) {
  const v1::StateChange& change = s.change;
  registry_.RecordReportedState(worker, change, s.detail);
  if (change.state() == v1::WORKER_STATE_TRAINING && change.has_held()) {
    run.changes().OnStarted(
        change.generation(), change.held().step(),
        s.rank == static_cast<int>(run.generations().current()->source.rank) ? s.detail : "");
    PersistLocked(fx);
  }
  if (change.state() != v1::WORKER_STATE_FAILED) return;
  const std::string reason =
      absl::StrFormat("%s failed in generation %d: %s", DescribeLocked(*worker, s.rank),
                      change.generation(), s.detail);
  switch (ClassifyFailure(static_cast<absl::StatusCode>(change.code()))) {
    case FailureKind::kFault:
      OnFaultLocked(run, v1::CHANGE_CAUSE_FAILED, reason, {}, fx);
      OnLeftLocked(run, worker->id, fx);
      return;
    case FailureKind::kFatal:
      DDP_LOG(Warning) << reason;
      FailJobLocked(run, reason, fx);
      return;
  }
}

void Coordinator::OnPrepareFailedLocked(JobRun& run, WorkerRecord* worker,
                                        const v1::StateChange& change, const std::string& detail,
                                        Effects* fx) {
  registry_.MarkPrepareFailed(worker);
  if (!run.active()) return;
  const std::string reason =
      absl::StrCat("worker ", worker->id, " on ", worker->host, ": ", detail);
  if (ClassifyFailure(static_cast<absl::StatusCode>(change.code())) == FailureKind::kFault) {
    // Not asked again for this job until it attaches anew; the job goes on
    // without it, and the pool may give it to another.
    DDP_LOG(Warning) << reason;
    registry_.Release(worker);
    return;
  }
  // A model or data file it can't use: every worker would fail the same way
  // (as a generation failing on it would).
  DDP_LOG(Warning) << "job " << run.id() << " failed: " << reason;
  FailJobLocked(run, reason, fx);
}

std::string Coordinator::DescribeLocked(const WorkerRecord& worker, int rank) const {
  return absl::StrFormat("rank %d (worker %s on %s %s)", rank, worker.id, worker.host,
                         worker.device.ToString());
}

}  // namespace ddp
