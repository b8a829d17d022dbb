// The rendezvous store of a session started from torchrun's environment:
// rank 0 serves the coordinator's Store RPCs (over a KvStore) at
// MASTER_ADDR:MASTER_PORT, so every rank uses the same StoreClient and Gloo
// rendezvous a worker uses with a coordinator. Other RPCs are
// UNIMPLEMENTED. No TLS, like torchrun's TCPStore: for a network the job's
// ranks trust. But not open to every local user: each call must carry the
// job's secret (DDP_STORE_SECRET, the same on every rank) in the store
// token metadata, compared in constant time; a call without it, or with
// another, is UNAUTHENTICATED (the message never echoes a secret).
#ifndef DDP_WORKER_API_STORE_SERVER_H_
#define DDP_WORKER_API_STORE_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ddp {

class StoreServer {
 public:
  // Listens on `address` (HOST:PORT), alone: UNAVAILABLE when it can't be
  // bound, another process's listener included. `secret` empty: every call
  // is served (the user's explicit DDP_ALLOW_ANONYMOUS_STORE=1).
  static absl::StatusOr<std::unique_ptr<StoreServer>> Start(const std::string& address,
                                                            const std::string& secret);
  ~StoreServer();

 private:
  struct Impl;
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp

#endif  // DDP_WORKER_API_STORE_SERVER_H_
