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

// Why the members (in rank order) can't each drive a CUDA device of their
// own, as NCCL needs: the first member on the CPU, or the first two on one
// machine's cuda:N (a machine is a machine_id, or a host without one).
// Empty when every member has its own GPU. O(members).
std::string WhyNotOwnGpus(const std::vector<RankCandidate>& members);

}  // namespace ddp

#endif  // DDP_COORDINATOR_RANK_ASSIGNMENT_H_
