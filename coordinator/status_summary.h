// What GetStatus and WatchStatus answer with: the job, a summary of every
// worker (counts by state, step spread, who is behind, the slowest), and at
// most a fixed number of workers in full, so that an answer costs the same
// at 4,096 workers as at 100. ListWorkers pages through the rest.
#ifndef DDP_COORDINATOR_STATUS_SUMMARY_H_
#define DDP_COORDINATOR_STATUS_SUMMARY_H_

#include <cstdint>

#include "ddp/v1/status.pb.h"

namespace ddp {

inline constexpr uint32_t kDefaultStatusWorkers = 100;
// Workers named in WorkerSummary.behind and .slowest.
inline constexpr int kSummaryBriefs = 8;
// Worker ids kept in each of a generation change's lists.
inline constexpr int kChangeIds = 32;

// Makes `view`, a copy of `full` without its workers, what GetStatus answers:
// - summary: counted over every worker of `full`;
// - workers: at most `max_workers` of them; all, in `full`'s order, when they
//   fit, otherwise the ones most worth a look (failed and lost, then members
//   furthest behind, then members by rank, then the rest);
// - members: its first `max_workers` ids; each generation change's left,
//   joined and members: their first kChangeIds (ids_omitted counts the rest).
void BoundStatusView(const v1::JobStatus& full, uint32_t max_workers, v1::JobStatus* view);

}  // namespace ddp

#endif  // DDP_COORDINATOR_STATUS_SUMMARY_H_
