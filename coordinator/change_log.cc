#include "coordinator/change_log.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

double UnixSeconds(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
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
    for (const std::string& id : left) {
      if (std::find(change.left().begin(), change.left().end(), id) == change.left().end()) {
        change.add_left(id);
      }
    }
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
  pausing_ = false;
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
    if (!Contains(previous, id)) change.add_joined(id);
  }
  for (const std::string& id : previous) {
    const bool listed =
        std::find(change.left().begin(), change.left().end(), id) != change.left().end();
    if (!Contains(members, id) && !listed) change.add_left(id);
  }
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
  pausing_ = false;
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

void ChangeLog::OnStep(uint64_t generation) {
  if (!pausing_ || changes_.empty() || changes_.back().to_generation() != generation) return;
  v1::GenerationChange& change = changes_.back();
  change.set_pause_seconds(UnixSeconds(clock_->Now()) - change.at_unix_seconds());
  pausing_ = false;
}

void ChangeLog::Restore(const google::protobuf::RepeatedPtrField<v1::GenerationChange>& changes) {
  changes_.assign(changes.begin(), changes.end());
  // A change still open when the coordinator stopped stays open.
  open_ = !changes_.empty() && changes_.back().to_generation() == 0;
  pausing_ = false;
}

void ChangeLog::Fill(google::protobuf::RepeatedPtrField<v1::GenerationChange>* out) const {
  out->Clear();
  for (const v1::GenerationChange& change : changes_) *out->Add() = change;
}

}  // namespace ddp
