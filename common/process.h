// What every binary does at start: flags and termination signals.
#ifndef DDP_COMMON_PROCESS_H_
#define DDP_COMMON_PROCESS_H_

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace ddp {

// Parses absl flags, accepting the dashed spelling of every flag as well
// (--state-dir for --state_dir). Prints usage and exits 0 on --help, exits
// non-zero with the reason on a bad flag or a stray argument. With
// `program_allowed`, what follows a "--" is not parsed but returned (the
// program a launcher starts, and its arguments).
// As ParseFlagsOrExit, for a program that takes arguments besides flags:
// returns them (without the program's name); `program`, when not null,
// gets what follows a "--".
std::vector<std::string> ParseFlagsAndArgumentsOrExit(int argc, char** argv, const char* usage,
                                                      std::vector<std::string>* program = nullptr);
std::vector<std::string> ParseFlagsOrExit(int argc, char** argv, const char* usage,
                                          bool program_allowed = false);

// Catches SIGINT and SIGTERM so that WaitForTermination can report them.
// A handler, not a blocked mask: libraries (OpenBLAS, OpenMP) start threads
// before main, and a signal delivered to one of those would otherwise kill
// the process. Call first thing in main.
void CatchTerminationSignals();

// Waits up to `timeout` for SIGINT or SIGTERM; returns the signal (once per
// signal received), or 0.
int WaitForTermination(absl::Duration timeout);

}  // namespace ddp

#endif  // DDP_COMMON_PROCESS_H_
