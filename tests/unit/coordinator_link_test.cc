// CoordinatorLink against a scripted coordinator: a real grpc::Server on a
// loopback port inside the test, whose Attach does what each test says
// (accept, refuse, stay silent, close the stream, send a Stop). Heartbeats,
// backoff and the register's timeout run on a FakeClock, so the tests move
// time by hand and wait only for real events (bounded). Every interval is a
// minute or more, which real time never reaches within a test's waits: a
// link that read the real clock would fail them.
#include "worker/link/coordinator_link.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/coordinator_targets.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "worker/link/outbox.h"
#include "worker/link/progress_board.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

// How one Attach call is answered.
struct Answer {
  enum Kind { kAccept, kRefuse, kSilent } kind = kAccept;
  grpc::Status refusal;  // kRefuse
  std::string leader;    // kRefuse: sent in the "ddp-leader" trailer

  static Answer Accept() { return Answer{kAccept, grpc::Status::OK, ""}; }
  static Answer Silent() { return Answer{kSilent, grpc::Status::OK, ""}; }
  static Answer Refuse(grpc::StatusCode code, const std::string& message) {
    return Answer{kRefuse, grpc::Status(code, message), ""};
  }
  // A coordinator that is not the leader, as the real one answers.
  static Answer Standby(const std::string& leader) {
    return Answer{kRefuse,
                  grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "this coordinator is a standby; the leader is at " + leader),
                  leader};
  }
};

// What the test tells an accepted stream to do next.
struct Command {
  enum Kind { kClose, kStop } kind;
  grpc::Status close;  // kClose
  std::string reason;  // kStop
  std::string leader;  // kClose: sent in the "ddp-leader" trailer

  static Command Close(grpc::StatusCode code, const std::string& message) {
    return Command{kClose, grpc::Status(code, message), "", ""};
  }
  // A leader that lost its lease, naming its successor.
  static Command StepDown(const std::string& leader) {
    return Command{
        kClose,
        grpc::Status(grpc::StatusCode::UNAVAILABLE,
                     "this coordinator is no longer the leader; the leader is at " + leader),
        "", leader};
  }
  static Command Stop(const std::string& reason) {
    return Command{kStop, grpc::Status::OK, reason, ""};
  }
};

class ScriptedCoordinator final : public v1::Coordinator::Service {
 public:
  // Answers for the coming Attach calls, in order; the last one repeats.
  void Script(std::vector<Answer> answers) {
    absl::MutexLock lock(&mu_);
    answers_.assign(answers.begin(), answers.end());
  }
  // The accepted stream now open does `command`.
  void Tell(Command command) {
    absl::MutexLock lock(&mu_);
    commands_.push_back(std::move(command));
  }

  int attaches() const {
    absl::MutexLock lock(&mu_);
    return attaches_;
  }
  int heartbeats() const {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }
  std::vector<v1::WorkerMessage> received() const {
    absl::MutexLock lock(&mu_);
    return received_;
  }

  grpc::Status Attach(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) override {
    v1::WorkerMessage hello;
    if (!stream->Read(&hello) || !hello.has_register_()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no register");
    }
    Answer answer;
    {
      absl::MutexLock lock(&mu_);
      ++attaches_;
      if (!answers_.empty()) answer = answers_.front();
      if (answers_.size() > 1) answers_.pop_front();
    }
    switch (answer.kind) {
      case Answer::kRefuse:
        if (!answer.leader.empty()) context->AddTrailingMetadata(kLeaderMetadata, answer.leader);
        return answer.refusal;
      case Answer::kSilent:
        // Until the worker gives up on the register (bounded).
        for (int i = 0; i < 1000 && !context->IsCancelled(); ++i) {
          absl::SleepFor(absl::Milliseconds(10));
        }
        return grpc::Status(grpc::StatusCode::CANCELLED, "given up");
      case Answer::kAccept:
        return Serve(context, stream);
    }
    return grpc::Status::OK;
  }

