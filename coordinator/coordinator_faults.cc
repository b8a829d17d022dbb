// The Coordinator's side of faults and time: the periodic tick, silent,
// hung and lost workers, members that don't leave when told, a generation
// lost to a fault (and the fault budget), the job failing, and adopting a
// generation that kept training through a coordinator restart. Every
// decision comes from reform_policy.h; this file gathers the inputs and
// carries the answers out.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "coordinator/coordinator.h"

namespace ddp {

void Coordinator::Tick() {
  // What workers said while this coordinator could not act, first.
  ReplayHeldEvents();
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    const absl::Time now = clock_->Now();
    const size_t attached = registry_.num_attached();
    if (const absl::Duration stalled = stall_.OnTick(now, attached);
        stalled > absl::ZeroDuration()) {
      DDP_LOG(Warning) << "the coordinator did not run for " << absl::FormatDuration(stalled)
                       << " (stopped, frozen or starved): no worker is counted lost or hung for "
                          "that; each gets a fresh heartbeat timeout";
      GraceLocked(stalled);
    }
    // Silence is evidence against a worker only while others are heard.
    const bool deaf = stall_.Deaf(now, attached);
    if (deaf && !deaf_logged_) {
      deaf_logged_ = true;
      DDP_LOG(Warning) << "heard none of the " << attached
                       << " attached workers for a while: the coordinator's own threads or "
                          "network are stalled; no worker is counted lost or hung until they "
                          "are heard again";
    }
    if (!deaf) {
      for (const std::string& id : registry_.ExpireSilent()) {
        WorkerRecord* lost = registry_.Find(id);
        OnWorkerLostLocked(RunOfLocked(*lost), lost, &fx);
        dirty_ = true;
      }
    }
    // Each job's sweeps in turn (a sweep may end a job, never start one).
    for (const auto& run : runs_) {
      CheckAdoptionLocked(*run, &fx);
      if (!deaf) {
        CheckLeavingLocked(*run, &fx);
        CheckHungLocked(*run, &fx);
      }
    }
    AllocateLocked(&fx);
    bool unsaved = false;
    for (const auto& run : runs_) {
      MaybeFormGenerationLocked(*run, &fx, /*at_tick=*/true);
      unsaved = unsaved || run->ProgressUnsaved(absl::Seconds(5));
    }
    if (unsaved) PersistLocked(&fx);
    const absl::Duration age = clock_->Now() - published_at_;
    if ((dirty_ && age >= options_.snapshot_min_interval) || age >= options_.snapshot_max_age) {
      PublishLocked();
    }
  }
  Apply(fx);
  store_.ExpireWaiters();
  streams_.CloseUnregistered();
}

void Coordinator::HeardLocked() {
  const absl::Duration deaf = stall_.OnHeard(clock_->Now(), registry_.num_attached());
  if (deaf <= absl::ZeroDuration()) return;
  deaf_logged_ = false;
  DDP_LOG(Warning) << "heard from the workers again after " << absl::FormatDuration(deaf)
                   << " of silence: each gets a fresh heartbeat timeout";
  GraceLocked(deaf);
}

void Coordinator::GraceLocked(absl::Duration paused) {
  registry_.Grace(paused);
  for (const auto& run : runs_) run->lifecycle().Grace(paused);  // every job's deadlines too
  dirty_ = true;
}

void Coordinator::OnClaimLocked(JobRun& run, WorkerRecord* worker,
                                const v1::RegisterRequest& request, bool took_over, Effects* fx) {
  GenerationLifecycle& lifecycle = run.lifecycle();
  GenerationManager& generations = run.generations();
  const uint64_t claimed = request.generation();
  const Generation* g = generations.current();
  if (claimed == 0) {
    // Back without a generation: if it was a member of one being adopted,
    // that generation can't go on as it was.
    if (lifecycle.adopting() && g && g->RankOf(worker->id) >= 0) {
      lifecycle.MemberReturnedIdle();
      CheckAdoptionLocked(run, fx);
    }
    return;
  }
  // Numbers only grow, even past what this coordinator remembers (within
  // reason: a wild claim must not wrap the numbering around).
  if (claimed - generations.latest() < (uint64_t{1} << 32) || claimed < generations.latest()) {
    generations.RestoreLatest(claimed);
  }
  if (g && g->number == claimed) {
    const int rank = g->RankOf(worker->id);
    if (rank >= 0 && static_cast<uint32_t>(rank) == request.rank()) {
      if (took_over) return;  // its stream was replaced; nothing changed
      if (lifecycle.adopting()) {
        lifecycle.MemberReturned(worker->id);
        registry_.MarkRejoined(worker, claimed);
        CheckAdoptionLocked(run, fx);
        return;
      }
    }
    const std::string why =
        rank < 0 ? absl::StrCat("it is not a member of generation ", claimed)
                 : absl::StrCat("it claims rank ", request.rank(), " but holds rank ", rank);
    DDP_LOG(Warning) << "worker " << worker->id << " refused in generation " << claimed << ": "
                     << why;
    SendAbortLocked(worker->id, claimed,
                    absl::StrCat("the coordinator refuses your claim to generation ", claimed, ": ",
                                 why, "; leave it and wait for an assignment"),
                    false, fx);
    return;
  }
  SendAbortLocked(
      worker->id, claimed,
      absl::StrCat("generation ", claimed, " is over (the job ",
                   g ? absl::StrCat("is in generation ", g->number)
                     : absl::StrCat("has no generation running; latest ", generations.latest()),
                   "); leave it, keeping your state, and wait for an assignment"),
      false, fx);
}

