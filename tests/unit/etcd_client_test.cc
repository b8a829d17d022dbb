// EtcdClient against a real etcd (tests/etcd_cluster.h): one member for the
// calls, three for losing one. A cluster per suite keeps the binary fast.
#include "common/etcd_client.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/etcd_cluster.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr absl::Duration kWait = absl::Seconds(5);  // any wait in these tests

MATCHER_P(IsOkAndHolds, matcher, "") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(matcher, *arg, result_listener);
}

std::unique_ptr<EtcdClient> MakeClient(const std::vector<std::string>& endpoints,
                                       absl::Duration timeout = absl::Seconds(1)) {
  EtcdClient::Options options;
  options.endpoints = endpoints;
  options.timeout = timeout;
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(options);
  EXPECT_THAT(client, IsOk());
  return client.ok() ? *std::move(client) : nullptr;
}

std::vector<std::string> Keys(const std::vector<EtcdKeyValue>& kvs) {
  std::vector<std::string> keys;
  for (const EtcdKeyValue& kv : kvs) keys.push_back(kv.key);
  return keys;
}

// What a watch delivered, waited for with a bound.
class WatchRecorder {
 public:
  std::function<void(const std::vector<EtcdEvent>&)> OnEvents() {
    return [this](const std::vector<EtcdEvent>& events) {
      absl::MutexLock lock(&mu_);
      events_.insert(events_.end(), events.begin(), events.end());
    };
  }
  std::function<void(const absl::Status&)> OnError() {
    return [this](const absl::Status& s) {
      absl::MutexLock lock(&mu_);
      errors_.push_back(s);
    };
  }
  // The events once there are `n`, or those there are after kWait.
  std::vector<EtcdEvent> WaitForEvents(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return events_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
    return events_;
  }
  std::vector<absl::Status> WaitForError() {
    absl::MutexLock lock(&mu_);
    auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !errors_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&any), kWait);
    return errors_;
  }
  std::vector<absl::Status> errors() {
    absl::MutexLock lock(&mu_);
    return errors_;
  }

 private:
  absl::Mutex mu_;
  std::vector<EtcdEvent> events_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> errors_ ABSL_GUARDED_BY(mu_);
};

// Starts the suite's cluster once; every test fails with its reason when
// it could not start (etcd not installed, most likely).
template <int kMembers>
class ClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster = EtcdCluster::Start(kMembers);
    if (cluster.ok()) {
      cluster_ = cluster->release();
    } else {
      start_error_ = new std::string(cluster.status().ToString());
    }
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    delete start_error_;
    start_error_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr) << "no etcd cluster: " << *start_error_; }

  static EtcdCluster* cluster_;
  static std::string* start_error_;
};
template <int kMembers>
EtcdCluster* ClusterTest<kMembers>::cluster_ = nullptr;
template <int kMembers>
std::string* ClusterTest<kMembers>::start_error_ = nullptr;

class EtcdClientTest : public ClusterTest<1> {
 protected:
  void SetUp() override {
    ClusterTest<1>::SetUp();
    client_ = MakeClient(cluster_->client_endpoints());
    ASSERT_NE(client_, nullptr);
  }
  std::unique_ptr<EtcdClient> client_;
};

class EtcdClientClusterTest : public ClusterTest<3> {};

// ---------------------------------------------------------------- no etcd

TEST(RangeEndForPrefixTest, Table) {
  EXPECT_EQ(RangeEndForPrefix("a/"), "a0");
  EXPECT_EQ(RangeEndForPrefix("ab"), "ac");
  EXPECT_EQ(RangeEndForPrefix(std::string("a\xff", 2)), "b");
  EXPECT_EQ(RangeEndForPrefix(std::string("a\xfe\xff\xff", 4)), std::string("a\xff", 2));
  EXPECT_EQ(RangeEndForPrefix(std::string("\xff\xff", 2)), std::string(1, '\0'));
  EXPECT_EQ(RangeEndForPrefix(""), std::string(1, '\0'));
}

