// Gloo collectives over TCP, rendezvoused through the coordinator's store.
#ifndef DDP_WORKER_GLOO_COMMUNICATOR_H_
#define DDP_WORKER_GLOO_COMMUNICATOR_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/communicator.h"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}
}  // namespace gloo

namespace ddp {

class GlooCommunicator final : public Communicator {
 public:
  struct Options {
    int rank = 0;
    int world_size = 1;
    // Address peers connect to this rank at (a name or IP of this host).
    std::string host = "127.0.0.1";
    // Bounds the rendezvous and every collective.
    absl::Duration timeout = absl::Minutes(5);
  };

  // Connects the full mesh: every rank publishes its address in `store` and
  // reads the others'. UNAVAILABLE with the store's error when a peer never
  // shows.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(
      gloo::rendezvous::Store& store, const Options& options);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "gloo"; }
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  void Abort() override;

 private:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, const Options& options);
  absl::Status Failed(const char* op, const std::exception& e) const;

  std::shared_ptr<gloo::Context> context_;
  const int rank_;
  const int world_size_;
  const absl::Duration timeout_;
  // Same sequence on every rank: collectives are issued in the same order.
  uint32_t next_tag_ = 0;
  std::atomic<bool> aborted_{false};
};

}  // namespace ddp

#endif  // DDP_WORKER_GLOO_COMMUNICATOR_H_
