// The Coordinator's generation side: forming generations, faults (lost, hung
// and failed members), admitting joiners, and adopting a generation that
// kept training through a coordinator restart. Every decision comes from
// reform_policy.h; this file gathers the inputs and carries the answers out.
#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "coordinator/coordinator.h"

namespace ddp {
namespace {

bool IsFree(const WorkerRecord& w) {
  return !w.lost && (w.state == v1::WORKER_STATE_IDLE || w.state == v1::WORKER_STATE_DONE ||
                     w.state == v1::WORKER_STATE_FAILED);
}

// Whether the worker can run the job's backend on its device.
bool CanRun(const WorkerRecord& w, const v1::JobSpec& spec) {
  // A ddp-worker trains the built-in models; a program on the library only
  // its own.
  if (w.capabilities.program() != IsProgramJob(spec)) return false;
  if (spec.backend() == "gloo" || spec.backend() == "shm") return !w.device.is_cuda();
  const auto& backends = w.capabilities.backends();
  const bool has_nccl = std::find(backends.begin(), backends.end(), "nccl") != backends.end();
  if (spec.backend() == "nccl") return w.device.is_cuda() && has_nccl;
  return !w.device.is_cuda() || has_nccl;  // auto: nccl on CUDA devices
}

// Holds the job's state (it checked the job and spec when it said so),
// or is a program on the library, which builds its own before attaching.
bool Prepared(const WorkerRecord& w) { return w.capabilities.program() || w.held.has_value(); }

std::string SourceWords(const SourceChoice& s) {
  switch (s.source) {
    case v1::STATE_SOURCE_MEMORY:
      return absl::StrCat("rank ", s.rank, "'s state at step ", s.step);
    case v1::STATE_SOURCE_CHECKPOINT:
      return absl::StrCat("the checkpoint of step ", s.step);
    default:
      return "fresh weights at step 0";
  }
}

}  // namespace

void Coordinator::Tick() {
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
        OnWorkerLostLocked(registry_.Find(id), &fx);
        dirty_ = true;
      }
    }
    CheckAdoptionLocked(&fx);
    if (!deaf) {
      CheckLeavingLocked(&fx);
      CheckHungLocked(&fx);
    }
    MaybeFormGenerationLocked(&fx);
    if (job_.active() && job_.committed_step() != persisted_step_ &&
        clock_->Now() - persisted_at_ >= absl::Seconds(5)) {
      PersistLocked(&fx);
    }
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
  for (auto& [id, since] : leaving_) since += paused;
  admitting_since_ += paused;
  recovering_since_ += paused;
  if (adoption_) adoption_->deadline += paused;
  dirty_ = true;
}

