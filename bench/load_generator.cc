// Speaks the real protocol to a coordinator as N simulated workers, over the
// real network stack: each registers on its own Attach stream, sends
// heartbeats, does rendezvous store traffic when assigned, and sends step
// reports at a steady rate; meanwhile an operator thread calls GetStatus.
// Prints one JSON object with what it measured.
//
//   ddp_load_generator --coordinator 127.0.0.1:29400 --workers 1000
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/coordinator_targets.h"
#include "common/job_spec.h"
#include "common/process.h"
#include "common/version.h"
#include "ddp/v1/coordinator.grpc.pb.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:29400",
          "the coordinator's HOST:PORT, or a comma list of several (the leader is found once, "
          "at the start)");
ABSL_FLAG(int32_t, workers, 100, "simulated workers");
ABSL_FLAG(int32_t, streams_per_channel, 100, "Attach streams sharing one HTTP/2 connection");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(1), "between heartbeats");
ABSL_FLAG(double, steps_per_second, 10, "steps each worker reports per second");
ABSL_FLAG(absl::Duration, report_batch, absl::Milliseconds(100),
          "reports are batched over this long, as a real worker does");
ABSL_FLAG(absl::Duration, loaded, absl::Seconds(10), "how long to hold the full load");
ABSL_FLAG(absl::Duration, status_every, absl::Milliseconds(20), "between GetStatus calls");

namespace ddp {
namespace {

using Stub = v1::Coordinator::Stub;

std::vector<double> Sorted(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v;
}
double Pct(const std::vector<double>& sorted, double p) {
  return sorted.empty() ? 0 : sorted[static_cast<size_t>(p * (sorted.size() - 1))];
}

class SimWorker final : public grpc::ClientBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
 public:
  SimWorker(Stub* stub, int index) : stub_(stub), index_(index) {
    stub->async()->Attach(&context_, this);
    v1::WorkerMessage hello;
    auto* r = hello.mutable_register_();
    r->set_host(absl::StrCat("sim-host-", index / 8));
    r->set_device(absl::StrCat("cpu:", index % 8));
    r->set_version(kVersion);
    r->set_pid(100000 + index);
    r->mutable_capabilities()->add_backends("gloo");
    Enqueue(std::move(hello));
    StartRead(&in_);
    StartCall();
  }

  void Enqueue(v1::WorkerMessage m) {
    bool start = false;
    {
      absl::MutexLock lock(&mu_);
      if (done_) return;
      queue_.push_back(std::move(m));
      if (!writing_) {
        writing_ = true;
        out_ = std::move(queue_.front());
        queue_.pop_front();
        start = true;
      }
    }
    if (start) StartWrite(&out_);
  }

