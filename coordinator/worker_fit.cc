#include "coordinator/worker_fit.h"

#include <algorithm>

#include "common/job_kinds.h"
#include "common/job_spec.h"
#include "common/labels.h"

namespace ddp {

bool CanRun(const WorkerRecord& w, const v1::JobSpec& spec) {
  // A ddp-worker trains the built-in models; a program on the library only
  // its own.
  if (w.capabilities.program() != IsProgramJob(spec)) return false;
  if (!LabelsMatch(w.labels, {spec.worker_selector().begin(), spec.worker_selector().end()})) {
    return false;
  }
  const auto& backends = w.capabilities.backends();
  const bool has_nccl = std::find(backends.begin(), backends.end(), "nccl") != backends.end();
  switch (BackendOf(spec)) {
    case v1::BACKEND_GLOO:
    case v1::BACKEND_SHM:
      return true;  // a GPU's buckets are staged through host memory
    case v1::BACKEND_NCCL:
      return w.device.is_cuda() && has_nccl;
    case v1::BACKEND_AUTO:  // nccl when every rank has its own GPU (transport_choice.h)
      return true;
    case v1::BACKEND_UNKNOWN:  // refused by the job's check
      return false;
  }
  return false;
}

bool CanGive(const WorkerRecord& w, const v1::JobSpec& spec) {
  if (!CanRun(w, spec)) return false;
  if (w.capabilities.program() && w.held.has_value() && !w.held->job_id().empty()) {
    return w.held->job_id() == spec.name();
  }
  return true;
}

}  // namespace ddp
