// The election and the guarded state writes against a real etcd.
#include "coordinator/leader_election.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/etcd_client.h"
#include "common/state_seal.h"
#include "coordinator/etcd_state_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/etcd_cluster.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

const StateSeal kSeal = StateSeal::WithKey(std::string(64, 'k'));

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kTtl = absl::Seconds(1);

class LeaderElectionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto cluster = EtcdCluster::Start(1);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(cluster_, nullptr);
    etcd_ = Client(cluster_->client_endpoints());
    // Every test its own cluster of coordinators.
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    prefix_ = absl::StrCat("/test/", info->name());
  }

  static std::unique_ptr<EtcdClient> Client(std::vector<std::string> endpoints) {
    EtcdClient::Options options;
    options.endpoints = std::move(endpoints);
    options.timeout = absl::Milliseconds(500);
    auto client = EtcdClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  std::unique_ptr<LeaderElection> Candidate(const std::string& address,
                                            const Clock* clock = RealClock::Get()) {
    auto election = std::make_unique<LeaderElection>(etcd_.get(), clock,
                                                     LeaderElection::Options{prefix_, kTtl});
    EXPECT_THAT(election->Start(address), IsOk());
    return election;
  }

  static v1::DurableState StateWithJob(const std::string& name) {
    v1::DurableState state;
    state.mutable_job()->set_name(name);
    return state;
  }

  static EtcdCluster* cluster_;
  std::unique_ptr<EtcdClient> etcd_;
  std::string prefix_;
};

EtcdCluster* LeaderElectionTest::cluster_ = nullptr;

