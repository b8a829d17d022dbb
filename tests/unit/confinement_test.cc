// The confinement a worker puts on the thread that runs a job's code: what a
// hostile model would try (files outside its folders, a fork, an exec, a
// UDP or packet socket, a signal to another process) is refused in that
// thread and the threads it starts, while the worker's other threads go on
// as before. TorchScript has no fork or socket operator, so those are tried
// here directly; the file cases are also tried by real jobs
// (tests/py/confinement_test.py).
#include "worker/confinement.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace ddp {
namespace {

class ConfinementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!LandlockAbi().ok()) GTEST_SKIP() << "this kernel has no Landlock";
    root_ = std::filesystem::path(::testing::TempDir()) /
            ("confinement-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ / "in");
    std::ofstream(root_ / "in" / "data") << "inputs";
    std::ofstream(root_ / "secret") << "SECRET";
    std::ofstream(root_ / "metrics.jsonl") << "";
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }

  Confinement Job() const {
    Confinement c;
    c.read = {(root_ / "in").string()};
    c.write = {(root_ / "out").string()};
    c.write_files = {(root_ / "metrics.jsonl").string()};
    return c;
  }

  // Runs `body` on a thread of its own after confining it.
  void Confined(const std::function<void()>& body) {
    std::thread t([&] {
      absl::Status s = ConfineThisThread(Job());
      ASSERT_TRUE(s.ok()) << s;
      body();
    });
    t.join();
  }

  int Open(const std::filesystem::path& path, int flags) {
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0640);
    const int e = errno;
    if (fd >= 0) ::close(fd);
    return fd >= 0 ? 0 : e;
  }

  std::filesystem::path root_;
};

TEST_F(ConfinementTest, ReadsOnlyItsInputsAndWritesOnlyItsFolders) {
  Confined([&] {
    EXPECT_EQ(Open(root_ / "in" / "data", O_RDONLY), 0);
    EXPECT_EQ(Open(root_ / "secret", O_RDONLY), EACCES) << "a file outside the inputs";
    EXPECT_EQ(Open(root_ / "in" / "data", O_WRONLY), EACCES) << "inputs are read-only";
    EXPECT_EQ(Open(root_ / "secret", O_WRONLY | O_TRUNC), EACCES);
    EXPECT_EQ(Open(root_ / "dropped", O_WRONLY | O_CREAT), EACCES);
    EXPECT_EQ(Open(root_ / "out" / "model.pt", O_WRONLY | O_CREAT), 0) << "its output folder";
    EXPECT_EQ(Open(root_ / "metrics.jsonl", O_WRONLY | O_APPEND), 0);
    EXPECT_EQ(Open("/etc/passwd", O_RDONLY), EACCES);
    EXPECT_EQ(Open("/proc/1/environ", O_RDONLY), EACCES) << "another process";
    EXPECT_EQ(Open("/proc/self/status", O_RDONLY), 0) << "its own process";
    EXPECT_EQ(Open("/usr/lib", O_RDONLY | O_DIRECTORY), 0) << "the system's libraries";
    EXPECT_NE(::symlink("/etc/passwd", (root_ / "out" / "link").c_str()), 0);
  });
  EXPECT_TRUE(std::filesystem::is_directory(root_ / "out")) << "created for the job";
  EXPECT_EQ(std::filesystem::status(root_ / "out").permissions() & std::filesystem::perms::all,
            std::filesystem::perms(0750));
}

TEST_F(ConfinementTest, StartsNoProcessAndOpensNoOtherSocket) {
  Confined([&] {
    const pid_t child = ::fork();
    if (child == 0) ::_exit(0);  // only if the filter failed
    EXPECT_EQ(child, -1);
    EXPECT_EQ(errno, EPERM);
    char* const argv[] = {const_cast<char*>("/bin/true"), nullptr};
    EXPECT_EQ(::execv("/bin/true", argv), -1);
    EXPECT_EQ(errno, EPERM);
    EXPECT_EQ(::socket(AF_INET, SOCK_DGRAM, 0), -1) << "UDP";
    EXPECT_EQ(errno, EPERM);
    EXPECT_EQ(::socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0), -1);
    EXPECT_EQ(::socket(AF_PACKET, SOCK_RAW, 0), -1) << "packet";
    EXPECT_EQ(errno, EPERM);
    EXPECT_EQ(::socket(AF_NETLINK, SOCK_RAW, 9 /* NETLINK_AUDIT */), -1);
    EXPECT_EQ(::kill(1, 0), -1) << "a signal to another process";
    EXPECT_EQ(errno, EPERM);
    // What the communicator and the coordinator link use.
    const int tcp = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(tcp, 0);
    if (tcp >= 0) ::close(tcp);
    const int unix_socket = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(unix_socket, 0);
    if (unix_socket >= 0) ::close(unix_socket);
  });
}

