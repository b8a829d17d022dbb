// The coordinator's Prometheus series, read at each scrape from the status
// snapshot (which never waits behind stream handlers) and a few counters of
// the store and the stream gate: nothing on a hot path takes a lock or does
// work for metrics.
//
//   ddp_job_state{state}                    1 for the job's state, 0 for the others
//   ddp_job_generation, ddp_job_world_size, ddp_job_global_step, ddp_job_total_steps,
//   ddp_job_epoch, ddp_job_samples_per_second, ddp_job_loss, ddp_job_test_accuracy,
//   ddp_job_faults, ddp_job_elapsed_seconds
//   ddp_job_generation_changes_total{cause} generation changes seen, by cause
//   ddp_coordinator_workers{state}          workers by state (no worker ids: unbounded)
//   ddp_coordinator_attach_streams          worker streams open (registered or not)
//   ddp_coordinator_store_keys, ddp_coordinator_store_bytes, ddp_coordinator_store_waiters
//   ddp_coordinator_is_leader, ddp_coordinator_leader_changes_total (coordinators that fail
//   over through etcd only)
//
// RPC counts and latencies come from rpc_metrics.h.
#ifndef DDP_COORDINATOR_COORDINATOR_METRICS_H_
#define DDP_COORDINATOR_COORDINATOR_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ddp/v1/status.pb.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace ddp {

// What one scrape reads.
struct CoordinatorSample {
  std::shared_ptr<const v1::JobStatus> status;  // never null
  uint64_t store_keys = 0;
  uint64_t store_bytes = 0;
  uint64_t store_waiters = 0;
  uint64_t attach_streams = 0;
  // Coordinators that fail over to each other: whether this one leads, and
  // the changes of leader it saw.
  bool replicated = false;
  bool is_leader = false;
  uint64_t leader_changes = 0;
};

// Counts generation changes by cause across scrapes. The status keeps only
// the newest 100 changes, so the count can't be the list's length: each
// change is counted once, when first seen (by its time and generation).
// Not thread-safe (CoordinatorMetrics locks around it).
class ChangeTally {
 public:
  // Counts the changes in `changes` (oldest first) not seen before.
  void Observe(const google::protobuf::RepeatedPtrField<v1::GenerationChange>& changes);
  // Cause label ("start", "lost", ...) -> changes seen.
  const std::map<std::string, uint64_t>& counts() const { return counts_; }

 private:
  // The newest change counted: (at_unix_seconds, from_generation).
  double last_at_ = -1;
  uint64_t last_from_ = 0;
  std::map<std::string, uint64_t> counts_;
};

// A label value from an enum value's name: lower case, without its prefix
// ("JOB_STATE_RUNNING" -> "running").
std::string JobStateLabel(v1::JobState state);
std::string WorkerStateLabel(v1::WorkerState state);
std::string ChangeCauseLabel(v1::ChangeCause cause);

// The families one sample maps to (pure; `tally` already observed it).
std::vector<prometheus::MetricFamily> CoordinatorFamilies(const CoordinatorSample& sample,
                                                          const ChangeTally& tally);

// Registered with a MetricsServer; `sample` is called on a scrape thread and
// must return at once (read the snapshot and counters, nothing else).
class CoordinatorMetrics final : public prometheus::Collectable {
 public:
  explicit CoordinatorMetrics(std::function<CoordinatorSample()> sample)
      : sample_(std::move(sample)) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const std::function<CoordinatorSample()> sample_;
  mutable absl::Mutex mu_;
  mutable ChangeTally tally_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_COORDINATOR_METRICS_H_
