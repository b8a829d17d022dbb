// The coordinator core without a network, shared by its tests: a fake clock,
// channels that record what the coordinator sends, and workers that say
// what a test tells them to.
#ifndef DDP_TESTS_UNIT_COORDINATOR_FIXTURE_H_
#define DDP_TESTS_UNIT_COORDINATOR_FIXTURE_H_

#include <stdlib.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "coordinator/coordinator.h"
#include "coordinator/file_state_store.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {

// Records what the coordinator sends. Like a ddp-worker, it answers a
// Prepare with the fresh state it built (an IDLE holding step 0 of
// generation 0), at once, unless a test prepares by hand (auto_prepare).
class RecordingChannel final : public WorkerChannel {
 public:
  void Send(const v1::CoordinatorMessage& message) override {
    std::optional<Coordinator::Session> answer_now;
    {
      absl::MutexLock lock(&mu_);
      messages_.push_back(message);
      if (!message.has_prepare() || !auto_prepare_) return;
      if (!session_) {
        unanswered_.push_back(message.prepare());  // answered once bound
        return;
      }
      answer_now = session_;
    }
    Answer(*answer_now, message.prepare());
  }
  // The stream's session on `core`, once Attach returned it.
  void Bind(Coordinator* core, const Coordinator::Session& session) {
    std::vector<v1::Prepare> pending;
    {
      absl::MutexLock lock(&mu_);
      core_ = core;
      session_ = session;
      pending.swap(unanswered_);
    }
    for (const v1::Prepare& p : pending) Answer(session, p);
  }
  void set_auto_prepare(bool on) {
    absl::MutexLock lock(&mu_);
    auto_prepare_ = on;
  }
  // The state a worker holds once it prepared `prepare`.
  static v1::HeldState Fresh(const v1::Prepare& prepare) {
    v1::HeldState held;
    held.set_job_id(prepare.job_id());
    held.set_spec_digest(SpecDigest(prepare.spec()));
    return held;
  }
  void Close(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    closed_ = status;
  }
  // Messages of one kind received so far.
  std::vector<v1::CoordinatorMessage> Of(v1::CoordinatorMessage::KindCase kind) {
    absl::MutexLock lock(&mu_);
    std::vector<v1::CoordinatorMessage> out;
    for (const auto& m : messages_) {
      if (m.kind_case() == kind) out.push_back(m);
    }
    return out;
  }
  std::optional<absl::Status> closed() {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  void Answer(const Coordinator::Session& session, const v1::Prepare& prepare) {
    Coordinator* core;
    {
      absl::MutexLock lock(&mu_);
      core = core_;
    }
    v1::WorkerMessage m;
    m.mutable_state()->set_state(v1::WORKER_STATE_IDLE);
    m.mutable_state()->set_detail("prepared");
    *m.mutable_state()->mutable_held() = Fresh(prepare);
    core->OnMessage(session, m);
  }

  absl::Mutex mu_;
  std::vector<v1::CoordinatorMessage> messages_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> closed_ ABSL_GUARDED_BY(mu_);
  bool auto_prepare_ ABSL_GUARDED_BY(mu_) = true;
  Coordinator* core_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::optional<Coordinator::Session> session_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::Prepare> unanswered_ ABSL_GUARDED_BY(mu_);
};

struct TestWorker {
  Coordinator::Session session;
  std::shared_ptr<RecordingChannel> channel;
  // What it registered with.
  v1::RegisterRequest request;