void Coordinator::OnClaimLocked(WorkerRecord* worker, const v1::RegisterRequest& request,
                                bool took_over, Effects* fx) {
  const uint64_t claimed = request.generation();
  const Generation* g = generations_.current();
  if (claimed == 0) {
    // Back without a generation: if it was a member of one being adopted,
    // that generation can't go on as it was.
    if (adoption_ && g && g->RankOf(worker->id) >= 0) {
      ++adoption_->returned_idle;
      CheckAdoptionLocked(fx);
    }
    return;
  }
  // Numbers only grow, even past what this coordinator remembers (within
  // reason: a wild claim must not wrap the numbering around).
  if (claimed - generations_.latest() < (uint64_t{1} << 32) || claimed < generations_.latest()) {
    generations_.RestoreLatest(claimed);
  }
  if (g && g->number == claimed) {
    const int rank = g->RankOf(worker->id);
    if (rank >= 0 && static_cast<uint32_t>(rank) == request.rank()) {
      if (took_over) return;  // its stream was replaced; nothing changed
      if (adoption_) {
        adoption_->returned.insert(worker->id);
        worker->state = v1::WORKER_STATE_TRAINING;
        worker->detail = "training (re-attached after a coordinator restart)";
        worker->generation = claimed;
        if (worker->held) worker->step = worker->held->step();
        registry_.RestartHangClock(worker);
        CheckAdoptionLocked(fx);
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
                     : absl::StrCat("has no generation running; latest ", generations_.latest()),
                   "); leave it, keeping your state, and wait for an assignment"),
      false, fx);
}

void Coordinator::CheckAdoptionLocked(Effects* fx) {
  if (!adoption_) return;
  const Generation* g = generations_.current();
  if (g == nullptr || !job_.active()) {
    adoption_.reset();
    return;
  }
  AdoptionInput in;
  in.members = static_cast<uint32_t>(g->members.size());
  in.returned = static_cast<uint32_t>(adoption_->returned.size());
  in.returned_idle = adoption_->returned_idle;
  in.deadline = adoption_->deadline;
  in.now = clock_->Now();
  switch (DecideAdoption(in)) {
    case Adoption::kWait:
      job_.SetWaitingMessage(absl::StrFormat(
          "the coordinator restarted; %d of generation %d's %d members are back (waiting %.0fs "
          "more)",
          in.returned, g->number, in.members, absl::ToDoubleSeconds(in.deadline - in.now)));
      return;
    case Adoption::kAdopt: {
      adoption_.reset();
      uint64_t step = g->source.step;
      for (const RankCandidate& m : g->members) {
        if (const WorkerRecord* w = registry_.Find(m.worker_id); w && w->held) {
          step = std::max(step, w->held->step());
        }
      }
      job_.OnGenerationStarted(static_cast<uint32_t>(g->members.size()), step, g->lr);
      changes_.Adopted(g->number, g->MemberIds(), step);
      last_formed_at_ = clock_->Now();
      DDP_LOG(Info) << "adopted generation " << g->number << ": every member came back";
      // A member may have finished while the others were not back yet: its
      // DONE then counted for nothing, and it won't say it again.
      bool succeeded = false;
      for (size_t r = 0; r < g->members.size(); ++r) {
        const WorkerRecord* w = registry_.Find(g->members[r].worker_id);
        if (w != nullptr && w->state == v1::WORKER_STATE_DONE) {
          succeeded = job_.OnRankDone(static_cast<uint32_t>(r));
        }
      }
      if (succeeded) EndGenerationLocked("", fx);
      PersistLocked(fx);
      return;
    }
    case Adoption::kGiveUp: {
      std::vector<std::string> missing;
      for (const RankCandidate& m : g->members) {
        if (!adoption_->returned.count(m.worker_id)) missing.push_back(m.worker_id);
      }
      const std::string reason =
          absl::StrCat("the coordinator restarted and generation ", g->number,
                       " can't go on: ", absl::StrJoin(missing, ", "),
                       in.returned_idle > 0 ? " came back without it or are missing"
                                            : " did not come back in time");
      adoption_.reset();
      OnFaultLocked(v1::CHANGE_CAUSE_COORDINATOR_RESTART, reason, missing, fx);
      return;
    }
  }
}

void Coordinator::CheckHungLocked(Effects* fx) {
  const Generation* g = generations_.current();
  if (g == nullptr || adoption_ || job_.state() != v1::JOB_STATE_RUNNING) return;
  std::vector<MemberActivity> activity;
  activity.reserve(g->members.size());
  for (size_t r = 0; r < g->members.size(); ++r) {
    const WorkerRecord* w = registry_.Find(g->members[r].worker_id);
    // A member that finished, or already left (for joiners), waits for no
    // step: it can't be hung. One still meeting its peers is bounded by the
    // collective timeout instead (loading data, taking up the state).
    if (w == nullptr || w->lost || IsFree(*w) || w->state == v1::WORKER_STATE_RENDEZVOUS) {
      continue;
    }
    activity.push_back(MemberActivity{w->id, static_cast<int>(r), w->step, w->step_advanced_at,
                                      w->phase, w->phase_bound});
  }
  const absl::Duration threshold =
      HangThreshold(absl::Seconds(job_.spec().hang_timeout_seconds()), job_.median_step_time());
  HangVerdict verdict = FindHungMembers(activity, threshold, clock_->Now());
  if (verdict.reform_all) {
    OnFaultLocked(v1::CHANGE_CAUSE_HUNG, verdict.reason, {}, fx);
    return;
  }
  if (verdict.evict.empty()) return;
  for (const std::string& id : verdict.evict) {
    EvictLocked(registry_.Find(id), absl::StrCat("evicted as hung: ", verdict.reason), fx);
  }
  OnFaultLocked(v1::CHANGE_CAUSE_HUNG, verdict.reason, verdict.evict, fx);
}

void Coordinator::CheckLeavingLocked(Effects* fx) {
  if (!job_.active()) leaving_.clear();
  if (leaving_.empty() && !admitting_) return;
  const absl::Duration limit =
      HangThreshold(absl::Seconds(job_.spec().hang_timeout_seconds()), job_.median_step_time());
  const absl::Time now = clock_->Now();
  std::vector<std::string> overdue;
  for (const auto& [id, since] : leaving_) {
    if (now - since > limit) overdue.push_back(id);
  }
  for (const std::string& id : overdue) {
    if (WorkerRecord* w = registry_.Find(id); w && !w->lost) {
      EvictLocked(w,
                  absl::StrFormat("evicted: told to leave generation %d %.0fs ago and still in it",
                                  w->generation, absl::ToDoubleSeconds(now - leaving_[id])),
                  fx);
    }
    leaving_.erase(id);
  }
  if (admitting_ && now - admitting_since_ > limit && generations_.current() &&
      !EvaluatingLocked()) {
    // The members did not reach a step boundary in time: stop waiting for
    // one and lose the step in flight instead.
    OnFaultLocked(v1::CHANGE_CAUSE_HUNG,
                  absl::StrFormat("members did not leave at a step boundary within %.0fs",
                                  absl::ToDoubleSeconds(limit)),
                  {}, fx);
  }
  if (!overdue.empty()) MaybeFormGenerationLocked(fx);
}

bool Coordinator::EvaluatingLocked() const {
  const Generation* g = generations_.current();
  if (g == nullptr) return false;
  const absl::Time now = clock_->Now();
  for (const RankCandidate& m : g->members) {
    const WorkerRecord* w = registry_.Find(m.worker_id);
    if (w == nullptr || w->lost || w->phase_bound <= absl::ZeroDuration()) continue;
    if (now - w->step_advanced_at <= w->phase_bound) return true;
  }
  return false;
}

std::vector<Candidate> Coordinator::FreeCandidatesLocked(uint32_t* preparing) {
  const Generation* g = generations_.current();
  std::vector<Candidate> free;
  for (const WorkerRecord* w : registry_.All()) {
    if (!IsFree(*w) || !CanRun(*w, job_.spec())) continue;
    if (!Prepared(*w)) {
      if (preparing && !w->prepare_failed && !w->prepare_asked.empty()) ++*preparing;
      continue;
    }
    // A member that finished first (DONE) is not a joiner.
    if (g != nullptr && g->RankOf(w->id) >= 0) continue;
    free.push_back(Candidate{RankCandidate{w->id, w->host, w->device, w->machine_id}, w->held});
  }
  return free;
}

void Coordinator::MaybePrepareLocked(WorkerRecord* worker, Effects* fx) {
  if (!job_.active() || worker->lost || !IsFree(*worker) || Prepared(*worker) ||
      !CanRun(*worker, job_.spec())) {
    return;
  }
  const std::string asked = absl::StrCat(job_.id(), "/", job_.spec_digest());
  if (worker->prepare_asked == asked) return;
  worker->prepare_asked = asked;
  v1::CoordinatorMessage message;
  message.mutable_prepare()->set_job_id(job_.id());
  *message.mutable_prepare()->mutable_spec() = job_.spec();
  message.mutable_prepare()->set_spec_digest(job_.spec_digest());
  SendLocked(worker->id, std::move(message), fx);
}

void Coordinator::MaybeFormGenerationLocked(Effects* fx) {
  if (!job_.active() || adoption_ || admitting_) return;
  const v1::JobSpec& spec = job_.spec();
  const Generation* g = generations_.current();
  const v1::JobState state = job_.state();
  // Cheap tests first: this runs on every registration.
  if (state == v1::JOB_STATE_RUNNING && (g == nullptr || g->members.size() >= spec.max_workers())) {
    return;
  }
  if (state == v1::JOB_STATE_WAITING && registry_.num_attached() < spec.min_workers()) {
    quorum_since_.reset();
    job_.SetWaitingMessage(absl::StrCat("waiting for ", spec.min_workers(), " worker(s) (",
                                        registry_.num_attached(), " attached)"));
    return;
  }
  uint32_t preparing = 0;
  std::vector<Candidate> free = FreeCandidatesLocked(&preparing);
  const absl::Time now = clock_->Now();
  if (state == v1::JOB_STATE_WAITING) {
    if (free.size() < spec.min_workers()) {
      quorum_since_.reset();
    } else if (!quorum_since_) {
      quorum_since_ = now;
    }
  }
  FormationInput in;
  in.job_state = state;
  in.generation_running = g != nullptr;
  in.world_size = g ? static_cast<uint32_t>(g->members.size()) : 0;
  in.free_workers = static_cast<uint32_t>(free.size());
  in.preparing_workers = preparing;
  in.prepare_timeout = absl::Seconds(spec.collective_timeout_seconds());
  in.leaving_members = static_cast<uint32_t>(leaving_.size());
  in.min_workers = spec.min_workers();
  in.max_workers = spec.max_workers();
  in.settle = absl::Seconds(spec.settle_seconds());
  in.rejoin_timeout = absl::Seconds(spec.rejoin_timeout_seconds());
  in.reform_min_interval = absl::Seconds(spec.reform_min_interval_seconds());
  in.quorum_since = quorum_since_;
  in.recovering_since = recovering_since_;
  in.last_formed_at = last_formed_at_;
  in.now = now;
  const FormationDecision decision = DecideFormation(in);
  switch (decision.what) {
    case Formation::kWait:
      job_.SetWaitingMessage(decision.why);
      return;
    case Formation::kForm:
      FormGenerationLocked(std::move(free), fx);
      return;
    case Formation::kAdmitJoiners:
      AdmitJoinersLocked(decision.why, fx);
      return;
    case Formation::kFail:
      DDP_LOG(Warning) << "job " << job_.id() << " failed: " << decision.why;
      FailJobLocked(decision.why, fx);
      return;
  }
}

void Coordinator::FormGenerationLocked(std::vector<Candidate> candidates, Effects* fx) {
  const v1::JobSpec& spec = job_.spec();
  std::vector<Candidate> members = ChooseMembers(std::move(candidates), spec.max_workers());
  SourceInput source_in;
  source_in.members = &members;
  source_in.checkpoint_step = job_.checkpoint_step();
  source_in.checkpoint_generation = job_.checkpoint_generation();
  source_in.committed_step = job_.committed_step();
  const SourceChoice source = ChooseSource(source_in);
  const uint32_t world = static_cast<uint32_t>(members.size());
  const double lr = spec.lr_scaling() == "linear"
                        ? spec.optimizer().lr() * world / std::max(1u, spec.max_workers())
                        : spec.optimizer().lr();
  std::vector<RankCandidate> slots;
  absl::flat_hash_set<std::string> joiners;
  for (const Candidate& c : members) {
    slots.push_back(c.slot);
    // New to a running job, with a state that never trained.
    const bool trained = c.held && c.held->generation() > 0;
    if (!last_members_.empty() && !trained &&
        std::find(last_members_.begin(), last_members_.end(), c.slot.worker_id) ==
            last_members_.end()) {
      joiners.insert(c.slot.worker_id);
    }
  }
  const Generation& g = generations_.Form(std::move(slots), source, lr, std::move(joiners));
  job_.OnGenerationStarted(world, source.step, lr);
  changes_.Formed(g.number, g.MemberIds(), last_members_, source);
  last_formed_at_ = clock_->Now();
  quorum_since_.reset();
  leaving_.clear();
  DDP_LOG(Info) << "job " << job_.id() << ": generation " << g.number << " formed with " << world
                << " worker(s), starting from " << SourceWords(source)
                << (source.steps_lost ? absl::StrCat(" (", source.steps_lost, " steps lost)") : "");
  const int largest_machine = g.LargestMachine();
  for (size_t rank = 0; rank < g.members.size(); ++rank) {
    const RankCandidate& member = g.members[rank];
    WorkerRecord* w = registry_.Find(member.worker_id);
    w->state = v1::WORKER_STATE_RENDEZVOUS;
    w->detail = absl::StrCat("assigned rank ", rank, " of generation ", g.number);
    w->generation = g.number;
    w->step = source.step;
    registry_.RestartHangClock(w);
    w->unused_parameters.clear();
    w->unused_names_dropped = 0;
    w->reduction.Clear();
    w->timings.Clear();
    w->step_seconds = 0;
    w->probe.Clear();
    w->parameter_digest.clear();
    w->digest_step = 0;
    v1::CoordinatorMessage message;
    v1::Assignment* a = message.mutable_assignment();
    a->set_job_id(job_.id());
    a->set_generation(g.number);
    a->set_rank(static_cast<uint32_t>(rank));
    a->set_world_size(world);
    a->set_start_epoch(source.epoch);
    a->set_start_step(source.step);
    a->set_start_cursor(source.cursor);
    a->set_sampler_seed(spec.seed());
    a->set_source_rank(source.rank);
    a->set_state_source(source.source);
    a->set_lr(lr);
    *a->mutable_spec() = spec;
    a->set_worker_id(member.worker_id);
    a->set_single_machine(g.single_machine);
    const int machine = g.MachineOf(static_cast<int>(rank));
    a->set_machine(static_cast<uint32_t>(machine));
    a->set_local_rank(static_cast<uint32_t>(rank) - g.machine_starts[machine]);
    a->set_local_size(g.MachineSize(machine));
    a->set_machines(static_cast<uint32_t>(g.machine_starts.size() - 1));
    a->set_max_local_size(largest_machine);
    a->set_evaluated_epochs(job_.evaluated_epochs());
    a->set_store_token(g.store_tokens[rank]);
    SendLocked(member.worker_id, std::move(message), fx);
  }
  dirty_ = true;
  PersistLocked(fx);
}

void Coordinator::AdmitJoinersLocked(const std::string& why, Effects* fx) {
  const Generation* g = generations_.current();
  if (g == nullptr) return;
  DDP_LOG(Info) << "job " << job_.id() << ": " << why << " of generation " << g->number;
  admitting_ = true;
  admitting_since_ = clock_->Now();
  changes_.Open(v1::CHANGE_CAUSE_JOINED, g->number, why, {});
  for (const RankCandidate& m : g->members) {
    SendAbortLocked(m.worker_id, g->number, why, /*at_step_boundary=*/true, fx);
  }
  job_.SetWaitingMessage(why);
}

void Coordinator::OnLeftLocked(const std::string& worker_id, Effects* fx) {
  leaving_.erase(worker_id);
  if (!admitting_) return;
  const Generation* g = generations_.current();
  if (g == nullptr) {
    admitting_ = false;
    return;
  }
  for (const RankCandidate& m : g->members) {
    const WorkerRecord* w = registry_.Find(m.worker_id);
    if (w != nullptr && !w->lost && !IsFree(*w)) return;  // still finishing its step
  }
  // Every member left at the same step boundary: nothing was lost.
  admitting_ = false;
  EndGenerationLocked("", fx);
  job_.Recover("admitting joining workers");
  recovering_since_ = clock_->Now();
  PersistLocked(fx);
  MaybeFormGenerationLocked(fx);
}

void Coordinator::OnFaultLocked(v1::ChangeCause cause, const std::string& reason,
                                const std::vector<std::string>& left, Effects* fx) {
  const Generation* g = generations_.current();
  if (g == nullptr || !job_.active()) return;
  DDP_LOG(Warning) << "job " << job_.id() << ", generation " << g->number << ": " << reason;
  admitting_ = false;
  adoption_.reset();
  changes_.Open(cause, g->number, reason, left);
  if (!job_.CountFault()) {
    FailJobLocked(absl::StrFormat("%s; the job's fault budget (%d) is spent", reason,
                                  job_.spec().fault_budget()),
                  fx);
    return;
  }
  EndGenerationLocked(reason, fx);
  job_.Recover(absl::StrCat("re-forming after: ", reason));
  recovering_since_ = clock_->Now();
  PersistLocked(fx);  // RECOVERING, not the RUNNING that EndGenerationLocked saw
}

void Coordinator::FailJobLocked(const std::string& reason, Effects* fx) {
  job_.Fail(reason);
  adoption_.reset();
  admitting_ = false;
  EndGenerationLocked(reason, fx);
  leaving_.clear();
  PersistLocked(fx);
}

void Coordinator::EndGenerationLocked(const std::string& abort_reason, Effects* fx) {
  // After the aborts, which say why.
  absl::Cleanup stop_programs = [this, fx]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (job_.ended()) StopProgramsLocked(fx);
  };
  const Generation* g = generations_.current();
  if (g == nullptr) return;
  const absl::Time now = clock_->Now();
  if (!abort_reason.empty()) {
    for (const RankCandidate& member : g->members) {
      WorkerRecord* w = registry_.Find(member.worker_id);
      if (w == nullptr || w->lost || IsFree(*w)) continue;
      SendAbortLocked(member.worker_id, g->number, abort_reason, false, fx);
      // The next generation waits for the members whose state may be the
      // newest, not for a joiner still at the rendezvous (it holds nothing
      // the others lack): it is admitted later, once it has left.
      const bool never_trained =
          w->state == v1::WORKER_STATE_RENDEZVOUS && g->joiners.contains(member.worker_id);
      if (!never_trained) leaving_.emplace(member.worker_id, now);
    }
  }
  last_members_ = g->MemberIds();
  fx->dropped_namespaces.push_back(absl::StrCat(job_.id(), "/", g->number, "/"));
  generations_.EndCurrent();
  dirty_ = true;
  PersistLocked(fx);
}

