// Builds a job's training state (data, model, optimizer) before the worker
// is admitted to a generation, so that its peers never wait at the
// rendezvous for it to load: the coordinator asks (Prepare) while the worker
// is free, the state is built on a thread of its own, put in the worker's
// slot, and the worker says it holds it (an IDLE state change carrying its
// HeldState), or FAILED (generation 0) when it can't be built.
#ifndef DDP_WORKER_STATE_PREPARER_H_
#define DDP_WORKER_STATE_PREPARER_H_

#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/device.h"
#include "ddp/v1/worker.pb.h"
#include "worker/confinement.h"
#include "worker/generation_run.h"
#include "worker/link/outbox.h"

namespace ddp {

class StatePreparer {
 public:
  // `slot` and `outbox` outlive it. States are built on `device`.
  StatePreparer(StateSlot* slot, Outbox* outbox, JobConfinementOptions confinement, Device device);
  // Finishes the state being built, if any (it can't be interrupted).
  ~StatePreparer();
  StatePreparer(const StatePreparer&) = delete;
  StatePreparer& operator=(const StatePreparer&) = delete;

  // Builds `prepare`'s state unless the slot holds it already (then says so
  // at once); a newer request replaces one not yet started. Returns at once.
  // Thread-safe.
  void Prepare(const v1::Prepare& prepare);

 private:
  void Loop();
  void Build(const v1::Prepare& prepare);
  void Push(v1::WorkerState state, const std::string& detail, const v1::HeldState* held,
            absl::StatusCode code);

  StateSlot* slot_;
  Outbox* outbox_;
  const JobConfinementOptions confinement_;
  const Device device_;
  absl::Mutex mu_;
  std::optional<v1::Prepare> pending_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ddp

#endif  // DDP_WORKER_STATE_PREPARER_H_
