// ddp-coordinator as one of several that fail over to each other through
// etcd (--etcd_endpoints): it serves as a standby (every call refused,
// naming the leader; reads forwarded) while it campaigns; when it leads it
// loads the state from etcd and runs the whole coordinator on the same
// port, adopting the running generation as a restarted coordinator does.
// A leader that loses its lease stops acting at once and returns
// kLostLeadership: ddp-coordinator then executes itself again, so that
// nothing of the old term's memory survives into the next campaign.
#ifndef DDP_COORDINATOR_FAILOVER_H_
#define DDP_COORDINATOR_FAILOVER_H_

#include <functional>
#include <string>

#include "absl/time/time.h"
#include "common/etcd_client.h"
#include "coordinator/coordinator_server.h"

namespace ddp {

struct FailoverOptions {
  EtcdClient::Options etcd;
  std::string prefix;  // --etcd_prefix
  absl::Duration lease_ttl = absl::Seconds(2);
  // The address clients dial this coordinator at (--advertise_address);
  // empty: --listen's, with the port it got.
  std::string advertise;
  // The state's seal key (--state_key_file); empty: this user's on this
  // machine (common/state_seal.h).
  std::string state_key_file;
  // How long a coordinator that refused to lead (state it can't trust)
  // waits before it stands again.
  absl::Duration refused_retry = absl::Seconds(5);
};

// Returns the exit code: CoordinatorServer::Wait's, 1 when --listen can't
// be served, or 2 for a setting that can't work. A leader that loses its
// lease calls `start_over(port)` (which does not return: ddp-coordinator
// executes itself again, serving on `port`).
int RunWithFailover(CoordinatorServer::Options options, const FailoverOptions& failover,
                    const std::function<void(int port)>& start_over);

}  // namespace ddp

#endif  // DDP_COORDINATOR_FAILOVER_H_
