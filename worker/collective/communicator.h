// Collectives among the ranks of one generation. Four implementations:
// shared memory (ranks on one machine), Gloo (CPU memory, TCP), the
// hierarchical one over both (several machines of several ranks), and NCCL
// (CUDA memory; compiled where CUDA is, never yet run: README's "Limits").
//
// Collectives are called from one thread at a time, in the same order on
// every rank. Abort may be called from any thread.
#ifndef DDP_WORKER_COLLECTIVE_COMMUNICATOR_H_
#define DDP_WORKER_COLLECTIVE_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "worker/collective/half.h"

namespace ddp {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // "gloo" or "nccl".
  virtual std::string backend() const = 0;

  // Whether the collectives take device (accelerator) memory. False: host
  // memory only; a reducer stages device buckets through host buffers. A
  // reducer calls a communicator that takes device memory once what it
  // queued on the buffer has completed (it synchronizes its communication
  // stream first), so the communicator may run on a stream of its own; it
  // must return only once the collective completed (as it must anyway).
  virtual bool takes_device_memory() const { return false; }

  // Sums `count` floats at `data` over all ranks, in place; returns when the
  // result is in `data`. UNAVAILABLE when a peer failed, DEADLINE_EXCEEDED
  // past the collective timeout, ABORTED after Abort.
  virtual absl::Status AllReduceSum(float* data, size_t count) = 0;
  // The same for 16-bit floats (gradient compression): each partial sum is
  // rounded to `type`, as Gloo sums float16.
  virtual absl::Status AllReduceSumHalf(uint16_t* data, size_t count, HalfType type) = 0;

  // Copies `bytes` at `data` on rank `root` to `data` on every other rank.
  virtual absl::Status Broadcast(void* data, size_t bytes, int root) = 0;

  // Makes collectives in flight and later ones fail promptly with ABORTED.
  virtual void Abort() = 0;
};

}  // namespace ddp

#endif  // DDP_WORKER_COLLECTIVE_COMMUNICATOR_H_
