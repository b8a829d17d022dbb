// Confines the thread that runs a job's code (a TorchScript model, the
// job's data files, its checkpoints) to what the job needs, whatever that
// code tries at step 10,000: the check at submission can't prove that.
//
// Two kernel mechanisms, both per thread and inherited by the threads the
// confined one starts later (its communicator's, its OpenMP team), so the
// worker's other threads (the coordinator link, heartbeats) go on as
// before:
//  - Landlock: files may be read only under `read`, written only under
//    `write` (plus /dev/shm for the shared-memory communicator); the system
//    libraries stay readable and executable.
//  - seccomp: no new processes (fork, vfork, exec, clone without
//    CLONE_THREAD), no ptrace or reading other processes' memory, no
//    signals to other processes, no namespaces, bpf, perf or io_uring, and
//    sockets only for TCP (the communicator, the coordinator link), Unix
//    and route netlink: no UDP, raw or packet sockets.
// A refused call fails with EACCES (files) or EPERM (the rest).
#ifndef DDP_WORKER_CONFINEMENT_H_
#define DDP_WORKER_CONFINEMENT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddp/v1/job.pb.h"

namespace ddp {

struct Confinement {
  // Files or folders (with everything under them) the code may read.
  std::vector<std::string> read;
  // The same, resolved when the job was checked (its pins' real paths: no
  // symbolic link on them): opened now without following any link, so one
  // put on the path since (a folder swapped for a link to /) is refused,
  // not followed.
  std::vector<std::string> read_checked;
  // Folders (with everything under them) the code may read, write, create
  // and remove files in; created (0750) if missing and possible (one that
  // can't be made stays out of reach, for its user to report).
  std::vector<std::string> write;
  // The same, resolved when the job was checked: opened now without
  // following any link.
  std::vector<std::string> write_checked;
  // Files the code may read and append to; created (0640) if missing.
  std::vector<std::string> write_files;
  // Device files a GPU needs (/dev/nvidia*), opened read-write with ioctls.
  bool gpu = false;
};

// How a worker confines the threads that run a job's code.
struct JobConfinementOptions {
  // The worker trains on a GPU.
  bool gpu = false;
  // Where the kernel can't confine, run the job's code anyway (with a
  // warning) instead of refusing it.
  bool allow_unconfined = false;
  // The worker's own files the job's thread appends to (metrics, index log).
  std::vector<std::string> files;
};

// What a job's code needs: its model, data and test files to read; its
// checkpoint folder and its output's folder to write; the options' files
// to append to.
Confinement ConfinementForJob(const v1::JobSpec& spec, const JobConfinementOptions& options);

// Confines the calling thread to ConfinementForJob. Where the kernel can't,
// FAILED_PRECONDITION saying why and what to do, or (allow_unconfined) a
// warning and OK.
absl::Status ConfineJobThread(const v1::JobSpec& spec, const JobConfinementOptions& options);

// As ConfineJobThread, for a job's process while it is still one thread:
// every thread it starts inherits the confinement, and ConfineJobThread for
// the same spec then has nothing to add (it returns OK at once).
absl::Status ConfineJobProcess(const v1::JobSpec& spec, const JobConfinementOptions& options);

// The Landlock ABI version this kernel offers, or UNAVAILABLE saying why
// there is none (kernel too old, or disabled at boot).
absl::StatusOr<int> LandlockAbi();

// Confines the calling thread (and the threads it starts from now on) for
// good: there is no way back. FAILED_PRECONDITION when the kernel lacks
// Landlock or seccomp; INVALID_ARGUMENT for a path that can't be opened.
absl::Status ConfineThisThread(const Confinement& confinement);

// Says, for an error message, that the confinement refused a call: appended
// to a job's failure when its text says EACCES/EPERM.
std::string ExplainRefusal(const std::string& message);

}  // namespace ddp

#endif  // DDP_WORKER_CONFINEMENT_H_
