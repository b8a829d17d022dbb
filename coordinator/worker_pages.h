// ListWorkers' paging: one bounded page of a status snapshot's workers, in a
// stable order (host, device, worker id), filtered by state or membership.
// The page token names the last worker handed out, so a worker that comes
// or goes between two calls neither repeats nor shifts the rest.
#ifndef DDP_COORDINATOR_WORKER_PAGES_H_
#define DDP_COORDINATOR_WORKER_PAGES_H_

#include "absl/status/statusor.h"
#include "ddp/v1/coordinator.pb.h"
#include "ddp/v1/status.pb.h"

namespace ddp {

inline constexpr uint32_t kDefaultWorkerPage = 100;
inline constexpr uint32_t kMaxWorkerPage = 1000;

// INVALID_ARGUMENT for a page token this coordinator did not give.
absl::StatusOr<v1::ListWorkersResponse> PageOfWorkers(const v1::JobStatus& status,
                                                      const v1::ListWorkersRequest& request);

}  // namespace ddp

#endif  // DDP_COORDINATOR_WORKER_PAGES_H_
