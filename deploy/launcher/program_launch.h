// ddp-run -- PROGRAM ARGS: N copies of a user's program that trains with
// the ddp library, each joined to the coordinator ddp-run started (a job
// with model.kind "program"), as torchrun starts copies of a script. Each
// gets DDP_COORDINATOR, LOCAL_RANK, LOCAL_WORLD_SIZE, what the coordinator's
// TLS and tokens need (DDP_TLS_*, DDP_TOKEN_FILE), and its share of the
// cores (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS).
#ifndef DDP_DEPLOY_LAUNCHER_PROGRAM_LAUNCH_H_
#define DDP_DEPLOY_LAUNCHER_PROGRAM_LAUNCH_H_

#include <string>
#include <vector>

#include "ddp/v1/job.pb.h"
#include "deploy/launcher/child_processes.h"

namespace ddp {

struct ProgramLaunch {
  std::vector<std::string> argv;  // the program and its arguments
  int nproc = 1;
  int threads = 1;
  // Empty: every rank writes to this terminal; else rank-N.log there.
  std::string log_dir;
  // HOST:PORT of the coordinator, and the environment every copy gets for
  // it besides (DDP_TOKEN_FILE, DDP_TLS_CA, ...).
  std::string coordinator;
  std::vector<std::string> env;
  // Copies that die are started again, this many times in all: the new
  // copy joins the running job (a program with elastic state takes up the
  // others' state; see ddp::Session::set_elastic_state).
  int max_restarts = 0;
  // Below nproc: once restarts are spent, a failed copy stops the others
  // only when fewer than this many would be left (the job's min_workers:
  // they train on without it).
  int min_nproc = 1;
};

// The job ddp-run's coordinator runs for a program on `nproc` ranks: it
// forms with all of them (all that attach within a few seconds when
// `min_nproc` is lower), and again once a lost one's restarted copy is back
// or, with at least `min_nproc` left (ddp-run's --min_nproc), with the
// survivors meanwhile.
v1::JobSpec ProgramJobSpec(int min_nproc, int nproc);

// The program as a path to execute: as given when it has a '/', else the
// first executable of that name on PATH. Empty when there is none.
std::string ResolveProgram(const std::string& program);

// Starts the copies in `children` (where the coordinator runs as
// "coordinator") and waits until all exit. A copy that fails (non-zero, or
// a signal) is started again while restarts are left; otherwise, unless at
// least min_nproc copies (fewer than nproc) are still running and the job
// with them, it stops the others (SIGTERM, then SIGKILL after 10 s) and its
// code is returned (128 + N for signal N). SIGINT or SIGTERM to ddp-run
// stops them all and returns 128 + the signal. Otherwise the coordinator's
// code (the job's outcome).
int RunProgram(const ProgramLaunch& launch, ChildProcesses& children);

}  // namespace ddp

#endif  // DDP_DEPLOY_LAUNCHER_PROGRAM_LAUNCH_H_
