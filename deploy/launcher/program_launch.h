// ddp-run -- PROGRAM ARGS: N copies of a user's program that trains with
// the ddp library, started as torchrun starts a script: each with RANK,
// LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (a
// free loopback port rank 0 serves the rendezvous at), and its share of the
// cores (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS).
#ifndef DDP_DEPLOY_LAUNCHER_PROGRAM_LAUNCH_H_
#define DDP_DEPLOY_LAUNCHER_PROGRAM_LAUNCH_H_

#include <string>
#include <vector>

namespace ddp {

struct ProgramLaunch {
  std::vector<std::string> argv;  // the program and its arguments
  int nproc = 1;
  int threads = 1;
  // Empty: every rank writes to this terminal; else rank-N.log there.
  std::string log_dir;
};

// Runs the copies until all exit. The first that fails (non-zero, or a
// signal) stops the others (SIGTERM, then SIGKILL after 10 s) and its code
// is returned (128 + N for signal N); SIGINT or SIGTERM to ddp-run stops
// them all and returns 128 + the signal; 0 when every rank succeeded.
int RunProgram(const ProgramLaunch& launch);

}  // namespace ddp

#endif  // DDP_DEPLOY_LAUNCHER_PROGRAM_LAUNCH_H_
