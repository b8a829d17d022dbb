// What a ddp::Session holds, shared with the rest of the library (the
// DistributedDataParallel hands it each step's reduction).
#ifndef DDP_WORKER_API_SESSION_IMPL_H_
#define DDP_WORKER_API_SESSION_IMPL_H_

#include <cstdint>
#include <exception>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ddp/session.h"
#include "ddp/v1/worker.pb.h"
#include "worker/api/coordinator_session.h"
#include "worker/api/store_server.h"
#include "worker/communicator.h"

namespace ddp {

struct Session::Impl {
  // `what` failed with `status`: the message for ddp::Error, with the
  // coordinator's reason when it ended this rank's generation.
  std::string Explain(const absl::Status& status, const std::string& what) const;

  Options options;
  int rank = 0;
  int world_size = 1;
  std::unique_ptr<StoreServer> server;         // rank 0's, started torchrun's way
  std::unique_ptr<CoordinatorSession> joined;  // with a coordinator
  Communicator* comm = nullptr;                // the one above's, or `owned`
  std::shared_ptr<Communicator> owned;

  // Reports (joined only).
  uint64_t steps = 0;
  absl::Time last_report;
  v1::ReductionStatus last_reduction;
  bool finished = false;
  // Exceptions in flight when the session began: more at its end means the
  // program is leaving by one.
  int uncaught_at_start = std::uncaught_exceptions();
};

}  // namespace ddp

#endif  // DDP_WORKER_API_SESSION_IMPL_H_
