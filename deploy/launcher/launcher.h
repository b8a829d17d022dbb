// ddp-run's composition root: a log folder, a coordinator on a free loopback
// port, N ddp-worker daemons (or N copies of a program) joined to it, a
// progress display, and the job's outcome as the exit code. main.cc turns
// flags into Options; Launcher runs them.
//
// Threads: Start and Wait are called from one thread, in that order.
#ifndef DDP_DEPLOY_LAUNCHER_LAUNCHER_H_
#define DDP_DEPLOY_LAUNCHER_LAUNCHER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/credentials.h"
#include "ddp/v1/job.pb.h"
#include "deploy/launcher/child_processes.h"
#include "deploy/launcher/program_launch.h"
#include "deploy/launcher/progress_watcher.h"

namespace ddp {

// What ddp-run passes to its coordinator, its workers and its own watcher
// for TLS and tokens (on plain loopback, the coordinator makes its own).
struct LaunchSecurity {
  std::vector<std::string> coordinator_flags;
  std::vector<std::string> worker_flags;
  ClientSecurity watcher;
  std::string worker_token;  // written to the log folder for the workers
};

class Launcher {
 public:
  // Every flag checked already (main.cc).
  struct Options {
    std::vector<std::string> program;  // a program and its arguments; empty: ddp-worker
    v1::JobSpec spec;                  // min_workers and max_workers set
    int nproc = 1;
    int min_nproc = 1;
    int threads = 1;      // per worker
    std::string log_dir;  // --log_dir; empty: a new folder under /tmp
    int max_restarts = 0;
    bool status_page = true;
    bool verbose = false;                  // children's logs on the terminal
    std::vector<std::string> worker_args;  // more flags for every worker
    int metrics_port = 0;                  // 0: none
    LaunchSecurity security;
  };

  explicit Launcher(Options options);

  // Prepares the log folder, starts the coordinator, waits until it serves
  // and starts showing progress. nullopt: running; else the exit code to
  // leave with.
  std::optional<int> Start();
  // Runs the workers (or the program's copies) until the job ends, and
  // reports its outcome. Returns ddp-run's exit code: the job's, or
  // 128 + N when signal N stopped ddp-run.
  int Wait();

 private:
  std::optional<int> PrepareLogDir();
  std::optional<int> WriteWorkerToken();
  std::optional<int> AnnounceJob();
  std::optional<int> StartCoordinator();
  std::optional<int> AwaitCoordinatorPort();
  void FindWatcherToken();
  // The log file of child `name`; empty (the terminal) with verbose.
  std::string LogOf(const std::string& name) const;
  std::vector<std::string> WorkerArgs(int i) const;
  int RunWorkers();
  // A worker that exited with `code`: restarted while restarts are left.
  void OnWorkerExit(const std::string& name, int code, int& restarts_left);
  ProgramLaunch ProgramFor() const;
  // After the job: the rest of the progress, and what went wrong.
  void Report(int exit_code);

  Options options_;
  std::string dir_;
  std::string port_file_, status_file_, http_port_file_;
  std::string target_;  // the coordinator's HOST:PORT once it serves
  std::vector<std::string> env_;
  std::vector<std::vector<std::string>> worker_argv_;
  ChildProcesses children_;
  // Destroyed before children_: it watches the coordinator among them.
  std::unique_ptr<ProgressWatcher> watcher_;
};

}  // namespace ddp

#endif  // DDP_DEPLOY_LAUNCHER_LAUNCHER_H_
