// Builds the communicator an assignment calls for, through the generation's
// rendezvous store: shared memory, Gloo over TCP or NCCL, as the job's
// backend says, "auto" resolved by ChooseTransport (transport_choice.h:
// NCCL only when every rank has a GPU of its own). Shared memory that turns
// out unusable under "auto" falls back to Gloo on every rank together. A
// worker without NCCL or a GPU gets NCCL's FAILED_PRECONDITION here.
#ifndef DDP_WORKER_COLLECTIVE_CONNECT_H_
#define DDP_WORKER_COLLECTIVE_CONNECT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/store_client.h"
#include "ddp/v1/worker.pb.h"
#include "worker/collective/communicator.h"

namespace ddp {

// `host` is the address peers reach this rank at (Gloo).
absl::StatusOr<std::shared_ptr<Communicator>> ConnectForAssignment(const v1::Assignment& a,
                                                                   const Device& device,
                                                                   const std::string& host,
                                                                   StoreClient* store);

// Proves the ring: every rank adds rank + 1, and the sum must be what it
// should. DATA_LOSS when it isn't, the communicator's error when it fails.
absl::StatusOr<v1::ProbeResult> ProveRing(Communicator& comm);

}  // namespace ddp

#endif  // DDP_WORKER_COLLECTIVE_CONNECT_H_
