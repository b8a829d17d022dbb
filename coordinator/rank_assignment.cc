#include "coordinator/rank_assignment.h"

#include <algorithm>

namespace ddp {

std::vector<RankCandidate> OrderByRank(std::vector<RankCandidate> candidates) {
  std::sort(
      candidates.begin(), candidates.end(), [](const RankCandidate& a, const RankCandidate& b) {
        return SlotKey(a.host, a.device, a.worker_id) < SlotKey(b.host, b.device, b.worker_id);
      });
  return candidates;
}

}  // namespace ddp
