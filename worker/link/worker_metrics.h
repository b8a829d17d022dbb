// A worker's Prometheus series, fed from each committed step's report (on
// the training thread: a few atomic adds and one uncontended histogram lock
// per series, no I/O) and from the report queue, read at scrape time.
//
//   ddp_worker_steps_total, ddp_worker_samples_total
//   ddp_worker_step_seconds                    histogram of whole steps
//   ddp_worker_step_phase_seconds{phase}       histograms of its parts: data, forward,
//                                              backward, allreduce_wait, optimizer
//   ddp_worker_allreduce_seconds               histogram of a step's time inside all-reduce
//   ddp_worker_allreduce_bytes_total, ddp_worker_allreduce_buckets_total
//   ddp_worker_bucket_allreduce_seconds_total{bucket}, ddp_worker_bucket_allreduce_bytes_total
//   {bucket}, ddp_worker_bucket_allreduces_total{bucket}
//                                              each bucket's all-reduce, by launch order
//                                              ("0".."31"; later buckets together as "32+")
//   ddp_worker_buckets                         buckets in the plan
//   ddp_worker_unused_parameters, ddp_worker_globally_unused_parameters (last step)
//   ddp_worker_loss, ddp_worker_step, ddp_worker_generation, ddp_worker_rank,
//   ddp_worker_world_size                      (last step)
//   ddp_worker_report_queue_depth, ddp_worker_reports_dropped_total
//
// Thread-safe.
#ifndef DDP_WORKER_LINK_WORKER_METRICS_H_
#define DDP_WORKER_LINK_WORKER_METRICS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace prometheus {
class Counter;
template <typename T>
class Family;
class Gauge;
class Histogram;
class Registry;
}  // namespace prometheus

namespace ddp {

class Outbox;
namespace v1 {
class StepReport;
}  // namespace v1

class WorkerMetrics final : public prometheus::Collectable {
 public:
  WorkerMetrics();
  ~WorkerMetrics() override;

  // A committed step of this worker at `rank`. Training thread; returns at
  // once.
  void OnStep(const v1::StepReport& report, uint32_t rank);
  // The queue whose depth and drops to show; null to stop (the outbox is
  // going away). The outbox must outlive the next call of this.
  void WatchReports(const Outbox* outbox);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter* steps_;
  prometheus::Counter* samples_;
  prometheus::Histogram* step_seconds_;
  // data, forward, backward, allreduce_wait, optimizer.
  prometheus::Histogram* phase_seconds_[5];
  prometheus::Histogram* allreduce_seconds_;
  prometheus::Counter* allreduce_bytes_;
  prometheus::Counter* allreduce_buckets_;
  prometheus::Gauge* buckets_;
  // Per bucket label (kBucketLabels of them), made on first use; training
  // thread only.
  static constexpr size_t kBucketLabels = 33;
  prometheus::Family<prometheus::Counter>* bucket_seconds_family_;
  prometheus::Family<prometheus::Counter>* bucket_bytes_family_;
  prometheus::Family<prometheus::Counter>* bucket_count_family_;
  struct BucketSeries {
    prometheus::Counter* seconds = nullptr;
    prometheus::Counter* bytes = nullptr;
    prometheus::Counter* count = nullptr;
  };
  BucketSeries bucket_series_[kBucketLabels];
  prometheus::Gauge* unused_;
  prometheus::Gauge* globally_unused_;
  prometheus::Gauge* loss_;
  prometheus::Gauge* step_;
  prometheus::Gauge* generation_;
  prometheus::Gauge* rank_;
  prometheus::Gauge* world_size_;

  mutable absl::Mutex mu_;
  const Outbox* outbox_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace ddp

#endif  // DDP_WORKER_LINK_WORKER_METRICS_H_
