// Where the coordinator's durable state lives: a file in --state-dir (one
// machine), or etcd (coordinators that fail over to each other). The core
// saves through this interface and does not know which it has.
//
// Implementations are thread-safe.
#ifndef DDP_COORDINATOR_STATE_STORE_H_
#define DDP_COORDINATOR_STATE_STORE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddp/v1/state.pb.h"

namespace ddp {

class StateStore {
 public:
  virtual ~StateStore() = default;

  // The saved state, or nullopt when none was saved. DATA_LOSS if it is
  // unreadable.
  virtual absl::StatusOr<std::optional<v1::DurableState>> Load() const = 0;

  // Saves `state` as version `sequence`; an older sequence than the last
  // saved one is skipped, so concurrent savers can't go back in time.
  virtual absl::Status Save(const v1::DurableState& state, uint64_t sequence) = 0;

  // Where the state is, for the log ("/var/lib/ddp/coordinator.state").
  virtual std::string Describe() const = 0;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_STATE_STORE_H_
