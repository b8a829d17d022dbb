#include "tests/etcd_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/etcd_client.h"

namespace ddp {
namespace {

constexpr int kStartAttempts = 3;
constexpr size_t kLogTailBytes = 3000;

std::string FindEtcd() {
  const char* path = std::getenv("PATH");
  std::vector<std::string> dirs = absl::StrSplit(path ? path : "", ':', absl::SkipEmpty());
  dirs.push_back("/usr/bin");  // where etcd-server puts it, whatever PATH says
  for (const std::string& dir : dirs) {
    const std::string candidate = dir + "/etcd";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// `n` loopback ports nobody listens on now: all bound at once, so that they
// differ, then released for etcd to take (someone may take one first: Start
// tries again then).
absl::StatusOr<std::vector<int>> FreePorts(int n) {
  std::vector<int> fds;
  std::vector<int> ports;
  absl::Status status;
  for (int i = 0; i < n && status.ok(); ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      status =
          absl::InternalError(absl::StrCat("can't bind a loopback port: ", std::strerror(errno)));
    } else {
      ports.push_back(ntohs(addr.sin_port));
    }
    if (fd >= 0) fds.push_back(fd);
  }
  for (int fd : fds) ::close(fd);
  if (!status.ok()) return status;
  return ports;
}

std::string Tail(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  return all.size() > kLogTailBytes ? "..." + all.substr(all.size() - kLogTailBytes) : all;
}

std::string Url(int port) { return absl::StrCat("http://127.0.0.1:", port); }

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::Start(int members) {
  if (members < 1) return absl::InvalidArgumentError("an etcd cluster needs a member");
  const std::string etcd = FindEtcd();
  if (etcd.empty()) {
    return absl::FailedPreconditionError(
        "etcd is not installed (no etcd on PATH or in /usr/bin): apt-get install etcd-server "
        "(deploy/setup.sh installs it)");
  }
  absl::Status last;
  for (int attempt = 0; attempt < kStartAttempts; ++attempt) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/ddp-etcd-XXXXXX");
    if (::mkdtemp(pattern.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("mkdtemp ", pattern, ": ", std::strerror(errno)));
    }
    std::unique_ptr<EtcdCluster> cluster(new EtcdCluster(etcd, pattern));
    cluster->token_ = absl::StrCat("ddp-test-", ::getpid(), "-", attempt);
    absl::StatusOr<std::vector<int>> ports = FreePorts(2 * members);
    if (!ports.ok()) return ports.status();
    for (int i = 0; i < members; ++i) {
      Member m;
      m.name = absl::StrCat("m", i);
      m.dir = absl::StrCat(pattern, "/", m.name);
      m.client_port = (*ports)[2 * i];
      m.peer_port = (*ports)[2 * i + 1];
      if (::mkdir(m.dir.c_str(), 0700) != 0) {
        return absl::InternalError(absl::StrCat("mkdir ", m.dir, ": ", std::strerror(errno)));
      }
      cluster->members_.push_back(std::move(m));
    }
    std::vector<int> all;
    last = absl::OkStatus();
    for (int i = 0; i < members && last.ok(); ++i) {
      last = cluster->Spawn(i, /*existing=*/false);
      all.push_back(i);
    }
    if (last.ok()) last = cluster->WaitReady(all, kStartTimeout);
    if (last.ok()) return cluster;
    // A member that exited at once most likely lost its port to someone
    // else: new ports. A cluster that never answered won't do better.
    if (!absl::IsAborted(last)) break;
  }
  return last;
}

EtcdCluster::~EtcdCluster() {
  for (int i = 0; i < size(); ++i) Kill(i);
  std::error_code ignored;
  std::filesystem::remove_all(base_, ignored);
}

std::vector<std::string> EtcdCluster::client_endpoints() const {
  std::vector<std::string> endpoints;
  for (const Member& m : members_) endpoints.push_back(absl::StrCat("127.0.0.1:", m.client_port));
  return endpoints;
}

void EtcdCluster::Kill(int i) {
  Member& m = members_[i];
  if (m.pid <= 0) return;
  ::kill(m.pid, SIGKILL);
  int status = 0;
  while (::waitpid(m.pid, &status, 0) < 0 && errno == EINTR) {
  }
  m.pid = -1;
}

void EtcdCluster::Stop(int i) {
  if (members_[i].pid > 0) ::kill(members_[i].pid, SIGSTOP);
}

void EtcdCluster::Cont(int i) {
  if (members_[i].pid > 0) ::kill(members_[i].pid, SIGCONT);
}

absl::Status EtcdCluster::Restart(int i) {
  Kill(i);
  absl::Status s = Spawn(i, /*existing=*/true);
  if (!s.ok()) return s;
  return WaitReady({i}, kStartTimeout);
}

std::string EtcdCluster::Log(int i) const { return Tail(members_[i].dir + "/etcd.log"); }

absl::Status EtcdCluster::Spawn(int i, bool existing) {
  Member& m = members_[i];
  std::vector<std::string> initial;
  for (const Member& other : members_) {
    initial.push_back(absl::StrCat(other.name, "=", Url(other.peer_port)));
  }
  const std::vector<std::string> argv = {
      etcd_,
      "--name=" + m.name,
      "--data-dir=" + m.dir + "/data",
      "--listen-client-urls=" + Url(m.client_port),
      "--advertise-client-urls=" + Url(m.client_port),
      "--listen-peer-urls=" + Url(m.peer_port),
      "--initial-advertise-peer-urls=" + Url(m.peer_port),
      "--initial-cluster=" + absl::StrJoin(initial, ","),
      existing ? "--initial-cluster-state=existing" : "--initial-cluster-state=new",
      "--initial-cluster-token=" + token_,
      // Elections in well under a second (etcd wants the election timeout
      // at least 5 heartbeats); this also makes 1 s etcd's shortest lease.
      "--heartbeat-interval=50",
      "--election-timeout=500",
      // A restarted member would otherwise force an election as it comes
      // back, failing calls with "leader changed" (off by default in 3.4).
      "--pre-vote=true",
      "--snapshot-count=10000",
      "--logger=zap",
      "--log-outputs=stderr",
      "--log-level=error",
  };
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::string log_path = m.dir + "/etcd.log";
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (log_fd < 0) {
    return absl::InternalError(absl::StrCat("can't write ", log_path, ": ", std::strerror(errno)));
  }
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec (gRPC has threads).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    ::execv(args[0], args.data());
    const char msg[] = "etcd_cluster: exec failed\n";
    (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(log_fd);
  if (null_fd >= 0) ::close(null_fd);
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(fork_errno)));
  m.pid = pid;
  return absl::OkStatus();
}

absl::Status EtcdCluster::WaitReady(const std::vector<int>& members, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::unique_ptr<EtcdClient>> clients(members_.size());
  for (int i : members) {
    EtcdClient::Options options;
    options.endpoints = {client_endpoints()[i]};
    options.timeout = absl::Milliseconds(500);
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(options);
    if (!client.ok()) return client.status();
    clients[i] = *std::move(client);
  }
  std::vector<int> waiting = members;
  absl::Status last;
  while (!waiting.empty()) {
    std::vector<int> still;
    for (int i : waiting) {
      Member& m = members_[i];
      int status = 0;
      if (::waitpid(m.pid, &status, WNOHANG) == m.pid) {
        m.pid = -1;
        return absl::AbortedError(absl::StrCat("etcd member ", m.name, " exited (status ", status,
                                               "); its log:\n", Log(i)));
      }
      // A linearizable read: answered only once the member has a leader.
      last = clients[i]->Range("ddp-etcd-cluster-probe").status();
      if (!last.ok()) still.push_back(i);
    }
    waiting = std::move(still);
    if (waiting.empty()) break;
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "etcd member ", members_[waiting[0]].name, " did not answer within ",
          absl::FormatDuration(timeout), " (", last.ToString(), "); its log:\n", Log(waiting[0])));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::OkStatus();
}

}  // namespace ddp
