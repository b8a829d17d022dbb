// The rendezvous store client against real in-process gRPC servers: a
// standby's answer (UNAVAILABLE naming the leader in the "ddp-leader"
// trailer) sends the call, and the calls after it, to the leader.
#include "common/store_client.h"

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/coordinator_targets.h"
#include "common/credentials.h"
#include "grpcpp/grpcpp.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

// A store that answers as a leader does, or (with a leader set) as a
// standby does: every call UNAVAILABLE, naming the leader.
class FakeStore final : public v1::Coordinator::Service {
 public:
  void set_leader(std::string leader) {
    absl::MutexLock lock(&mu_);
    leader_ = std::move(leader);
  }
  int calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  std::string last_token() const {
    absl::MutexLock lock(&mu_);
    return last_token_;
  }
  double last_get_timeout() const {
    absl::MutexLock lock(&mu_);
    return last_get_timeout_;
  }

  grpc::Status StoreSet(grpc::ServerContext* context, const v1::StoreSetRequest* request,
                        v1::StoreSetResponse*) override {
    absl::MutexLock lock(&mu_);
    if (grpc::Status s = AnswerLocked(context); !s.ok()) return s;
    values_[request->key()] = request->value();
    return grpc::Status::OK;
  }
  grpc::Status StoreGet(grpc::ServerContext* context, const v1::StoreGetRequest* request,
                        v1::StoreGetResponse* response) override {
    absl::MutexLock lock(&mu_);
    if (grpc::Status s = AnswerLocked(context); !s.ok()) return s;
    last_get_timeout_ = request->timeout_seconds();
    auto it = values_.find(request->key());
    if (it == values_.end()) return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no key");
    response->set_value(it->second);
    return grpc::Status::OK;
  }
  grpc::Status StoreAdd(grpc::ServerContext* context, const v1::StoreAddRequest* request,
                        v1::StoreAddResponse* response) override {
    absl::MutexLock lock(&mu_);
    if (grpc::Status s = AnswerLocked(context); !s.ok()) return s;
    counters_[request->key()] += request->delta();
    response->set_value(counters_[request->key()]);
    return grpc::Status::OK;
  }

 private:
  grpc::Status AnswerLocked(grpc::ServerContext* context) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++calls_;
    const auto& metadata = context->client_metadata();
    auto token = metadata.find(kStoreTokenMetadata);
    last_token_ =
        token == metadata.end() ? "" : std::string(token->second.data(), token->second.size());
    if (leader_.empty()) return grpc::Status::OK;
    context->AddTrailingMetadata(kLeaderMetadata, leader_);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "this coordinator is a standby; the leader is at " + leader_);
  }

  mutable absl::Mutex mu_;
  std::string leader_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_token_ ABSL_GUARDED_BY(mu_);
  double last_get_timeout_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> counters_ ABSL_GUARDED_BY(mu_);
};

class StoreServer {
 public:
  StoreServer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&store);
    server_ = builder.BuildAndStart();
  }
  ~StoreServer() { server_->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  FakeStore store;

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

std::shared_ptr<v1::Coordinator::StubInterface> StubTo(const std::string& target) {
  return v1::Coordinator::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
}

TEST(StoreClient, StandbyNamesTheLeader_CallMadeThereOnceAndLaterCallsToo) {
  StoreServer standby, leader;
  standby.store.set_leader(leader.address());
  StoreClient client(StubTo(standby.address()), "job", 1, "store-token", &StubTo);
  // An add a standby refused is made once, on the leader.
  absl::StatusOr<int64_t> added = client.Add("arrived", 1);
  ASSERT_THAT(added, IsOk());
  EXPECT_EQ(*added, 1);
  EXPECT_EQ(standby.store.calls(), 1);
  EXPECT_EQ(leader.store.calls(), 1);
  EXPECT_EQ(leader.store.last_token(), "store-token");
  // The standby is not asked again.
  EXPECT_THAT(client.Set("k", "v"), IsOk());
  absl::StatusOr<std::string> got = client.Get("k", absl::Seconds(30));
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(*got, "v");
  EXPECT_EQ(standby.store.calls(), 1);
  EXPECT_EQ(leader.store.calls(), 3);
}

TEST(StoreClient, GetFollowsTheLeader_WaitsNoLongerThanAsked) {
  StoreServer standby, leader;
  standby.store.set_leader(leader.address());
  StoreClient client(StubTo(standby.address()), "job", 1, "", &StubTo);
  EXPECT_THAT(client.Get("missing", absl::Seconds(30)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("store get missing")));
  EXPECT_GT(leader.store.last_get_timeout(), 0);
  EXPECT_LE(leader.store.last_get_timeout(), 30);
}

TEST(StoreClient, NoStubFactory_FailsAsTheStandbyAnswered) {
  StoreServer standby, leader;
  standby.store.set_leader(leader.address());
  StoreClient client(StubTo(standby.address()), "job", 1);
  EXPECT_THAT(client.Add("arrived", 1),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("the leader is at")));
  EXPECT_EQ(leader.store.calls(), 0);
}

TEST(StoreClient, StandbysNamingEachOther_GivenUpAfterAFewHops) {
  StoreServer a, b;
  a.store.set_leader(b.address());
  b.store.set_leader(a.address());
  StoreClient client(StubTo(a.address()), "job", 1, "", &StubTo);
  EXPECT_THAT(client.Set("k", "v"), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(a.store.calls() + b.store.calls(), 1 + kMaxLeaderHops);
}

TEST(StoreClient, UnreachableWithoutALeaderNamed_NotRetried) {
  // A coordinator that is down (its port closed), or a leader that died
  // mid-call: the add may have been made, so it is not made again.
  auto gone = std::make_unique<StoreServer>();
  const std::string address = gone->address();
  gone.reset();
  int made = 0;
  StoreClient client(StubTo(address), "job", 1, "", [&](const std::string& target) {
    ++made;
    return StubTo(target);
  });
  EXPECT_THAT(client.Add("arrived", 1), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(made, 0);
}

}  // namespace
}  // namespace ddp
