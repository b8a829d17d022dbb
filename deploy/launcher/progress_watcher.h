// ddp-run's view of the job: follows the coordinator's WatchStatus stream on
// a thread of its own and prints progress lines (ProgressPrinter) until it
// is stopped, watching again whenever the stream ends.
#ifndef DDP_DEPLOY_LAUNCHER_PROGRESS_WATCHER_H_
#define DDP_DEPLOY_LAUNCHER_PROGRESS_WATCHER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/credentials.h"
#include "ddp/v1/coordinator.grpc.pb.h"
#include "deploy/launcher/progress_printer.h"
#include "grpcpp/grpcpp.h"

namespace ddp {

class ProgressWatcher {
 public:
  // Starts watching `target` (HOST:PORT) at once.
  ProgressWatcher(const std::string& target, const ClientSecurity& security);
  ~ProgressWatcher() { Stop(); }
  // Ends the watch and joins its thread. Idempotent; from one thread.
  void Stop();
  // Stops watching, and returns the lines `final_status` still adds.
  std::vector<std::string> Drain(const v1::JobStatus& final_status);

 private:
  void Loop();

  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Used by the watch thread, then by Drain once that thread has stopped.
  ProgressPrinter printer_;
  std::thread thread_;
};

}  // namespace ddp

#endif  // DDP_DEPLOY_LAUNCHER_PROGRESS_WATCHER_H_
