// The Prometheus series: what a status snapshot, an RPC and a step map to,
// and the endpoint's address rules. tests/py/prometheus_test.py scrapes the
// real daemons with a real Prometheus.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
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
#include "worker/outbox.h"
#include "worker/worker_metrics.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;
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

TEST(CheckMetricsListen, Loopback_Ok) {
  EXPECT_THAT(CheckMetricsListen("--metrics_listen", "127.0.0.1:9400", false), IsOk());
  EXPECT_THAT(CheckMetricsListen("--metrics_listen", "localhost:0", false), IsOk());
}

TEST(CheckMetricsListen, OffLoopbackWithoutInsecure_FailsWithFailedPrecondition) {
  EXPECT_THAT(CheckMetricsListen("--metrics_listen", "0.0.0.0:9400", false),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--insecure")));
  EXPECT_THAT(CheckMetricsListen("--metrics_listen", "0.0.0.0:9400", true), IsOk());
}

TEST(CheckMetricsListen, Malformed_FailsWithInvalidArgument) {
  EXPECT_THAT(CheckMetricsListen("--metrics_listen", "nonsense", true),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--metrics_listen")));
}

// GET /metrics over a plain socket; the body, or "" on failure.
std::string Scrape(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
    }
  }
  ::close(fd);
  return out;
}

TEST(MetricsServer, Start_ServesRegisteredSeries_SecondOnSamePortUnavailable) {
  auto server = MetricsServer::Start("--metrics_listen", "127.0.0.1:0", false);
  ASSERT_THAT(server, IsOk());
  ASSERT_GT((*server)->port(), 0);
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter()
      .Name("ddp_test_total")
      .Help("t")
      .Register(*registry)
      .Add({})
      .Increment(3);
  (*server)->Register(registry);
  EXPECT_THAT(Scrape((*server)->port()), HasSubstr("ddp_test_total 3"));

  const std::string taken = "127.0.0.1:" + std::to_string((*server)->port());
  EXPECT_THAT(MetricsServer::Start("--metrics_listen", taken, false),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(taken)));
  // The default address taken: metrics off, the daemon runs.
  auto optional = StartMetricsServer(taken, false, /*required=*/false);
  ASSERT_THAT(optional, IsOk());
  EXPECT_EQ(*optional, nullptr);
  EXPECT_THAT(StartMetricsServer(taken, false, /*required=*/true),
              StatusIs(absl::StatusCode::kUnavailable));
  auto off = StartMetricsServer("", false, true);
  ASSERT_THAT(off, IsOk());
  EXPECT_EQ(*off, nullptr);
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
