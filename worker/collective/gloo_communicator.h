// Collectives over Gloo's TCP transport, rendezvoused through a store (the
// coordinator's, in a worker). The all-reduce is a bandwidth-optimal ring
// (reduce-scatter, then all-gather) written on Gloo's unbound buffers, so
// that Abort can break a wait in flight: Gloo's own collectives can only
// time out.
#ifndef DDP_WORKER_COLLECTIVE_GLOO_COMMUNICATOR_H_
#define DDP_WORKER_COLLECTIVE_GLOO_COMMUNICATOR_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/collective/communicator.h"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}
namespace transport {
class UnboundBuffer;
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
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(gloo::rendezvous::Store& store,
                                                                  const Options& options);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "gloo"; }
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status AllReduceSumHalf(uint16_t* data, size_t count, HalfType type) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  void Abort() override;

 private:
  // A buffer Abort can reach while it is in use. It leaves the active set
  // before it is freed, so an Abort racing a failed collective never touches
  // a buffer that is gone.
  class Buffer {
   public:
    Buffer(GlooCommunicator* comm, std::unique_ptr<gloo::transport::UnboundBuffer> buffer);
    ~Buffer();
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    gloo::transport::UnboundBuffer* operator->() const { return buffer_.get(); }
    gloo::transport::UnboundBuffer* get() const { return buffer_.get(); }

   private:
    GlooCommunicator* comm_;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
  };

  GlooCommunicator(std::shared_ptr<gloo::Context> context, const Options& options);
  absl::Status Failed(const char* op, const std::exception& e) const;
  // A buffer over `bytes` at `data` that Abort can reach while in use.
  std::unique_ptr<Buffer> Track(void* data, size_t bytes);
  // Waits for one send or receive; false when aborted. Throws on timeout.
  bool WaitSend(gloo::transport::UnboundBuffer* b);
  bool WaitRecv(gloo::transport::UnboundBuffer* b);
  template <typename T, typename Add>
  absl::Status AllReduceWith(T* data, size_t count, Add add);
  template <typename T, typename Add>
  absl::Status RingAllReduce(T* data, size_t count, Add add);

  std::shared_ptr<gloo::Context> context_;
  const int rank_;
  const int world_size_;
  const absl::Duration timeout_;
  std::vector<char> scratch_;

  absl::Mutex mu_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  // Buffers of the collective in flight.
  std::vector<gloo::transport::UnboundBuffer*> active_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_WORKER_COLLECTIVE_GLOO_COMMUNICATOR_H_
