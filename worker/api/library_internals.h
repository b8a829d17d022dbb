// What the worker daemon's trainer (worker/trainer.cc) uses of the library
// that a program can't reach, so that the daemon trains through the same
// Session and DistributedDataParallel as a program does: a Session over the
// communicator the daemon already holds, whose steps the trainer drives
// (StepDriver), and a DistributedDataParallel over the parameters and
// buffers a Model lists.
#ifndef DDP_WORKER_API_LIBRARY_INTERNALS_H_
#define DDP_WORKER_API_LIBRARY_INTERNALS_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/error.h"
#include "ddp/session.h"
#include "worker/api/session_impl.h"
#include "worker/collective/communicator.h"

namespace ddp {

// A ddp::Error that keeps the status it came from (a collective's ABORTED
// or UNAVAILABLE), for callers that decide by code.
class StatusError : public Error {
 public:
  StatusError(absl::Status status, const std::string& what)
      : Error(std::string(what) + ": " + std::string(status.message())),
        status_(status.code(), what + ": " + std::string(status.message())) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// A reduction as the coordinator reads it: `stats`' figures and per-bucket
// times replace what `status` held; the newly unused parameter names are
// added to those not yet reported.
void AddReduction(const ReductionStats& stats, v1::ReductionStatus* status);

struct LibraryInternals {
  // A session of `comm`'s rank and world; `comm` outlives it.
  static std::unique_ptr<Session> SessionOver(Communicator* comm, StepDriver driver);
  // The DistributedDataParallel's construction (a collective) as a status:
  // the communicator's code when a collective failed, INVALID_ARGUMENT
  // when the ranks' parameters differ.
  static absl::StatusOr<std::unique_ptr<DistributedDataParallel>> DataParallelOver(
      Session& session, std::vector<std::pair<std::string, torch::Tensor>> params,
      std::vector<std::pair<std::string, torch::Tensor>> buffers,
      const DistributedDataParallel::Options& options);
};

}  // namespace ddp

#endif  // DDP_WORKER_API_LIBRARY_INTERNALS_H_
