// Following the leader among several coordinators: the list as the flags
// give it, the moves a failure makes, and the leader's address read from a
// real call's trailers (an in-process server that answers as a standby
// does).
#include "common/coordinator_targets.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ddp/v1/coordinator.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Move = CoordinatorTargets::Move;

const grpc::Status kUnavailable(grpc::StatusCode::UNAVAILABLE, "connection refused");

TEST(ParseCoordinatorList, OneAddress_ThatAddress) {
  for (const char* address : {"127.0.0.1:29400", "unix:/run/ddp.sock", "dns:///c.example:1"}) {
    auto parsed = ParseCoordinatorList(address);
    ASSERT_THAT(parsed, IsOk()) << address;
    EXPECT_THAT(*parsed, ElementsAre(address));
  }
}

TEST(ParseCoordinatorList, CommaList_InOrderSpacesDropped) {
  auto parsed = ParseCoordinatorList("a:29400, b:29400 ,[fd00::1]:1");
  ASSERT_THAT(parsed, IsOk());
  EXPECT_THAT(*parsed, ElementsAre("a:29400", "b:29400", "[fd00::1]:1"));
}

TEST(ParseCoordinatorList, BadEntry_InvalidArgumentNamingIt) {
  struct Case {
    const char* in;
    const char* why;
  };
  for (const Case& c : {Case{"a:1,b,c:3", "entry 2 of 3: \"b\" is not HOST:PORT"},
                        Case{"a:1,b:0", "entry 2 of 2: \"b:0\""}, Case{"a:1,,c:3", "entry 2 of 3"},
                        Case{"a:1,", "entry 2 of 2: no address"}, Case{"", "no address"},
                        Case{"a:1,a:1", "\"a:1\" is listed twice"}, Case{"unix:", "no socket"},
                        Case{"nohost", "\"nohost\" is not HOST:PORT"}}) {
    EXPECT_THAT(ParseCoordinatorList(c.in),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.why)))
        << c.in;
  }
  // One address says what it always said, with no entry number.
  EXPECT_THAT(ParseCoordinatorList("localhost"),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::Not(HasSubstr("entry"))));
}

TEST(CoordinatorTargets, OneAddress_EveryMoveLandsOnItAndIsARound) {
  CoordinatorTargets targets("a:1");
  EXPECT_EQ(targets.current(), "a:1");
  grpc::ClientContext context;
  const CoordinatorTargets::Next next = targets.OnFailure("a:1", kUnavailable, context);
  EXPECT_EQ(next.target, "a:1");
  EXPECT_EQ(next.move, Move::kNewRound);
  EXPECT_EQ(targets.OnUnreachable("a:1").move, Move::kNewRound);
  EXPECT_EQ(targets.current(), "a:1");
}

TEST(CoordinatorTargets, Unreachable_NextAddressThenANewRoundAtTheEnd) {
  CoordinatorTargets targets("a:1,b:2,c:3");
  grpc::ClientContext context;
  CoordinatorTargets::Next next = targets.OnFailure("a:1", kUnavailable, context);
  EXPECT_EQ(next.target, "b:2");
  EXPECT_EQ(next.move, Move::kNextAddress);
  next = targets.OnUnreachable("b:2");
  EXPECT_EQ(next.target, "c:3");
  EXPECT_EQ(next.move, Move::kNextAddress);
  next = targets.OnFailure("c:3", grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, ""), context);
  EXPECT_EQ(next.target, "a:1");
  EXPECT_EQ(next.move, Move::kNewRound);
  EXPECT_EQ(targets.current(), "a:1");
}

TEST(CoordinatorTargets, Success_StartsTheRoundOver) {
  CoordinatorTargets targets("a:1,b:2");
  EXPECT_EQ(targets.OnUnreachable("a:1").move, Move::kNextAddress);
  targets.OnSuccess();
  const CoordinatorTargets::Next next = targets.OnUnreachable("b:2");
  EXPECT_EQ(next.target, "a:1");
  EXPECT_EQ(next.move, Move::kNextAddress);
}

TEST(CoordinatorTargets, OtherCodes_Stay) {
  CoordinatorTargets targets("a:1,b:2");
  grpc::ClientContext context;
  for (grpc::StatusCode code :
       {grpc::StatusCode::ABORTED, grpc::StatusCode::ALREADY_EXISTS,
        grpc::StatusCode::RESOURCE_EXHAUSTED, grpc::StatusCode::CANCELLED}) {
    const CoordinatorTargets::Next next = targets.OnFailure("a:1", grpc::Status(code, ""), context);
    EXPECT_EQ(next.target, "a:1");
    EXPECT_EQ(next.move, Move::kStay);
  }
}

TEST(CoordinatorTargets, TwoCallersFailOnOneTarget_MoveOnce) {
  CoordinatorTargets targets("a:1,b:2,c:3");
  EXPECT_EQ(targets.OnUnreachable("a:1").target, "b:2");
  // The second heard of a:1 too, late: b:2 is not skipped untried.
  const CoordinatorTargets::Next next = targets.OnUnreachable("a:1");
  EXPECT_EQ(next.target, "b:2");
  EXPECT_EQ(targets.current(), "b:2");
}

