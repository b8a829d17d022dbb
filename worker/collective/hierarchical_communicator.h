// Collectives for several ranks on each of several machines: sums go
// through shared memory within a machine, then over Gloo's TCP ring among
// one leader per machine, then back through shared memory. Only the leaders
// touch the network, and each sends its machine's gradient once instead of
// every rank sending its own.
//
// The ranks of a machine are consecutive (the coordinator orders ranks by
// host); `machine` numbers the machines in rank order. Sums are the flat
// ring's within float rounding: the terms are added in another order.
#ifndef DDP_WORKER_COLLECTIVE_HIERARCHICAL_COMMUNICATOR_H_
#define DDP_WORKER_COLLECTIVE_HIERARCHICAL_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/collective/communicator.h"

namespace gloo::rendezvous {
class Store;
}

namespace ddp {

class HierarchicalCommunicator final : public Communicator {
 public:
  struct Options {
    int rank = 0;
    int world_size = 1;
    // This rank among its machine's ranks, and how many there are.
    int local_rank = 0;
    int local_size = 1;
    // This machine's number in rank order, and how many machines there are.
    int machine = 0;
    int machines = 1;
    // Where peers reach this rank over TCP (used by a machine's leader).
    std::string host = "127.0.0.1";
    absl::Duration timeout = absl::Minutes(5);
    // Shared-memory staging per rank.
    size_t shm_slot_bytes = size_t{4} << 20;
  };

  // Joins the machine's shared memory (keys under "machine-<m>/" in
  // `store`) and, on a leader, the leaders' ring (keys under "leaders/").
  // INVALID_ARGUMENT for options that don't describe consecutive ranks;
  // otherwise the failing part's error.
  static absl::StatusOr<std::unique_ptr<HierarchicalCommunicator>> Create(
      gloo::rendezvous::Store& store, const Options& options);
  ~HierarchicalCommunicator() override;

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  std::string backend() const override { return "hierarchical"; }
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status AllReduceSumHalf(uint16_t* data, size_t count, HalfType type) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  void Abort() override;

 private:
  HierarchicalCommunicator(const Options& options, std::unique_ptr<Communicator> local,
                           std::unique_ptr<Communicator> leaders);
  // Every machine's first rank, learned once at creation (machines may hold
  // different numbers of ranks), and machines + 1 entries.
  absl::Status LearnLayout();
  // The sum over machines of each machine's (already summed) data: the
  // leaders' ring, then a broadcast within each machine.
  template <typename ReduceLeaders>
  absl::Status AcrossMachines(void* data, size_t bytes, ReduceLeaders reduce);
  absl::Status BroadcastInParts(void* data, size_t bytes, int root);
  // Aborts both parts when `status` is an error; returns it.
  absl::Status AbortOnFailure(absl::Status status);

  const Options options_;
  // Null when the machine has one rank.
  std::unique_ptr<Communicator> local_;
  // Set on a machine's first rank only, and only with several machines.
  std::unique_ptr<Communicator> leaders_;
  std::vector<int> first_rank_;
};

}  // namespace ddp

#endif  // DDP_WORKER_COLLECTIVE_HIERARCHICAL_COMMUNICATOR_H_
