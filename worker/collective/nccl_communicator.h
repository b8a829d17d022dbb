// NCCL collectives on CUDA memory: rank 0's ncclUniqueId goes through the
// coordinator's store, then ncclCommInitRank; ncclCommAbort on Abort. NCCL
// and the CUDA runtime are bound at run time (nccl_library.h), so every
// build has this communicator and a machine without them refuses at Create.
//
// Buffers are device pointers on this rank's GPU (the gradient buckets),
// or host memory (the control words, the probe, the state's bytes), which
// goes through a device buffer of the communicator's. Each collective runs
// on the communicator's own stream and returns once it completed there;
// the caller makes sure device data is ready before calling (the reducer
// synchronizes its communication stream first).
#ifndef DDP_WORKER_COLLECTIVE_NCCL_COMMUNICATOR_H_
#define DDP_WORKER_COLLECTIVE_NCCL_COMMUNICATOR_H_

#include <atomic>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/store_client.h"
#include "worker/collective/communicator.h"
#include "worker/collective/nccl_library.h"

namespace ddp {

class NcclCommunicator final : public Communicator {
 public:
  struct Options {
    int rank = 0;
    int world_size = 1;
    // CUDA device index this rank owns.
    int device = 0;
    absl::Duration timeout = absl::Minutes(5);
  };

  // FAILED_PRECONDITION when NCCL or the CUDA runtime can't be loaded
  // ("no NCCL: ...", "no CUDA runtime: ...") or there is no usable CUDA
  // device ("no CUDA device: ..."); UNAVAILABLE when the rendezvous or
  // ncclCommInitRank fails.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(StoreClient* store,
                                                                  const Options& options);
  ~NcclCommunicator() override;

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  std::string backend() const override { return "nccl"; }
  bool takes_device_memory() const override { return true; }
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status AllReduceSumHalf(uint16_t* data, size_t count, HalfType type) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  void Abort() override;

  // NCCL's version as "major.minor.patch", or "none" where it can't be
  // loaded.
  static std::string Version();

 private:
  struct Handles;
  NcclCommunicator(std::unique_ptr<Handles> handles, const Options& options);
  // Waits for the stream, watching for NCCL errors, Abort and the timeout.
  absl::Status Wait(const char* op);
  // Runs `launch` on `bytes` at `data`: in place when they are device
  // memory, else copied to a device buffer of the communicator's and back,
  // all on its stream; then waits.
  absl::Status OnDevice(void* data, size_t bytes, const char* op,
                        const std::function<nccl::Result(void*)>& launch);

  std::unique_ptr<Handles> handles_;
  const Options options_;
  std::atomic<bool> aborted_{false};
};

}  // namespace ddp

#endif  // DDP_WORKER_COLLECTIVE_NCCL_COMMUNICATOR_H_
