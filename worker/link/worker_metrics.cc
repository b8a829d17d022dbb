#include "worker/link/worker_metrics.h"

#include <algorithm>
#include <map>
#include <string>

#include "ddp/v1/worker.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/link/outbox.h"

namespace ddp {
namespace {

// 1 ms to 2 minutes, roughly x2.5 apart: a small CPU model's step is a few
// ms, a large GPU model's seconds.
const prometheus::Histogram::BucketBoundaries& SecondsBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120};
  return *buckets;
}

prometheus::Gauge* AddGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
}

prometheus::Counter* AddCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

prometheus::MetricFamily Single(const std::string& name, const std::string& help,
                                prometheus::MetricType type, double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(metric);
  return family;
}

}  // namespace

WorkerMetrics::WorkerMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  steps_ = AddCounter(r, "ddp_worker_steps_total", "optimizer steps this worker committed");
  samples_ = AddCounter(r, "ddp_worker_samples_total", "samples this worker trained on");
  step_seconds_ = &prometheus::BuildHistogram()
                       .Name("ddp_worker_step_seconds")
                       .Help("wall time of each committed step on this worker")
                       .Register(r)
                       .Add({}, SecondsBuckets());
  auto& phases = prometheus::BuildHistogram()
                     .Name("ddp_worker_step_phase_seconds")
                     .Help(
                         "time of each part of a step: waiting for data, forward, backward, "
                         "waiting for the last all-reduces after backward, optimizer")
                     .Register(r);
  const char* const kPhases[] = {"data", "forward", "backward", "allreduce_wait", "optimizer"};
  for (int i = 0; i < 5; ++i)
    phase_seconds_[i] = &phases.Add({{"phase", kPhases[i]}}, SecondsBuckets());
  allreduce_seconds_ = &prometheus::BuildHistogram()
                            .Name("ddp_worker_allreduce_seconds")
                            .Help(
                                "time the communication thread spent inside all-reduce in "
                                "each step (much of it hidden behind backward)")
                            .Register(r)
                            .Add({}, SecondsBuckets());
  allreduce_bytes_ =
      AddCounter(r, "ddp_worker_allreduce_bytes_total", "gradient bytes this worker all-reduced");
  allreduce_buckets_ =
      AddCounter(r, "ddp_worker_allreduce_buckets_total", "bucket all-reduces completed");
  buckets_ = AddGauge(r, "ddp_worker_buckets", "gradient buckets in the reducer's plan");
  bucket_seconds_family_ = &prometheus::BuildCounter()
                                .Name("ddp_worker_bucket_allreduce_seconds_total")
                                .Help("time inside each bucket's all-reduce, by launch order")
                                .Register(r);
  bucket_bytes_family_ = &prometheus::BuildCounter()
                              .Name("ddp_worker_bucket_allreduce_bytes_total")
                              .Help("bytes of each bucket's all-reduces, by launch order")
                              .Register(r);
  bucket_count_family_ = &prometheus::BuildCounter()
                              .Name("ddp_worker_bucket_allreduces_total")
                              .Help("all-reduces of each bucket, by launch order")
                              .Register(r);
  unused_ = AddGauge(r, "ddp_worker_unused_parameters",
                     "parameters that got no gradient on this worker in its last step");
  globally_unused_ = AddGauge(r, "ddp_worker_globally_unused_parameters",
                              "parameters that got no gradient on any rank in the last step");
  loss_ = AddGauge(r, "ddp_worker_loss", "training loss of this worker's last step");
  step_ = AddGauge(r, "ddp_worker_step", "global optimizer steps completed, as of the last step");
  generation_ = AddGauge(r, "ddp_worker_generation", "generation of the last step");
  rank_ = AddGauge(r, "ddp_worker_rank", "this worker's rank in the generation of the last step");
  world_size_ = AddGauge(r, "ddp_worker_world_size", "ranks in the generation of the last step");
}

WorkerMetrics::~WorkerMetrics() = default;

void WorkerMetrics::OnStep(const v1::StepReport& report, uint32_t rank) {
  steps_->Increment();
  samples_->Increment(static_cast<double>(report.samples()));
  step_seconds_->Observe(report.step_seconds());
  const v1::StepTimings& t = report.timings();
  const double phase_ms[] = {t.data_ms(), t.forward_ms(), t.backward_ms(), t.allreduce_wait_ms(),
                             t.optimizer_ms()};
  for (int i = 0; i < 5; ++i) phase_seconds_[i]->Observe(phase_ms[i] / 1000);
  const v1::ReductionStatus& r = report.reduction();
  allreduce_seconds_->Observe(r.allreduce_ms() / 1000);
  allreduce_bytes_->Increment(static_cast<double>(r.bytes()));
  allreduce_buckets_->Increment(r.buckets_reduced());
  buckets_->Set(r.buckets_total());
  for (int b = 0; b < r.buckets_size(); ++b) {
    const size_t label = std::min<size_t>(b, kBucketLabels - 1);
    BucketSeries& series = bucket_series_[label];
    if (series.seconds == nullptr) {
      const std::map<std::string, std::string> labels = {
          {"bucket",
           label + 1 < kBucketLabels ? std::to_string(label) : std::to_string(label) + "+"}};
      series.seconds = &bucket_seconds_family_->Add(labels);
      series.bytes = &bucket_bytes_family_->Add(labels);
      series.count = &bucket_count_family_->Add(labels);
    }
    series.seconds->Increment(r.buckets(b).allreduce_ms() / 1000);
    series.bytes->Increment(static_cast<double>(r.buckets(b).bytes()));
    series.count->Increment();
  }
  unused_->Set(r.unused_parameters());
  globally_unused_->Set(r.globally_unused_parameters());
  loss_->Set(report.loss());
  step_->Set(static_cast<double>(report.step()));
  generation_->Set(static_cast<double>(report.generation()));
  rank_->Set(rank);
  world_size_->Set(report.world_size());
}

void WorkerMetrics::WatchReports(const Outbox* outbox) {
  absl::MutexLock lock(&mu_);
  outbox_ = outbox;
}

std::vector<prometheus::MetricFamily> WorkerMetrics::Collect() const {
  std::vector<prometheus::MetricFamily> out = registry_->Collect();
  uint64_t queued = 0;
  uint64_t dropped = 0;
  {
    absl::MutexLock lock(&mu_);
    if (outbox_ != nullptr) {
      queued = outbox_->queued_reports();
      dropped = outbox_->dropped_total();
    }
  }
  out.push_back(Single("ddp_worker_report_queue_depth",
                       "step reports waiting to be sent to the coordinator",
                       prometheus::MetricType::Gauge, static_cast<double>(queued)));
  out.push_back(Single("ddp_worker_reports_dropped_total",
                       "step reports dropped because the queue was full (coordinator slow or away)",
                       prometheus::MetricType::Counter, static_cast<double>(dropped)));
  return out;
}

}  // namespace ddp