void Coordinator::CheckAdoptionLocked(JobRun& run, Effects* fx) {
  GenerationLifecycle& lifecycle = run.lifecycle();
  if (!lifecycle.adopting()) return;
  const Generation* g = run.generations().current();
  if (g == nullptr || !run.active()) {
    lifecycle.EndAdoption();
    return;
  }
  const AdoptionInput in = lifecycle.AdoptionState(static_cast<uint32_t>(g->members.size()));
  switch (DecideAdoption(in)) {
    case Adoption::kWait:
      run.progress().SetWaitingMessage(absl::StrFormat(
          "the coordinator restarted; %d of generation %d's %d members are back (waiting %.0fs "
          "more)",
          in.returned, g->number, in.members, absl::ToDoubleSeconds(in.deadline - in.now)));
      return;
    case Adoption::kAdopt: {
      uint64_t step = g->source.step;
      for (const RankCandidate& m : g->members) {
        if (const WorkerRecord* w = registry_.Find(m.worker_id); w && w->held) {
          step = std::max(step, w->held->step());
        }
      }
      run.AdoptGeneration(step);
      DDP_LOG(Info) << "adopted generation " << g->number << ": every member came back";
      // A member may have finished while the others were not back yet: its
      // DONE then counted for nothing, and it won't say it again.
      bool succeeded = false;
      for (size_t r = 0; r < g->members.size(); ++r) {
        const WorkerRecord* w = registry_.Find(g->members[r].worker_id);
        if (w != nullptr && w->state() == v1::WORKER_STATE_DONE) {
          succeeded = run.progress().OnRankDone(static_cast<uint32_t>(r));
        }
      }
      if (succeeded) EndGenerationLocked(run, "", fx);
      PersistLocked(fx);
      return;
    }
    case Adoption::kGiveUp: {
      const std::vector<std::string> missing = lifecycle.NotReturned(g->MemberIds());
      const std::string reason =
          absl::StrCat("the coordinator restarted and generation ", g->number,
                       " can't go on: ", absl::StrJoin(missing, ", "),
                       in.returned_idle > 0 ? " came back without it or are missing"
                                            : " did not come back in time");
      lifecycle.EndAdoption();
      OnFaultLocked(run, v1::CHANGE_CAUSE_COORDINATOR_RESTART, reason, missing, fx);
      return;
    }
  }
}

void Coordinator::CheckHungLocked(JobRun& run, Effects* fx) {
  const JobProgress& job = run.progress();
  const Generation* g = run.generations().current();
  if (g == nullptr || run.lifecycle().adopting() || job.state() != v1::JOB_STATE_RUNNING) return;
  std::vector<MemberActivity> activity;
  activity.reserve(g->members.size());
  for (size_t r = 0; r < g->members.size(); ++r) {
    const WorkerRecord* w = registry_.Find(g->members[r].worker_id);
    // A member that finished, or already left (for joiners), waits for no
    // step: it can't be hung. One still meeting its peers is bounded by the
    // collective timeout instead (loading data, taking up the state).
    if (w == nullptr || w->lost() || IsFree(*w) || w->state() == v1::WORKER_STATE_RENDEZVOUS) {
      continue;
    }
    activity.push_back(MemberActivity{w->id, static_cast<int>(r), w->step, w->step_advanced_at,
                                      w->phase, w->phase_bound});
  }
  const absl::Duration threshold =
      HangThreshold(absl::Seconds(job.spec().hang_timeout_seconds()), job.median_step_time());
  HangVerdict verdict = FindHungMembers(activity, threshold, clock_->Now());
  if (verdict.reform_all) {
    OnFaultLocked(run, v1::CHANGE_CAUSE_HUNG, verdict.reason, {}, fx);
    return;
  }
  if (verdict.evict.empty()) return;
  for (const std::string& id : verdict.evict) {
    EvictLocked(run, registry_.Find(id), absl::StrCat("evicted as hung: ", verdict.reason), fx);
  }
  OnFaultLocked(run, v1::CHANGE_CAUSE_HUNG, verdict.reason, verdict.evict, fx);
}

