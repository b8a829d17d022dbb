// The processes ddp-run starts, and the guarantee that none outlives it.
#ifndef DDP_DEPLOY_LAUNCHER_CHILD_PROCESSES_H_
#define DDP_DEPLOY_LAUNCHER_CHILD_PROCESSES_H_

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ddp {

// Not thread-safe: the launcher's main thread owns it.
class ChildProcesses {
 public:
  ~ChildProcesses();  // kills whatever still runs

  // Starts `argv` with `env` added to the environment and stderr and stdout
  // written to `log_path` (emptied first, unless `append`) (or inherited
  // when empty). Each child gets its
  // own process group, so a terminal's Ctrl-C reaches only the launcher,
  // and dies with the launcher even if the launcher is killed.
  absl::StatusOr<pid_t> Start(const std::string& name, const std::vector<std::string>& argv,
                              const std::vector<std::string>& env, const std::string& log_path,
                              bool append = false);

  // Reaps children that exited; returns (name, exit code) for each, where a
  // death by signal N reads as 128 + N.
  std::vector<std::pair<std::string, int>> Reap();

  // Sends SIGTERM to every running child's process group, waits up to
  // `grace`, then SIGKILL.
  void StopAll(absl::Duration grace);

  // Waits up to `wait` for SIGINT or SIGTERM to the launcher; if one came,
  // says so, stops every child (StopAll(grace)) and returns 128 + the
  // signal. interrupted() says so from then on.
  std::optional<int> StopOnTermination(absl::Duration wait, absl::Duration grace);
  bool interrupted() const { return interrupted_; }

  bool running(pid_t pid) const { return children_.count(pid) > 0; }
  size_t num_running() const { return children_.size(); }

 private:
  std::map<pid_t, std::string> children_;
  bool interrupted_ = false;
};

}  // namespace ddp

#endif  // DDP_DEPLOY_LAUNCHER_CHILD_PROCESSES_H_
