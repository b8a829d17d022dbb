// The one way a training state moves between ranks, the daemon's trainer
// and the library's session alike: rank `source` broadcasts its encoded
// state (worker/elastic/state_codec.h), and every other rank believes no length it
// announces before checking it against what its own model can hold.
#ifndef DDP_WORKER_ELASTIC_STATE_TRANSFER_H_
#define DDP_WORKER_ELASTIC_STATE_TRANSFER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/collective/communicator.h"

namespace ddp {

// A collective over `comm`: every rank calls it with the same `source`.
// `mine` is the source's encoded state, or why it has none (ignored on the
// other ranks). Returns the state's bytes on every rank, the source's own
// included. Errors, the same on every rank unless said:
//   the source's own error   on the source, as given; the others get
//                            UNAVAILABLE "rank S could not provide the state"
//   DATA_LOSS                an announced size over `max_bytes` (this rank's
//                            MaxEncodedStateBytes): refused before allocating
//   the communicator's       as it returns them (a peer lost: ABORTED, ...)
absl::StatusOr<std::string> BroadcastState(Communicator& comm, int source,
                                           absl::StatusOr<std::string> mine, uint64_t max_bytes);

}  // namespace ddp

#endif  // DDP_WORKER_ELASTIC_STATE_TRANSFER_H_
