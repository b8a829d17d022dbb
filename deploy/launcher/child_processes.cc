#include "deploy/launcher/child_processes.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/process.h"

namespace ddp {

ChildProcesses::~ChildProcesses() { StopAll(absl::Seconds(2)); }

absl::StatusOr<pid_t> ChildProcesses::Start(const std::string& name,
                                            const std::vector<std::string>& argv,
                                            const std::vector<std::string>& env,
                                            const std::string& log_path, bool append) {
  int log_fd = -1;
  if (!log_path.empty()) {
    log_fd = ::open(log_path.c_str(),
                    O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC) | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("can't write ", log_path, ": ", std::strerror(errno)));
    }
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // The environment is built before fork: the launcher has threads, and
  // the child may only make async-signal-safe calls until exec.
  std::vector<std::string> merged;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& add : env) overridden |= add.compare(0, key.size() + 1, key + "=") == 0;
    if (!overridden) merged.push_back(entry);
  }
  merged.insert(merged.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& e : merged) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the launcher died already
    ::setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (log_fd >= 0) {
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
    }
    ::execve(args[0], args.data(), envp.data());
    const char msg[] = "ddp-run: exec failed\n";
    (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  if (log_fd >= 0) ::close(log_fd);
  children_[pid] = name;
  return pid;
}

std::vector<std::pair<std::string, int>> ChildProcesses::Reap() {
  std::vector<std::pair<std::string, int>> exited;
  for (auto it = children_.begin(); it != children_.end();) {
    int status = 0;
    const pid_t r = ::waitpid(it->first, &status, WNOHANG);
    if (r == 0) {
      ++it;
      continue;
    }
    int code = 255;
    if (r > 0 && WIFEXITED(status)) code = WEXITSTATUS(status);
    if (r > 0 && WIFSIGNALED(status)) code = 128 + WTERMSIG(status);
    exited.emplace_back(it->second, code);
    it = children_.erase(it);
  }
  return exited;
}

void ChildProcesses::StopAll(absl::Duration grace) {
  if (children_.empty()) return;
  // The whole process group each child leads: a program's own children
  // (a shell's, say) go with it, and don't hold the terminal or pipes.
  for (const auto& [pid, name] : children_) ::kill(-pid, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  while (!children_.empty() && absl::Now() < deadline) {
    Reap();
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (const auto& [pid, name] : children_) ::kill(-pid, SIGKILL);
  for (const auto& [pid, name] : children_) ::waitpid(pid, nullptr, 0);
  children_.clear();
}

std::optional<int> ChildProcesses::StopOnTermination(absl::Duration wait, absl::Duration grace) {
  const int sig = WaitForTermination(wait);
  if (sig == 0) return std::nullopt;
  std::cerr << "ddp-run: " << (sig == SIGINT ? "interrupted" : "terminated")
            << "; stopping every process" << std::endl;
  interrupted_ = true;
  StopAll(grace);
  return 128 + sig;
}

}  // namespace ddp
