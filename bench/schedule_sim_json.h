// The simulator's input and output as JSON (bench/scheduling.py writes the
// one and reads the other).
//
// A trace: every key but "jobs" optional (defaults: SimCosts, 64 workers),
// unknown keys refused, "meta" free-form and ignored:
//   {"workers": 64, "reform_pause_s": 10, "checkpoint_pause_s": 30,
//    "restart_pause_s": 30, "reform_min_interval_s": 60,
//    "max_events": 1000000, "owner_quota": {"alice": 16}, "meta": {...},
//    "jobs": [{"id": "j000", "owner": "alice", "priority": 0,
//              "submit_s": 0, "work": 1e6, "t1": 100, "a": 0.05,
//              "min_workers": 1, "max_workers": 4}, ...]}
#ifndef DDP_BENCH_SCHEDULE_SIM_JSON_H_
#define DDP_BENCH_SCHEDULE_SIM_JSON_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bench/schedule_sim_core.h"

namespace ddp {

// INVALID_ARGUMENT naming the key: malformed JSON, a key given twice or
// unknown, a value of the wrong type or out of range.
absl::StatusOr<Trace> ParseTrace(absl::string_view json);

// One JSON object: "policy", "workers", "costs", "totals" (jobs, avg_jct_s,
// makespan_s, utilisation = busy worker-seconds / (workers * makespan),
// training_utilisation (the same without pauses), longest_wait_s and its
// job (the most time one job spent queued, first wait and after
// preemptions together), events, decisions, starts, grows, shrinks,
// preemptions) and "jobs": per job submit_s, start_s, end_s, jct_s, wait_s
// (submission to first start), queued_s, paused_s, starts, grows, shrinks,
// reallocations (grows + shrinks), preemptions, work_done and, with
// `segments`, its allocation over time.
std::string ResultToJson(const Trace& trace, const SimResult& result, bool segments);

}  // namespace ddp

#endif  // DDP_BENCH_SCHEDULE_SIM_JSON_H_