 private:
  grpc::Status Serve(grpc::ServerContext* context,
                     grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) {
    v1::CoordinatorMessage registered;
    registered.mutable_registered()->set_worker_id("w-1");
    registered.mutable_registered()->set_heartbeat_interval_ms(60000);
    stream->Write(registered);
    // Reads on its own thread; a close waits for the worker's next message
    // (the test moves the clock to a heartbeat), since a sync handler can't
    // return while a Read is pending, and cancelling would hide the status.
    std::atomic<bool> closing{false};
    std::thread reader([this, stream, &closing] {
      v1::WorkerMessage message;
      while (stream->Read(&message)) {
        absl::MutexLock lock(&mu_);
        if (message.has_heartbeat()) ++heartbeats_;
        received_.push_back(message);
        if (closing) return;
      }
    });
    grpc::Status result(grpc::StatusCode::CANCELLED, "the worker left");
    while (!context->IsCancelled()) {
      std::optional<Command> command;
      {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(this, &ScriptedCoordinator::HasCommandLocked),
                                 absl::Milliseconds(10))) {
          command = commands_.front();
          commands_.pop_front();
        }
      }
      if (!command.has_value()) continue;
      if (command->kind == Command::kClose) {
        closing = true;
        result = command->close;
        if (!command->leader.empty()) {
          context->AddTrailingMetadata(kLeaderMetadata, command->leader);
        }
        break;
      }
      v1::CoordinatorMessage stop;
      stop.mutable_stop()->set_reason(command->reason);
      stream->Write(stop);
    }
    reader.join();
    return result;
  }
  bool HasCommandLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !commands_.empty(); }

  mutable absl::Mutex mu_;
  std::deque<Answer> answers_ ABSL_GUARDED_BY(mu_);
  std::deque<Command> commands_ ABSL_GUARDED_BY(mu_);
  int attaches_ ABSL_GUARDED_BY(mu_) = 0;
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1::WorkerMessage> received_ ABSL_GUARDED_BY(mu_);
};

