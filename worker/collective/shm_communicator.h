// Collectives among ranks on one machine through a shared-memory segment:
// no TCP, no kernel copies, no event-loop threads. Each rank copies its
// buffer into its slot, a barrier, each rank sums one chunk across all slots
// (always in rank order, so every rank gets the same bits), a barrier, each
// copies the result out. Waiting spins briefly, then sleeps on a futex in
// the segment, so a rank waiting for a slow peer leaves its core to its own
// backward pass.
//
// A rank that aborts marks the segment, so its peers fail at once; a peer
// whose process died is noticed by pid within a fraction of a second.
#ifndef DDP_WORKER_COLLECTIVE_SHM_COMMUNICATOR_H_
#define DDP_WORKER_COLLECTIVE_SHM_COMMUNICATOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/collective/communicator.h"

namespace gloo::rendezvous {
class Store;
}

namespace ddp {

class ShmCommunicator final : public Communicator {
 public:
  // Ranks on one machine this communicator can join.
  static constexpr int kMaxRanks = 64;

  struct Options {
    int rank = 0;
    int world_size = 1;
    // Bounds the rendezvous and every wait for a peer.
    absl::Duration timeout = absl::Minutes(5);
    // Per-rank staging capacity; larger buffers go through in pieces.
    size_t slot_bytes = size_t{4} << 20;
  };

  // Rank 0 creates the segment and publishes its name in `store`; the others
  // map it. FAILED_PRECONDITION when shared memory can't be had (too many
  // ranks, /dev/shm full or not writable); UNAVAILABLE when a peer never
  // comes.
  static absl::StatusOr<std::unique_ptr<ShmCommunicator>> Create(gloo::rendezvous::Store& store,
                                                                 const Options& options);
  // Unlinks segments whose creator process is gone (or a zombie): what a
  // rank 0 killed in a rendezvous left. Each rank 0 does it before it makes
  // its own.
  static void RemoveStaleSegments();
  ~ShmCommunicator() override;

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  std::string backend() const override { return "shm"; }
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status AllReduceSumHalf(uint16_t* data, size_t count, HalfType type) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  void Abort() override;

 private:
  struct Segment;
  // Where the slots start, past the header.
  static size_t DataOffset();
  // ABORTED once any rank aborted the communicator.
  // Sums with add(dst, src, n) (dst[i] += src[i] in T's arithmetic), in
  // rank order.
  template <typename T, typename Add>
  absl::Status AllReduceWith(T* data, size_t count, Add add);
  absl::Status CheckNotAborted() const;
  // Rank 0 makes the segment `name` of `bytes` (unlinked again on failure);
  // the others map it, checking it is this generation's.
  static absl::Status CreateSegment(const std::string& name, size_t bytes, const Options& options,
                                    Segment** segment);
  static absl::Status MapSegment(const std::string& name, size_t bytes, const Options& options,
                                 Segment** segment);
  ShmCommunicator(Segment* segment, size_t mapped_bytes, const Options& options);
  // Publishes this rank's arrival for the next operation and waits for all.
  absl::Status Barrier(int phase);
  absl::Status WaitFor(int phase, int peer, uint32_t sequence, absl::Time deadline);
  char* slot(int rank) const;
  char* result() const;

  Segment* segment_;
  const size_t mapped_bytes_;
  const Options options_;
  uint32_t sequence_ = 0;
  std::atomic<bool> aborted_{false};
};

}  // namespace ddp

#endif  // DDP_WORKER_COLLECTIVE_SHM_COMMUNICATOR_H_
