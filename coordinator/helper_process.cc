#include "coordinator/helper_process.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

namespace ddp {
namespace {

constexpr absl::Duration kPollSlice = absl::Milliseconds(50);
// Read from stderr per wake-up, of which only the tail is kept.
constexpr size_t kStderrReadBudget = 1 << 20;

// The step before exec that failed in the child, reported through a pipe.
enum ChildStep : int {
  kRedirect = 1,
  kLimits,
  kDirectory,
  kGroups,
  kGid,
  kUid,
  kCapabilities,
  kNoNewPrivs,
  kParentDeath,
  kExec
};

// write(2) to a pipe whose reader is gone (a helper that exited without
// reading all of stdin) raises SIGPIPE, which would end the coordinator:
// blocked for this thread around the write, and a pending one taken, so the
// write just fails with EPIPE whatever the process's disposition.
ssize_t WriteWithoutSigpipe(int fd, const char* data, size_t size) {
  sigset_t pipe_only;
  sigset_t before;
  ::sigemptyset(&pipe_only);
  ::sigaddset(&pipe_only, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe_only, &before);
  const ssize_t w = ::write(fd, data, size);
  const int saved = errno;
  if (w < 0 && saved == EPIPE) {
    const struct timespec now = {0, 0};
    while (::sigtimedwait(&pipe_only, nullptr, &now) == SIGPIPE) {
    }
  }
  ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  errno = saved;
  return w;
}

const char* StepName(int step) {
  switch (step) {
    case kRedirect:
      return "redirecting stdin/stdout/stderr";
    case kLimits:
      return "setting resource limits";
    case kDirectory:
      return "changing to /";
    case kGroups:
      return "dropping supplementary groups";
    case kGid:
      return "changing group";
    case kUid:
      return "changing user";
    case kCapabilities:
      return "dropping capabilities";
    case kNoNewPrivs:
      return "setting no_new_privs";
    case kParentDeath:
      return "tying it to the coordinator";
    case kExec:
      return "exec";
    default:
      return "starting it";
  }
}

struct ChildFailure {
  int step = 0;
  int error = 0;
};

// A file descriptor that closes itself.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    Close();
    fd_ = std::exchange(other.fd_, -1);
    return *this;
  }
  ~Fd() { Close(); }
  int get() const { return fd_; }
  bool open() const { return fd_ >= 0; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// A close-on-exec pipe whose ends are above stderr, so the child's dup2
// onto 0, 1 and 2 never meets them.
absl::Status MakePipe(Fd* read_end, Fd* write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", ::strerror(errno)));
  }
  for (int& fd : fds) {
    if (fd < 3) {
      const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
      ::close(fd);
      fd = moved;
    }
  }
  *read_end = Fd(fds[0]);
  *write_end = Fd(fds[1]);
  if (!read_end->open() || !write_end->open()) {
    return absl::InternalError(absl::StrCat("pipe: ", ::strerror(errno)));
  }
  return absl::OkStatus();
}

void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Everything the child needs, prepared before fork: after fork the child
// makes only async-signal-safe calls (raw syscalls for the user change,
// which glibc would otherwise broadcast to threads the child doesn't have).
struct ChildPlan {
  const char* program = nullptr;
  std::vector<char*> argv, envp;
  int stdin_fd = -1, stdout_fd = -1, stderr_fd = -1, report_fd = -1;
  int max_fd = 1024;
  rlimit address_space{}, cpu{}, core{}, file_size{}, open_files{};
  std::optional<uid_t> uid;
  gid_t gid = 0;
  pid_t parent = 0;
};

[[noreturn]] void ChildFail(int report_fd, int step) {
  ChildFailure failure{step, errno};
  [[maybe_unused]] ssize_t n = ::write(report_fd, &failure, sizeof(failure));
  ::_exit(127);
}

[[noreturn]] void RunChild(const ChildPlan& p) {
  ::setpgid(0, 0);
  const int from[3] = {p.stdin_fd, p.stdout_fd, p.stderr_fd};
  for (int target = 0; target < 3; ++target) {
    if (::dup2(from[target], target) < 0) ChildFail(p.report_fd, kRedirect);
  }
  // Every other descriptor closes at exec (the report pipe among them).
  if (::syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC) != 0) {
    for (int fd = 3; fd < p.max_fd; ++fd) {
      if (fd != p.report_fd) ::close(fd);
    }
  }
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction default_action = {};
  default_action.sa_handler = SIG_DFL;
  ::sigaction(SIGPIPE, &default_action, nullptr);
  if (::setrlimit(RLIMIT_AS, &p.address_space) != 0 || ::setrlimit(RLIMIT_CPU, &p.cpu) != 0 ||
      ::setrlimit(RLIMIT_CORE, &p.core) != 0 || ::setrlimit(RLIMIT_FSIZE, &p.file_size) != 0 ||
      ::setrlimit(RLIMIT_NOFILE, &p.open_files) != 0) {
    ChildFail(p.report_fd, kLimits);
  }
  if (::chdir("/") != 0) ChildFail(p.report_fd, kDirectory);
  if (p.uid.has_value()) {
    if (::syscall(SYS_setgroups, 0, nullptr) != 0) ChildFail(p.report_fd, kGroups);
    if (::syscall(SYS_setresgid, p.gid, p.gid, p.gid) != 0) ChildFail(p.report_fd, kGid);
    if (::syscall(SYS_setresuid, *p.uid, *p.uid, *p.uid) != 0) ChildFail(p.report_fd, kUid);
    // Only leaving uid 0 clears capabilities: a coordinator that runs as
    // its own user with CAP_SETUID/CAP_SETGID (the systemd unit) would pass
    // them on, ambient ones even through exec. None survive.
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct none[_LINUX_CAPABILITY_U32S_3] = {};
    if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 ||
        ::syscall(SYS_capset, &header, none) != 0) {
      ChildFail(p.report_fd, kCapabilities);
    }
  }
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ChildFail(p.report_fd, kNoNewPrivs);
  // After the user change, which clears it.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != p.parent) {
    ChildFail(p.report_fd, kParentDeath);
  }
  ::execve(p.program, p.argv.data(), p.envp.data());
  ChildFail(p.report_fd, kExec);
}

