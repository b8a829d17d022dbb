#include "coordinator/job_run.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace ddp {

JobRun::JobRun(const Clock* clock)
    : clock_(clock), progress_(clock), generations_(clock), changes_(clock), lifecycle_(clock) {}

absl::Status JobRun::Start(const v1::JobSpec& spec, const std::string& owner,
                           absl::Time submitted_at) {
  if (absl::Status s = progress_.Submit(spec, submitted_at); !s.ok()) return s;
  owner_ = owner;
  changes_ = ChangeLog(clock_);
  lifecycle_.StartJob();
  return absl::OkStatus();
}

absl::Status JobRun::Cancel(const std::string& job_id, const std::string& reason) {
  if (absl::Status s = progress_.Cancel(job_id, reason); !s.ok()) return s;
  lifecycle_.EndAdoption();
  return absl::OkStatus();
}

void JobRun::Fail(const std::string& reason) {
  progress_.Fail(reason);
  lifecycle_.EndAdoption();
  lifecycle_.EndAdmitting();
}

bool JobRun::IsOwnState(const v1::HeldState& held) const {
  return held.job_id() == progress_.id() && held.spec_digest() == progress_.spec_digest();
}

std::string JobRun::PrepareKey() const {
  return absl::StrCat(progress_.id(), "/", progress_.spec_digest());
}

std::string JobRun::StoreNamespace(uint64_t generation) const {
  return absl::StrCat(progress_.id(), "/", generation, "/");
}

const Generation& JobRun::FormGeneration(const std::vector<Candidate>& members,
                                         const SourceChoice& source, double lr) {
  std::vector<RankCandidate> slots;
  absl::flat_hash_set<std::string> joiners;
  for (const Candidate& c : members) {
    slots.push_back(c.slot);
    if (lifecycle_.IsJoiner(c)) joiners.insert(c.slot.worker_id);
  }
  const Generation& g = generations_.Form(std::move(slots), source, lr, std::move(joiners));
  progress_.OnGenerationStarted(static_cast<uint32_t>(members.size()), source.step, lr);
  changes_.Formed(g.number, g.MemberIds(), lifecycle_.last_members(), source);
  lifecycle_.Formed();
  return g;
}

void JobRun::AdoptGeneration(uint64_t step) {
  const Generation& g = *generations_.current();
  lifecycle_.Adopted();
  progress_.OnGenerationStarted(static_cast<uint32_t>(g.members.size()), step, g.lr);
  changes_.Adopted(g.number, g.MemberIds(), step);
}

void JobRun::BeginLeaveVote(v1::ChangeCause cause, const std::string& why,
                            const std::vector<std::string>& giving) {
  lifecycle_.BeginAdmitting();
  leave_vote_why_ = why;
  changes_.Open(cause, generations_.current()->number, why, giving);
  progress_.SetWaitingMessage(why);
}

void JobRun::BeginPreemption(const std::string& for_job, const std::string& why) {
  BeginLeaveVote(v1::CHANGE_CAUSE_PREEMPTED, why, generations_.current()->MemberIds());
  preempted_at_ = clock_->Now();
  DDP_LOG(Info) << "job " << id() << " is preempted for job " << for_job << ": " << why;
}

void JobRun::LoseGeneration(v1::ChangeCause cause, const std::string& reason,
                            const std::vector<std::string>& left) {
  lifecycle_.EndAdmitting();
  lifecycle_.EndAdoption();
  changes_.Open(cause, generations_.current()->number, reason, left);
}

std::string JobRun::EndGeneration() {
  const Generation& g = *generations_.current();
  lifecycle_.RememberMembers(g.MemberIds());
  std::string ns = StoreNamespace(g.number);
  generations_.EndCurrent();
  return ns;
}

void JobRun::Recover(const std::string& message) {
  progress_.Recover(message);
  lifecycle_.BeginRecovery();
}

void JobRun::Restore(const v1::DurableState& state, absl::Duration adopt_grace) {
  // Its own latest generation (an older state has only the pool's).
  generations_.RestoreLatest(state.job_latest_generation() != 0 ? state.job_latest_generation()
                                                                : state.latest_generation());
  progress_.Restore(state);
  owner_ = state.job_owner();
  changes_.Restore(state.generation_changes());
  lifecycle_.BeginRecovery();
  if (state.has_generation()) {
    std::vector<std::string> members;
    for (const auto& m : state.generation().members()) members.push_back(m.worker_id());
    lifecycle_.RememberMembers(std::move(members));
    if (progress_.active()) {
      generations_.RestoreCurrent(state.generation());
      lifecycle_.BeginAdoption(clock_->Now() + adopt_grace);
      DDP_LOG(Info) << "restored generation " << state.generation().number() << " of job "
                    << progress_.id() << "; waiting up to " << adopt_grace
                    << " for its members to come back";
    }
  } else if (progress_.state() == v1::JOB_STATE_RECOVERING && !changes_.is_open()) {
    // It had trained, and no generation was running: the next one recovers.
    if (const v1::GenerationChange* latest = changes_.latest()) {
      lifecycle_.RememberMembers({latest->members().begin(), latest->members().end()});
    }
    changes_.Open(v1::CHANGE_CAUSE_COORDINATOR_RESTART, state.latest_generation(),
                  "the coordinator restarted with no generation running", {});
  }
}

void JobRun::FillDurable(v1::DurableState* state) const {
  progress_.FillDurable(state);
  state->set_job_owner(owner_);
  state->set_latest_generation(generations_.latest());
  state->set_job_latest_generation(generations_.latest());
  if (progress_.active() && generations_.current() != nullptr) {
    generations_.FillDurable(state->mutable_generation());
  }
  changes_.Fill(state->mutable_generation_changes());
}

v1::JobRecord JobRun::Record() const {
  v1::JobRecord record;
  progress_.FillRecord(&record);
  record.set_owner(owner_);
  record.set_latest_generation(generations_.latest());
  return record;
}

void JobRun::NotePersisted() {
  persisted_at_ = clock_->Now();
  persisted_step_ = progress_.committed_step();
}

bool JobRun::ProgressUnsaved(absl::Duration interval) const {
  return progress_.active() && progress_.committed_step() != persisted_step_ &&
         clock_->Now() - persisted_at_ >= interval;
}

v1::JobSummary JobRun::Summary(absl::Time now) const {
  v1::JobSummary s;
  s.set_job_id(id());
  s.set_state(progress_.state());
  s.set_message(progress_.message());
  s.set_priority(spec().priority());
  s.set_owner(owner_);
  s.set_age_seconds(absl::ToDoubleSeconds(now - progress_.submitted_at()));
  progress_.FillSummary(&s);
  if (preempting()) s.set_message(leave_vote_why_);
  s.set_generation(generations_.latest());
  if (const Generation* current = generations_.current()) {
    s.set_world_size(static_cast<uint32_t>(current->members.size()));
    for (const RankCandidate& m : current->members) s.add_members(m.worker_id);
  }
  return s;
}

void JobRun::FillStatus(v1::JobStatus* status) const {
  progress_.FillStatus(status);
  if (preempting()) status->set_message(leave_vote_why_);
  if (progress_.state() != v1::JOB_STATE_UNSPECIFIED) status->set_owner(owner_);
  changes_.Fill(status->mutable_generation_changes());
  status->set_generation(generations_.latest());
  if (const Generation* current = generations_.current()) {
    status->set_world_size(static_cast<uint32_t>(current->members.size()));
    for (const RankCandidate& m : current->members) status->add_members(m.worker_id);
  }
}

}  // namespace ddp
