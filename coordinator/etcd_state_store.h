// The coordinator's durable state in etcd, for coordinators that fail over
// to each other: the whole DurableState under PREFIX/state, written only by
// the leader, and only while it leads. Every save is one transaction
// guarded by the election (its leader key still holds), which also records
// the writer's lease under PREFIX/writer, so etcd's revision history shows
// which term made each write. The state is sealed (common/state_seal.h):
// what someone without the coordinators' key wrote there is refused.
//
// Thread-safe.
#ifndef DDP_COORDINATOR_ETCD_STATE_STORE_H_
#define DDP_COORDINATOR_ETCD_STATE_STORE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/etcd_client.h"
#include "common/state_seal.h"
#include "coordinator/leader_election.h"
#include "coordinator/state_store.h"

namespace ddp {

// The value of PREFIX/format: a coordinator refuses a prefix holding another.
// (2: the state is sealed.)
inline constexpr char kEtcdStateFormat[] = "ddp-coordinator-state 2";

class EtcdStateStore final : public StateStore {
 public:
  // Makes sure `prefix` is this kind of coordinator's, marking it so when
  // it is empty. FAILED_PRECONDITION when it holds another format (a newer
  // coordinator's) or keys that are not a coordinator's; UNAVAILABLE when
  // etcd can't be reached.
  static absl::Status ClaimPrefix(EtcdClient* etcd, const std::string& prefix);

  // `etcd` and `election` outlive the store.
  EtcdStateStore(EtcdClient* etcd, std::string prefix, const LeaderElection* election,
                 StateSeal seal);

  // PERMISSION_DENIED when the state is not sealed with this key (someone
  // else wrote it); DATA_LOSS when it does not parse. Both name the key.
  absl::StatusOr<std::optional<v1::DurableState>> Load() const override;
  // FAILED_PRECONDITION when this coordinator no longer leads (etcd refused
  // the guarded write).
  absl::Status Save(const v1::DurableState& state, uint64_t sequence) override;
  std::string Describe() const override;

 private:
  EtcdClient* const etcd_;
  const std::string prefix_;
  const LeaderElection* const election_;
  const StateSeal seal_;
  absl::Mutex mu_;
  uint64_t saved_sequence_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_ETCD_STATE_STORE_H_
