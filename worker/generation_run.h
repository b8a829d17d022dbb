// One assignment, run on its own thread: build the communicator through the
// store, prove the ring with a probe all-reduce, train, and say how it ended.
#ifndef DDP_WORKER_GENERATION_RUN_H_
#define DDP_WORKER_GENERATION_RUN_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/device.h"
#include "common/store_client.h"
#include "ddp/v1/coordinator.grpc.pb.h"
#include "worker/communicator.h"
#include "worker/outbox.h"

namespace ddp {

// What the heartbeat reports while a step is in flight.
struct ProgressBoard {
  std::atomic<uint64_t> generation{0};
  std::atomic<uint64_t> step{0};
  std::atomic<int> phase{0};
};

class GenerationRun {
 public:
  struct Environment {
    std::shared_ptr<v1::Coordinator::StubInterface> stub;
    // Address peers reach this worker at.
    std::string host;
    Device device;
    // When set, one JSON line per step is appended here.
    std::string metrics_file;
    // Step reports to the coordinator (off only to measure what they cost).
    bool send_reports = true;
  };

  // Starts the run's thread. `outbox` and `board` outlive the run.
  GenerationRun(v1::Assignment assignment, Environment env, Outbox* outbox, ProgressBoard* board);
  // Aborts and joins.
  ~GenerationRun();

  // Leaves the generation as soon as possible: breaks a collective in
  // flight. Thread-safe.
  void Abort(const std::string& reason);
  uint64_t generation() const { return assignment_.generation(); }
  bool finished() const { return finished_; }

 private:
  void Run();
  // Sets up the communicator and the probe, then trains.
  absl::Status RunSteps();
  // Builds the communicator the job's backend calls for.
  absl::StatusOr<std::shared_ptr<Communicator>> Connect(StoreClient* store);
  void PushState(uint64_t generation, v1::WorkerState state, const std::string& detail,
                 const v1::ProbeResult* probe = nullptr);

  const v1::Assignment assignment_;
  const Environment env_;
  Outbox* outbox_;
  ProgressBoard* board_;
  std::atomic<bool> abort_{false};
  std::atomic<bool> finished_{false};

  absl::Mutex mu_;
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  // Set once built; Abort reaches it through here.
  std::shared_ptr<Communicator> comm_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ddp

#endif  // DDP_WORKER_GENERATION_RUN_H_
