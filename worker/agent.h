// The worker daemon's life: attached to the coordinator through a
// CoordinatorLink (which reconnects, sends heartbeats and queued reports),
// it runs each assignment it is given, one generation at a time, keeping the
// job's training state between them: in a process per job (IsolatedJobs),
// or in its own (InProcessJobs). A lost stream does not end the generation
// in flight; only the coordinator does (an Abort, or closing the stream
// with ABORTED).
#ifndef DDP_WORKER_AGENT_H_
#define DDP_WORKER_AGENT_H_

#include <atomic>
#include <memory>
#include <string>

#include "common/device.h"
#include "common/labels.h"
#include "ddp/v1/coordinator.grpc.pb.h"
#include "worker/link/coordinator_link.h"
#include "worker/link/outbox.h"
#include "worker/link/progress_board.h"
#include "worker/process/job_runner.h"
#include "worker/process/shared_board.h"

namespace ddp {

class WorkerMetrics;

class WorkerAgent final : public CoordinatorLink::Handler {
 public:
  struct Options {
    // The coordinator, how to reach it, and how patiently.
    CoordinatorLink::Options link;
    // Where peers reach this worker, and the name it registers under.
    std::string host;
    Device device;
    std::string name;
    // What it declares about itself (--labels).
    Labels labels;
    // Intra-op and BLAS threads (0: every core).
    int threads = 0;
    // GPU arithmetic that repeats bit for bit (--deterministic).
    bool deterministic = false;
    // When set, one JSON line per training step is appended here.
    std::string metrics_file;
    // When set, steps and the report queue feed these Prometheus series;
    // must outlive the agent.
    WorkerMetrics* metrics = nullptr;
    // When set, each step's dataset indices are logged here (a debug aid:
    // tests prove from it that every sample is trained once).
    std::string index_log;
    // Test-only fault injection (see GenerationRun::Environment).
    std::string debug_hang_file;
    // Step reports to the coordinator (off only to measure what they cost).
    bool send_reports = true;
    // Runs job code where the kernel can't confine it (worker/confinement.h).
    bool allow_unconfined = false;
    // When set, each job runs in a process of its own, started from this
    // binary (the daemon's own); empty: in this process.
    std::string job_process_binary;
  };

  explicit WorkerAgent(Options options);
  ~WorkerAgent() override;

  // Runs until Shutdown or a Stop from the coordinator (returns 0), or a
  // registration the coordinator refuses for good (returns 2).
  int Run();
  // Ends Run soon. Thread-safe.
  void Shutdown();

 private:
  std::unique_ptr<JobRunner> MakeJobs();
  // CoordinatorLink::Handler
  v1::RegisterRequest MakeRegister() override;
  void OnAssignment(const v1::Assignment& assignment,
                    std::shared_ptr<v1::Coordinator::StubInterface> stub) override;
  void OnAbort(const v1::Abort& abort) override;
  void OnPrepare(const v1::Prepare& prepare) override;
  void OnDropped(const std::string& why) override;
  void OnStopping(const std::string& reason) override;

  const Options options_;
  Outbox outbox_;
  // Shared with the job's process (none in process, or if it can't be
  // made: then jobs run in this process).
  std::unique_ptr<SharedBoard> shared_board_;
  ProgressBoard own_board_;
  ProgressBoard* const board_;
  CoordinatorLink link_;
  // Made once the link is (in-process runs take its stub factory); ended
  // before it.
  std::unique_ptr<JobRunner> jobs_;
  std::atomic<bool> stopping_{false};
};

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_H_