TEST(EtcdClientCreateTest, BadOptions_FailWithInvalidArgument) {
  EtcdClient::Options options;
  EXPECT_THAT(EtcdClient::Create(options), StatusIs(absl::StatusCode::kInvalidArgument));
  options.endpoints = {"http://127.0.0.1:2379"};
  EXPECT_THAT(EtcdClient::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("HOST:PORT")));
  options.endpoints = {"127.0.0.1:2379"};
  options.ca_file = "/nonexistent/ca.pem";
  EXPECT_THAT(EtcdClient::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/nonexistent/ca.pem")));
  options.ca_file = "";
  options.cert_file = "/nonexistent/cert.pem";
  EXPECT_THAT(EtcdClient::Create(options), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(EtcdClientUnreachableTest, NoMemberListening_UnavailableNamingEveryEndpoint) {
  // Ports nothing listens on: a cluster of one, stopped and gone.
  absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster = EtcdCluster::Start(1);
  ASSERT_THAT(cluster, IsOk());
  const std::string dead = (*cluster)->client_endpoints()[0];
  cluster->reset();
  const std::vector<std::string> endpoints = {dead, "127.0.0.1:1"};
  std::unique_ptr<EtcdClient> client = MakeClient(endpoints);
  ASSERT_NE(client, nullptr);

  const absl::Time start = absl::Now();
  EXPECT_THAT(client->Put("k", "v"),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("etcd unreachable at ", dead, ", 127.0.0.1:1"))));
  EXPECT_THAT(client->Range("k"), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(client->LeaseKeepAlive(1), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));

  WatchRecorder recorder;
  std::unique_ptr<EtcdWatch> watch =
      client->Watch("k", "", 0, recorder.OnEvents(), recorder.OnError());
  EXPECT_THAT(recorder.WaitForError(),
              ElementsAre(StatusIs(absl::StatusCode::kUnavailable, HasSubstr("Watch"))));
}

// ------------------------------------------------------------- one member

TEST_F(EtcdClientTest, PutRangeDelete_OneKey_RoundTrips) {
  absl::StatusOr<int64_t> put = client_->Put("one/k", "v1");
  ASSERT_THAT(put, IsOk());
  absl::StatusOr<EtcdRangeResult> read = client_->Range("one/k");
  ASSERT_THAT(read, IsOk());
  ASSERT_THAT(read->kvs, SizeIs(1));
  EXPECT_EQ(read->kvs[0].key, "one/k");
  EXPECT_EQ(read->kvs[0].value, "v1");
  EXPECT_EQ(read->kvs[0].mod_revision, *put);
  EXPECT_EQ(read->kvs[0].create_revision, *put);
  EXPECT_EQ(read->kvs[0].version, 1);
  EXPECT_GE(read->revision, *put);
  EXPECT_EQ(read->count, 1);

  absl::StatusOr<int64_t> again = client_->Put("one/k", "v2");
  ASSERT_THAT(again, IsOk());
  EXPECT_GT(*again, *put);
  read = client_->Range("one/k");
  ASSERT_THAT(read, IsOk());
  ASSERT_THAT(read->kvs, SizeIs(1));
  EXPECT_EQ(read->kvs[0].value, "v2");
  EXPECT_EQ(read->kvs[0].version, 2);

  EXPECT_THAT(client_->Delete("one/k"), IsOkAndHolds(1));
  read = client_->Range("one/k");
  ASSERT_THAT(read, IsOk());
  EXPECT_THAT(read->kvs, IsEmpty());
  EXPECT_EQ(read->count, 0);
  EXPECT_THAT(client_->Delete("one/k"), IsOkAndHolds(0));
}

TEST_F(EtcdClientTest, Range_Prefix_ReadsOnlyThePrefixInKeyOrder) {
  for (const char* key : {"pre/b", "pre/a", "pre/c", "pre0", "prf/x"}) {
    ASSERT_THAT(client_->Put(key, "x"), IsOk());
  }
  const std::string end = RangeEndForPrefix("pre/");
  absl::StatusOr<EtcdRangeResult> all = client_->Range("pre/", end);
  ASSERT_THAT(all, IsOk());
  EXPECT_THAT(Keys(all->kvs), ElementsAre("pre/a", "pre/b", "pre/c"));

  absl::StatusOr<EtcdRangeResult> two = client_->Range("pre/", end, /*limit=*/2);
  ASSERT_THAT(two, IsOk());
  EXPECT_THAT(Keys(two->kvs), ElementsAre("pre/a", "pre/b"));
  EXPECT_EQ(two->count, 3);

  EXPECT_THAT(client_->Delete("pre/", end), IsOkAndHolds(3));
  absl::StatusOr<EtcdRangeResult> left = client_->Range("pre", RangeEndForPrefix("pr"));
  ASSERT_THAT(left, IsOk());
  EXPECT_THAT(Keys(left->kvs), ElementsAre("pre0", "prf/x"));
  // The whole keyspace: "" and RangeEndForPrefix("").
  absl::StatusOr<EtcdRangeResult> everything = client_->Range("", RangeEndForPrefix(""));
  ASSERT_THAT(everything, IsOk());
  EXPECT_GE(everything->count, 2);
}

