#include "coordinator/rank_assignment.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace ddp {

std::vector<RankCandidate> OrderByRank(std::vector<RankCandidate> candidates) {
  std::sort(
      candidates.begin(), candidates.end(), [](const RankCandidate& a, const RankCandidate& b) {
        return SlotKey(a.host, a.device, a.worker_id) < SlotKey(b.host, b.device, b.worker_id);
      });
  return candidates;
}

std::string WhyNotOwnGpus(const std::vector<RankCandidate>& members) {
  if (members.empty()) return "no members";
  // (machine, cuda index) -> the first rank on it.
  absl::flat_hash_map<std::pair<std::string, int>, size_t> first;
  for (size_t r = 0; r < members.size(); ++r) {
    const RankCandidate& m = members[r];
    if (!m.device.is_cuda()) {
      return absl::StrCat("rank ", r, " is on ", m.device.ToString(),
                          " (NCCL needs a GPU on every rank)");
    }
    const std::string& machine = m.machine_id.empty() ? m.host : m.machine_id;
    auto [it, inserted] = first.try_emplace(std::make_pair(machine, m.device.index), r);
    if (!inserted) {
      return absl::StrCat("ranks ", it->second, " and ", r, " share ", m.device.ToString(), " on ",
                          machine, " (NCCL refuses two ranks on one device)");
    }
  }
  return "";
}

}  // namespace ddp
