// A job's process (worker/process/job_process.h), from its side: it reads
// the daemon's start, confines itself to the job before any other thread
// exists and before it opens any of the job's files (no_new_privs, seccomp,
// Landlock, no core dumps), then runs what the daemon passes on from the
// coordinator in this process (InProcessJobs), sending back what it says
// and claims, until the daemon closes the channel.
#ifndef DDP_WORKER_JOB_HOST_H_
#define DDP_WORKER_JOB_HOST_H_

namespace ddp {

// ddp-worker's main when argv[1] is kJobProcessFlag: returns the exit code.
int RunJobProcess(int argc, char** argv);

}  // namespace ddp

#endif  // DDP_WORKER_JOB_HOST_H_