TEST_F(EtcdClientTest, Txn_CreateRevisionZero_SucceedsOnceThenRunsTheFailureBranch) {
  const EtcdCompare absent{"txn/lock", EtcdCompare::Target::kCreateRevision,
                           EtcdCompare::Result::kEqual, 0, ""};
  EtcdOp put;
  put.kind = EtcdOp::Kind::kPut;
  put.key = "txn/lock";
  put.value = "first";
  EtcdOp read;
  read.kind = EtcdOp::Kind::kRange;
  read.key = "txn/lock";

  absl::StatusOr<EtcdTxnResult> first = client_->Txn({absent}, {put, read}, {read});
  ASSERT_THAT(first, IsOk());
  EXPECT_TRUE(first->succeeded);
  ASSERT_THAT(first->ranges, SizeIs(2));
  EXPECT_THAT(first->ranges[0], IsEmpty());  // the put
  ASSERT_THAT(first->ranges[1], SizeIs(1));
  EXPECT_EQ(first->ranges[1][0].mod_revision, first->revision);

  put.value = "second";
  absl::StatusOr<EtcdTxnResult> second = client_->Txn({absent}, {put}, {read});
  ASSERT_THAT(second, IsOk());
  EXPECT_FALSE(second->succeeded);
  ASSERT_THAT(second->ranges, SizeIs(1));
  ASSERT_THAT(second->ranges[0], SizeIs(1));
  EXPECT_EQ(second->ranges[0][0].value, "first");

  // The other targets, against what the first transaction wrote.
  const int64_t created = first->revision;
  const std::vector<EtcdCompare> holds = {
      {"txn/lock", EtcdCompare::Target::kVersion, EtcdCompare::Result::kEqual, 1, ""},
      {"txn/lock", EtcdCompare::Target::kModRevision, EtcdCompare::Result::kLess, created + 1, ""},
      {"txn/lock", EtcdCompare::Target::kValue, EtcdCompare::Result::kNotEqual, 0, "second"},
      {"txn/lock", EtcdCompare::Target::kLease, EtcdCompare::Result::kEqual, 0, ""},
      {"txn/lock", EtcdCompare::Target::kCreateRevision, EtcdCompare::Result::kGreater, 0, ""}};
  EtcdOp del;
  del.kind = EtcdOp::Kind::kDelete;
  del.key = "txn/lock";
  absl::StatusOr<EtcdTxnResult> third = client_->Txn(holds, {del});
  ASSERT_THAT(third, IsOk());
  EXPECT_TRUE(third->succeeded);
  EXPECT_THAT(client_->Range("txn/lock"),
              IsOkAndHolds(::testing::Field(&EtcdRangeResult::kvs, IsEmpty())));
}

TEST_F(EtcdClientTest, Lease_Revoked_DeletesItsKeysAndKeepAliveIsNotFound) {
  absl::StatusOr<int64_t> lease = client_->LeaseGrant(absl::Seconds(30));
  ASSERT_THAT(lease, IsOk());
  ASSERT_THAT(client_->Put("lease/revoked", "x", *lease), IsOk());
  absl::StatusOr<EtcdRangeResult> read = client_->Range("lease/revoked");
  ASSERT_THAT(read, IsOk());
  ASSERT_THAT(read->kvs, SizeIs(1));
  EXPECT_EQ(read->kvs[0].lease, *lease);
  EXPECT_THAT(client_->LeaseKeepAlive(*lease), IsOkAndHolds(absl::Seconds(30)));

  ASSERT_THAT(client_->LeaseRevoke(*lease), IsOk());
  read = client_->Range("lease/revoked");
  ASSERT_THAT(read, IsOk());
  EXPECT_THAT(read->kvs, IsEmpty());
  EXPECT_THAT(client_->LeaseKeepAlive(*lease), StatusIs(absl::StatusCode::kNotFound));
  // etcd's own code and message, named by endpoint and call.
  EXPECT_THAT(client_->LeaseRevoke(*lease),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr(absl::StrCat("etcd ", cluster_->client_endpoints()[0],
                                              ": LeaseRevoke: "))));
}