class RecordingHandler final : public CoordinatorLink::Handler {
 public:
  v1::RegisterRequest MakeRegister() override {
    v1::RegisterRequest r;
    r.set_host("test-host");
    r.set_device("cpu:0");
    return r;
  }
  void OnAssignment(const v1::Assignment&,
                    std::shared_ptr<v1::Coordinator::StubInterface>) override {}
  void OnAbort(const v1::Abort&) override {}
  void OnDropped(const std::string& why) override {
    absl::MutexLock lock(&mu_);
    dropped_.push_back(why);
  }
  void OnStopping(const std::string& reason) override {
    absl::MutexLock lock(&mu_);
    stops_.push_back(reason);
  }
  std::vector<std::string> dropped() const {
    absl::MutexLock lock(&mu_);
    return dropped_;
  }
  std::vector<std::string> stops() const {
    absl::MutexLock lock(&mu_);
    return stops_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> dropped_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> stops_ ABSL_GUARDED_BY(mu_);
};

// Polls `done` for up to 10 s of real time: for events, never for timeouts.
template <typename F>
bool Eventually(F done) {
  for (int i = 0; i < 1000; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

// Gives the link's threads time to act on the clock, to show they did not.
void Settle() { absl::SleepFor(absl::Milliseconds(100)); }

// A real server for `service` on a free loopback port.
std::unique_ptr<grpc::Server> Serve(grpc::Service* service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

std::string Loopback(int port) { return "127.0.0.1:" + std::to_string(port); }

// A loopback port bound but not listening: connections to it are refused
// (a coordinator that is down), and no other test can take it meanwhile.
class ClosedPort {
 public:
  ClosedPort() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }
  ClosedPort(const ClosedPort&) = delete;
  ClosedPort& operator=(const ClosedPort&) = delete;
  ~ClosedPort() { ::close(fd_); }
  std::string address() const { return Loopback(port_); }

 private:
  const int fd_;
  int port_ = 0;
};

class CoordinatorLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = Serve(&coordinator_, &port_);
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }
  void TearDown() override {
    if (runner_.joinable()) {
      link_->Shutdown();
      runner_.join();
    }
    server_->Shutdown(std::chrono::system_clock::now());
  }

  // The test's coordinator's address.
  std::string address() const { return Loopback(port_); }

  void StartLink(CoordinatorLink::Options options = {}) { StartLinkTo(address(), options); }
  // To `coordinators`: one address or a comma list.
  void StartLinkTo(const std::string& coordinators, CoordinatorLink::Options options = {}) {
    options.coordinator = coordinators;
    link_ = std::make_unique<CoordinatorLink>(&clock_, options, &handler_, &outbox_, &board_);
    runner_ = std::thread([this] { result_ = link_->Run(); });
  }
  // Waits for Run to return; its result.
  int Finish() {
    EXPECT_TRUE(Eventually([&] { return result_.load() != -1; }));
    runner_.join();
    return result_;
  }
  // Waits until a thread of the link waits on the clock for a deadline in
  // [now + from, now + to); returns how long from now that is. The tests
  // move time only then: a link that had not yet chosen its deadline would
  // count from the moved time.
  absl::Duration AwaitWaitWithin(absl::Duration from, absl::Duration to) {
    const absl::Time now = clock_.Now();
    absl::Duration found = absl::InfiniteDuration();
    EXPECT_TRUE(Eventually([&] {
      for (absl::Time deadline : clock_.Deadlines()) {
        if (deadline >= now + from && deadline < now + to) {
          found = deadline - now;
          return true;
        }
      }
      return false;
    })) << "no wait for ["
        << from << ", " << to << ") from now";
    return found;
  }

  FakeClock clock_;
  ScriptedCoordinator coordinator_;
  RecordingHandler handler_;
  Outbox outbox_{&clock_, Outbox::Options{}};
  ProgressBoard board_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CoordinatorLink> link_;
  std::thread runner_;
  std::atomic<int> result_{-1};
};

TEST_F(CoordinatorLinkTest, Heartbeats_OneAtAttachThenOnePerIntervalOfTheClock) {
  StartLink();
  ASSERT_TRUE(Eventually([&] { return coordinator_.heartbeats() == 1; }));
  // The next one a minute (the Registered's interval) after the first.
  EXPECT_EQ(AwaitWaitWithin(absl::Seconds(60), absl::Seconds(61)), absl::Seconds(60));
  clock_.Advance(absl::Seconds(59));
  Settle();
  EXPECT_EQ(coordinator_.heartbeats(), 1);
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(Eventually([&] { return coordinator_.heartbeats() == 2; }));
  EXPECT_EQ(AwaitWaitWithin(absl::Seconds(60), absl::Seconds(61)), absl::Seconds(60));
  clock_.Advance(absl::Seconds(60));
  EXPECT_TRUE(Eventually([&] { return coordinator_.heartbeats() == 3; }));
  EXPECT_TRUE(link_->ever_attached());
}

TEST_F(CoordinatorLinkTest, UnreachableCoordinator_BackoffDoublesOnTheClock) {
  coordinator_.Script({Answer::Refuse(grpc::StatusCode::UNAVAILABLE, "down")});
  CoordinatorLink::Options options;
  options.min_backoff = absl::Minutes(1);
  options.max_backoff = absl::Minutes(8);
  StartLink(options);
  ASSERT_TRUE(Eventually([&] { return coordinator_.attaches() == 1; }));
  // Each wait is the backoff times a jitter in [0.5, 1): 30-60 s, then
  // 60-120 s.
  absl::Duration wait = AwaitWaitWithin(absl::Seconds(30), absl::Seconds(60));
  clock_.Advance(wait - absl::Seconds(1));
  Settle();
  EXPECT_EQ(coordinator_.attaches(), 1);
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(Eventually([&] { return coordinator_.attaches() == 2; }));
  wait = AwaitWaitWithin(absl::Seconds(60), absl::Seconds(120));
  clock_.Advance(wait);
  ASSERT_TRUE(Eventually([&] { return coordinator_.attaches() == 3; }));
  AwaitWaitWithin(absl::Seconds(120), absl::Seconds(240));
  EXPECT_FALSE(link_->ever_attached());
  EXPECT_THAT(link_->last_error(), HasSubstr("down"));
}

TEST_F(CoordinatorLinkTest, StreamLost_ReattachesAfterBackoff_AbortedMeansDropped) {
  CoordinatorLink::Options options;
  options.min_backoff = absl::Minutes(1);
  StartLink(options);
  ASSERT_TRUE(Eventually([&] { return coordinator_.heartbeats() == 1; }));
  // A coordinator that went away: retried, and not a drop. The close waits
  // for the worker's next message, the heartbeat a minute on.
  coordinator_.Tell(Command::Close(grpc::StatusCode::UNAVAILABLE, "restarting"));
  clock_.Advance(AwaitWaitWithin(absl::Seconds(60), absl::Seconds(61)));
  const absl::Duration backoff = AwaitWaitWithin(absl::Seconds(30), absl::Seconds(60));
  EXPECT_EQ(coordinator_.attaches(), 1);
  clock_.Advance(backoff);
  ASSERT_TRUE(Eventually([&] { return coordinator_.attaches() == 2; }));
  EXPECT_TRUE(handler_.dropped().empty());
  // The coordinator dropping this worker: the handler hears why.
  ASSERT_TRUE(Eventually([&] { return coordinator_.heartbeats() == 3; }));
  coordinator_.Tell(Command::Close(grpc::StatusCode::ABORTED, "marked lost"));
  clock_.Advance(AwaitWaitWithin(absl::Seconds(60), absl::Seconds(61)));
  ASSERT_TRUE(Eventually([&] { return handler_.dropped().size() == 1; }));
  EXPECT_EQ(handler_.dropped()[0], "marked lost");
}

TEST_F(CoordinatorLinkTest, SilentCoordinator_RegisterGivenUpAtTheTimeoutOnTheClock) {
  coordinator_.Script({Answer::Silent(), Answer::Accept()});
  CoordinatorLink::Options options;
  options.register_timeout = absl::Minutes(10);
  options.min_backoff = absl::Minutes(1);
  StartLink(options);
  ASSERT_TRUE(Eventually([&] { return coordinator_.attaches() == 1; }));
  // The register's watchdog, armed before the call.
  EXPECT_LE(AwaitWaitWithin(absl::ZeroDuration(), absl::Minutes(10) + absl::Seconds(1)),
            absl::Minutes(10));
  clock_.Advance(absl::Seconds(599));
  Settle();
  EXPECT_EQ(link_->last_error(), "");
  EXPECT_EQ(coordinator_.attaches(), 1);
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(Eventually([&] { return !link_->last_error().empty(); }));
  EXPECT_THAT(link_->last_error(), HasSubstr("no answer to register within 10m"));
  clock_.Advance(AwaitWaitWithin(absl::Seconds(30), absl::Seconds(60)));
  ASSERT_TRUE(Eventually([&] { return coordinator_.attaches() == 2; }));
  EXPECT_TRUE(Eventually([&] { return link_->ever_attached(); }));
}

TEST_F(CoordinatorLinkTest, RefusalRetryingCantCure_RunReturns2AndSaysWhy) {
  coordinator_.Script({Answer::Refuse(grpc::StatusCode::UNAUTHENTICATED, "bad token")});
  StartLink();
  EXPECT_EQ(Finish(), 2);
  EXPECT_EQ(coordinator_.attaches(), 1);
  EXPECT_THAT(link_->last_error(), HasSubstr("UNAUTHENTICATED: bad token"));
}

TEST_F(CoordinatorLinkTest, StopFromTheCoordinator_RunReturns0AndTheHandlerHearsIt) {
  StartLink();
  ASSERT_TRUE(Eventually([&] { return coordinator_.heartbeats() == 1; }));
  coordinator_.Tell(Command::Stop("the job finished"));
  EXPECT_EQ(Finish(), 0);
  EXPECT_THAT(handler_.stops(), ::testing::ElementsAre("the job finished"));
}

TEST_F(CoordinatorLinkTest, ReportsQueuedWhileAway_SentFirstOnAttach) {
  coordinator_.Script({Answer::Refuse(grpc::StatusCode::UNAVAILABLE, "down"), Answer::Accept()});
  CoordinatorLink::Options options;
  options.min_backoff = absl::Minutes(1);
  StartLink(options);
  ASSERT_TRUE(Eventually([&] { return coordinator_.attaches() == 1; }));
  const absl::Duration backoff = AwaitWaitWithin(absl::Seconds(30), absl::Seconds(60));
  v1::WorkerMessage state;
  state.mutable_state()->set_detail("queued while away");
  outbox_.Push(state);
  clock_.Advance(backoff);
  ASSERT_TRUE(Eventually([&] { return coordinator_.heartbeats() == 1; }));
  const std::vector<v1::WorkerMessage> received = coordinator_.received();
  ASSERT_FALSE(received.empty());
  EXPECT_EQ(received[0].state().detail(), "queued while away");
}

// Several coordinators: the test's own (coordinator_) is the leader.

TEST_F(CoordinatorLinkTest, StandbyNamesTheLeader_AttachesThereWithoutABackoff) {
  ScriptedCoordinator standby;
  standby.Script({Answer::Standby(address())});
  int standby_port = 0;
  std::unique_ptr<grpc::Server> standby_server = Serve(&standby, &standby_port);
  CoordinatorLink::Options options;
  options.min_backoff = absl::Minutes(10);
  StartLinkTo(Loopback(standby_port) + "," + address(), options);
  // The clock never moves: no backoff was waited for.
  ASSERT_TRUE(Eventually([&] { return coordinator_.heartbeats() == 1; }));
  EXPECT_EQ(standby.attaches(), 1);
  EXPECT_EQ(coordinator_.attaches(), 1);
  EXPECT_TRUE(link_->ever_attached());
  standby_server->Shutdown(std::chrono::system_clock::now());
}

TEST_F(CoordinatorLinkTest, StandbyNamesALeaderNotListed_FollowedAnyway) {
  ScriptedCoordinator standby;
  standby.Script({Answer::Standby(address())});
  int standby_port = 0;
  std::unique_ptr<grpc::Server> standby_server = Serve(&standby, &standby_port);
  CoordinatorLink::Options options;
  options.min_backoff = absl::Minutes(10);
  // One address, a standby's: its leader is where the link goes.
  StartLinkTo(Loopback(standby_port), options);
  ASSERT_TRUE(Eventually([&] { return coordinator_.heartbeats() == 1; }));
  EXPECT_EQ(standby.attaches(), 1);
  standby_server->Shutdown(std::chrono::system_clock::now());
}

TEST_F(CoordinatorLinkTest, FirstCoordinatorDown_MovesToTheNextAfterTheBackoff) {
  ClosedPort closed;
  const std::string down = closed.address();
  CoordinatorLink::Options options;
  options.min_backoff = absl::Minutes(1);
  StartLinkTo(down + "," + address(), options);
  const absl::Duration backoff = AwaitWaitWithin(absl::Seconds(30), absl::Seconds(60));
  EXPECT_EQ(coordinator_.attaches(), 0);
  EXPECT_THAT(link_->last_error(), HasSubstr(down + ": UNAVAILABLE"));
  clock_.Advance(backoff);
  ASSERT_TRUE(Eventually([&] { return coordinator_.heartbeats() == 1; }));
  EXPECT_EQ(link_->last_error(), "");
}

TEST_F(CoordinatorLinkTest, AllDown_BackoffDoublesPerRoundNotPerAddress) {
  CoordinatorLink::Options options;
  options.min_backoff = absl::Minutes(1);
  options.max_backoff = absl::Minutes(8);
  ClosedPort a, b;
  StartLinkTo(a.address() + "," + b.address(), options);
  // Both addresses at 30-60 s apart, then both at 60-120 s.
  for (absl::Duration from : {absl::Seconds(30), absl::Seconds(30), absl::Seconds(60),
                              absl::Seconds(60), absl::Seconds(120)}) {
    clock_.Advance(AwaitWaitWithin(from, from * 2));
  }
  EXPECT_FALSE(link_->ever_attached());
}

TEST_F(CoordinatorLinkTest, LeaderStepsDown_ReattachesToItsSuccessorAtOnce) {
  ScriptedCoordinator successor;
  int successor_port = 0;
  std::unique_ptr<grpc::Server> successor_server = Serve(&successor, &successor_port);
  CoordinatorLink::Options options;
  options.min_backoff = absl::Minutes(10);
  StartLinkTo(address() + "," + Loopback(successor_port), options);
  ASSERT_TRUE(Eventually([&] { return coordinator_.heartbeats() == 1; }));
  // The close waits for the worker's next message, the heartbeat a minute
  // on; the clock moves no further.
  coordinator_.Tell(Command::StepDown(Loopback(successor_port)));
  clock_.Advance(AwaitWaitWithin(absl::Seconds(60), absl::Seconds(61)));
  ASSERT_TRUE(Eventually([&] { return successor.heartbeats() == 1; }));
  EXPECT_EQ(coordinator_.attaches(), 1);
  EXPECT_TRUE(handler_.dropped().empty());
  link_->Shutdown();
  runner_.join();
  successor_server->Shutdown(std::chrono::system_clock::now());
}

TEST_F(CoordinatorLinkTest, StandbysNamingEachOther_BackoffAfterAFewHops) {
  ScriptedCoordinator a, b;
  int a_port = 0, b_port = 0;
  std::unique_ptr<grpc::Server> a_server = Serve(&a, &a_port);
  std::unique_ptr<grpc::Server> b_server = Serve(&b, &b_port);
  a.Script({Answer::Standby(Loopback(b_port))});
  b.Script({Answer::Standby(Loopback(a_port))});
  CoordinatorLink::Options options;
  options.min_backoff = absl::Minutes(1);
  StartLinkTo(Loopback(a_port) + "," + Loopback(b_port), options);
  AwaitWaitWithin(absl::Seconds(30), absl::Seconds(60));
  EXPECT_EQ(a.attaches() + b.attaches(), 1 + kMaxLeaderHops);
  EXPECT_THAT(link_->last_error(), HasSubstr("this coordinator is a standby"));
  link_->Shutdown();
  runner_.join();
  a_server->Shutdown(std::chrono::system_clock::now());
  b_server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace ddp
