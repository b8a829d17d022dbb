// The gRPC layer in-process: a real grpc::Server on a loopback port over a
// real Coordinator on the fake clock, called through a real channel. What
// the core decides is tested elsewhere; here, that the service carries it:
// Attach streams, WatchStatus, store waits, and who may call what.
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/coordinator_targets.h"
#include "coordinator/authorizer.h"
#include "coordinator/service.h"
#include "coordinator/status_watchers.h"
#include "ddp/v1/coordinator.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_fixture.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

// Every client call gives up after this: a broken test fails, never hangs.
constexpr absl::Duration kCallBound = absl::Seconds(5);

constexpr char kWorkerToken[] = "worker-token-0123456789";
constexpr char kOperatorToken[] = "operator-token-0123456789";
constexpr char kAdminToken[] = "admin-token-of-alice-0123456789";

// Waits for a condition that real threads (gRPC's) make true, bounded.
bool Eventually(const std::function<bool()>& condition) {
  const absl::Time until = absl::Now() + kCallBound;
  while (!condition()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

class CoordinatorServiceTest : public CoordinatorTest {
 protected:
  ~CoordinatorServiceTest() override {
    if (!server_) return;
    // As ddp-coordinator stops: watches end, then the server.
    watchers_->FinishAll();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_.reset();
  }

  // `authorizer` null: every call allowed; `leadership` null: a
  // coordinator on its own.
  void Serve(std::unique_ptr<Authorizer> authorizer = nullptr,
             size_t max_watches = StatusWatchers::kDefaultMaxWatches,
             const Leadership* leadership = nullptr) {
    authorizer_ = std::move(authorizer);
    watchers_ = std::make_unique<StatusWatchers>(max_watches);
    service_ = std::make_unique<CoordinatorService>(core_.get(), watchers_.get(), authorizer_.get(),
                                                    nullptr, leadership);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr);
    ASSERT_NE(port, 0);
    stub_ = v1::Coordinator::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }

  // A client context bounded by kCallBound, with `token` if one is given.
  static std::unique_ptr<grpc::ClientContext> Context(const std::string& token = "") {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + kCallBound));
    if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
    return context;
  }

  // Offers the latest status to every watch, as the ticker does; `at` far
  // enough ahead that every watch's interval has passed.
  void Broadcast() {
    core_->Tick();
    broadcast_at_ += absl::Hours(1);
    watchers_->Broadcast([this](const std::string& id) { return core_->JobStatusView(id); },
                         broadcast_at_);
  }

  // Reads until a snapshot is `wanted`, offering the latest status all the
  // while: a watch with a write in flight skips an offer, as it does for a
  // slow client. False when the stream ended (or hit kCallBound) first.
  bool ReadUntil(grpc::ClientReader<v1::JobStatus>& reader,
                 const std::function<bool(const v1::JobStatus&)>& wanted) {
    std::atomic<bool> done{false};
    std::thread offers([&] {
      while (!done) {
        Broadcast();
        absl::SleepFor(absl::Milliseconds(1));
      }
    });
    v1::JobStatus status;
    bool found = false;
    while (!found && reader.Read(&status)) found = wanted(status);
    done = true;
    offers.join();
    return found;
  }

  v1::StoreGetRequest Get(const std::string& key, double timeout_seconds) {
    v1::StoreGetRequest get;
    get.set_job_id("test-job");
    get.set_generation(1);
    get.set_key(key);
    get.set_timeout_seconds(timeout_seconds);
    return get;
  }

  std::unique_ptr<Authorizer> authorizer_;
  std::unique_ptr<StatusWatchers> watchers_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  absl::Time broadcast_at_ = absl::Now();
};

v1::WorkerMessage Registration(const v1::RegisterRequest& request) {
  v1::WorkerMessage m;
  *m.mutable_register_() = request;
  return m;
}

