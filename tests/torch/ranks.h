// Runs N ranks as threads over Gloo's in-memory store, as Gloo's own tests
// do: real TCP pairs on loopback, no coordinator.
#ifndef DDP_TESTS_TORCH_RANKS_H_
#define DDP_TESTS_TORCH_RANKS_H_

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "worker/gloo_communicator.h"

namespace ddp {

// Calls body(rank, communicator) on `world` threads and joins them.
inline void RunRanks(int world, const std::function<void(int, Communicator*)>& body,
                     absl::Duration timeout = absl::Seconds(30)) {
  gloo::rendezvous::HashStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      GlooCommunicator::Options options;
      options.rank = r;
      options.world_size = world;
      options.timeout = timeout;
      auto comm = GlooCommunicator::Create(store, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(r, comm->get());
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace ddp

#endif  // DDP_TESTS_TORCH_RANKS_H_
