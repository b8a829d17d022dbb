#include "deploy/launcher/program_launch.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/process.h"
#include "deploy/launcher/child_processes.h"

namespace ddp {
namespace {

// A loopback port nobody listens on now (rank 0 binds it moments later).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

// `program` as a path to execute: as given when it has a '/', else the
// first executable of that name on PATH (as a shell finds it).
std::string Resolve(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    return ::access(program.c_str(), X_OK) == 0 ? program : "";
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", program);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

}  // namespace

int RunProgram(const ProgramLaunch& launch) {
  std::vector<std::string> argv = launch.argv;
  argv[0] = Resolve(launch.argv[0]);
  if (argv[0].empty()) {
    std::cerr << "ddp-run: " << launch.argv[0]
              << (launch.argv[0].find('/') != std::string::npos ? " is not an executable file"
                                                                : " is not on PATH")
              << "\n";
    return 127;
  }
  const int port = FreePort();
  if (port == 0) {
    std::cerr << "ddp-run: no free loopback port for the rendezvous\n";
    return 1;
  }
  std::cout << "ddp-run: " << launch.nproc << " rank(s) of " << absl::StrJoin(launch.argv, " ")
            << ", " << launch.threads << " thread(s) each, rendezvous at 127.0.0.1:" << port
            << (launch.log_dir.empty() ? "" : ", logs in " + launch.log_dir) << std::endl;
  ChildProcesses children;
  for (int rank = 0; rank < launch.nproc; ++rank) {
    const std::vector<std::string> env = {absl::StrCat("RANK=", rank),
                                          absl::StrCat("LOCAL_RANK=", rank),
                                          absl::StrCat("WORLD_SIZE=", launch.nproc),
                                          absl::StrCat("LOCAL_WORLD_SIZE=", launch.nproc),
                                          "MASTER_ADDR=127.0.0.1",
                                          absl::StrCat("MASTER_PORT=", port),
                                          absl::StrCat("OMP_NUM_THREADS=", launch.threads),
                                          absl::StrCat("OPENBLAS_NUM_THREADS=", launch.threads)};
    const std::string log =
        launch.log_dir.empty() ? "" : absl::StrCat(launch.log_dir, "/rank-", rank, ".log");
    auto started = children.Start(absl::StrCat("rank ", rank), argv, env, log);
    if (!started.ok()) {
      std::cerr << "ddp-run: " << started.status().message() << "\n";
      return 1;
    }
  }
  int finished = 0;
  while (finished < launch.nproc) {
    if (const int sig = WaitForTermination(absl::Milliseconds(100)); sig != 0) {
      std::cerr << "ddp-run: " << (sig == SIGINT ? "interrupted" : "terminated")
                << "; stopping every rank" << std::endl;
      children.StopAll(absl::Seconds(10));
      return 128 + sig;
    }
    for (const auto& [name, code] : children.Reap()) {
      ++finished;
      if (code == 0) continue;
      std::cerr << "ddp-run: " << name << " exited with code " << code
                << "; stopping the other ranks" << std::endl;
      children.StopAll(absl::Seconds(10));
      return code;
    }
  }
  std::cout << "ddp-run: all " << launch.nproc << " rank(s) finished" << std::endl;
  return 0;
}

}  // namespace ddp