void Coordinator::StopProgramsLocked(Effects* fx) {
  // "job NAME succeeded", "... failed", "... cancelled".
  const std::string reason = absl::StrCat(
      "job ", job_.id(), " ", absl::AsciiStrToLower(v1::JobState_Name(job_.state()).substr(10)));
  for (const auto& [id, channel] : channels_) {
    const WorkerRecord* w = registry_.Find(id);
    if (w == nullptr || !w->capabilities.program()) continue;
    v1::CoordinatorMessage message;
    message.mutable_stop()->set_reason(reason);
    // The program's finish() throws with the job's message unless it
    // succeeded, so that it exits non-zero.
    message.mutable_stop()->set_outcome(job_.outcome());
    message.mutable_stop()->set_job_message(job_.message());
    fx->sends.emplace_back(channel.second, std::move(message));
  }
}

void Coordinator::OnWorkerLostLocked(WorkerRecord* worker, Effects* fx) {
  DDP_LOG(Warning) << "worker " << worker->id << " lost: " << worker->detail;
  auto channel = channels_.find(worker->id);
  if (channel != channels_.end()) {
    // ABORTED, not UNAVAILABLE: the worker must leave its generation (a
    // transport error alone would let it train on through an outage).
    fx->closes.emplace_back(channel->second.second,
                            absl::AbortedError(absl::StrCat("marked lost (", worker->detail,
                                                            "); leave your generation and attach "
                                                            "again")));
    channels_.erase(channel);
  }
  leaving_.erase(worker->id);
  const Generation* g = generations_.current();
  const int rank = g ? g->RankOf(worker->id) : -1;
  if (rank < 0) {
    NoteDepartureLocked(worker->id);
    OnLeftLocked(worker->id, fx);
    return;
  }
  if (adoption_ && !adoption_->returned.count(worker->id)) return;  // not back yet anyway
  OnFaultLocked(v1::CHANGE_CAUSE_LOST,
                absl::StrFormat("%s lost in generation %d: %s; it had completed step %d and was "
                                "in phase %s",
                                DescribeLocked(*worker, rank), g->number, worker->detail,
                                worker->step, v1::StepPhase_Name(worker->phase)),
                {worker->id}, fx);
}

void Coordinator::NoteDepartureLocked(const std::string& worker_id) {
  if (generations_.current() == nullptr &&
      std::find(last_members_.begin(), last_members_.end(), worker_id) != last_members_.end()) {
    changes_.OnLeft(worker_id);
  }
}

void Coordinator::EvictLocked(WorkerRecord* worker, const std::string& reason, Effects* fx) {
  if (worker == nullptr || worker->lost) return;
  DDP_LOG(Warning) << "worker " << worker->id << " " << reason;
  registry_.Evict(worker, reason);
  NoteDepartureLocked(worker->id);
  if (auto channel = channels_.find(worker->id); channel != channels_.end()) {
    fx->closes.emplace_back(
        channel->second.second,
        absl::AbortedError(absl::StrCat(reason, "; leave your generation and attach again")));
    channels_.erase(channel);
  }
  leaving_.erase(worker->id);
  dirty_ = true;
}

}  // namespace ddp
