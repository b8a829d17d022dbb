// The Coordinator's generation side: which free workers can train, asking
// them to prepare, forming a generation and assigning its ranks, admitting
// joiners at a step boundary, and ending a generation. Faults, hangs and
// adoption are in coordinator_faults.cc. Every decision comes from
// reform_policy.h; this file gathers the inputs and carries the answers out.
#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job_kinds.h"
#include "common/job_spec.h"
#include "common/labels.h"
#include "common/logging.h"
#include "coordinator/coordinator.h"
#include "coordinator/worker_fit.h"

namespace ddp {
namespace {

// Holds the job's state (it checked the job and spec when it said so),
// or is a program on the library, which builds its own before attaching.
bool Prepared(const WorkerRecord& w, const JobRun& run) {
  return w.capabilities.program() || (w.held.has_value() && run.IsOwnState(*w.held));
}

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

// "; only workers labelled zone=a count" for a job with a selector: the
// attached workers an operator sees may not be the ones the job can use.
std::string SelectorNote(const v1::JobSpec& spec) {
  if (spec.worker_selector().empty()) return "";
  return absl::StrCat("; only workers labelled ",
                      FormatLabels({spec.worker_selector().begin(), spec.worker_selector().end()}),
                      " count");
}

// Jobs holding more workers than this are weighed for a generation at most
// every kFormationCheckEvery (and at every tick).
constexpr size_t kFormationCheckAbove = 256;
constexpr absl::Duration kFormationCheckEvery = absl::Milliseconds(20);

}  // namespace

std::vector<const WorkerRecord*> Coordinator::FreeCandidatesLocked(const JobRun& run,
                                                                   uint32_t* preparing) {
  const Generation* g = run.generations().current();
  std::vector<const WorkerRecord*> free;
  // Only the workers the pool gave this job.
  for (const WorkerRecord* w : registry_.OfJob(run.id())) {
    if (!IsFree(*w) || !CanRun(*w, run.spec())) continue;
    if (!Prepared(*w, run)) {
      if (preparing && !w->prepare_failed && !w->prepare_asked.empty()) ++*preparing;
      continue;
    }
    // A member that finished first (DONE) is not a joiner.
    if (g != nullptr && g->RankOf(w->id) >= 0) continue;
    free.push_back(w);
  }
  return free;
}

void Coordinator::MaybePrepareLocked(const JobRun& run, WorkerRecord* worker, Effects* fx) {
  if (!run.active() || worker->job != run.id() || worker->lost() || !IsFree(*worker) ||
      Prepared(*worker, run) || !CanRun(*worker, run.spec())) {
    return;
  }
  const std::string asked = run.PrepareKey();
  if (worker->prepare_asked == asked) return;
  registry_.MarkPrepareAsked(worker, asked);
  v1::CoordinatorMessage message;
  message.mutable_prepare()->set_job_id(run.id());
  *message.mutable_prepare()->mutable_spec() = run.spec();
  message.mutable_prepare()->set_spec_digest(run.progress().spec_digest());
  SendLocked(worker->id, std::move(message), fx);
}

void Coordinator::MaybeFormGenerationLocked(JobRun& run, Effects* fx, bool at_tick) {
  JobProgress& job = run.progress();
  GenerationLifecycle& lifecycle = run.lifecycle();
  if (!job.active() || lifecycle.adopting() || lifecycle.admitting() || run.preempting()) return;
  const v1::JobSpec& spec = job.spec();
  const Generation* g = run.generations().current();
  const v1::JobState state = job.state();
  // Cheap tests first: this runs on every registration.
  if (state == v1::JOB_STATE_RUNNING && (g == nullptr || g->members.size() >= spec.max_workers())) {
    return;
  }
  if (state == v1::JOB_STATE_WAITING && registry_.num_attached() < spec.min_workers()) {
    lifecycle.NoteQuorum(false);
    job.SetWaitingMessage(absl::StrCat("waiting for ", spec.min_workers(), " worker(s) (",
                                       registry_.num_attached(), " attached)", SelectorNote(spec)));
    return;
  }
  // A job of thousands of workers is weighed at most every
  // kFormationCheckEvery between ticks: each registration or preparation
  // reaching it here would walk all of its workers under the lock (8,192
  // prepared answers, each a walk of 8,192, starved the heartbeats).
  const absl::Time now = clock_->Now();
  if (!at_tick && registry_.OfJob(run.id()).size() > kFormationCheckAbove &&
      now - lifecycle.formation_checked_at() < kFormationCheckEvery) {
    return;
  }
  lifecycle.set_formation_checked_at(now);
  uint32_t preparing = 0;
  // Pointers: this runs at every registration, and only a generation that
  // forms needs the candidates' copies.
  std::vector<const WorkerRecord*> free = FreeCandidatesLocked(run, &preparing);
  if (state == v1::JOB_STATE_WAITING) lifecycle.NoteQuorum(free.size() >= spec.min_workers());
  FormationInput in;
  in.job_state = state;
  in.generation_running = g != nullptr;
  in.world_size = g ? static_cast<uint32_t>(g->members.size()) : 0;
  in.free_workers = static_cast<uint32_t>(free.size());
  in.preparing_workers = preparing;
  in.prepare_timeout = absl::Seconds(spec.collective_timeout_seconds());
  in.min_workers = spec.min_workers();
  in.max_workers = spec.max_workers();
  in.settle = absl::Seconds(spec.settle_seconds());
  in.rejoin_timeout = absl::Seconds(spec.rejoin_timeout_seconds());
  in.reform_min_interval = absl::Seconds(spec.reform_min_interval_seconds());
  lifecycle.FillFormationInput(&in);
  in.now = clock_->Now();
  const FormationDecision decision = DecideFormation(in);
  switch (decision.what) {
    case Formation::kWait:
      job.SetWaitingMessage(absl::StrCat(decision.why, SelectorNote(spec)));
      return;
    case Formation::kForm: {
      std::vector<Candidate> candidates;
      candidates.reserve(free.size());
      for (const WorkerRecord* w : free) {
        candidates.push_back(
            Candidate{RankCandidate{w->id, w->host, w->device, w->machine_id}, w->held});
      }
      FormGenerationLocked(run, std::move(candidates), fx);
      return;
    }
    case Formation::kAdmitJoiners:
      AdmitJoinersLocked(run, decision.why, fx);
      return;
    case Formation::kFail:
      DDP_LOG(Warning) << "job " << job.id() << " failed: " << decision.why;
      FailJobLocked(run, decision.why, fx);
      return;
  }
}

void Coordinator::FormGenerationLocked(JobRun& run, std::vector<Candidate> candidates,
                                       Effects* fx) {
  const JobProgress& job = run.progress();
  const v1::JobSpec& spec = job.spec();
  std::vector<Candidate> members = ChooseMembers(std::move(candidates), spec.max_workers());
  SourceInput source_in;
  source_in.members = &members;
  source_in.checkpoint_step = job.checkpoint_step();
  source_in.checkpoint_generation = job.checkpoint_generation();
  source_in.committed_step = job.committed_step();
  const SourceChoice source = ChooseSource(source_in);
  const uint32_t world = static_cast<uint32_t>(members.size());
  const double lr = ScaledLr(spec.optimizer().lr(), LrScalingOf(spec), world, spec.max_workers());
  // Numbered after every job's generations: a number names one job's.
  run.generations().RestoreLatest(LatestGenerationLocked());
  const Generation& g = run.FormGeneration(members, source, lr);
  DDP_LOG(Info) << "job " << job.id() << ": generation " << g.number << " formed with " << world
                << " worker(s), starting from " << SourceWords(source)
                << (source.steps_lost ? absl::StrCat(" (", source.steps_lost, " steps lost)") : "");
  const AssignmentJob assigned{job.id(), &spec, job.evaluated_epochs()};
  for (uint32_t rank = 0; rank < world; ++rank) {
    const std::string& id = g.members[rank].worker_id;
    registry_.MarkAssigned(registry_.Find(id), g.number, rank, source.step);
    v1::CoordinatorMessage message;
    *message.mutable_assignment() = BuildAssignment(g, rank, assigned);
    SendLocked(id, std::move(message), fx);
  }
  dirty_ = true;
  PersistLocked(fx);
}

void Coordinator::AdmitJoinersLocked(JobRun& run, const std::string& why, Effects* fx) {
  const Generation* g = run.generations().current();
  if (g == nullptr) return;
  DDP_LOG(Info) << "job " << run.id() << ": " << why << " of generation " << g->number;
  run.BeginLeaveVote(v1::CHANGE_CAUSE_JOINED, why);
  for (const RankCandidate& m : g->members) {
    SendAbortLocked(m.worker_id, g->number, why, /*at_step_boundary=*/true, fx);
  }
}

void Coordinator::OnLeftLocked(JobRun& run, const std::string& worker_id, Effects* fx) {
  GenerationLifecycle& lifecycle = run.lifecycle();
  lifecycle.Left(worker_id);
  if (!lifecycle.admitting()) return;
  const Generation* g = run.generations().current();
  if (g == nullptr) {
    lifecycle.EndAdmitting();
    return;
  }
  for (const RankCandidate& m : g->members) {
    const WorkerRecord* w = registry_.Find(m.worker_id);
    // One that left may already train in another job's generation (it was
    // given away): only a member still in this generation is finishing its step.
    if (w != nullptr && !w->lost() && !IsFree(*w) && w->generation == g->number) return;
  }
  // Every member left at the same step boundary: nothing was lost.
  lifecycle.EndAdmitting();
  EndGenerationLocked(run, "", fx);
  // A preempted job goes back to the queue (RequeuePreemptedLocked).
  if (run.preempting()) return;
  run.Recover(absl::StrCat("re-forming after a leave vote: ", run.leave_vote_why()));
  PersistLocked(fx);
  MaybeFormGenerationLocked(run, fx);
}

void Coordinator::EndGenerationLocked(JobRun& run, const std::string& abort_reason, Effects* fx) {
  // After the aborts, which say why.
  absl::Cleanup stop_programs = [this, &run, fx]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (run.progress().ended()) StopProgramsLocked(run, fx);
  };
  const Generation* g = run.generations().current();
  if (g == nullptr) return;
  if (!abort_reason.empty()) {
    for (const RankCandidate& member : g->members) {
      const WorkerRecord* w = registry_.Find(member.worker_id);
      if (w == nullptr || w->lost() || IsFree(*w)) continue;
      SendAbortLocked(member.worker_id, g->number, abort_reason, false, fx);
      // The next generation waits for the members whose state may be the
      // newest, not for a joiner still at the rendezvous (it holds nothing
      // the others lack): it is admitted later, once it has left. Nor for
      // a member given to another job in a shrink: it won't be in the next
      // one, and what it says once it has left is that job's to hear.
      const bool never_trained =
          w->state() == v1::WORKER_STATE_RENDEZVOUS && g->joiners.contains(member.worker_id);
      const bool given_away = w->job != run.id();
      if (!never_trained && !given_away) run.lifecycle().ToldToLeave(member.worker_id);
    }
  }
  fx->dropped_namespaces.push_back(run.EndGeneration());
  dirty_ = true;
  PersistLocked(fx);
}

void Coordinator::StopProgramsLocked(const JobRun& run, Effects* fx) {
  const JobProgress& job = run.progress();
  // "job NAME succeeded", "... failed", "... cancelled".
  const std::string reason = absl::StrCat(
      "job ", job.id(), " ", absl::AsciiStrToLower(v1::JobState_Name(job.state()).substr(10)));
  for (const auto& [id, channel] : channels_) {
    const WorkerRecord* w = registry_.Find(id);
    if (w == nullptr || !w->capabilities.program()) continue;
    // Only this job's programs: another job's run on beside it.
    if (!w->job.empty() && w->job != run.id()) continue;
    v1::CoordinatorMessage message;
    message.mutable_stop()->set_reason(reason);
    // The program's finish() throws with the job's message unless it
    // succeeded, so that it exits non-zero.
    message.mutable_stop()->set_outcome(job.outcome());
    message.mutable_stop()->set_job_message(job.message());
    fx->sends.emplace_back(channel.second, std::move(message));
  }
}

}  // namespace ddp