TEST_F(CoordinatorServiceTest, Attach_WorkerRegistersAndPrepares_ReceivesAssignment) {
  Serve();
  auto context = Context();
  auto stream = stub_->Attach(context.get());
  ASSERT_TRUE(stream->Write(Registration(Req("h", "cpu:0"))));
  v1::CoordinatorMessage in;
  ASSERT_TRUE(stream->Read(&in));
  ASSERT_TRUE(in.has_registered()) << in.DebugString();
  const std::string worker_id = in.registered().worker_id();
  EXPECT_FALSE(worker_id.empty());
  EXPECT_TRUE(Eventually([&] { return Status().attached_workers() == 1; }));

  ASSERT_THAT(Submit(*core_, Job(1)), IsOk());
  ASSERT_TRUE(stream->Read(&in));
  ASSERT_TRUE(in.has_prepare()) << in.DebugString();
  v1::WorkerMessage prepared;
  prepared.mutable_state()->set_state(v1::WORKER_STATE_IDLE);
  *prepared.mutable_state()->mutable_held() = RecordingChannel::Fresh(in.prepare());
  ASSERT_TRUE(stream->Write(prepared));
  ASSERT_TRUE(stream->Read(&in));
  ASSERT_TRUE(in.has_assignment()) << in.DebugString();
  EXPECT_EQ(in.assignment().job_id(), "test-job");
  EXPECT_EQ(in.assignment().generation(), 1u);
  EXPECT_EQ(in.assignment().rank(), 0u);
  EXPECT_EQ(in.assignment().world_size(), 1u);
  EXPECT_EQ(in.assignment().worker_id(), worker_id);

  // The worker hangs up: the core counts it lost (and says so, ABORTED, to
  // a stream that is going anyway).
  stream->WritesDone();
  while (stream->Read(&in)) ADD_FAILURE() << "unexpected " << in.DebugString();
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::ABORTED);
  EXPECT_TRUE(Eventually([&] { return Status().attached_workers() == 0; }));
}

