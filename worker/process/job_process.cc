#include "worker/process/job_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"

extern char** environ;

namespace ddp {
namespace {

// A copy of `fd` numbered 10 or above, close-on-exec: dup2 onto 3 and 4 in
// the child then can't clobber one with the other, nor keep close-on-exec
// (dup2 of a descriptor onto itself would).
int HighCopy(int fd) { return ::fcntl(fd, F_DUPFD_CLOEXEC, 10); }

class SpawnSettings {
 public:
  SpawnSettings() {
    ::posix_spawn_file_actions_init(&actions_);
    ::posix_spawnattr_init(&attr_);
  }
  ~SpawnSettings() {
    ::posix_spawn_file_actions_destroy(&actions_);
    ::posix_spawnattr_destroy(&attr_);
  }
  absl::Status Build(int channel_fd, int board_fd) {
    if (::posix_spawn_file_actions_adddup2(&actions_, channel_fd, kJobProcessChannelFd) != 0 ||
        ::posix_spawn_file_actions_adddup2(&actions_, board_fd, kJobProcessBoardFd) != 0) {
      return absl::InternalError("posix_spawn_file_actions_adddup2 failed");
    }
    // In the daemon's process group (a SIGSTOP or SIGKILL of the group
    // reaches both), with the daemon's blocked signals unblocked and its
    // handlers gone; the process then ignores ^C and SIGTERM itself: the
    // daemon ends it.
    sigset_t none;
    sigemptyset(&none);
    ::posix_spawnattr_setsigmask(&attr_, &none);
    sigset_t defaults;
    sigemptyset(&defaults);
    for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD, SIGHUP}) sigaddset(&defaults, sig);
    ::posix_spawnattr_setsigdefault(&attr_, &defaults);
    ::posix_spawnattr_setflags(&attr_, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    return absl::OkStatus();
  }
  const posix_spawn_file_actions_t* actions() const { return &actions_; }
  const posix_spawnattr_t* attr() const { return &attr_; }

 private:
  posix_spawn_file_actions_t actions_;
  posix_spawnattr_t attr_;
};

}  // namespace

std::string DescribeWaitStatus(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return absl::StrCat("killed by signal ", sig, " (", ::strsignal(sig), ")");
  }
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  return absl::StrCat("ended with wait status ", status);
}

absl::StatusOr<std::unique_ptr<JobProcess>> JobProcess::Launch(const std::string& binary,
                                                               int board_fd, OnMessage on_message,
                                                               OnDeath on_death) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    return absl::InternalError(absl::StrCat("socketpair: ", std::strerror(errno)));
  }
  const int child_channel = HighCopy(pair[1]);
  const int child_board = HighCopy(board_fd);
  ::close(pair[1]);
  absl::Status status = child_channel >= 0 && child_board >= 0
                            ? absl::OkStatus()
                            : absl::InternalError(absl::StrCat("fcntl: ", std::strerror(errno)));
  SpawnSettings settings;
  if (status.ok()) status = settings.Build(child_channel, child_board);
  pid_t pid = -1;
  if (status.ok()) {
    const std::string parent = std::to_string(::getpid());
    std::vector<char*> argv = {const_cast<char*>("ddp-worker"), const_cast<char*>(kJobProcessFlag),
                               const_cast<char*>(parent.c_str()), nullptr};
    if (const int rc = ::posix_spawn(&pid, binary.c_str(), settings.actions(), settings.attr(),
                                     argv.data(), environ);
        rc != 0) {
      status = absl::InternalError(
          absl::StrCat("can't start the job's process (", binary, "): ", std::strerror(rc)));
    }
  }
  if (child_channel >= 0) ::close(child_channel);
  if (child_board >= 0) ::close(child_board);
  if (!status.ok()) {
    ::close(pair[0]);
    return status;
  }
  return std::unique_ptr<JobProcess>(
      new JobProcess(pid, pair[0], std::move(on_message), std::move(on_death)));
}

absl::Status JobProcess::Start(const v1::JobProcessStart& start) { return channel_.Send(start); }

JobProcess::JobProcess(pid_t pid, int fd, OnMessage on_message, OnDeath on_death)
    : pid_(pid),
      channel_(fd, kMaxFromJobProcessBytes),
      on_message_(std::move(on_message)),
      on_death_(std::move(on_death)) {
  reader_ = std::thread([this] { ReadLoop(); });
}

JobProcess::~JobProcess() {
  {
    absl::MutexLock lock(&mu_);
    asked_to_end_ = true;
  }
  channel_.CloseWrite();
  {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(&ended_), kEndGrace)) {
      DDP_LOG(Warning) << "the job's process (pid " << pid_ << ") did not end within " << kEndGrace
                       << "; killing it";
      ::kill(pid_, SIGKILL);
    }
  }
  reader_.join();
}

absl::Status JobProcess::Send(const v1::ToJobProcess& message) { return channel_.Send(message); }

bool JobProcess::ended() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

void JobProcess::ReadLoop() {
  std::string trouble;
  while (true) {
    v1::FromJobProcess message;
    absl::StatusOr<bool> got = channel_.Receive(&message);
    if (!got.ok()) {
      trouble = absl::StrCat(" after a bad message (", got.status().message(), ")");
      // Whatever it is doing, it is no longer a job's process we can trust.
      ::kill(pid_, SIGKILL);
      break;
    }
    if (!*got) break;
    on_message_(std::move(message));
  }
  const std::string how = Reap() + trouble;
  bool asked;
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    asked = asked_to_end_;
  }
  if (!asked) on_death_(how);
}

std::string JobProcess::Reap() {
  // It closed its end: it is exiting. One that closed it and lives on is
  // killed after the grace.
  const absl::Time deadline = absl::Now() + kEndGrace;
  int status = 0;
  while (true) {
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) return DescribeWaitStatus(status);
    if (r < 0 && errno != EINTR) return absl::StrCat("lost (waitpid: ", std::strerror(errno), ")");
    if (absl::Now() >= deadline) {
      ::kill(pid_, SIGKILL);
      if (::waitpid(pid_, &status, 0) == pid_) return DescribeWaitStatus(status);
      return "lost";
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

}  // namespace ddp
