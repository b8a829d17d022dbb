// One job's process, seen from the ddp-worker daemon that started it: the
// daemon's own binary run again (`--job_process`), which confines itself to
// the job before it opens any of the job's files and then trains it
// (worker/process/job_host.h). The two talk over a socket pair; the process
// writes its steps on a shared progress board.
//
// The process is in the daemon's process group, ignores SIGINT and SIGTERM
// (the daemon ends it, leaving its generation first) and dies with the
// daemon (PR_SET_PDEATHSIG). What it sends is read as untrusted: bounded, and a
// message that doesn't parse ends it.
#ifndef DDP_WORKER_PROCESS_JOB_PROCESS_H_
#define DDP_WORKER_PROCESS_JOB_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ddp/v1/job_process.pb.h"
#include "worker/process/message_channel.h"

namespace ddp {

// The flag that makes ddp-worker a job's process; its argument is the
// daemon's pid. The socket is descriptor 3, the board descriptor 4.
inline constexpr char kJobProcessFlag[] = "--job_process";
inline constexpr int kJobProcessChannelFd = 3;
inline constexpr int kJobProcessBoardFd = 4;
// The largest message either side reads: an assignment carries the job's
// spec (bounded far lower by the coordinator); the process's messages are
// step reports and state changes.
inline constexpr size_t kMaxToJobProcessBytes = 64 << 20;
inline constexpr size_t kMaxFromJobProcessBytes = 4 << 20;

class JobProcess {
 public:
  // Called on the process's reader thread, in the order it sent them.
  using OnMessage = std::function<void(v1::FromJobProcess message)>;
  // Called once, on the reader thread, when the process ended without being
  // asked (crashed, killed, exited, or sent what doesn't parse): how.
  using OnDeath = std::function<void(const std::string& how)>;

  // Starts `binary` as a job's process, which loads (LibTorch takes a
  // second or more) and waits for Start: a daemon keeps one ready so that a
  // new job waits for its data, not for a process.
  static absl::StatusOr<std::unique_ptr<JobProcess>> Launch(const std::string& binary, int board_fd,
                                                            OnMessage on_message, OnDeath on_death);
  // Gives it its job. Once.
  absl::Status Start(const v1::JobProcessStart& start);
  // Asks it to end (it leaves its generation and exits), waits up to
  // kEndGrace and kills it past that. Its last messages are still passed on.
  ~JobProcess();
  JobProcess(const JobProcess&) = delete;
  JobProcess& operator=(const JobProcess&) = delete;

  absl::Status Send(const v1::ToJobProcess& message);
  pid_t pid() const { return pid_; }
  // Whether it has ended (and was reaped). Thread-safe.
  bool ended() const;

  // How long an asked-to-end process is given before SIGKILL.
  static constexpr absl::Duration kEndGrace = absl::Seconds(10);

 private:
  JobProcess(pid_t pid, int fd, OnMessage on_message, OnDeath on_death);
  void ReadLoop();
  // Waits for the process to end (killing it past kEndGrace): how it ended.
  std::string Reap();

  const pid_t pid_;
  MessageChannel channel_;
  const OnMessage on_message_;
  const OnDeath on_death_;
  mutable absl::Mutex mu_;
  bool asked_to_end_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reader_;  // last: it starts once the fields above exist
};

// "killed by signal 11 (Segmentation fault)", "exited with status 2".
std::string DescribeWaitStatus(int status);

}  // namespace ddp

#endif  // DDP_WORKER_PROCESS_JOB_PROCESS_H_