TEST(CoordinatorTargets, ConcurrentFailures_EveryAnswerIsAListedAddress) {
  CoordinatorTargets targets("a:1,b:2,c:3");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        const std::string tried = targets.current();
        const std::string next = targets.OnUnreachable(tried).target;
        EXPECT_TRUE(next == "a:1" || next == "b:2" || next == "c:3") << next;
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

// A coordinator that is not the leader, as the real one answers: every
// call UNAVAILABLE, naming the leader in the "ddp-leader" trailer (none
// when `leader` is empty: an election in progress).
class FakeStandby final : public v1::Coordinator::Service {
 public:
  void set_leader(std::string leader) {
    absl::MutexLock lock(&mu_);
    leader_ = std::move(leader);
  }
  grpc::Status GetStatus(grpc::ServerContext* context, const v1::GetStatusRequest*,
                         v1::JobStatus*) override {
    absl::MutexLock lock(&mu_);
    if (!leader_.empty()) context->AddTrailingMetadata(kLeaderMetadata, leader_);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "this coordinator is a standby; the leader is at " + leader_);
  }

 private:
  absl::Mutex mu_;
  std::string leader_ ABSL_GUARDED_BY(mu_);
};

class StandbyServer {
 public:
  explicit StandbyServer(std::string leader) {
    service_.set_leader(std::move(leader));
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~StandbyServer() { server_->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  void set_leader(std::string leader) { service_.set_leader(std::move(leader)); }

  // Calls it as a client does; the finished call's context.
  grpc::Status Call(grpc::ClientContext* context) const {
    auto stub = v1::Coordinator::NewStub(
        grpc::CreateChannel(address(), grpc::InsecureChannelCredentials()));
    v1::JobStatus status;
    return stub->GetStatus(context, v1::GetStatusRequest(), &status);
  }

 private:
  FakeStandby service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST(LeaderHint, StandbysTrailer_ReadFromARealCall) {
  StandbyServer standby("10.0.0.2:29400");
  grpc::ClientContext context;
  EXPECT_EQ(standby.Call(&context).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(LeaderHint(context), "10.0.0.2:29400");
}

TEST(LeaderHint, NoLeaderKnown_Empty) {
  StandbyServer electing("");
  grpc::ClientContext context;
  EXPECT_EQ(electing.Call(&context).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(LeaderHint(context), "");
}

TEST(LeaderHint, NotAnAddress_Ignored) {
  StandbyServer garbled("not an address");
  grpc::ClientContext context;
  garbled.Call(&context);
  EXPECT_EQ(LeaderHint(context), "");
}

TEST(CoordinatorTargetsOverGrpc, StandbyNamesTheLeader_TargetIsTheLeaderEvenUnlisted) {
  StandbyServer standby("10.0.0.9:29400");
  CoordinatorTargets targets(standby.address() + ",b:2");
  grpc::ClientContext context;
  const grpc::Status status = standby.Call(&context);
  const CoordinatorTargets::Next next = targets.OnFailure(standby.address(), status, context);
  EXPECT_EQ(next.target, "10.0.0.9:29400");
  EXPECT_EQ(next.move, Move::kLeader);
  EXPECT_EQ(targets.current(), "10.0.0.9:29400");
  // The leader gone too: on to the address after the standby's.
  EXPECT_EQ(targets.OnUnreachable("10.0.0.9:29400").target, "b:2");
}

TEST(CoordinatorTargetsOverGrpc, StandbyNamesAListedLeader_TheListGoesOnAfterIt) {
  StandbyServer standby("c:3");
  CoordinatorTargets targets(standby.address() + ",b:2,c:3");
  grpc::ClientContext context;
  const grpc::Status status = standby.Call(&context);
  EXPECT_EQ(targets.OnFailure(standby.address(), status, context).target, "c:3");
  EXPECT_EQ(targets.OnUnreachable("c:3").target, standby.address());
}

TEST(CoordinatorTargetsOverGrpc, ElectionInProgress_NextAddress) {
  StandbyServer electing("");
  CoordinatorTargets targets(electing.address() + ",b:2");
  grpc::ClientContext context;
  const grpc::Status status = electing.Call(&context);
  const CoordinatorTargets::Next next = targets.OnFailure(electing.address(), status, context);
  EXPECT_EQ(next.target, "b:2");
  EXPECT_EQ(next.move, Move::kNextAddress);
}

TEST(CoordinatorTargetsOverGrpc, StandbyNamesItself_NotFollowedAsALeader) {
  StandbyServer standby("");
  standby.set_leader(standby.address());
  CoordinatorTargets targets(standby.address() + ",b:2");
  grpc::ClientContext context;
  const grpc::Status status = standby.Call(&context);
  const CoordinatorTargets::Next next = targets.OnFailure(standby.address(), status, context);
  EXPECT_EQ(next.target, "b:2");
  EXPECT_EQ(next.move, Move::kNextAddress);
}

}  // namespace
}  // namespace ddp
