// Runs N ranks as threads over Gloo's in-memory store, as Gloo's own tests
// do: real TCP pairs on loopback, no coordinator.
#ifndef DDP_TESTS_TORCH_RANKS_H_
#define DDP_TESTS_TORCH_RANKS_H_

#include <algorithm>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "worker/collective/gloo_communicator.h"
#include "worker/collective/hierarchical_communicator.h"
#include "worker/collective/shm_communicator.h"

namespace ddp {

// The CPU communicators, for tests parameterised over them. kHierarchical
// puts ranks two to a "machine" (a last one alone when the world is odd).
enum class Backend { kGloo, kShm, kHierarchical };

inline std::string BackendName(Backend b) {
  return b == Backend::kGloo ? "gloo" : b == Backend::kShm ? "shm" : "hierarchical";
}

// Calls body(rank, communicator) on `world` threads and joins them.
// `shm_slot_bytes` makes the shared-memory backend work in small pieces.
inline void RunRanks(int world, const std::function<void(int, Communicator*)>& body,
                     absl::Duration timeout = absl::Seconds(30), Backend backend = Backend::kGloo,
                     size_t shm_slot_bytes = size_t{4} << 20) {
  gloo::rendezvous::HashStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm;
      if (backend == Backend::kGloo) {
        GlooCommunicator::Options options;
        options.rank = r;
        options.world_size = world;
        options.timeout = timeout;
        auto created = GlooCommunicator::Create(store, options);
        ASSERT_TRUE(created.ok()) << created.status();
        comm = std::move(*created);
      } else if (backend == Backend::kHierarchical) {
        HierarchicalCommunicator::Options options;
        options.rank = r;
        options.world_size = world;
        options.local_rank = r % 2;
        options.local_size = std::min(2, world - r / 2 * 2);
        options.machine = r / 2;
        options.machines = (world + 1) / 2;
        options.timeout = timeout;
        options.shm_slot_bytes = shm_slot_bytes;
        auto created = HierarchicalCommunicator::Create(store, options);
        ASSERT_TRUE(created.ok()) << created.status();
        comm = std::move(*created);
      } else {
        ShmCommunicator::Options options;
        options.rank = r;
        options.world_size = world;
        options.timeout = timeout;
        options.slot_bytes = shm_slot_bytes;
        auto created = ShmCommunicator::Create(store, options);
        ASSERT_TRUE(created.ok()) << created.status();
        comm = std::move(*created);
      }
      body(r, comm.get());
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace ddp

#endif  // DDP_TESTS_TORCH_RANKS_H_