// Reads what is there, up to `budget` bytes, without blocking; false at
// end of file or on an error.
bool ReadSome(int fd, std::string* out, size_t budget) {
  char chunk[1 << 14];
  while (budget > 0) {
    const ssize_t n = ::read(fd, chunk, std::min(sizeof(chunk), budget));
    if (n > 0) {
      out->append(chunk, n);
      budget -= n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && errno == EAGAIN;
  }
  return true;
}

// The running child: killed and reaped when it goes out of scope, unless
// it was reaped already.
class Child {
 public:
  explicit Child(pid_t pid) : pid_(pid) {}
  ~Child() { Kill(); }
  // True once it has exited, with its wait status.
  bool Exited(int* wait_status) {
    if (reaped_) return true;
    if (::waitpid(pid_, wait_status, WNOHANG) == pid_) reaped_ = true;
    return reaped_;
  }
  void Kill() {
    if (reaped_) return;
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
    int ignored;
    while (::waitpid(pid_, &ignored, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
  }

 private:
  const pid_t pid_;
  bool reaped_ = false;
};

// Root, or a user holding CAP_SETUID and CAP_SETGID (the systemd unit runs
// the coordinator as ddp with those two alone).
bool CanChangeUser() {
  if (::geteuid() == 0) return true;
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct caps[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capget, &header, caps) != 0) return false;
  auto has = [&](int cap) { return (caps[CAP_TO_INDEX(cap)].effective & CAP_TO_MASK(cap)) != 0; };
  return has(CAP_SETUID) && has(CAP_SETGID);
}

// The helper's pipes: stdin, stdout, stderr, and the report pipe on which
// the child says why it could not exec.
struct Pipes {
  Fd in_read, in_write, out_read, out_write, err_read, err_write, report_read, report_write;

  absl::Status Make() {
    for (auto [r, w] : {std::pair{&in_read, &in_write}, std::pair{&out_read, &out_write},
                        std::pair{&err_read, &err_write}, std::pair{&report_read, &report_write}}) {
      if (absl::Status s = MakePipe(r, w); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  // After fork, the parent keeps its own ends only: the child's closing
  // its ends is then seen as end of file.
  void CloseChildEnds() {
    in_read.Close();
    out_write.Close();
    err_write.Close();
    report_write.Close();
  }
};

// What the child will do, prepared in the parent. Points into `options`,
// which must outlive it.
ChildPlan PlanChild(const HelperProcess::Options& options, std::optional<uid_t> uid, gid_t gid,
                    const Pipes& pipes) {
  ChildPlan plan;
  plan.program = options.program.c_str();
  plan.argv.push_back(const_cast<char*>(options.program.c_str()));
  for (const std::string& arg : options.args) plan.argv.push_back(const_cast<char*>(arg.c_str()));
  plan.argv.push_back(nullptr);
  for (const std::string& var : options.env) plan.envp.push_back(const_cast<char*>(var.c_str()));
  plan.envp.push_back(nullptr);
  plan.stdin_fd = pipes.in_read.get();
  plan.stdout_fd = pipes.out_write.get();
  plan.stderr_fd = pipes.err_write.get();
  plan.report_fd = pipes.report_write.get();
  rlimit files;
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0) {
    plan.max_fd = static_cast<int>(std::min<rlim_t>(files.rlim_cur, 1 << 20));
  }
  plan.address_space = {options.max_address_space_bytes, options.max_address_space_bytes};
  // SIGXCPU at the soft limit; SIGKILL a little later should it be caught.
  plan.cpu = {options.max_cpu_seconds, options.max_cpu_seconds + 2};
  plan.core = {0, 0};
  plan.file_size = {0, 0};
  plan.open_files = {options.max_open_files, options.max_open_files};
  plan.uid = uid;
  plan.gid = gid;
  plan.parent = ::getpid();
  return plan;
}

// The report pipe closes at exec; before, the child writes why it failed.
// OK once it exec'd.
absl::Status ExecResult(const Fd& report_read, const std::string& program) {
  ChildFailure failure;
  ssize_t n;
  while ((n = ::read(report_read.get(), &failure, sizeof(failure))) < 0 && errno == EINTR) {
  }
  if (n != sizeof(failure)) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("can't start ", program, ": ", StepName(failure.step),
                                          ": ", ::strerror(failure.error)));
}

// The parent's side of a running child's pipes: feeds its stdin and takes
// its stdout and the tail of its stderr, within the bounds of `options`,
// never blocking but in Poll.
class ChildIo {
 public:
  ChildIo(const HelperProcess::Options& options, Pipes& pipes, absl::string_view input)
      : options_(options), pipes_(pipes), input_(input) {
    SetNonBlocking(pipes_.in_write.get());
    SetNonBlocking(pipes_.out_read.get());
    SetNonBlocking(pipes_.err_read.get());
    if (input_.empty()) pipes_.in_write.Close();
  }

  // Waits up to a poll slice for a pipe, or `exited`, to be ready.
  void Poll(const Fd& exited) {
    pollfd fds[4];
    int count = 0;
    const Fd* const all[] = {&pipes_.in_write, &pipes_.out_read, &pipes_.err_read, &exited};
    for (const Fd* fd : all) {
      if (!fd->open()) continue;
      fds[count++] = {fd->get(), static_cast<short>(fd == &pipes_.in_write ? POLLOUT : POLLIN), 0};
    }
    ::poll(fds, count, static_cast<int>(absl::ToInt64Milliseconds(kPollSlice)));
  }

  // Writes what stdin takes now; closes it once all is written, or the
  // child stopped reading.
  void Feed() {
    Fd& in = pipes_.in_write;
    if (!in.open()) return;
    const ssize_t w =
        WriteWithoutSigpipe(in.get(), input_.data() + written_, input_.size() - written_);
    if (w > 0) written_ += w;
    if (written_ == input_.size() || (w < 0 && errno != EAGAIN && errno != EINTR)) in.Close();
  }

  // Takes what the pipes hold, within bounds; false when stdout overflowed.
  bool Drain() {
    Fd& out = pipes_.out_read;
    Fd& err = pipes_.err_read;
    if (out.open() &&
        !ReadSome(out.get(), &output_, options_.max_output_bytes + 1 - output_.size())) {
      out.Close();
    }
    if (err.open() && !ReadSome(err.get(), &err_, kStderrReadBudget)) err.Close();
    if (err_.size() > options_.stderr_tail_bytes) {
      err_.erase(0, err_.size() - options_.stderr_tail_bytes);
    }
    return output_.size() <= options_.max_output_bytes;
  }

  absl::Status Overflow() const {
    return absl::ResourceExhaustedError(
        absl::StrCat("wrote more than ", options_.max_output_bytes, " bytes on stdout"));
  }

  // What the child left, once it exited with `wait_status`.
  HelperProcess::Result Take(int wait_status) {
    HelperProcess::Result result;
    result.output = std::move(output_);
    result.stderr_tail = std::move(err_);
    if (WIFEXITED(wait_status)) result.exit_code = WEXITSTATUS(wait_status);
    if (WIFSIGNALED(wait_status)) result.signal = WTERMSIG(wait_status);
    return result;
  }

 private:
  const HelperProcess::Options& options_;
  Pipes& pipes_;
  const absl::string_view input_;
  size_t written_ = 0;
  std::string output_;
  std::string err_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HelperProcess>> HelperProcess::Create(Options options) {
  if (options.program.empty() || options.program[0] != '/' ||
      ::access(options.program.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("can't run ", options.program, ": ",
                     options.program.empty() || options.program[0] != '/' ? "not an absolute path"
                                                                          : ::strerror(errno)));
  }
  std::optional<uid_t> uid;
  gid_t gid = 0;
  if (CanChangeUser() && !options.user.empty()) {
    std::vector<char> buffer(1 << 14);
    passwd entry;
    passwd* found = nullptr;
    ::getpwnam_r(options.user.c_str(), &entry, buffer.data(), buffer.size(), &found);
    if (found == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("user \"", options.user, "\" does not exist on this machine"));
    }
    uid = found->pw_uid;
    gid = found->pw_gid;
  }
  return std::unique_ptr<HelperProcess>(new HelperProcess(std::move(options), uid, gid));
}

std::string HelperProcess::user_description() const {
  if (!uid_.has_value()) return "the coordinator's own user";
  return absl::StrCat(options_.user, " (uid ", *uid_, ")");
}

absl::StatusOr<HelperProcess::Result> HelperProcess::Run(absl::string_view input,
                                                         absl::Duration timeout,
                                                         const std::atomic<bool>& stop) const {
  Pipes pipes;
  if (absl::Status s = pipes.Make(); !s.ok()) return s;
  const ChildPlan plan = PlanChild(options_, uid_, gid_, pipes);
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", ::strerror(errno)));
  if (pid == 0) RunChild(plan);
  Child child(pid);
  ::setpgid(pid, pid);  // also here, so the group exists before any kill
  // Readable when it exits, so the wait below wakes at once (without it,
  // within a poll slice).
  Fd exited(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  pipes.CloseChildEnds();
  if (absl::Status s = ExecResult(pipes.report_read, options_.program); !s.ok()) return s;

  ChildIo io(options_, pipes, input);
  const absl::Time deadline = options_.clock->Now() + timeout;
  int wait_status = 0;
  while (true) {
    if (stop.load()) return absl::CancelledError("stopped");
    if (options_.clock->Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("still running after ", absl::FormatDuration(timeout)));
    }
    io.Poll(exited);
    io.Feed();
    if (!io.Drain()) return io.Overflow();
    if (child.Exited(&wait_status)) break;
  }
  // It exited: take what is still in the pipes.
  if (!io.Drain()) return io.Overflow();
  return io.Take(wait_status);
}

}  // namespace ddp
