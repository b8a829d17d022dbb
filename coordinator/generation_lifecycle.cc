#include "coordinator/generation_lifecycle.h"

#include <algorithm>

namespace ddp {

void GenerationLifecycle::StartJob() {
  last_members_.clear();
  leaving_.clear();
  adoption_.reset();
  admitting_ = false;
  quorum_since_.reset();
}

void GenerationLifecycle::Grace(absl::Duration paused) {
  for (auto& [id, since] : leaving_) since += paused;
  admitting_since_ += paused;
  recovering_since_ += paused;
  if (adoption_) adoption_->deadline += paused;
}

void GenerationLifecycle::FillFormationInput(FormationInput* in) const {
  in->leaving_members = static_cast<uint32_t>(leaving_.size());
  in->quorum_since = quorum_since_;
  in->recovering_since = recovering_since_;
  in->last_formed_at = last_formed_at_;
}

void GenerationLifecycle::Formed() {
  last_formed_at_ = clock_->Now();
  quorum_since_.reset();
  leaving_.clear();
}

bool GenerationLifecycle::WasLastMember(const std::string& worker_id) const {
  return std::find(last_members_.begin(), last_members_.end(), worker_id) != last_members_.end();
}

bool GenerationLifecycle::IsJoiner(const Candidate& candidate) const {
  const bool trained = candidate.held && candidate.held->generation() > 0;
  return !last_members_.empty() && !trained && !WasLastMember(candidate.slot.worker_id);
}

void GenerationLifecycle::NoteQuorum(bool has_quorum) {
  if (!has_quorum) {
    quorum_since_.reset();
  } else if (!quorum_since_) {
    quorum_since_ = clock_->Now();
  }
}

std::vector<std::pair<std::string, absl::Duration>> GenerationLifecycle::TakeOverdueLeavers(
    absl::Duration limit) {
  const absl::Time now = clock_->Now();
  std::vector<std::pair<std::string, absl::Duration>> overdue;
  for (const auto& [id, since] : leaving_) {
    if (now - since > limit) overdue.emplace_back(id, now - since);
  }
  for (const auto& [id, waited] : overdue) leaving_.erase(id);
  return overdue;
}

void GenerationLifecycle::BeginAdmitting() {
  admitting_ = true;
  admitting_since_ = clock_->Now();
}

void GenerationLifecycle::BoundedPhaseEnded() {
  if (admitting_) admitting_since_ = std::max(admitting_since_, clock_->Now());
}

bool GenerationLifecycle::AdmittingOverdue(absl::Duration limit) const {
  return admitting_ && clock_->Now() - admitting_since_ > limit;
}

void GenerationLifecycle::BeginAdoption(absl::Time deadline) {
  adoption_ = AdoptionWindow{deadline, {}, 0};
}

void GenerationLifecycle::MemberReturned(const std::string& worker_id) {
  if (adoption_) adoption_->returned.insert(worker_id);
}

void GenerationLifecycle::MemberReturnedIdle() {
  if (adoption_) ++adoption_->returned_idle;
}

bool GenerationLifecycle::AwaitingReturn(const std::string& worker_id) const {
  return adoption_ && !adoption_->returned.count(worker_id);
}

AdoptionInput GenerationLifecycle::AdoptionState(uint32_t members) const {
  AdoptionInput in;
  in.members = members;
  if (adoption_) {
    in.returned = static_cast<uint32_t>(adoption_->returned.size());
    in.returned_idle = adoption_->returned_idle;
    in.deadline = adoption_->deadline;
  }
  in.now = clock_->Now();
  return in;
}

std::vector<std::string> GenerationLifecycle::NotReturned(
    const std::vector<std::string>& members) const {
  std::vector<std::string> missing;
  for (const std::string& id : members) {
    if (AwaitingReturn(id)) missing.push_back(id);
  }
  return missing;
}

void GenerationLifecycle::Adopted() {
  adoption_.reset();
  last_formed_at_ = clock_->Now();
}

}  // namespace ddp
