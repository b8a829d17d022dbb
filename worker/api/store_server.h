// The rendezvous store of a session started from torchrun's environment:
// rank 0 serves the coordinator's Store RPCs (over a KvStore) at
// MASTER_ADDR:MASTER_PORT, so every rank uses the same StoreClient and Gloo
// rendezvous a worker uses with a coordinator. Other RPCs are
// UNIMPLEMENTED. No TLS or tokens, like torchrun's TCPStore: for a network
// the job's ranks trust.
#ifndef DDP_WORKER_API_STORE_SERVER_H_
#define DDP_WORKER_API_STORE_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ddp {

class StoreServer {
 public:
  // Listens on `address` (HOST:PORT), alone: UNAVAILABLE when it can't be
  // bound, another process's listener included.
  static absl::StatusOr<std::unique_ptr<StoreServer>> Start(const std::string& address);
  ~StoreServer();

 private:
  struct Impl;
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp

#endif  // DDP_WORKER_API_STORE_SERVER_H_
