// Rank order, as a pure function: neighbours in the ring share a host.
#ifndef DDP_COORDINATOR_RANK_ASSIGNMENT_H_
#define DDP_COORDINATOR_RANK_ASSIGNMENT_H_

#include <string>
#include <tuple>
#include <vector>

#include "common/device.h"

namespace ddp {

// The sort key of a worker slot: host, device kind, device index, id.
inline auto SlotKey(const std::string& host, const Device& device, const std::string& id) {
  return std::tie(host, device.kind, device.index, id);
}

struct RankCandidate {
  std::string worker_id;
  std::string host;
  Device device;
  std::string machine_id;
};

// Returns the candidates in rank order: by host, then device kind (cpu
// before cuda), then device index (numerically: cuda:2 before cuda:10), then
// worker id. Rank r is element r. Independent of the input order.
std::vector<RankCandidate> OrderByRank(std::vector<RankCandidate> candidates);

}  // namespace ddp

#endif  // DDP_COORDINATOR_RANK_ASSIGNMENT_H_
