#include "coordinator/coordinator_metrics.h"

#include <map>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace ddp {
namespace {

std::string EnumLabel(const std::string& name, absl::string_view prefix) {
  absl::string_view rest = name;
  absl::ConsumePrefix(&rest, prefix);
  return absl::AsciiStrToLower(rest);
}

prometheus::MetricFamily Family(std::string name, std::string help, prometheus::MetricType type) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  return family;
}

void AddValue(prometheus::MetricFamily* family, double value,
              std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::ClientMetric metric;
  metric.label = std::move(labels);
  if (family->type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family->metric.push_back(std::move(metric));
}

prometheus::MetricFamily Gauge(std::string name, std::string help, double value) {
  prometheus::MetricFamily family =
      Family(std::move(name), std::move(help), prometheus::MetricType::Gauge);
  AddValue(&family, value);
  return family;
}

}  // namespace

std::string JobStateLabel(v1::JobState state) {
  return EnumLabel(v1::JobState_Name(state), "JOB_STATE_");
}
std::string WorkerStateLabel(v1::WorkerState state) {
  return EnumLabel(v1::WorkerState_Name(state), "WORKER_STATE_");
}
std::string ChangeCauseLabel(v1::ChangeCause cause) {
  return EnumLabel(v1::ChangeCause_Name(cause), "CHANGE_CAUSE_");
}

void ChangeTally::Observe(const google::protobuf::RepeatedPtrField<v1::GenerationChange>& changes) {
  for (const v1::GenerationChange& change : changes) {
    const bool newer =
        change.at_unix_seconds() > last_at_ ||
        (change.at_unix_seconds() == last_at_ && change.from_generation() > last_from_);
    if (!newer) continue;
    ++counts_[ChangeCauseLabel(change.cause())];
    last_at_ = change.at_unix_seconds();
    last_from_ = change.from_generation();
  }
}

