// Whether this coordinator may act as the leader, for coordinators that fail
// over to each other (coordinator/leader_election.h). The service refuses
// every call while it is not, and the ticker forms no generation. A
// coordinator on its own has no Leadership and always acts.
//
// Implementations are thread-safe and answer without blocking.
#ifndef DDP_COORDINATOR_LEADERSHIP_H_
#define DDP_COORDINATOR_LEADERSHIP_H_

#include <cstdint>
#include <string>

#include "common/coordinator_targets.h"  // kLeaderMetadata
#include "ddp/v1/status.pb.h"

namespace ddp {

// The message of a non-leader's refusal, naming `leader` ("" unknown) and
// why etcd can't be reached from this coordinator (`etcd_trouble`, "" when it
// can).
std::string NotLeaderMessage(const std::string& leader, const std::string& etcd_trouble = "");

class Leadership {
 public:
  virtual ~Leadership() = default;
  // True only while this coordinator leads and its lease surely still holds
  // on the etcd side. It may turn false for a while and true again (a
  // renewal answered late, an etcd leader election): the coordinator only
  // pauses meanwhile.
  virtual bool IsLeader() const = 0;
  // The term is over for good (etcd said the lease or the key is gone, or
  // no renewal came back for twice the TTL): the coordinator starts over.
  virtual bool Deposed() const = 0;
  // The leader's address, or "" while none is known (an election).
  virtual std::string LeaderAddress() const = 0;
  virtual v1::CoordinatorLeadership Describe() const = 0;
  // Why etcd could not be reached at the last try ("" when it was): the
  // leader named may be out of date then.
  virtual std::string EtcdTrouble() const = 0;
  // Changes of leader seen (the first leader seen counts).
  virtual uint64_t leader_changes() const = 0;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_LEADERSHIP_H_
