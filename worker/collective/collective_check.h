// Every rank says what it is about to do on a communicator before it does
// it, so that ranks whose programs went different ways (one skipped a
// backward, one called all_reduce_sum while the others reduce gradients)
// fail together, each naming every rank's collective, instead of summing
// unrelated buffers or tripping over mismatched sizes in the transport.
//
// The check itself is one all-reduce of a fixed size, so it can't be
// misaligned: each rank adds the 16 hex digits of a hash of its collective
// (kind, size, root, and its place: the sequence number on this
// communicator and the synchronized steps before it) and their squares. Every
// rank holds the same collective exactly when, for each digit, the sum is
// world x the digit and the sum of squares world x its square (equal mean
// and mean square leave no variance), and every rank sees the same sums, so
// all fail together or none does. Only then do the ranks exchange their
// whole collectives (a few floats per rank), to say who was doing what.
//
// Device-memory communicators (NCCL) are not checked: the check's floats
// live in host memory.
#ifndef DDP_WORKER_COLLECTIVE_COLLECTIVE_CHECK_H_
#define DDP_WORKER_COLLECTIVE_COLLECTIVE_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/collective/communicator.h"

namespace ddp {

enum class CollectiveKind : uint32_t {
  // A synchronized backward: its buckets (count: floats; extra: buckets),
  // then the buffers broadcast after it (bytes_after, from root).
  kGradients = 1,
  // The reducer's one rebuild of its buckets (count: parameters).
  kBucketOrder = 2,
  // A DistributedDataParallel's construction (root: the source rank).
  kModel = 3,
  // Session::all_reduce_sum (count: floats).
  kAllReduce = 4,
  // Session::broadcast (count: bytes; root).
  kBroadcast = 5,
  // Session::barrier.
  kBarrier = 6,
  // Elastic training: taking up rank `root`'s state.
  kState = 7,
};

struct Collective {
  CollectiveKind kind = CollectiveKind::kBarrier;
  uint64_t count = 0;
  uint64_t extra = 0;
  int32_t root = -1;
  // Bytes broadcast from `root` right after it (kGradients: the buffers).
  uint64_t bytes_after = 0;
};

// A collective at its place on one communicator, as a rank announces it.
struct AnnouncedCollective {
  Collective collective;
  // Collectives checked before it on this communicator.
  uint64_t sequence = 0;
  // Synchronized backwards (kGradients) before it.
  uint64_t steps = 0;

  bool operator==(const AnnouncedCollective& o) const {
    return collective.kind == o.collective.kind && collective.count == o.collective.count &&
           collective.extra == o.collective.extra && collective.root == o.collective.root &&
           collective.bytes_after == o.collective.bytes_after && sequence == o.sequence &&
           steps == o.steps;
  }
};

// What a person reads: "the gradients of synchronized backward #5 (3
// buckets, 2410 floats)", "all_reduce_sum of 1 float after synchronized
// backward #4".
std::string DescribeCollective(const AnnouncedCollective& c);

// The error for ranks announcing `by_rank` (indexed by rank), naming each
// group of ranks that agree, and what every rank must do alike.
absl::Status MisalignedError(const std::vector<AnnouncedCollective>& by_rank);

// Whether `status` is MisalignedError's: a fault of the program, not of a
// peer or the network, so re-forming the job would not help.
bool IsMisaligned(const absl::Status& status);

class CollectiveCheck {
 public:
  // `comm` outlives this.
  explicit CollectiveCheck(Communicator* comm) : comm_(comm) {}

  // Collective: every rank announces `collective` at its place. OK when all
  // announced the same; MisalignedError (FAILED_PRECONDITION) on every rank
  // when not; the communicator's error when the exchange itself failed.
  // Called from one thread at a time (the trainer, or the reducer's
  // communication thread while the trainer waits in backward).
  absl::Status Agree(const Collective& collective);

 private:
  Communicator* const comm_;
  absl::Mutex mu_;
  uint64_t sequence_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ddp

#endif  // DDP_WORKER_COLLECTIVE_COLLECTIVE_CHECK_H_