TEST_F(EtcdClientTest, Lease_Expired_DeletesItsKeys) {
  // Rounded up to etcd's whole seconds.
  absl::StatusOr<int64_t> lease = client_->LeaseGrant(absl::Milliseconds(300));
  ASSERT_THAT(lease, IsOk());
  EXPECT_THAT(client_->LeaseKeepAlive(*lease), IsOkAndHolds(absl::Seconds(1)));
  ASSERT_THAT(client_->Put("lease/expiring", "x", *lease), IsOk());
  const absl::Time deadline = absl::Now() + kWait;
  bool gone = false;
  while (!gone && absl::Now() < deadline) {
    absl::StatusOr<EtcdRangeResult> read = client_->Range("lease/expiring");
    ASSERT_THAT(read, IsOk());
    gone = read->kvs.empty();
    if (!gone) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(gone) << "the key outlived its 1 s lease by " << kWait;
  EXPECT_THAT(client_->LeaseKeepAlive(*lease), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(EtcdClientTest, Watch_Prefix_SeesPutAndDeleteInOrder) {
  absl::StatusOr<EtcdRangeResult> now = client_->Range("watch/");
  ASSERT_THAT(now, IsOk());
  WatchRecorder recorder;
  // From the next revision: what happens before the watch is registered is
  // not missed.
  std::unique_ptr<EtcdWatch> watch =
      client_->Watch("watch/", RangeEndForPrefix("watch/"), now->revision + 1, recorder.OnEvents(),
                     recorder.OnError());
  absl::StatusOr<int64_t> put = client_->Put("watch/a", "1");
  ASSERT_THAT(put, IsOk());
  ASSERT_THAT(client_->Put("elsewhere", "1"), IsOk());
  ASSERT_THAT(client_->Delete("watch/a"), IsOk());
  absl::StatusOr<EtcdRangeResult> after = client_->Range("watch/");
  ASSERT_THAT(after, IsOk());

  const std::vector<EtcdEvent> events = recorder.WaitForEvents(2);
  ASSERT_THAT(events, SizeIs(2));
  EXPECT_EQ(events[0].type, EtcdEvent::Type::kPut);
  EXPECT_EQ(events[0].kv.key, "watch/a");
  EXPECT_EQ(events[0].kv.value, "1");
  EXPECT_EQ(events[0].kv.mod_revision, *put);
  EXPECT_EQ(events[1].type, EtcdEvent::Type::kDelete);
  EXPECT_EQ(events[1].kv.key, "watch/a");
  EXPECT_EQ(events[1].kv.mod_revision, after->revision);
  EXPECT_THAT(recorder.errors(), IsEmpty());
}

TEST_F(EtcdClientTest, Watch_Destroyed_ReturnsPromptlyWithoutOnError) {
  WatchRecorder recorder;
  std::unique_ptr<EtcdWatch> watch = client_->Watch("quiet/", RangeEndForPrefix("quiet/"), 0,
                                                    recorder.OnEvents(), recorder.OnError());
  // Let the stream be established first, then destroy a watch in progress.
  absl::StatusOr<int64_t> put = client_->Put("quiet/a", "1");
  ASSERT_THAT(put, IsOk());
  absl::Time start = absl::Now();
  watch.reset();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  // And one destroyed at once, before its stream can have started.
  start = absl::Now();
  client_->Watch("quiet/", "", 0, recorder.OnEvents(), recorder.OnError()).reset();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_THAT(recorder.errors(), IsEmpty());
}

TEST_F(EtcdClientTest, Watch_FromACompactedRevision_OnErrorOutOfRange) {
  absl::StatusOr<int64_t> first = client_->Put("compacted/k", "1");
  ASSERT_THAT(first, IsOk());
  absl::StatusOr<int64_t> second = client_->Put("compacted/k", "2");
  ASSERT_THAT(second, IsOk());
  // Our client has no Compact (nothing of ours compacts): etcdctl does it.
  if (::access("/usr/bin/etcdctl", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/etcdctl";
  const std::string compact =
      absl::StrCat("ETCDCTL_API=3 /usr/bin/etcdctl --endpoints=", cluster_->client_endpoints()[0],
                   " compaction ", *second, " >/dev/null");
  ASSERT_EQ(std::system(compact.c_str()), 0) << compact;

  WatchRecorder recorder;
  std::unique_ptr<EtcdWatch> watch =
      client_->Watch("compacted/k", "", *first, recorder.OnEvents(), recorder.OnError());
  EXPECT_THAT(recorder.WaitForError(),
              ElementsAre(StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("compacted"))));
  EXPECT_THAT(recorder.WaitForEvents(0), IsEmpty());
}

TEST_F(EtcdClientTest, Restart_TheOnlyMember_UsedAgainWithinASecond) {
  ASSERT_THAT(client_->Put("restart/k", "v"), IsOk());
  cluster_->Kill(0);
  EXPECT_THAT(client_->Range("restart/k"), StatusIs(absl::StatusCode::kUnavailable));
  ASSERT_THAT(cluster_->Restart(0), IsOk()) << cluster_->Log(0);
  // The client's channel has failed; gRPC reconnects only while some thread
  // polls (the client's own, see Poller): not 5-10 s later.
  const absl::Time back = absl::Now();
  absl::StatusOr<EtcdRangeResult> read = client_->Range("restart/k");
  while (!read.ok() && absl::Now() - back < kWait) {
    absl::SleepFor(absl::Milliseconds(50));
    read = client_->Range("restart/k");
  }
  ASSERT_THAT(read, IsOk());
  EXPECT_LT(absl::Now() - back, absl::Seconds(1));
  ASSERT_THAT(read->kvs, SizeIs(1));
  EXPECT_EQ(read->kvs[0].value, "v");
}

// ----------------------------------------------------------- three members

// The member `client` sends to now.
int InUse(const EtcdClient& client, const std::vector<std::string>& endpoints) {
  return static_cast<int>(std::find(endpoints.begin(), endpoints.end(), client.endpoint()) -
                          endpoints.begin());
}

TEST_F(EtcdClientClusterTest, Kill_TheMemberInUse_CallsStillSucceedAndItRejoins) {
  const std::vector<std::string> endpoints = cluster_->client_endpoints();
  // Long enough for an election when the killed member led.
  std::unique_ptr<EtcdClient> client = MakeClient(endpoints, absl::Seconds(3));
  ASSERT_NE(client, nullptr);
  absl::StatusOr<int64_t> before = client->Put("kill/before", "x");
  ASSERT_THAT(before, IsOk());
  const int used = InUse(*client, endpoints);
  ASSERT_LT(used, 3);
  WatchRecorder recorder;
  std::unique_ptr<EtcdWatch> watch = client->Watch("kill/", RangeEndForPrefix("kill/"), *before + 1,
                                                   recorder.OnEvents(), recorder.OnError());
  ASSERT_THAT(client->Put("kill/watched", "x"), IsOk());
  EXPECT_THAT(recorder.WaitForEvents(1), SizeIs(1));

  cluster_->Kill(used);
  EXPECT_THAT(recorder.WaitForError(),
              ElementsAre(StatusIs(absl::StatusCode::kUnavailable, HasSubstr(endpoints[used]))));
  ASSERT_THAT(client->Put("kill/after", "y"), IsOk());
  EXPECT_NE(client->endpoint(), endpoints[used]);
  absl::StatusOr<EtcdRangeResult> read = client->Range("kill/", RangeEndForPrefix("kill/"));
  ASSERT_THAT(read, IsOk());
  EXPECT_THAT(Keys(read->kvs), ElementsAre("kill/after", "kill/before", "kill/watched"));
  absl::StatusOr<int64_t> lease = client->LeaseGrant(absl::Seconds(10));
  ASSERT_THAT(lease, IsOk());
  EXPECT_THAT(client->LeaseKeepAlive(*lease), IsOk());
  EXPECT_THAT(client->LeaseRevoke(*lease), IsOk());

  // Back on its data: it has caught up with what it missed.
  ASSERT_THAT(cluster_->Restart(used), IsOk()) << cluster_->Log(used);
  std::unique_ptr<EtcdClient> only = MakeClient({endpoints[used]});
  ASSERT_NE(only, nullptr);
  read = only->Range("kill/after");
  ASSERT_THAT(read, IsOk());
  ASSERT_THAT(read->kvs, SizeIs(1));
  EXPECT_EQ(read->kvs[0].value, "y");
}

TEST_F(EtcdClientClusterTest, Stop_TheMemberInUse_CallsMoveOnAfterTheTimeout) {
  const std::vector<std::string> endpoints = cluster_->client_endpoints();
  std::unique_ptr<EtcdClient> client = MakeClient(endpoints, absl::Seconds(2));
  ASSERT_NE(client, nullptr);
  ASSERT_THAT(client->Put("stop/before", "x"), IsOk());
  const int used = InUse(*client, endpoints);
  ASSERT_LT(used, 3);

  // It hangs with its connections open: only the deadline says so.
  cluster_->Stop(used);
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> put = client->Put("stop/after", "y");
  const absl::Duration took = absl::Now() - start;
  cluster_->Cont(used);
  ASSERT_THAT(put, IsOk());
  EXPECT_NE(client->endpoint(), endpoints[used]);
  EXPECT_GE(took, absl::Seconds(2));
  EXPECT_LT(took, absl::Seconds(5));  // its timeout, then one more member's answer
}

}  // namespace
}  // namespace ddp
