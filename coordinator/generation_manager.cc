#include "coordinator/generation_manager.h"

namespace ddp {

int Generation::RankOf(const std::string& worker_id) const {
  for (size_t r = 0; r < members.size(); ++r) {
    if (members[r].worker_id == worker_id) return static_cast<int>(r);
  }
  return -1;
}

std::optional<Generation> GenerationManager::MaybeForm(const v1::JobSpec& spec,
                                                       std::vector<RankCandidate> free_workers) {
  if (current_) return std::nullopt;
  const absl::Time now = clock_->Now();
  if (free_workers.size() < spec.min_workers()) {
    quorum_since_.reset();
    return std::nullopt;
  }
  if (!quorum_since_) quorum_since_ = now;
  const bool full = free_workers.size() >= spec.max_workers();
  const bool settled = now - *quorum_since_ >= absl::Seconds(spec.settle_seconds());
  if (!full && !settled) return std::nullopt;

  std::vector<RankCandidate> ordered = OrderByRank(std::move(free_workers));
  if (ordered.size() > spec.max_workers()) ordered.resize(spec.max_workers());
  Generation g;
  g.number = ++latest_;
  g.members = std::move(ordered);
  g.formed_at = now;
  current_ = g;
  last_ = g;
  quorum_since_.reset();
  return g;
}

void GenerationManager::EndCurrent() {
  current_.reset();
  quorum_since_.reset();
}

}  // namespace ddp
