// The Prometheus series: what a status snapshot, an RPC and a step map to,
// and the endpoint's address rules. tests/py/prometheus_test.py scrapes the
// real daemons with a real Prometheus.
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "common/metrics_server.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/rpc_metrics.h"
#include "ddp/v1/worker.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"
#include "tests/test_util.h"
#include "worker/link/outbox.h"
#include "worker/link/worker_metrics.h"

namespace ddp {
namespace {

using Labels = std::vector<prometheus::ClientMetric::Label>;

const prometheus::MetricFamily* Find(const std::vector<prometheus::MetricFamily>& families,
                                     const std::string& name) {
  for (const auto& f : families) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// The metric of `name` with exactly `labels`; fails the test when absent.
prometheus::ClientMetric Metric(const std::vector<prometheus::MetricFamily>& families,
                                const std::string& name, Labels labels = {}) {
  const prometheus::MetricFamily* f = Find(families, name);
  EXPECT_NE(f, nullptr) << name;
  if (f == nullptr) return {};
  for (const auto& m : f->metric) {
    if (m.label == labels) return m;
  }
  ADD_FAILURE() << name << " has no metric with those labels";
  return {};
}

double GaugeValue(const std::vector<prometheus::MetricFamily>& f, const std::string& name,
                  Labels labels = {}) {
  return Metric(f, name, std::move(labels)).gauge.value;
}
double CounterValue(const std::vector<prometheus::MetricFamily>& f, const std::string& name,
                    Labels labels = {}) {
  return Metric(f, name, std::move(labels)).counter.value;
}

v1::GenerationChange Change(double at, uint64_t from, v1::ChangeCause cause) {
  v1::GenerationChange c;
  c.set_at_unix_seconds(at);
  c.set_from_generation(from);
  c.set_to_generation(from + 1);
  c.set_cause(cause);
  return c;
}

TEST(CoordinatorFamilies, RunningJob_MapsSnapshotToGauges) {
  auto status = std::make_shared<v1::JobStatus>();
  status->set_state(v1::JOB_STATE_RUNNING);
  status->set_generation(3);
  status->set_world_size(2);
  status->set_global_step(120);
  status->set_total_steps(640);
  status->set_samples_per_sec(1500.5);
  status->set_loss(0.25);
  status->set_test_accuracy(0.875);
  status->set_queued_jobs(4);
  for (v1::WorkerState s : {v1::WORKER_STATE_TRAINING, v1::WORKER_STATE_TRAINING,
                            v1::WORKER_STATE_LOST, v1::WORKER_STATE_IDLE}) {
    status->add_workers()->set_state(s);
  }
  CoordinatorSample sample;
  sample.status = status;
  sample.store_keys = 7;
  sample.store_bytes = 4096;
  sample.attach_streams = 3;
  ChangeTally tally;
  const auto f = CoordinatorFamilies(sample, tally);

  EXPECT_EQ(GaugeValue(f, "ddp_job_state", {{"state", "running"}}), 1);
  EXPECT_EQ(GaugeValue(f, "ddp_job_state", {{"state", "waiting"}}), 0);
  EXPECT_EQ(GaugeValue(f, "ddp_job_state", {{"state", "queued"}}), 0);
  EXPECT_EQ(GaugeValue(f, "ddp_coordinator_queued_jobs"), 4);
  EXPECT_EQ(GaugeValue(f, "ddp_job_generation"), 3);
  EXPECT_EQ(GaugeValue(f, "ddp_job_world_size"), 2);
  EXPECT_EQ(GaugeValue(f, "ddp_job_global_step"), 120);
  EXPECT_EQ(GaugeValue(f, "ddp_job_total_steps"), 640);
  EXPECT_EQ(GaugeValue(f, "ddp_job_samples_per_second"), 1500.5);
  EXPECT_EQ(GaugeValue(f, "ddp_job_loss"), 0.25);
  EXPECT_EQ(GaugeValue(f, "ddp_job_test_accuracy"), 0.875);
  EXPECT_EQ(GaugeValue(f, "ddp_coordinator_workers", {{"state", "training"}}), 2);
  EXPECT_EQ(GaugeValue(f, "ddp_coordinator_workers", {{"state", "lost"}}), 1);
  EXPECT_EQ(GaugeValue(f, "ddp_coordinator_workers", {{"state", "idle"}}), 1);
  EXPECT_EQ(GaugeValue(f, "ddp_coordinator_workers", {{"state", "done"}}), 0);
  EXPECT_EQ(GaugeValue(f, "ddp_coordinator_store_keys"), 7);
  EXPECT_EQ(GaugeValue(f, "ddp_coordinator_store_bytes"), 4096);
  EXPECT_EQ(GaugeValue(f, "ddp_coordinator_attach_streams"), 3);
  // Every cause has a series from the start, so rate() works on the first change.
  EXPECT_EQ(CounterValue(f, "ddp_job_generation_changes_total", {{"cause", "hung"}}), 0);
  EXPECT_EQ(Find(f, "ddp_job_generation_changes_total")->type, prometheus::MetricType::Counter);
}

TEST(CoordinatorFamilies, ManyJobs_OneSeriesPerJobThatStarted) {
  auto status = std::make_shared<v1::JobStatus>();
  v1::JobSummary* a = status->add_jobs();
  a->set_job_id("a");
  a->set_state(v1::JOB_STATE_RUNNING);
  a->set_workers(2);
  a->set_world_size(2);
  a->set_global_step(40);
  a->set_samples_per_sec(800);
  v1::JobSummary* b = status->add_jobs();
  b->set_job_id("b");
  b->set_state(v1::JOB_STATE_SUCCEEDED);
  b->set_priority(10);
  CoordinatorSample sample;
  sample.status = status;
  ChangeTally tally;
  const auto f = CoordinatorFamilies(sample, tally);
  EXPECT_EQ(GaugeValue(f, "ddp_pool_job_running", {{"job", "a"}}), 1);
  EXPECT_EQ(GaugeValue(f, "ddp_pool_job_running", {{"job", "b"}}), 0);
  EXPECT_EQ(GaugeValue(f, "ddp_pool_job_workers", {{"job", "a"}}), 2);
  EXPECT_EQ(GaugeValue(f, "ddp_pool_job_world_size", {{"job", "a"}}), 2);
  EXPECT_EQ(GaugeValue(f, "ddp_pool_job_global_step", {{"job", "a"}}), 40);
  EXPECT_EQ(GaugeValue(f, "ddp_pool_job_samples_per_second", {{"job", "a"}}), 800);
  EXPECT_EQ(GaugeValue(f, "ddp_pool_job_priority", {{"job", "b"}}), 10);
  EXPECT_EQ(Find(f, "ddp_pool_job_workers")->metric.size(), 2u);
  // Both jobs are nobody's (no owner=): the owner "" holds a's two.
  EXPECT_EQ(GaugeValue(f, "ddp_pool_owner_workers", {{"owner", ""}}), 2);
}

TEST(CoordinatorFamilies, Owners_WorkersTheirJobsHoldTogether) {
  auto status = std::make_shared<v1::JobStatus>();
  for (const auto& [id, owner, workers] :
       {std::tuple{"a", "alice", 2}, std::tuple{"b", "alice", 3}, std::tuple{"c", "bob", 1}}) {
    v1::JobSummary* j = status->add_jobs();
    j->set_job_id(id);
    j->set_owner(owner);
    j->set_workers(workers);
  }
  CoordinatorSample sample;
  sample.status = status;
  ChangeTally tally;
  const auto f = CoordinatorFamilies(sample, tally);
  EXPECT_EQ(GaugeValue(f, "ddp_pool_owner_workers", {{"owner", "alice"}}), 5);
  EXPECT_EQ(GaugeValue(f, "ddp_pool_owner_workers", {{"owner", "bob"}}), 1);
  EXPECT_EQ(Find(f, "ddp_pool_owner_workers")->metric.size(), 2u);
}

TEST(CoordinatorFamilies, Leadership_OnlyForCoordinatorsThatFailOver) {
  CoordinatorSample sample;
  sample.status = std::make_shared<v1::JobStatus>();
  ChangeTally tally;
  EXPECT_EQ(Find(CoordinatorFamilies(sample, tally), "ddp_coordinator_is_leader"), nullptr);
  sample.replicated = true;
  sample.is_leader = true;
  sample.leader_changes = 3;
  const auto f = CoordinatorFamilies(sample, tally);
  EXPECT_EQ(GaugeValue(f, "ddp_coordinator_is_leader"), 1);
  EXPECT_EQ(CounterValue(f, "ddp_coordinator_leader_changes_total"), 3);
  sample.is_leader = false;
  EXPECT_EQ(GaugeValue(CoordinatorFamilies(sample, tally), "ddp_coordinator_is_leader"), 0);
}

TEST(ChangeTally, ListRollsOver_CountsEachChangeOnce) {
  v1::JobStatus status;
  *status.add_generation_changes() = Change(100, 0, v1::CHANGE_CAUSE_START);
  *status.add_generation_changes() = Change(200, 1, v1::CHANGE_CAUSE_LOST);
  ChangeTally tally;
  tally.Observe(status.generation_changes());
  tally.Observe(status.generation_changes());  // the same list again: nothing new
  EXPECT_EQ(tally.counts().at("start"), 1u);
  EXPECT_EQ(tally.counts().at("lost"), 1u);

  // The oldest entry falls off (the list keeps the newest 100); two new ones.
  status.mutable_generation_changes()->DeleteSubrange(0, 1);
  *status.add_generation_changes() = Change(300, 2, v1::CHANGE_CAUSE_JOINED);
  *status.add_generation_changes() = Change(300, 3, v1::CHANGE_CAUSE_LOST);
  tally.Observe(status.generation_changes());
  EXPECT_EQ(tally.counts().at("start"), 1u);
  EXPECT_EQ(tally.counts().at("lost"), 2u);
  EXPECT_EQ(tally.counts().at("joined"), 1u);
}

TEST(CoordinatorMetrics, Collect_ReadsSampleAndTalliesChanges) {
  auto status = std::make_shared<v1::JobStatus>();
  *status->add_generation_changes() = Change(100, 0, v1::CHANGE_CAUSE_START);
  CoordinatorMetrics metrics([status] {
    CoordinatorSample s;
    s.status = status;
    return s;
  });
  EXPECT_EQ(
      CounterValue(metrics.Collect(), "ddp_job_generation_changes_total", {{"cause", "start"}}), 1);
  EXPECT_EQ(
      CounterValue(metrics.Collect(), "ddp_job_generation_changes_total", {{"cause", "start"}}), 1);
}

TEST(RpcMetrics, Handled_CountsByMethodAndCode_TimesByMethod) {
  FakeClock clock;
  prometheus::Registry registry;
  RpcMetrics rpc(&registry, &clock);
  rpc.Started("/ddp.v1.Coordinator/GetStatus");
  rpc.Handled("/ddp.v1.Coordinator/GetStatus", 0, absl::Milliseconds(2));
  rpc.Started("/ddp.v1.Coordinator/GetStatus");
  rpc.Handled("/ddp.v1.Coordinator/GetStatus", 7, absl::Milliseconds(3));
  rpc.Handled("/ddp.v1.Coordinator/GetStatus", 0, absl::Milliseconds(4));
  const auto f = registry.Collect();
  const Labels method = {{"method", "ddp.v1.Coordinator/GetStatus"}};
  EXPECT_EQ(CounterValue(f, "ddp_coordinator_rpcs_started_total", method), 2);
  EXPECT_EQ(CounterValue(f, "ddp_coordinator_rpcs_handled_total",
                         {{"code", "OK"}, {"method", "ddp.v1.Coordinator/GetStatus"}}),
            2);
  EXPECT_EQ(
      CounterValue(f, "ddp_coordinator_rpcs_handled_total",
                   {{"code", "PERMISSION_DENIED"}, {"method", "ddp.v1.Coordinator/GetStatus"}}),
      1);
  const auto h = Metric(f, "ddp_coordinator_rpc_duration_seconds", method).histogram;
  EXPECT_EQ(h.sample_count, 3u);
  EXPECT_NEAR(h.sample_sum, 0.009, 1e-9);
}

TEST(RpcMetrics, MethodLabel_PastLimit_IsOther) {
  FakeClock clock;
  prometheus::Registry registry;
  RpcMetrics rpc(&registry, &clock);
  for (size_t i = 0; i < RpcMetrics::kMaxMethods; ++i) {
    EXPECT_EQ(rpc.MethodLabel("/s/m" + std::to_string(i)), "s/m" + std::to_string(i));
  }
  EXPECT_EQ(rpc.MethodLabel("/s/one-too-many"), "other");
  EXPECT_EQ(rpc.MethodLabel("/s/m0"), "s/m0");
}

TEST(WorkerMetrics, OnStep_ObservesStepPartsAndReduction) {
  WorkerMetrics metrics;
  v1::StepReport report;
  report.set_step(5);
  report.set_generation(2);
  report.set_world_size(4);
  report.set_samples(32);
  report.set_loss(0.5);
  report.set_step_seconds(0.02);
  report.mutable_timings()->set_data_ms(1);
  report.mutable_timings()->set_forward_ms(5);
  report.mutable_timings()->set_backward_ms(8);
  report.mutable_timings()->set_allreduce_wait_ms(3);
  report.mutable_timings()->set_optimizer_ms(2);
  report.mutable_reduction()->set_allreduce_ms(6);
  report.mutable_reduction()->set_bytes(1000);
  report.mutable_reduction()->set_buckets_reduced(2);
  report.mutable_reduction()->set_buckets_total(2);
  report.mutable_reduction()->set_unused_parameters(1);
  metrics.OnStep(report, 3);
  metrics.OnStep(report, 3);
  const auto f = metrics.Collect();
  EXPECT_EQ(CounterValue(f, "ddp_worker_steps_total"), 2);
  EXPECT_EQ(CounterValue(f, "ddp_worker_samples_total"), 64);
  const auto step = Metric(f, "ddp_worker_step_seconds").histogram;
  EXPECT_EQ(step.sample_count, 2u);
  EXPECT_NEAR(step.sample_sum, 0.04, 1e-12);
  const auto backward =
      Metric(f, "ddp_worker_step_phase_seconds", {{"phase", "backward"}}).histogram;
  EXPECT_NEAR(backward.sample_sum, 0.016, 1e-12);
  EXPECT_NEAR(Metric(f, "ddp_worker_step_phase_seconds", {{"phase", "allreduce_wait"}})
                  .histogram.sample_sum,
              0.006, 1e-12);
  EXPECT_NEAR(Metric(f, "ddp_worker_allreduce_seconds").histogram.sample_sum, 0.012, 1e-12);
  EXPECT_EQ(CounterValue(f, "ddp_worker_allreduce_bytes_total"), 2000);
  EXPECT_EQ(CounterValue(f, "ddp_worker_allreduce_buckets_total"), 4);
  EXPECT_EQ(GaugeValue(f, "ddp_worker_unused_parameters"), 1);
  EXPECT_EQ(GaugeValue(f, "ddp_worker_rank"), 3);
  EXPECT_EQ(GaugeValue(f, "ddp_worker_world_size"), 4);
  EXPECT_EQ(GaugeValue(f, "ddp_worker_step"), 5);
  // No outbox watched: the queue reads as empty.
  EXPECT_EQ(GaugeValue(f, "ddp_worker_report_queue_depth"), 0);
}

TEST(WorkerMetrics, OnStep_PerBucketSeriesByLaunchOrder_LaterBucketsTogether) {
  WorkerMetrics metrics;
  v1::StepReport report;
  for (int b = 0; b < 40; ++b) {
    v1::BucketReduction* bucket = report.mutable_reduction()->add_buckets();
    bucket->set_allreduce_ms(b + 1);
    bucket->set_bytes(100);
  }
  metrics.OnStep(report, 0);
  metrics.OnStep(report, 0);
  const auto f = metrics.Collect();
  EXPECT_NEAR(CounterValue(f, "ddp_worker_bucket_allreduce_seconds_total", {{"bucket", "0"}}),
              0.002, 1e-12);
  EXPECT_NEAR(CounterValue(f, "ddp_worker_bucket_allreduce_seconds_total", {{"bucket", "31"}}),
              0.064, 1e-12);
  EXPECT_EQ(CounterValue(f, "ddp_worker_bucket_allreduces_total", {{"bucket", "31"}}), 2);
  // Buckets 32..39 share one label: 8 buckets x 2 steps.
  EXPECT_EQ(CounterValue(f, "ddp_worker_bucket_allreduces_total", {{"bucket", "32+"}}), 16);
  EXPECT_EQ(CounterValue(f, "ddp_worker_bucket_allreduce_bytes_total", {{"bucket", "32+"}}), 1600);
}

TEST(WorkerMetrics, WatchReports_ShowsQueueDepthAndDrops) {
  FakeClock clock;
  Outbox outbox(&clock, Outbox::Options{2, absl::Milliseconds(100)});
  WorkerMetrics metrics;
  metrics.WatchReports(&outbox);
  for (int i = 0; i < 3; ++i) outbox.PushReport(v1::StepReport());
  auto f = metrics.Collect();
  EXPECT_EQ(GaugeValue(f, "ddp_worker_report_queue_depth"), 2);
  EXPECT_EQ(CounterValue(f, "ddp_worker_reports_dropped_total"), 1);
  metrics.WatchReports(nullptr);
  f = metrics.Collect();
  EXPECT_EQ(GaugeValue(f, "ddp_worker_report_queue_depth"), 0);
}

}  // namespace
}  // namespace ddp