std::vector<prometheus::MetricFamily> CoordinatorFamilies(const CoordinatorSample& sample,
                                                          const ChangeTally& tally) {
  using prometheus::MetricType;
  const v1::JobStatus& s = *sample.status;
  std::vector<prometheus::MetricFamily> out;

  // One series per state, so a dashboard can show the state without
  // knowing the enum's numbers.
  prometheus::MetricFamily state =
      Family("ddp_job_state", "1 for the job's current state, 0 for the others", MetricType::Gauge);
  for (int i = v1::JobState_MIN; i <= v1::JobState_MAX; ++i) {
    if (!v1::JobState_IsValid(i)) continue;
    const auto value = static_cast<v1::JobState>(i);
    AddValue(&state, s.state() == value ? 1 : 0, {{"state", JobStateLabel(value)}});
  }
  out.push_back(std::move(state));
  out.push_back(Gauge("ddp_job_generation", "latest generation (0 before the first forms)",
                      static_cast<double>(s.generation())));
  out.push_back(Gauge("ddp_job_world_size", "members of the latest generation", s.world_size()));
  out.push_back(Gauge("ddp_job_global_step", "optimizer steps every member has completed",
                      static_cast<double>(s.global_step())));
  out.push_back(Gauge("ddp_job_total_steps", "optimizer steps the whole job takes",
                      static_cast<double>(s.total_steps())));
  out.push_back(Gauge("ddp_job_epoch", "zero-based epoch of the slowest member",
                      static_cast<double>(s.epoch())));
  out.push_back(Gauge("ddp_job_samples_per_second", "sum over members of their samples per second",
                      s.samples_per_sec()));
  out.push_back(
      Gauge("ddp_job_loss", "mean over members of their last reported training loss", s.loss()));
  out.push_back(Gauge("ddp_job_test_accuracy",
                      "test accuracy after the last evaluated epoch, 0 to 1 (0 before any)",
                      s.test_accuracy()));
  out.push_back(Gauge("ddp_job_faults", "generations lost to faults so far (of the fault budget)",
                      s.faults()));
  out.push_back(
      Gauge("ddp_job_elapsed_seconds", "seconds since the job was submitted", s.elapsed_seconds()));
  out.push_back(Gauge("ddp_coordinator_queued_jobs", "jobs waiting for workers (JOB_STATE_QUEUED)",
                      s.queued_jobs()));
  // Every job that started, by its name: those running and the last few to
  // end (JobStatus.jobs, bounded by the coordinator), so the series a
  // client can make it keep are bounded too.
  struct PerJob {
    const char* name;
    const char* help;
    double (*value)(const v1::JobSummary&);
  };
  static constexpr PerJob kPerJob[] = {
      {"ddp_pool_job_running", "1 while the job runs (waits, trains or recovers), 0 once it ended",
       [](const v1::JobSummary& j) {
         return j.state() == v1::JOB_STATE_WAITING || j.state() == v1::JOB_STATE_RUNNING ||
                        j.state() == v1::JOB_STATE_RECOVERING
                    ? 1.0
                    : 0.0;
       }},
      {"ddp_pool_job_workers", "workers the pool gave the job (members and joiners preparing)",
       [](const v1::JobSummary& j) { return static_cast<double>(j.workers()); }},
      {"ddp_pool_job_world_size", "members of the job's generation training now (0 between)",
       [](const v1::JobSummary& j) { return static_cast<double>(j.world_size()); }},
      {"ddp_pool_job_global_step", "optimizer steps every member of the job has completed",
       [](const v1::JobSummary& j) { return static_cast<double>(j.global_step()); }},
      {"ddp_pool_job_samples_per_second", "the job's members' samples per second, summed",
       [](const v1::JobSummary& j) { return j.samples_per_sec(); }},
      {"ddp_pool_job_priority", "the job's priority (higher first)",
       [](const v1::JobSummary& j) { return static_cast<double>(j.priority()); }},
  };
  for (const PerJob& metric : kPerJob) {
    prometheus::MetricFamily family = Family(metric.name, metric.help, MetricType::Gauge);
    for (const v1::JobSummary& job : s.jobs()) {
      AddValue(&family, metric.value(job), {{"job", job.job_id()}});
    }
    out.push_back(std::move(family));
  }
  // What each owner's jobs hold together, against its quota: the owners of
  // the jobs above, so bounded as they are.
  std::map<std::string, double> by_owner;
  for (const v1::JobSummary& job : s.jobs()) by_owner[job.owner()] += job.workers();
  prometheus::MetricFamily owners = Family(
      "ddp_pool_owner_workers",
      "workers the jobs of each owner hold together (its quota caps this)", MetricType::Gauge);
  for (const auto& [owner, workers] : by_owner) AddValue(&owners, workers, {{"owner", owner}});
  out.push_back(std::move(owners));

  prometheus::MetricFamily changes =
      Family("ddp_job_generation_changes_total",
             "generation changes since the coordinator started, by cause", MetricType::Counter);
  for (int i = v1::ChangeCause_MIN; i <= v1::ChangeCause_MAX; ++i) {
    if (!v1::ChangeCause_IsValid(i) || i == v1::CHANGE_CAUSE_UNSPECIFIED) continue;
    const std::string cause = ChangeCauseLabel(static_cast<v1::ChangeCause>(i));
    auto it = tally.counts().find(cause);
    AddValue(&changes, it == tally.counts().end() ? 0 : static_cast<double>(it->second),
             {{"cause", cause}});
  }
  out.push_back(std::move(changes));

  std::map<v1::WorkerState, int> by_state;
  for (const v1::WorkerStatus& w : s.workers()) ++by_state[w.state()];
  prometheus::MetricFamily workers = Family(
      "ddp_coordinator_workers", "workers the coordinator knows, by state", MetricType::Gauge);
  for (int i = v1::WorkerState_MIN; i <= v1::WorkerState_MAX; ++i) {
    if (!v1::WorkerState_IsValid(i) || i == v1::WORKER_STATE_UNSPECIFIED) continue;
    const auto value = static_cast<v1::WorkerState>(i);
    AddValue(&workers, by_state[value], {{"state", WorkerStateLabel(value)}});
  }
  out.push_back(std::move(workers));

  out.push_back(Gauge("ddp_coordinator_attach_streams", "worker streams open, registered or not",
                      static_cast<double>(sample.attach_streams)));
  out.push_back(Gauge("ddp_coordinator_store_keys", "keys in the rendezvous store",
                      static_cast<double>(sample.store_keys)));
  out.push_back(Gauge("ddp_coordinator_store_bytes",
                      "bytes of keys and values in the rendezvous store",
                      static_cast<double>(sample.store_bytes)));
  out.push_back(Gauge("ddp_coordinator_store_waiters", "store gets waiting for their key",
                      static_cast<double>(sample.store_waiters)));
  if (sample.replicated) {
    out.push_back(Gauge("ddp_coordinator_is_leader",
                        "1 while this coordinator leads (its etcd lease holds), else 0",
                        sample.is_leader ? 1 : 0));
    prometheus::MetricFamily changes =
        Family("ddp_coordinator_leader_changes_total",
               "changes of leader this coordinator process saw", MetricType::Counter);
    AddValue(&changes, static_cast<double>(sample.leader_changes));
    out.push_back(std::move(changes));
  }
  return out;
}

std::vector<prometheus::MetricFamily> CoordinatorMetrics::Collect() const {
  const CoordinatorSample sample = sample_();
  absl::MutexLock lock(&mu_);
  tally_.Observe(sample.status->generation_changes());
  return CoordinatorFamilies(sample, tally_);
}

}  // namespace ddp
