// Runs a helper program the coordinator does not trust (ddp-validate, which
// runs a submitted job's own code) as a child process, boxed in:
//  - unprivileged: when the coordinator runs as root, or as another user
//    holding CAP_SETUID and CAP_SETGID (as the systemd unit runs it), the
//    child runs as `user` (its primary group, no supplementary groups, no
//    capabilities), with PR_SET_NO_NEW_PRIVS, set before exec;
//  - limited: address space, CPU seconds, no core dumps, no file written
//    (RLIMIT_FSIZE 0), few open files; and a deadline, past which it is
//    killed;
//  - alone: an environment of its own (nothing inherited), working
//    directory "/", no descriptor of the coordinator's but its stdin,
//    stdout and stderr (pipes), its own process group, killed if the thread
//    that started it goes away;
//  - heard within bounds: at most max_output bytes of stdout are taken (more
//    kills it), and only the tail of stderr is kept.
#ifndef DDP_COORDINATOR_HELPER_PROCESS_H_
#define DDP_COORDINATOR_HELPER_PROCESS_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace ddp {

class HelperProcess {
 public:
  struct Options {
    std::string program;            // absolute path
    std::vector<std::string> args;  // after argv[0]
    std::vector<std::string> env;   // its whole environment, "NAME=value"
    // When the coordinator may change user (root, or CAP_SETUID and
    // CAP_SETGID), the child runs as this user. Ignored otherwise (the
    // child keeps the coordinator's user).
    std::string user = "nobody";
    uint64_t max_address_space_bytes = uint64_t{4} << 30;
    uint64_t max_cpu_seconds = 60;
    uint64_t max_open_files = 64;
    size_t max_output_bytes = 64 << 10;
    size_t stderr_tail_bytes = 2 << 10;
    // The deadline is measured on it. Not owned.
    const Clock* clock = RealClock::Get();
  };

  struct Result {
    std::string output;       // all of stdout
    std::string stderr_tail;  // the last stderr_tail_bytes of stderr
    // How it ended: an exit code, or the signal that killed it.
    std::optional<int> exit_code;
    std::optional<int> signal;
  };

  // INVALID_ARGUMENT naming the user when it does not exist (checked only
  // when the coordinator may change user); FAILED_PRECONDITION when `program` is not an
  // executable file.
  static absl::StatusOr<std::unique_ptr<HelperProcess>> Create(Options options);

  // Runs the program once: `input` on its stdin (then closed), its output
  // gathered until it exits. DEADLINE_EXCEEDED when it runs past `timeout`,
  // CANCELLED when `stop` becomes true, RESOURCE_EXHAUSTED when its stdout
  // passes max_output_bytes: in each case it is killed first. INTERNAL
  // when it can't be started (the message says at which step).
  //
  // Blocks the calling thread until then (never call it on a gRPC thread);
  // notices `stop` within about 50 ms. Thread-safe. The child is tied to
  // the calling thread: should that thread exit, the child is killed.
  absl::StatusOr<Result> Run(absl::string_view input, absl::Duration timeout,
                             const std::atomic<bool>& stop) const;

  const Options& options() const { return options_; }
  // The user the child runs as, in words ("nobody (uid 65534)", or "the
  // coordinator's own user").
  std::string user_description() const;

 private:
  HelperProcess(Options options, std::optional<uid_t> uid, gid_t gid)
      : options_(std::move(options)), uid_(uid), gid_(gid) {}

  const Options options_;
  // Set when the child changes user.
  const std::optional<uid_t> uid_;
  const gid_t gid_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_HELPER_PROCESS_H_