void Coordinator::CheckLeavingLocked(JobRun& run, Effects* fx) {
  GenerationLifecycle& lifecycle = run.lifecycle();
  if (!run.active()) lifecycle.ClearLeaving();
  if (!lifecycle.anyone_leaving() && !lifecycle.admitting()) return;
  const absl::Duration limit = HangThreshold(absl::Seconds(run.spec().hang_timeout_seconds()),
                                             run.progress().median_step_time());
  const auto overdue = lifecycle.TakeOverdueLeavers(limit);
  for (const auto& [id, waited] : overdue) {
    if (WorkerRecord* w = registry_.Find(id); w && !w->lost()) {
      EvictLocked(run, w,
                  absl::StrFormat("evicted: told to leave generation %d %.0fs ago and still in it",
                                  w->generation, absl::ToDoubleSeconds(waited)),
                  fx);
    }
  }
  if (lifecycle.AdmittingOverdue(limit) && run.generations().current() && !EvaluatingLocked(run)) {
    // The members did not reach a step boundary in time: stop waiting for
    // one and lose the step in flight instead.
    OnFaultLocked(run, v1::CHANGE_CAUSE_HUNG,
                  absl::StrFormat("members did not leave at a step boundary within %.0fs",
                                  absl::ToDoubleSeconds(limit)),
                  {}, fx);
  }
  if (!overdue.empty()) MaybeFormGenerationLocked(run, fx);
}

bool Coordinator::EvaluatingLocked(const JobRun& run) const {
  const Generation* g = run.generations().current();
  if (g == nullptr) return false;
  const absl::Time now = clock_->Now();
  for (const RankCandidate& m : g->members) {
    const WorkerRecord* w = registry_.Find(m.worker_id);
    if (w == nullptr || w->lost() || w->phase_bound <= absl::ZeroDuration()) continue;
    if (now - w->step_advanced_at <= w->phase_bound) return true;
  }
  return false;
}

void Coordinator::OnFaultLocked(JobRun& run, v1::ChangeCause cause, const std::string& reason,
                                const std::vector<std::string>& left, Effects* fx) {
  const Generation* g = run.generations().current();
  if (g == nullptr || !run.active()) return;
  DDP_LOG(Warning) << "job " << run.id() << ", generation " << g->number << ": " << reason;
  run.LoseGeneration(cause, reason, left);
  const FaultOutcome outcome =
      DecideFault(run.progress().CountFault(), run.spec().fault_budget(), reason);
  if (outcome.fail_job) {
    FailJobLocked(run, outcome.reason, fx);
    return;
  }
  EndGenerationLocked(run, reason, fx);
  run.Recover(absl::StrCat("re-forming after: ", reason));
  PersistLocked(fx);  // RECOVERING, not the RUNNING that EndGenerationLocked saw
}

void Coordinator::FailJobLocked(JobRun& run, const std::string& reason, Effects* fx) {
  run.Fail(reason);
  EndGenerationLocked(run, reason, fx);
  run.lifecycle().ClearLeaving();
  PersistLocked(fx);
}

void Coordinator::OnWorkerLostLocked(JobRun& run, WorkerRecord* worker, Effects* fx) {
  DDP_LOG(Warning) << "worker " << worker->id << " lost: " << worker->detail();
  auto channel = channels_.find(worker->id);
  if (channel != channels_.end()) {
    // ABORTED, not UNAVAILABLE: the worker must leave its generation (a
    // transport error alone would let it train on through an outage).
    fx->closes.emplace_back(channel->second.second,
                            absl::AbortedError(absl::StrCat("marked lost (", worker->detail(),
                                                            "); leave your generation and attach "
                                                            "again")));
    channels_.erase(channel);
  }
  run.lifecycle().Left(worker->id);
  const Generation* g = run.generations().current();
  const int rank = g ? g->RankOf(worker->id) : -1;
  if (rank < 0) {
    NoteDepartureLocked(run, worker->id);
    OnLeftLocked(run, worker->id, fx);
    return;
  }
  if (run.lifecycle().AwaitingReturn(worker->id)) return;  // not back yet anyway
  OnFaultLocked(run, v1::CHANGE_CAUSE_LOST,
                absl::StrFormat("%s lost in generation %d: %s; it had completed step %d and was "
                                "in phase %s",
                                DescribeLocked(*worker, rank), g->number, worker->detail(),
                                worker->step, v1::StepPhase_Name(worker->phase)),
                {worker->id}, fx);
}

void Coordinator::NoteDepartureLocked(JobRun& run, const std::string& worker_id) {
  if (run.generations().current() == nullptr && run.lifecycle().WasLastMember(worker_id)) {
    run.changes().OnLeft(worker_id);
  }
}

void Coordinator::EvictLocked(JobRun& run, WorkerRecord* worker, const std::string& reason,
                              Effects* fx) {
  if (worker == nullptr || worker->lost()) return;
  DDP_LOG(Warning) << "worker " << worker->id << " " << reason;
  registry_.Evict(worker, reason);
  NoteDepartureLocked(run, worker->id);
  if (auto channel = channels_.find(worker->id); channel != channels_.end()) {
    fx->closes.emplace_back(
        channel->second.second,
        absl::AbortedError(absl::StrCat(reason, "; leave your generation and attach again")));
    channels_.erase(channel);
  }
  run.lifecycle().Left(worker->id);
  dirty_ = true;
}

}  // namespace ddp
