#include "coordinator/helper_process.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using testing::HasSubstr;
using testing::Not;

const std::atomic<bool> kGoOn{false};

std::unique_ptr<HelperProcess> Helper(std::string program, std::vector<std::string> args,
                                      HelperProcess::Options options = {}) {
  options.program = std::move(program);
  options.args = std::move(args);
  if (options.env.empty()) options.env = {"PATH=/usr/bin:/bin"};
  auto helper = HelperProcess::Create(std::move(options));
  EXPECT_THAT(helper, IsOk());
  return helper.ok() ? std::move(*helper) : nullptr;
}

std::unique_ptr<HelperProcess> Shell(const std::string& script,
                                     HelperProcess::Options options = {}) {
  return Helper("/bin/sh", {"-c", script}, std::move(options));
}

absl::StatusOr<HelperProcess::Result> RunIt(const HelperProcess& helper,
                                            absl::string_view input = "") {
  return helper.Run(input, absl::Seconds(30), kGoOn);
}

TEST(HelperProcess, Run_Input_ReadOnStdinAndOutputReturned) {
  auto result = RunIt(*Helper("/bin/cat", {}), "hello");
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->output, "hello");
  EXPECT_EQ(result->exit_code, 0);
}

TEST(HelperProcess, Run_LargeInputAndOutput_NeitherSideBlocks) {
  HelperProcess::Options options;
  options.max_output_bytes = 4 << 20;
  const std::string big(3 << 20, 'x');  // far past a pipe's buffer
  auto result = RunIt(*Helper("/bin/cat", {}, options), big);
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->output.size(), big.size());
}

// A helper that exits without reading its stdin: the writes fail with
// EPIPE, and the SIGPIPE they raise (default: end the process, the
// coordinator) is not delivered. Its exit is reported as any other.
TEST(HelperProcess, Run_ChildReadsNoInput_ReportedAndNoSigpipe) {
  const std::string big(3 << 20, 'x');  // far past a pipe's buffer
  auto result = RunIt(*Shell("exec 0<&-; exit 4"), big);
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->exit_code, 4);
}

TEST(HelperProcess, Run_ExitCodeAndStderr_Reported) {
  HelperProcess::Options options;
  options.stderr_tail_bytes = 8;
  auto result = RunIt(*Shell("echo 'a long first part; the end' >&2; exit 3", options));
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->exit_code, 3);
  EXPECT_EQ(result->stderr_tail, "the end\n");
}

TEST(HelperProcess, Run_Environment_OnlyItsOwn) {
  HelperProcess::Options options;
  options.env = {"ONLY=this"};
  ::setenv("DDP_HELPER_TEST_SECRET", "leaked", 1);
  auto result = RunIt(*Helper("/usr/bin/env", {}, options));
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->output, "ONLY=this\n");
}

TEST(HelperProcess, Run_Sandbox_RootDirLimitsAndNoOtherDescriptors) {
  // A descriptor of "the coordinator's" without close-on-exec.
  const int fd = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(::dup2(fd, 57), 0);
  HelperProcess::Options options;
  options.max_open_files = 32;
  options.max_cpu_seconds = 7;
  options.max_address_space_bytes = uint64_t{1} << 30;
  auto result = RunIt(*Shell(
      "pwd; ulimit -f; ulimit -c; ulimit -n; ulimit -v; ulimit -t; ls /proc/self/fd | tr '\\n' ' '",
      options));
  ::close(57);
  ::close(fd);
  ASSERT_THAT(result, IsOk());
  // ls's own descriptor for /proc/self/fd is 3.
  EXPECT_EQ(result->output, "/\n0\n0\n32\n1048576\n7\n0 1 2 3 ");
}

TEST(HelperProcess, Run_WritesAFile_KilledBySigxfsz) {
  char tmpl[] = "/tmp/ddp-helper-test-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  ::chmod(dir.c_str(), 0777);
  auto result = RunIt(*Shell("echo data > " + dir + "/f; echo still here"));
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->signal, SIGXFSZ);
  EXPECT_THAT(result->output, Not(HasSubstr("still here")));
  struct stat st;
  if (::stat((dir + "/f").c_str(), &st) == 0) {
    EXPECT_EQ(st.st_size, 0);
  }
  std::system(("rm -rf " + dir).c_str());
}

TEST(HelperProcess, Run_AsRoot_RunsAsTheUserWithNoGroupsAndNoNewPrivileges) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root";
  auto result = RunIt(*Shell("id -u; id -G; grep NoNewPrivs /proc/self/status"));
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->output, "65534\n65534\nNoNewPrivs:\t1\n");
}

TEST(HelperProcess, Create_UnknownUser_InvalidArgumentNamingIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "the user is looked up only as root";
  HelperProcess::Options options;
  options.program = "/bin/true";
  options.user = "no-such-user-here";
  EXPECT_THAT(HelperProcess::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no-such-user-here")));
}

TEST(HelperProcess, Create_MissingProgram_FailedPrecondition) {
  HelperProcess::Options options;
  options.program = "/nonexistent/ddp-validate";
  EXPECT_THAT(HelperProcess::Create(options),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("/nonexistent")));
}

TEST(HelperProcess, Run_ExecFails_InternalSayingWhere) {
  // A folder passes access(X_OK) for root but can't be executed.
  HelperProcess::Options options;
  options.program = "/tmp";
  options.user = "";
  auto helper = HelperProcess::Create(options);
  if (!helper.ok()) GTEST_SKIP() << "not root: " << helper.status();
  EXPECT_THAT((*helper)->Run("", absl::Seconds(30), kGoOn),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("exec")));
}

TEST(HelperProcess, Run_PastTheDeadline_KilledWithDeadlineExceeded) {
  FakeClock clock;
  HelperProcess::Options options;
  options.clock = &clock;
  auto helper = Helper("/bin/sleep", {"600"}, options);
  // No time at all: the deadline has passed when it first looks.
  EXPECT_THAT(helper->Run("", absl::ZeroDuration(), kGoOn),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST(HelperProcess, Run_Stopped_KilledWithCancelled) {
  const std::atomic<bool> stop{true};
  EXPECT_THAT(Helper("/bin/sleep", {"600"})->Run("", absl::Seconds(30), stop),
              StatusIs(absl::StatusCode::kCancelled));
}

TEST(HelperProcess, Run_EndlessOutput_KilledWithResourceExhausted) {
  HelperProcess::Options options;
  options.max_output_bytes = 1000;
  EXPECT_THAT(RunIt(*Helper("/usr/bin/yes", {}, options)),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("1000 bytes")));
}

}  // namespace
}  // namespace ddp