  void OnWriteDone(bool ok) override {
    bool start = false;
    {
      absl::MutexLock lock(&mu_);
      if (ok) ++writes_;
      if (!ok || queue_.empty()) {
        writing_ = false;
      } else {
        out_ = std::move(queue_.front());
        queue_.pop_front();
        start = true;
      }
    }
    if (start) StartWrite(&out_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    const absl::Time now = absl::Now();
    if (in_.has_registered()) {
      registered_at_ = now;
      registered_ = true;
    } else if (in_.has_prepare()) {
      // As a ddp-worker whose state builds in no time: it holds it.
      v1::WorkerMessage prepared;
      auto* state = prepared.mutable_state();
      state->set_state(v1::WORKER_STATE_IDLE);
      state->set_detail("prepared");
      state->mutable_held()->set_job_id(in_.prepare().job_id());
      state->mutable_held()->set_spec_digest(SpecDigest(in_.prepare().spec()));
      Enqueue(std::move(prepared));
    } else if (in_.has_assignment()) {
      assignment_ = in_.assignment();
      assigned_at_ = now;
      assigned_ = true;
    } else if (in_.has_rejected()) {
      ++rejected_;
    }
    StartRead(&in_);
  }

  void OnDone(const grpc::Status& s) override {
    absl::MutexLock lock(&mu_);
    done_ = true;
    status_ = s;
  }

  void Finish() { context_.TryCancel(); }

  // Rendezvous as a ring neighbour would: publish an address (phase 0),
  // then read the previous rank's and say it is training (phase 1).
  void Rendezvous(int phase) {
    const v1::Assignment& a = assignment_;
    if (phase == 1) return ReadNeighbour();
    grpc::ClientContext set_ctx;
    v1::StoreSetRequest set;
    set.set_job_id(a.job_id());
    set.set_generation(a.generation());
    set.set_key(absl::StrCat("addr/", a.rank()));
    set.set_value(absl::StrCat("sim-host:", 40000 + index_));
    v1::StoreSetResponse set_reply;
    store_ok_ &= stub_->StoreSet(&set_ctx, set, &set_reply).ok();
  }

  void ReadNeighbour() {
    const v1::Assignment& a = assignment_;
    grpc::ClientContext get_ctx;
    get_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::StoreGetRequest get;
    get.set_job_id(a.job_id());
    get.set_generation(a.generation());
    get.set_key(absl::StrCat("addr/", (a.rank() + a.world_size() - 1) % a.world_size()));
    get.set_timeout_seconds(50);
    v1::StoreGetResponse get_reply;
    store_ok_ &= stub_->StoreGet(&get_ctx, get, &get_reply).ok();
    v1::WorkerMessage state;
    state.mutable_state()->set_generation(a.generation());
    state.mutable_state()->set_state(v1::WORKER_STATE_TRAINING);
    Enqueue(std::move(state));
  }

  void Heartbeat() {
    v1::WorkerMessage hb;
    hb.mutable_heartbeat()->set_generation(assigned_ ? assignment_.generation() : 0);
    hb.mutable_heartbeat()->set_step(step_);
    Enqueue(std::move(hb));
  }

  void Report(int steps, double seconds_each) {
    v1::WorkerMessage m;
    auto* batch = m.mutable_reports();
    for (int i = 0; i < steps; ++i) {
      v1::StepReport* r = batch->add_reports();
      r->set_generation(assignment_.generation());
      r->set_step(++step_);
      r->set_steps_per_epoch(1000000);
      r->set_loss(2.3 / (1 + 0.001 * step_));
      r->set_samples(64);
      r->set_step_seconds(seconds_each);
      r->mutable_reduction()->set_buckets_reduced(1);
      r->mutable_reduction()->set_buckets_total(1);
      r->mutable_reduction()->set_bytes(940000);
    }
    Enqueue(std::move(m));
  }

  std::atomic<bool> registered_{false}, assigned_{false};
  absl::Time registered_at_, assigned_at_;
  v1::Assignment assignment_;
  std::atomic<int> rejected_{0};
  bool store_ok_ = true;
  uint64_t step_ = 0;

  uint64_t writes() {
    absl::MutexLock lock(&mu_);
    return writes_;
  }
  bool failed() {
    absl::MutexLock lock(&mu_);
    return done_ && !status_.ok() && status_.error_code() != grpc::StatusCode::CANCELLED;
  }

 private:
  Stub* stub_;
  const int index_;
  grpc::ClientContext context_;
  v1::CoordinatorMessage in_;
  absl::Mutex mu_;
  std::deque<v1::WorkerMessage> queue_ ABSL_GUARDED_BY(mu_);
  v1::WorkerMessage out_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t writes_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

// The coordinator of `list` that answers as the leader (asked with
// GetStatus), or the last one tried: its error then shows at the submit.
std::string FindLeader(const std::string& list) {
  CoordinatorTargets targets(list);
  std::string target = targets.current();
  const size_t tries = 2 * targets.addresses().size() + kMaxLeaderHops;
  for (size_t i = 0; i < tries; ++i) {
    auto stub =
        v1::Coordinator::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::JobStatus status;
    const grpc::Status s = stub->GetStatus(&context, v1::GetStatusRequest(), &status);
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE) return target;
    target = targets.OnFailure(target, s, context).target;
  }
  return target;
}

int Run() {
  const int n = absl::GetFlag(FLAGS_workers);
  if (auto list = ParseCoordinatorList(absl::GetFlag(FLAGS_coordinator)); !list.ok()) {
    std::fprintf(stderr, "--coordinator: %s\n", std::string(list.status().message()).c_str());
    return 2;
  }
  const std::string target = FindLeader(absl::GetFlag(FLAGS_coordinator));
  std::vector<std::unique_ptr<Stub>> stubs;
  for (int c = 0; c * absl::GetFlag(FLAGS_streams_per_channel) < n; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("ddp.load.channel", c);  // a connection of its own
    stubs.push_back(v1::Coordinator::NewStub(
        grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args)));
  }
  auto operator_stub =
      v1::Coordinator::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));

  // Submit the job all of them will form one generation for.
  {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest request;
    v1::JobSpec* spec = request.mutable_spec();
    spec->set_name("load");
    spec->mutable_model()->set_kind("mlp");
    spec->mutable_dataset()->set_kind("synthetic");
    spec->set_backend("gloo");
    spec->set_min_workers(n);
    spec->set_max_workers(n);
    spec->set_epochs(1000);
    v1::SubmitJobResponse response;
    grpc::Status s = operator_stub->SubmitJob(&ctx, request, &response);
    if (!s.ok()) {
      std::fprintf(stderr, "SubmitJob: %s\n", s.error_message().c_str());
      return 1;
    }
  }

  const absl::Time start = absl::Now();
  std::vector<std::unique_ptr<SimWorker>> workers;
  for (int i = 0; i < n; ++i) {
    workers.push_back(
        std::make_unique<SimWorker>(stubs[i / absl::GetFlag(FLAGS_streams_per_channel)].get(), i));
  }
  // Heartbeats from the start, as real workers send them.
  std::atomic<bool> stop_heartbeats{false};
  std::atomic<uint64_t> heartbeats{0};
  std::atomic<bool> count_heartbeats{false};
  std::thread heartbeat_thread([&] {
    const absl::Duration every = absl::GetFlag(FLAGS_heartbeat_interval);
    absl::Time next = absl::Now() + every;
    while (!stop_heartbeats) {
      absl::SleepFor(next - absl::Now());
      next += every;
      for (auto& w : workers) {
        if (!w->registered_) continue;
        w->Heartbeat();
        if (count_heartbeats) ++heartbeats;
      }
    }
  });
  auto all = [&](auto pred) {
    return std::all_of(workers.begin(), workers.end(), [&](auto& w) { return pred(*w); });
  };
  const absl::Time deadline = start + absl::Seconds(120);
  while (!all([](SimWorker& w) { return w.assigned_.load(); }) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  absl::Time last_registered = absl::InfinitePast(), last_assigned = absl::InfinitePast();
  for (auto& w : workers) {
    if (!w->assigned_) {
      std::fprintf(stderr, "not every worker was assigned within 120 s\n");
      std::_Exit(1);
    }
    last_registered = std::max(last_registered, w->registered_at_);
    last_assigned = std::max(last_assigned, w->assigned_at_);
  }

  // Rendezvous store traffic, 16 threads' worth of concurrent clients.
  const absl::Time rendezvous_start = absl::Now();
  {
    for (int phase = 0; phase < 2; ++phase) {
      std::vector<std::thread> threads;
      for (int t = 0; t < 16; ++t) {
        threads.emplace_back([&, t, phase] {
          for (int i = t; i < n; i += 16) workers[i]->Rendezvous(phase);
        });
      }
      for (auto& t : threads) t.join();
    }
  }
  const double rendezvous_s = absl::ToDoubleSeconds(absl::Now() - rendezvous_start);

  // The loaded phase: heartbeats, reports, and an operator polling status.
  std::atomic<bool> stop{false};
  std::vector<double> status_ms;
  std::thread operator_thread([&] {
    while (!stop) {
      grpc::ClientContext ctx;
      v1::GetStatusRequest request;
      v1::JobStatus status;
      const absl::Time t0 = absl::Now();
      if (operator_stub->GetStatus(&ctx, request, &status).ok()) {
        status_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
      }
      absl::SleepFor(absl::GetFlag(FLAGS_status_every));
    }
  });
  const absl::Duration batch_every = absl::GetFlag(FLAGS_report_batch);
  const int steps_per_batch = std::max(1, static_cast<int>(absl::GetFlag(FLAGS_steps_per_second) *
                                                           absl::ToDoubleSeconds(batch_every)));
  const absl::Time load_start = absl::Now();
  const absl::Time load_end = load_start + absl::GetFlag(FLAGS_loaded);
  count_heartbeats = true;
  uint64_t reports = 0;
  absl::Time next_batch = load_start;
  while (absl::Now() < load_end) {
    for (auto& w : workers) {
      w->Report(steps_per_batch, 1.0 / absl::GetFlag(FLAGS_steps_per_second));
    }
    reports += static_cast<uint64_t>(n) * steps_per_batch;
    next_batch += batch_every;
    absl::SleepFor(next_batch - absl::Now());
  }
  const double load_s = absl::ToDoubleSeconds(absl::Now() - load_start);
  count_heartbeats = false;
  stop = true;
  operator_thread.join();

  // Did the coordinator keep every worker?
  grpc::ClientContext ctx;
  v1::GetStatusRequest request;
  v1::JobStatus final_status;
  operator_stub->GetStatus(&ctx, request, &final_status);
  // Every worker, through ListWorkers' pages (GetStatus lists only some).
  int lost = 0, stale = 0, listed = 0;
  v1::ListWorkersRequest page_request;
  page_request.set_page_size(1000);
  for (int pages = 0; pages < 100; ++pages) {
    grpc::ClientContext page_ctx;
    v1::ListWorkersResponse page;
    if (!operator_stub->ListWorkers(&page_ctx, page_request, &page).ok()) break;
    for (const auto& w : page.workers()) {
      lost += w.state() == v1::WORKER_STATE_LOST;
      stale += static_cast<int>(w.stale_messages());
      ++listed;
    }
    if (page.next_page_token().empty()) break;
    page_request.set_page_token(page.next_page_token());
  }
  int rejected = 0, failed = 0;
  bool store_ok = true;
  for (auto& w : workers) {
    rejected += w->rejected_;
    failed += w->failed();
    store_ok &= w->store_ok_;
  }
  const auto sorted = Sorted(status_ms);
  std::printf(
      "{\"workers\": %d, \"register_to_all_assigned_s\": %.4f, "
      "\"first_connect_to_all_assigned_s\": "
      "%.3f, \"rendezvous_s\": %.3f, \"store_ok\": %s, \"heartbeats_per_s\": %.0f, "
      "\"reports_per_s\": %.0f, \"job_state\": \"%s\", \"global_step\": %llu, \"attached\": %d, "
      "\"lost\": %d, \"stale\": %d, \"rejected\": %d, \"failed_streams\": %d, "
      "\"get_status_calls\": %zu, \"get_status_p50_ms\": %.2f, \"get_status_p99_ms\": %.2f, "
      "\"get_status_max_ms\": %.2f, \"get_status_bytes\": %zu, \"summary_total\": %u, "
      "\"listed_by_pages\": %d}\n",
      n, absl::ToDoubleSeconds(last_assigned - last_registered),
      absl::ToDoubleSeconds(last_assigned - start), rendezvous_s, store_ok ? "true" : "false",
      heartbeats.load() / load_s, reports / load_s, v1::JobState_Name(final_status.state()).c_str(),
      static_cast<unsigned long long>(final_status.global_step()), final_status.attached_workers(),
      lost, stale, rejected, failed, sorted.size(), Pct(sorted, 0.5), Pct(sorted, 0.99),
      sorted.empty() ? 0 : sorted.back(), final_status.ByteSizeLong(),
      final_status.summary().total(), listed);
  std::fflush(stdout);
  stop_heartbeats = true;
  heartbeat_thread.join();
  for (auto& w : workers) w->Finish();
  absl::SleepFor(absl::Milliseconds(500));
  std::_Exit(0);  // streams are cancelled; no orderly teardown needed
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  ddp::CatchTerminationSignals();
  ddp::ParseFlagsOrExit(argc, argv, "ddp_load_generator: simulated workers against a coordinator");
  return ddp::Run();
}