// Until `e` has read the candidates and names `leader` (bounded).
bool Names(const LeaderElection& e, const std::string& leader) {
  for (absl::Time end = absl::Now() + absl::Seconds(5); absl::Now() < end;) {
    if (e.LeaderAddress() == leader) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

TEST_F(LeaderElectionTest, ThreeCandidates_TheFirstLeads_TheOthersNameIt) {
  auto a = Candidate("a:1");
  ASSERT_TRUE(a->AwaitLeadership(absl::Seconds(5)));
  auto b = Candidate("b:1");
  auto c = Candidate("c:1");
  ASSERT_TRUE(Names(*c, "a:1"));
  EXPECT_FALSE(b->AwaitLeadership(absl::Milliseconds(300)));
  EXPECT_FALSE(c->IsLeader());
  for (auto* e : {a.get(), b.get(), c.get()}) EXPECT_EQ(e->LeaderAddress(), "a:1");
  const v1::CoordinatorLeadership seen = c->Describe();
  EXPECT_EQ(seen.leader(), "a:1");
  EXPECT_EQ(seen.this_coordinator(), "c:1");
  EXPECT_FALSE(seen.is_leader());
  EXPECT_EQ(seen.lease_id(), a->lease());
  EXPECT_THAT(seen.standbys(), ElementsAre("b:1", "c:1"));
  EXPECT_EQ(seen.etcd_prefix(), prefix_);
  EXPECT_TRUE(a->Describe().is_leader());
}

TEST_F(LeaderElectionTest, LeaderResigns_TheNextLeadsAtOnce) {
  auto a = Candidate("a:1");
  ASSERT_TRUE(a->AwaitLeadership(absl::Seconds(5)));
  auto b = Candidate("b:1");
  ASSERT_TRUE(Names(*b, "a:1"));
  const absl::Time resigned = absl::Now();
  a->Stop(/*resign=*/true);
  ASSERT_TRUE(b->AwaitLeadership(absl::Seconds(5)));
  // A watch, not the lease's expiry, told it.
  EXPECT_LT(absl::Now() - resigned, kTtl / 2);
  EXPECT_EQ(b->LeaderAddress(), "b:1");
  EXPECT_GE(b->leader_changes(), 2u);
}

// A coordinator restarted at once (its former process's key still there
// until the lease expires) names no leader rather than itself: clients, and
// its own forwarded reads, would come back to it.
TEST_F(LeaderElectionTest, FormerProcessOfTheSameAddress_NotNamedAsLeaderByItsSuccessor) {
  auto before = Candidate("a:1");
  ASSERT_TRUE(before->AwaitLeadership(absl::Seconds(5)));
  before->Stop(/*resign=*/false);
  auto again = Candidate("a:1");
  auto other = Candidate("b:1");
  ASSERT_TRUE(Names(*other, "a:1"));
  EXPECT_EQ(again->LeaderAddress(), "");
  EXPECT_FALSE(again->IsLeader());
  // Once the old lease expires, the restarted one leads after all.
  EXPECT_TRUE(again->AwaitLeadership(kTtl + absl::Seconds(3)));
  EXPECT_EQ(other->LeaderAddress(), "a:1");
}

TEST_F(LeaderElectionTest, LeaderGoneWithoutResigning_TheNextLeadsWithinTheTtl) {
  auto a = Candidate("a:1");
  ASSERT_TRUE(a->AwaitLeadership(absl::Seconds(5)));
  auto b = Candidate("b:1");
  const absl::Time gone = absl::Now();
  a->Stop(/*resign=*/false);  // renewals stop, as when the process is killed
  ASSERT_TRUE(b->AwaitLeadership(kTtl + absl::Seconds(2)));
  // The lease ends kTtl after its last renewal; etcd sweeps expired leases
  // every 500 ms, later on a loaded machine.
  const absl::Duration took = absl::Now() - gone;
  EXPECT_LT(took, kTtl + absl::Seconds(2)) << took;
}

// A leader that never sees time pass (its clock is stopped: a paused
// process believes it still leads) is deposed when its lease expires in etcd,
// and etcd refuses its writes: the guard, not its own belief, decides.
TEST_F(LeaderElectionTest, DeposedLeaderThatBelievesItLeads_WritesRefusedByEtcd) {
  FakeClock frozen;
  auto a = Candidate("a:1", &frozen);
  ASSERT_TRUE(a->AwaitLeadership(absl::Seconds(5)));
  EtcdStateStore a_store(etcd_.get(), prefix_, a.get(), kSeal);
  ASSERT_THAT(a_store.Save(StateWithJob("from-a"), 1), IsOk());

  auto b = Candidate("b:1");
  ASSERT_TRUE(b->AwaitLeadership(kTtl + absl::Seconds(3)));
  EtcdStateStore b_store(etcd_.get(), prefix_, b.get(), kSeal);
  ASSERT_THAT(b_store.Save(StateWithJob("from-b"), 1), IsOk());

  EXPECT_THAT(a_store.Save(StateWithJob("from-a-again"), 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no longer leads")));
  auto saved = b_store.Load();
  ASSERT_THAT(saved, IsOk());
  ASSERT_TRUE(saved->has_value());
  EXPECT_EQ((*saved)->job().name(), "from-b");
  // The writer of record is the new leader's lease.
  auto writer = etcd_->Range(prefix_ + "/writer");
  ASSERT_THAT(writer, IsOk());
  ASSERT_EQ(writer->kvs.size(), 1u);
  EXPECT_EQ(writer->kvs[0].value, absl::StrFormat("%016x", static_cast<uint64_t>(b->lease())));
}

// etcd out of reach: the leader stops acting once the last confirmed
// renewal plus the TTL less the margin (a tenth) has passed, before etcd
// could have let its lease expire; but it gives the term up only once no
// renewal was confirmed for twice the TTL (a late answer would have let it
// act again).
TEST_F(LeaderElectionTest, RenewalsUnanswered_StopsActingBeforeTheLeaseEndsAndGivesUpLater) {
  FakeClock clock;
  auto a = Candidate("a:1", &clock);
  ASSERT_TRUE(a->AwaitLeadership(absl::Seconds(5)));
  cluster_->Stop(0);
  clock.Advance(kTtl * 9 / 10 - absl::Milliseconds(10));
  EXPECT_TRUE(a->IsLeader());
  clock.Advance(absl::Milliseconds(20));
  EXPECT_FALSE(a->IsLeader());
  EXPECT_FALSE(a->Deposed());         // paused, not deposed
  EXPECT_EQ(a->LeaderAddress(), "");  // not itself any more
  clock.Advance(kTtl * 11 / 10);
  EXPECT_TRUE(a->Deposed());
  EXPECT_TRUE(a->AwaitLoss(absl::Seconds(1)));
  EXPECT_THAT(a->loss_reason(), HasSubstr("no renewal"));
  cluster_->Cont(0);
}

// Renewals confirmed late (a starved thread, an etcd leader election: here
// the leader's own clock runs ahead of its renewals) stop the leader acting
// until a newer one is confirmed, then it acts again, with the same lease:
// a late answer deposes nobody.
TEST_F(LeaderElectionTest, RenewalConfirmedLate_ActsAgainWithTheSameLease) {
  FakeClock clock;
  auto a = Candidate("a:1", &clock);
  ASSERT_TRUE(a->AwaitLeadership(absl::Seconds(5)));
  const int64_t lease = a->lease();
  clock.Advance(kTtl * 95 / 100);  // past the margin with nothing confirmed
  EXPECT_FALSE(a->IsLeader());
  // The renewal that time set off comes back: it acts again.
  const absl::Time asked = absl::Now();
  while (!a->IsLeader() && absl::Now() - asked < absl::Seconds(5)) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(a->IsLeader());
  EXPECT_FALSE(a->Deposed());
  EXPECT_EQ(a->lease(), lease);
}

TEST_F(LeaderElectionTest, StateStore_RoundTripThroughEtcd_OlderSequenceSkipped) {
  auto a = Candidate("a:1");
  ASSERT_TRUE(a->AwaitLeadership(absl::Seconds(5)));
  EtcdStateStore store(etcd_.get(), prefix_, a.get(), kSeal);
  auto empty = store.Load();
  ASSERT_THAT(empty, IsOk());
  EXPECT_FALSE(empty->has_value());
  ASSERT_THAT(store.Save(StateWithJob("second"), 2), IsOk());
  ASSERT_THAT(store.Save(StateWithJob("first"), 1), IsOk());
  auto loaded = store.Load();
  ASSERT_THAT(loaded, IsOk());
  EXPECT_EQ((*loaded)->job().name(), "second");
  EXPECT_THAT(store.Describe(), HasSubstr(prefix_ + "/state"));
}

// What someone without the key put under the prefix is refused, naming the
// key: a job written there in the clear, the leader's own state changed by
// a byte, and state sealed with another key.
TEST_F(LeaderElectionTest, StateStore_WrittenByOthers_RefusedNamingTheKey) {
  auto a = Candidate("a:1");
  ASSERT_TRUE(a->AwaitLeadership(absl::Seconds(5)));
  EtcdStateStore store(etcd_.get(), prefix_, a.get(), kSeal);
  ASSERT_THAT(etcd_->Put(prefix_ + "/state", StateWithJob("injected").SerializeAsString()), IsOk());
  EXPECT_THAT(store.Load(),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr(prefix_ + "/state"), HasSubstr("not sealed"))));
  ASSERT_THAT(store.Save(StateWithJob("mine"), 1), IsOk());
  auto sealed = etcd_->Range(prefix_ + "/state");
  ASSERT_THAT(sealed, IsOk());
  std::string changed = sealed->kvs[0].value;
  changed.back() ^= 1;
  ASSERT_THAT(etcd_->Put(prefix_ + "/state", changed), IsOk());
  EXPECT_THAT(store.Load(),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("MAC does not match")));
  EtcdStateStore other(etcd_.get(), prefix_, a.get(), StateSeal::WithKey(std::string(64, 'o')));
  ASSERT_THAT(other.Save(StateWithJob("theirs"), 1), IsOk());
  EXPECT_THAT(store.Load(), StatusIs(absl::StatusCode::kPermissionDenied));
  // Sealed with the key but not a state: it does not parse.
  ASSERT_THAT(etcd_->Put(prefix_ + "/state", kSeal.Seal("garbage")), IsOk());
  EXPECT_THAT(store.Load(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("does not parse")));
}

TEST_F(LeaderElectionTest, ClaimPrefix_EmptyClaimed_OursKept_OthersRefused) {
  ASSERT_THAT(EtcdStateStore::ClaimPrefix(etcd_.get(), prefix_), IsOk());
  EXPECT_THAT(EtcdStateStore::ClaimPrefix(etcd_.get(), prefix_), IsOk());
  auto format = etcd_->Range(prefix_ + "/format");
  ASSERT_THAT(format, IsOk());
  EXPECT_EQ(format->kvs.at(0).value, kEtcdStateFormat);

  const std::string newer = prefix_ + "-newer";
  ASSERT_THAT(etcd_->Put(newer + "/format", "ddp-coordinator-state 3"), IsOk());
  EXPECT_THAT(
      EtcdStateStore::ClaimPrefix(etcd_.get(), newer),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("ddp-coordinator-state 3")));

  const std::string foreign = prefix_ + "-foreign";
  ASSERT_THAT(etcd_->Put(foreign + "/registry/pods", "x"), IsOk());
  EXPECT_THAT(EtcdStateStore::ClaimPrefix(etcd_.get(), foreign),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("/registry/pods")));
}

TEST_F(LeaderElectionTest, EtcdUnreachable_StartSaysSo) {
  auto nowhere = Client({"127.0.0.1:1"});
  LeaderElection election(nowhere.get(), RealClock::Get(), {prefix_, kTtl});
  EXPECT_THAT(election.Start("a:1"),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("127.0.0.1:1")));
}

}  // namespace
}  // namespace ddp