// What a job's native code could do to its daemon (a job's process's
// parent), the coordinator or another job's process: signal it, change its
// limits or its priority. The test's parent stands for any of them: a
// process of the same user, which the kernel alone would allow.
TEST_F(ConfinementTest, NoSignalLimitOrPriorityReachesAnotherProcess) {
  const pid_t other = ::getppid();
  // Allowed by the kernel here, so a refusal below is the confinement's.
  struct rlimit limit;
  ASSERT_EQ(::prlimit(other, RLIMIT_NOFILE, nullptr, &limit), 0);
  Confined([&] {
    auto refused = [](long rc) { return rc == -1 && errno == EPERM; };
    siginfo_t info = {};
    info.si_code = SI_QUEUE;
    EXPECT_TRUE(refused(::kill(other, 0))) << "kill";
    EXPECT_TRUE(refused(::syscall(SYS_tgkill, other, other, 0))) << "tgkill";
    EXPECT_TRUE(refused(::syscall(SYS_tkill, other, 0))) << "tkill";
    EXPECT_TRUE(refused(::syscall(SYS_rt_sigqueueinfo, other, 0, &info))) << "rt_sigqueueinfo";
    EXPECT_TRUE(refused(::syscall(SYS_rt_tgsigqueueinfo, other, other, 0, &info)))
        << "rt_tgsigqueueinfo";
    EXPECT_TRUE(refused(::prlimit(other, RLIMIT_NOFILE, nullptr, &limit))) << "prlimit64";
    EXPECT_TRUE(refused(::setpriority(PRIO_PROCESS, other, 0))) << "setpriority";
    EXPECT_TRUE(refused(::kill(0, 0))) << "its process group (the daemon's, in process)";
    // Its own process stays its own.
    EXPECT_EQ(::kill(::getpid(), 0), 0);
    EXPECT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  });
}

TEST_F(ConfinementTest, ThreadsItStartsAreConfinedTooAndOthersAreNot) {
  Confined([&] {
    int inner = -1;
    std::thread([&] { inner = Open(root_ / "secret", O_RDONLY); }).join();
    EXPECT_EQ(inner, EACCES) << "a thread the job's code starts";
  });
  // The worker's other threads (its coordinator link among them).
  EXPECT_EQ(Open(root_ / "secret", O_RDONLY), 0);
  const int udp = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  EXPECT_GE(udp, 0);
  if (udp >= 0) ::close(udp);
}

TEST_F(ConfinementTest, AMissingInputIsAClearError) {
  Confinement c = Job();
  c.read.push_back((root_ / "missing").string());
  absl::Status s;
  std::thread([&] { s = ConfineThisThread(c); }).join();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("missing"), std::string::npos) << s;
}

// The check resolved in/ (a pin's real path); since, someone with write
// access beside it swapped it for a link to the folder holding the secret:
// the rule is not built on where the link leads now.
TEST_F(ConfinementTest, ACheckedInputNowBehindALink_RefusedNotFollowed) {
  std::filesystem::rename(root_ / "in", root_ / "in-moved");
  std::filesystem::create_directory_symlink(root_, root_ / "in");
  Confinement c = Job();
  c.read.clear();
  c.read_checked = {(root_ / "in").string()};
  absl::Status s;
  std::thread([&] { s = ConfineThisThread(c); }).join();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("a symbolic link lies on it now"), std::string::npos) << s;
}

// A path a pin stands for is confined to as the check resolved it, not as
// submitted (which a re-pointed link would resolve elsewhere).
TEST(ConfinementForJobTest, PinnedJob_OnlyTheCheckedRealPaths) {
  v1::JobSpec spec;
  spec.mutable_model()->set_path("/data/link-to-model.pt");
  spec.mutable_dataset()->set_path("/data/link-to-images");
  v1::InputFile* pin = spec.add_input_files();
  pin->set_path("/data/link-to-model.pt");
  pin->set_real_path("/data/models/model.pt");
  const Confinement c = ConfinementForJob(spec, JobConfinementOptions());
  EXPECT_EQ(c.read, std::vector<std::string>{"/data/link-to-images"});  // no pin stands for it
  EXPECT_EQ(c.read_checked, std::vector<std::string>{"/data/models/model.pt"});
  spec.clear_input_files();  // an older coordinator's job: its paths as given
  EXPECT_EQ(ConfinementForJob(spec, JobConfinementOptions()).read.size(), 2u);
}

TEST(ExplainRefusalTest, SaysTheConfinementRefusedIt) {
  EXPECT_NE(ExplainRefusal("open(/etc/x): Permission denied").find("confinement"),
            std::string::npos);
  EXPECT_EQ(ExplainRefusal("shape mismatch"), "shape mismatch");
}

}  // namespace
}  // namespace ddp
