#include "coordinator/change_log.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

double UnixSeconds(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

bool Contains(const google::protobuf::RepeatedPtrField<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// Formed, and no step completed after it yet. An adoption, or a change
// whose generation never ended after all (adopted), paused nothing.
bool Pausing(const v1::GenerationChange& c) {
  return c.to_generation() != 0 && c.to_generation() != c.from_generation() &&
         c.pause_seconds() == 0 && c.cause() != v1::CHANGE_CAUSE_ADOPTED;
}

}  // namespace

void ChangeLog::Push(v1::GenerationChange change) {
  changes_.push_back(std::move(change));
  while (changes_.size() > kMaxChanges) changes_.pop_front();
}

void ChangeLog::Open(v1::ChangeCause cause, uint64_t from, const std::string& reason,
                     const std::vector<std::string>& left) {
  if (open_) {
    v1::GenerationChange& change = changes_.back();
    // A fault while joiners were being admitted is what the change is about.
    if (change.cause() == v1::CHANGE_CAUSE_JOINED || change.cause() == v1::CHANGE_CAUSE_START) {
      change.set_cause(cause);
    }
    if (!reason.empty()) {
      change.set_reason(change.reason().empty() ? reason
                                                : absl::StrCat(change.reason(), "; then ", reason));
    }
    for (const std::string& id : left) OnLeft(id);
    return;
  }
  v1::GenerationChange change;
  change.set_from_generation(from);
  change.set_cause(cause);
  change.set_reason(reason);
  change.set_at_unix_seconds(UnixSeconds(clock_->Now()));
  for (const std::string& id : left) change.add_left(id);
  Push(std::move(change));
  open_ = true;
}

void ChangeLog::OnLeft(const std::string& worker_id) {
  if (!open_) return;
  v1::GenerationChange& change = changes_.back();
  if (!Contains(change.left(), worker_id)) change.add_left(worker_id);
}

void ChangeLog::Formed(uint64_t generation, const std::vector<std::string>& members,
                       const std::vector<std::string>& previous, const SourceChoice& source) {
  if (!open_) Open(v1::CHANGE_CAUSE_START, 0, "", {});
  v1::GenerationChange& change = changes_.back();
  change.set_to_generation(generation);
  change.clear_members();
  for (const std::string& id : members) change.add_members(id);
  change.clear_joined();
  for (const std::string& id : members) {
    // New, or left the ended generation and came back.
    if (!Contains(previous, id) || Contains(change.left(), id)) change.add_joined(id);
  }
  for (const std::string& id : previous) {
    if (!Contains(members, id) && !Contains(change.left(), id)) change.add_left(id);
  }
  // The pause runs from the ended generation's last step, which for a
  // change at a step boundary (joiners) came after the change opened.
  if (last_step_at_) change.set_last_step_unix_seconds(UnixSeconds(*last_step_at_));
  change.set_resume_step(source.step);
  change.set_state_source(source.source);
  change.set_steps_lost(source.steps_lost);
  change.set_world_size(static_cast<uint32_t>(members.size()));
  open_ = false;
  pausing_ = true;
}

void ChangeLog::Adopted(uint64_t generation, const std::vector<std::string>& members,
                        uint64_t step) {
  if (open_) changes_.back().set_to_generation(generation);  // it never ended after all
  v1::GenerationChange change;
  change.set_from_generation(generation);
  change.set_to_generation(generation);
  change.set_cause(v1::CHANGE_CAUSE_ADOPTED);
  change.set_reason("the coordinator restarted; every member came back and kept training");
  change.set_at_unix_seconds(UnixSeconds(clock_->Now()));
  for (const std::string& id : members) change.add_members(id);
  change.set_resume_step(step);
  change.set_state_source(v1::STATE_SOURCE_MEMORY);
  change.set_world_size(static_cast<uint32_t>(members.size()));
  Push(std::move(change));
  open_ = false;
}

void ChangeLog::OnStarted(uint64_t generation, uint64_t step, const std::string& detail) {
  if (changes_.empty() || changes_.back().to_generation() != generation) return;
  v1::GenerationChange& change = changes_.back();
  if (change.resume_step() != step && change.resume_step() > step) {
    change.set_steps_lost(change.steps_lost() + change.resume_step() - step);
  }
  change.set_resume_step(step);
  if (!detail.empty() && change.reason().find(detail) == std::string::npos) {
    change.set_reason(change.reason().empty() ? detail
                                              : absl::StrCat(change.reason(), "; ", detail));
  }
}

bool ChangeLog::OnStep(uint64_t generation) {
  const absl::Time now = clock_->Now();
  last_step_at_ = now;
  if (!pausing_) return false;
  pausing_ = false;
  bool ended = false;
  // Newest first: every change still pausing that this step comes after.
  for (auto it = changes_.rbegin(); it != changes_.rend(); ++it) {
    if (it->to_generation() == 0 || it->to_generation() == it->from_generation() ||
        it->cause() == v1::CHANGE_CAUSE_ADOPTED) {
      continue;  // not formed yet, or nothing paused
    }
    if (!Pausing(*it)) break;  // older ones ended before
    if (it->to_generation() > generation) {
      pausing_ = true;  // a step of an older generation: not after it
      continue;
    }
    const double from =
        it->last_step_unix_seconds() > 0 ? it->last_step_unix_seconds() : it->at_unix_seconds();
    // Never exactly 0 once ended: 0 means "still paused".
    it->set_pause_seconds(std::max(UnixSeconds(now) - from, 1e-6));
    ended = true;
  }
  return ended;
}

void ChangeLog::Restore(const google::protobuf::RepeatedPtrField<v1::GenerationChange>& changes) {
  changes_.assign(changes.begin(), changes.end());
  // A change still open when the coordinator stopped stays open, and one
  // still paused is measured on.
  open_ = !changes_.empty() && changes_.back().to_generation() == 0;
  pausing_ = std::any_of(changes_.begin(), changes_.end(), Pausing);
}

void ChangeLog::Fill(google::protobuf::RepeatedPtrField<v1::GenerationChange>* out) const {
  out->Clear();
  for (const v1::GenerationChange& change : changes_) *out->Add() = change;
}

}  // namespace ddp