  const std::string& id() const { return session.worker_id; }
  // The latest assignment, or an empty one.
  v1::Assignment assignment() const {
    auto all = channel->Of(v1::CoordinatorMessage::kAssignment);
    return all.empty() ? v1::Assignment() : all.back().assignment();
  }
  size_t assignments() const { return channel->Of(v1::CoordinatorMessage::kAssignment).size(); }
  std::vector<v1::Abort> aborts() const {
    std::vector<v1::Abort> out;
    for (const auto& m : channel->Of(v1::CoordinatorMessage::kAbort)) out.push_back(m.abort());
    return out;
  }
  size_t rejected() const { return channel->Of(v1::CoordinatorMessage::kRejected).size(); }
};

// Submits `spec` and returns the answer, as `owner`'s. It comes at once
// without a state store and a validate_job that waits; with a store, once
// the job is saved (on the writer's thread).
inline absl::StatusOr<v1::JobSpec> Submit(Coordinator& core, const v1::JobSpec& spec,
                                          const std::string& owner = "") {
  auto answer = std::make_shared<std::optional<absl::StatusOr<v1::JobSpec>>>();
  auto answered = std::make_shared<absl::Notification>();
  core.SubmitJob(
      spec,
      [answer, answered](absl::StatusOr<v1::JobSpec> s) {
        *answer = std::move(s);
        answered->Notify();
      },
      owner);
  EXPECT_TRUE(answered->WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "SubmitJob did not answer";
  return answer->value_or(absl::InternalError("SubmitJob did not answer"));
}

// Cancels job `id` and returns the answer (as Submit's, once saved).
inline absl::Status Cancel(Coordinator& core, const std::string& id, const std::string& reason,
                           const Coordinator::Caller& caller = Coordinator::Caller()) {
  auto answer = std::make_shared<absl::Status>(absl::InternalError("CancelJob did not answer"));
  auto answered = std::make_shared<absl::Notification>();
  core.CancelJob(
      id, reason,
      [answer, answered](absl::Status s) {
        *answer = std::move(s);
        answered->Notify();
      },
      caller);
  EXPECT_TRUE(answered->WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "CancelJob did not answer";
  return *answer;
}

// What a worker says each second while a test lets time pass.
struct Beat {
  TestWorker worker;
  uint64_t generation = 0;
  uint64_t step = 0;
  v1::StepPhase phase = v1::STEP_PHASE_UNSPECIFIED;
  // The phase's own bound (evaluating), in seconds.
  double phase_bound_seconds = 0;
};

class CoordinatorTest : public testing::Test {
 protected:
  CoordinatorTest() { core_ = std::make_unique<Coordinator>(&clock_, TestOptions()); }

  static Coordinator::Options TestOptions() {
    Coordinator::Options options;
    options.snapshot_min_interval = absl::ZeroDuration();  // every Tick publishes
    return options;
  }

  // A registration of a new worker process (a pid of its own).
  v1::RegisterRequest Req(const std::string& host, const std::string& device,
                          const std::string& machine_id = "") {
    v1::RegisterRequest r;
    r.set_host(host);
    r.set_device(device);
    r.set_machine_id(machine_id);
    r.set_version(kVersion);
    r.set_pid(next_pid_++);
    return r;
  }

  // `auto_prepare`: the worker answers a Prepare at once, as a ddp-worker
  // whose state builds in no time.
  absl::StatusOr<TestWorker> AttachWith(const v1::RegisterRequest& r, bool auto_prepare = true) {
    auto channel = std::make_shared<RecordingChannel>();
    channel->set_auto_prepare(auto_prepare);
    auto session = core_->Attach(r, channel);
    if (!session.ok()) return session.status();
    channel->Bind(core_.get(), *session);
    return TestWorker{*session, channel, r};
  }

  absl::StatusOr<TestWorker> Attach(const std::string& host, const std::string& device,
                                    const std::string& machine_id = "") {
    return AttachWith(Req(host, device, machine_id));
  }

  // A job of `min`..`max` workers (max = min when 0) that forms as soon as
  // min_workers are attached.
  static v1::JobSpec Job(uint32_t min, uint32_t max = 0) {
    v1::JobSpec spec;
    spec.set_name("test-job");
    spec.mutable_dataset()->set_kind("synthetic");
    spec.set_backend("gloo");
    spec.set_min_workers(min);
    spec.set_max_workers(max == 0 ? min : max);
    spec.set_settle_seconds(0);
    return spec;
  }

  // State of test-job held by a worker.
  // A state trained in `generation` (the first, unless said otherwise).
  static v1::HeldState Held(uint64_t step, uint64_t epoch = 0, uint64_t cursor = 0,
                            uint64_t generation = 1) {
    v1::HeldState held;
    held.set_job_id("test-job");
    held.set_spec_digest(SpecDigest(WithDefaults(Job(1))));
    held.set_step(step);
    held.set_epoch(epoch);
    held.set_cursor(cursor);
    held.set_generation(generation);
    return held;
  }

  // Three workers attached (out of rank order) and a three-worker job
  // running generation 1.
  std::vector<TestWorker> StartThree() {
    std::vector<TestWorker> workers;
    for (const char* d : {"cpu:2", "cpu:0", "cpu:1"}) workers.push_back(*Attach("h", d));
    EXPECT_THAT(Submit(*core_, Job(3)), IsOk());
    return workers;
  }

  // `n` workers h/cpu:0.. attached, `spec` submitted; returned in rank order.
  std::vector<TestWorker> Start(int n, const v1::JobSpec& spec) {
    std::vector<TestWorker> workers;
    for (int i = 0; i < n; ++i) workers.push_back(*Attach("h", absl::StrCat("cpu:", i)));
    EXPECT_THAT(Submit(*core_, spec), IsOk());
    return workers;
  }

  void Send(const TestWorker& w, const v1::WorkerMessage& m) { core_->OnMessage(w.session, m); }

  void SendState(const TestWorker& w, uint64_t generation, v1::WorkerState state,
                 const std::string& detail = "", absl::StatusCode code = absl::StatusCode::kOk,
                 std::optional<v1::HeldState> held = std::nullopt) {
    v1::WorkerMessage m;
    m.mutable_state()->set_generation(generation);
    m.mutable_state()->set_state(state);
    m.mutable_state()->set_detail(detail);
    m.mutable_state()->set_code(static_cast<int>(code));
    if (held) *m.mutable_state()->mutable_held() = *held;
    Send(w, m);
  }

  // The worker left `generation` holding the job's state at `step`.
  void Leave(const TestWorker& w, uint64_t generation, uint64_t step) {
    SendState(w, generation, v1::WORKER_STATE_IDLE, "left", absl::StatusCode::kOk,
              Held(step, 0, 0, generation));
  }

  void Heartbeat(const TestWorker& w, uint64_t generation, uint64_t step,
                 v1::StepPhase phase = v1::STEP_PHASE_UNSPECIFIED, double phase_bound_seconds = 0) {
    v1::WorkerMessage m;
    m.mutable_heartbeat()->set_generation(generation);
    m.mutable_heartbeat()->set_step(step);
    m.mutable_heartbeat()->set_phase(phase);
    m.mutable_heartbeat()->set_phase_bound_seconds(phase_bound_seconds);
    Send(w, m);
  }

  void SendReport(const TestWorker& w, uint64_t generation, uint64_t step, double loss,
                  const std::string& digest = "", double step_seconds = 0.01) {
    v1::WorkerMessage m;
    v1::StepReport* r = m.mutable_reports()->add_reports();
    r->set_generation(generation);
    r->set_step(step);
    r->set_loss(loss);
    r->set_steps_per_epoch(10);
    r->set_samples(64);
    r->set_step_seconds(step_seconds);
    r->set_parameter_digest(digest);
    Send(w, m);
  }

  // Moves time on by `d` in one-second ticks; each of `beats` sends a
  // heartbeat every second, so only the others go silent.
  void Pass(absl::Duration d, const std::vector<Beat>& beats) {
    for (absl::Duration passed; passed < d; passed += absl::Seconds(1)) {
      clock_.Advance(std::min(absl::Seconds(1), d - passed));
      for (const Beat& b : beats) {
        Heartbeat(b.worker, b.generation, b.step, b.phase, b.phase_bound_seconds);
      }
      core_->Tick();
    }
  }

  v1::JobStatus Status() {
    core_->Tick();
    return *core_->Snapshot();
  }

  static const v1::WorkerStatus* Find(const v1::JobStatus& status, const std::string& id) {
    for (const auto& w : status.workers()) {
      if (w.worker_id() == id) return &w;
    }
    return nullptr;
  }

  static std::vector<std::string> Ids(const google::protobuf::RepeatedPtrField<std::string>& ids) {
    return std::vector<std::string>(ids.begin(), ids.end());
  }

  FakeClock clock_;
  std::unique_ptr<Coordinator> core_;
  int64_t next_pid_ = 1000;
};

// A coordinator with a state directory, which a test can restart.
class PersistTest : public CoordinatorTest {
 protected:
  PersistTest() : dir_(MakeTempDir()) { Reopen(); }
  // The writer thread saves to store_: the coordinator goes first.
  ~PersistTest() override { core_.reset(); }

  static std::string MakeTempDir() {
    char tmpl[] = "/tmp/ddp-coordinator-test-XXXXXX";
    return ::mkdtemp(tmpl);
  }

  // A coordinator process starting over on the same state directory.
  void Reopen() {
    core_.reset();
    store_.reset();  // its lock goes with it, as with a process that exits
    store_ = *FileStateStore::Open(dir_);
    Coordinator::Options options = TestOptions();
    options.state_store = store_.get();
    core_ = std::make_unique<Coordinator>(&clock_, options);
  }

  v1::DurableState Saved() {
    core_->FlushState();
    auto loaded = store_->Load();
    EXPECT_THAT(loaded, IsOk());
    EXPECT_TRUE(loaded->has_value());
    return loaded->value_or(v1::DurableState());
  }

  // The coordinator is killed and started again on its state directory.
  void Restart() {
    const v1::DurableState saved = Saved();
    Reopen();
    core_->Restore(saved);
  }

  const std::string dir_;
  std::unique_ptr<FileStateStore> store_;
};

}  // namespace ddp

#endif  // DDP_TESTS_UNIT_COORDINATOR_FIXTURE_H_