TEST_F(CoordinatorServiceTest, Attach_FirstMessageNotARegistration_InvalidArgument) {
  Serve();
  auto context = Context();
  auto stream = stub_->Attach(context.get());
  v1::WorkerMessage heartbeat;  // not a registration
  heartbeat.mutable_heartbeat()->set_step(1);
  ASSERT_TRUE(stream->Write(heartbeat));
  v1::CoordinatorMessage in;
  while (stream->Read(&in)) {
  }
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(CoordinatorServiceTest, WatchStatus_StateChanges_WatcherSeesThem) {
  Serve();
  auto context = Context();
  v1::WatchStatusRequest request;
  request.set_interval_seconds(0.05);
  auto reader = stub_->WatchStatus(context.get(), request);
  v1::JobStatus status;
  ASSERT_TRUE(reader->Read(&status));  // the first, at once
  EXPECT_EQ(status.job_id(), "");

  ASSERT_THAT(Submit(*core_, Job(2)), IsOk());
  EXPECT_TRUE(ReadUntil(*reader, [](const v1::JobStatus& s) {
    return s.job_id() == "test-job" && s.attached_workers() == 0;
  }));
  ASSERT_THAT(Attach("h", "cpu:0"), IsOk());
  EXPECT_TRUE(ReadUntil(*reader, [](const v1::JobStatus& s) { return s.attached_workers() == 1; }));
}

TEST_F(CoordinatorServiceTest, WatchStatus_SlowAndCancelledWatchers_OthersStillServed) {
  Serve();
  v1::WatchStatusRequest request;
  request.set_interval_seconds(0.05);
  // One that never reads, and several that go away.
  auto slow_context = Context();
  auto slow = stub_->WatchStatus(slow_context.get(), request);
  std::vector<std::unique_ptr<grpc::ClientContext>> gone_contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::JobStatus>>> gone;
  for (int i = 0; i < 8; ++i) {
    gone_contexts.push_back(Context());
    gone.push_back(stub_->WatchStatus(gone_contexts.back().get(), request));
  }
  auto context = Context();
  auto reader = stub_->WatchStatus(context.get(), request);
  v1::JobStatus status;
  ASSERT_TRUE(reader->Read(&status));
  ASSERT_TRUE(Eventually([&] { return watchers_->open_count() == 10; }));

  // Offers race the cancellations: a watch finishing while a Broadcast
  // holds it is never written to after its end.
  std::atomic<bool> done{false};
  std::thread broadcaster([&] {
    while (!done) Broadcast();
  });
  for (auto& c : gone_contexts) c->TryCancel();
  EXPECT_TRUE(Eventually([&] { return watchers_->open_count() == 2; }));
  done = true;
  broadcaster.join();
  for (auto& g : gone) EXPECT_EQ(g->Finish().error_code(), grpc::StatusCode::CANCELLED);

  ASSERT_THAT(Submit(*core_, Job(1)), IsOk());
  EXPECT_TRUE(ReadUntil(*reader, [](const v1::JobStatus& s) { return s.job_id() == "test-job"; }));
  slow_context->TryCancel();
  EXPECT_TRUE(Eventually([&] { return watchers_->open_count() == 1; }));
}

TEST_F(CoordinatorServiceTest, WatchStatus_OfOneJob_ItsOwnStatus_EndsWhenItHasNone) {
  Serve();
  for (const char* device : {"cpu:0", "cpu:1"}) ASSERT_THAT(Attach("h", device), IsOk());
  for (const char* name : {"a", "b"}) {
    v1::JobSpec spec = Job(1, 1);
    spec.set_name(name);
    ASSERT_THAT(Submit(*core_, spec), IsOk());
  }
  core_->Tick();
  v1::WatchStatusRequest request;
  request.set_interval_seconds(0.05);
  request.set_job_id("b");
  auto context = Context();
  auto reader = stub_->WatchStatus(context.get(), request);
  v1::JobStatus status;
  ASSERT_TRUE(reader->Read(&status));  // the first, at once: b's own
  EXPECT_EQ(status.job_id(), "b");
  ASSERT_EQ(status.workers_size(), 1);
  EXPECT_EQ(status.workers(0).job_id(), "b");
  EXPECT_TRUE(ReadUntil(*reader, [](const v1::JobStatus& s) { return s.job_id() == "b"; }));
  // Once the coordinator has no status of b (it no longer keeps it), the
  // stream ends saying why.
  std::atomic<bool> done{false};
  std::thread offers([&] {
    while (!done) {  // until the stream ended (a write in flight skips an offer)
      broadcast_at_ += absl::Hours(1);
      watchers_->Broadcast(
          [](const std::string& id) -> absl::StatusOr<std::shared_ptr<const v1::JobStatus>> {
            return absl::NotFoundError("no job " + id);
          },
          broadcast_at_);
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  while (reader->Read(&status)) {
  }
  done = true;
  offers.join();
  const grpc::Status ended = reader->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(ended.error_message(), "no job b");

  // A job with no status: refused at once.
  request.set_job_id("nobody");
  auto unknown_context = Context();
  auto unknown = stub_->WatchStatus(unknown_context.get(), request);
  EXPECT_FALSE(unknown->Read(&status));
  EXPECT_EQ(unknown->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(CoordinatorServiceTest, WatchStatus_OverTheLimit_ResourceExhausted) {
  Serve(nullptr, /*max_watches=*/1);
  v1::WatchStatusRequest request;
  auto first_context = Context();
  auto first = stub_->WatchStatus(first_context.get(), request);
  v1::JobStatus status;
  ASSERT_TRUE(first->Read(&status));
  auto second_context = Context();
  auto second = stub_->WatchStatus(second_context.get(), request);
  EXPECT_FALSE(second->Read(&status));
  const grpc::Status refused = second->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("--max_watch_streams 1"));
}

TEST_F(CoordinatorServiceTest, StoreGet_KeySetWhileWaiting_Answered) {
  Serve();
  Start(1, Job(1));
  grpc::Status got_status;
  v1::StoreGetResponse got;
  std::thread getter([&] {
    auto context = Context();
    got_status = stub_->StoreGet(context.get(), Get("k", 30), &got);
  });
  ASSERT_TRUE(Eventually([&] { return core_->store_waiters() == 1; }));
  v1::StoreSetRequest set;
  set.set_job_id("test-job");
  set.set_generation(1);
  set.set_key("k");
  set.set_value("v");
  v1::StoreSetResponse set_response;
  EXPECT_TRUE(stub_->StoreSet(Context().get(), set, &set_response).ok());
  getter.join();
  EXPECT_TRUE(got_status.ok()) << got_status.error_message();
  EXPECT_EQ(got.value(), "v");
  EXPECT_EQ(core_->store_waiters(), 0u);
}

TEST_F(CoordinatorServiceTest, StoreGet_PastItsTimeout_DeadlineExceededOnTheFakeClock) {
  Serve();
  Start(1, Job(1));
  grpc::Status got_status;
  std::thread getter([&] {
    v1::StoreGetResponse got;
    got_status = stub_->StoreGet(Context().get(), Get("never", 2), &got);
  });
  ASSERT_TRUE(Eventually([&] { return core_->store_waiters() == 1; }));
  clock_.Advance(absl::Seconds(3));
  core_->Tick();
  getter.join();
  EXPECT_EQ(got_status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
}

TEST_F(CoordinatorServiceTest, StoreGet_CallerCancels_LeavesTheStore) {
  Serve();
  Start(1, Job(1));
  auto context = Context();
  grpc::Status got_status;
  std::thread getter([&] {
    v1::StoreGetResponse got;
    got_status = stub_->StoreGet(context.get(), Get("never", 30), &got);
  });
  ASSERT_TRUE(Eventually([&] { return core_->store_waiters() == 1; }));
  context->TryCancel();
  getter.join();
  EXPECT_EQ(got_status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(Eventually([&] { return core_->store_waiters() == 0; }));
}

class AuthorizedServiceTest : public CoordinatorServiceTest {
 protected:
  void SetUp() override {
    Serve(std::make_unique<Authorizer>(
        std::vector<TokenEntry>{{Role::kWorker, kWorkerToken},
                                {Role::kOperator, kOperatorToken},
                                {Role::kAdmin, kAdminToken, "alice"}}));
  }

  grpc::Status GetStatusWith(const std::string& token) {
    v1::JobStatus status;
    return stub_->GetStatus(Context(token).get(), v1::GetStatusRequest(), &status);
  }
};

TEST_F(AuthorizedServiceTest, GetStatus_NoOrUnknownToken_Unauthenticated) {
  EXPECT_EQ(GetStatusWith("").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(GetStatusWith("not-a-token-0123456789").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(AuthorizedServiceTest, SubmitJob_TheTokensOwnerOwnsTheJobAndASecondIsQueued) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Job(1);
  v1::SubmitJobResponse first, second;
  ASSERT_TRUE(stub_->SubmitJob(Context(kAdminToken).get(), request, &first).ok());
  EXPECT_EQ(first.state(), v1::JOB_STATE_WAITING);  // no worker yet; it holds the pool
  request.mutable_spec()->set_name("second");
  ASSERT_TRUE(stub_->SubmitJob(Context(kAdminToken).get(), request, &second).ok());
  EXPECT_EQ(second.state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(second.message(), HasSubstr("running: \"test-job\""));
  v1::GetJobRequest get;
  get.set_job_id("second");
  v1::JobSummary job;
  ASSERT_TRUE(stub_->GetJob(Context(kOperatorToken).get(), get, &job).ok());
  EXPECT_EQ(job.owner(), "alice");
  EXPECT_EQ(job.spec().name(), "second");
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(stub_->ListJobs(Context(kOperatorToken).get(), v1::ListJobsRequest(), &jobs).ok());
  ASSERT_EQ(jobs.jobs_size(), 2);
  EXPECT_EQ(jobs.jobs(0).owner(), "alice");
  // Operators read; only admins submit or cancel.
  EXPECT_EQ(stub_->SubmitJob(Context(kOperatorToken).get(), request, &second).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(stub_->ListJobs(Context(kWorkerToken).get(), v1::ListJobsRequest(), &jobs).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(AuthorizedServiceTest, GetStatus_RoleNotAllowed_PermissionDenied) {
  const grpc::Status refused = GetStatusWith(kWorkerToken);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(GetStatusWith(kOperatorToken).ok());
}

TEST_F(AuthorizedServiceTest, Attach_WithoutToken_RefusedBeforeAnythingIsRead) {
  auto context = Context();
  auto stream = stub_->Attach(context.get());
  stream->Write(Registration(Req("h", "cpu:0")));
  v1::CoordinatorMessage in;
  EXPECT_FALSE(stream->Read(&in));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Status().attached_workers(), 0u);
}

TEST_F(AuthorizedServiceTest, Attach_WorkerToken_Registers) {
  auto context = Context(kWorkerToken);
  auto stream = stub_->Attach(context.get());
  ASSERT_TRUE(stream->Write(Registration(Req("h", "cpu:0"))));
  v1::CoordinatorMessage in;
  ASSERT_TRUE(stream->Read(&in));
  EXPECT_TRUE(in.has_registered());
  context->TryCancel();
  stream->Finish();
}

TEST_F(AuthorizedServiceTest, WatchAndStore_WrongRole_PermissionDenied) {
  auto watch_context = Context(kWorkerToken);
  auto watch = stub_->WatchStatus(watch_context.get(), v1::WatchStatusRequest());
  v1::JobStatus status;
  EXPECT_FALSE(watch->Read(&status));
  EXPECT_EQ(watch->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);

  v1::StoreGetResponse got;
  const grpc::Status get = stub_->StoreGet(Context(kOperatorToken).get(), Get("k", 30), &got);
  EXPECT_EQ(get.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(core_->store_waiters(), 0u);
}

// What an election says, set by the test.
class SetLeadership final : public Leadership {
 public:
  bool IsLeader() const override { return leader; }
  bool Deposed() const override { return false; }
  std::string LeaderAddress() const override { return address; }
  v1::CoordinatorLeadership Describe() const override {
    v1::CoordinatorLeadership out;
    out.set_leader(address);
    out.set_is_leader(leader);
    return out;
  }
  std::string EtcdTrouble() const override { return trouble; }
  uint64_t leader_changes() const override { return 1; }
  std::atomic<bool> leader{true};
  std::string address = "10.0.0.2:29400";
  std::string trouble;
};

TEST_F(CoordinatorServiceTest, LeaderWhoseLeaseLapsed_RefusesEveryCall_NamingTheLeader) {
  SetLeadership leadership;
  Serve(nullptr, StatusWatchers::kDefaultMaxWatches, &leadership);
  v1::JobStatus status;
  ASSERT_TRUE(stub_->GetStatus(Context().get(), v1::GetStatusRequest(), &status).ok());
  EXPECT_TRUE(status.leadership().is_leader());

  leadership.leader = false;
  leadership.trouble = "etcd unreachable at 10.0.0.9:2379";
  for (int call = 0; call < 2; ++call) {
    auto context = Context();
    grpc::Status s;
    if (call == 0) {
      v1::CancelJobResponse response;
      s = stub_->CancelJob(context.get(), v1::CancelJobRequest(), &response);
    } else {
      s = stub_->GetStatus(context.get(), v1::GetStatusRequest(), &status);
    }
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(s.error_message(), HasSubstr("10.0.0.2:29400"));
    EXPECT_THAT(s.error_message(), HasSubstr("etcd can't be reached from here"));
    EXPECT_EQ(LeaderHint(*context), "10.0.0.2:29400");
  }
}

}  // namespace
}  // namespace ddp
