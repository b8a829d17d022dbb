// Runs a trace of jobs through the coordinator's scheduling policy on a
// simulated pool and prints what happened as JSON (bench/schedule_sim_json.h
// has both formats; bench/scheduling.py drives it).
//
//   ddp_schedule_sim --policy elastic trace.json     (or the trace on stdin)
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "bench/schedule_sim_core.h"
#include "bench/schedule_sim_json.h"

ABSL_FLAG(std::string, policy, "elastic", "fifo-gang, priority-preempt or elastic");
ABSL_FLAG(bool, segments, false, "print each job's allocation over time too");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("ddp_schedule_sim --policy NAME [TRACE.json]; stdin without one");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() > 2) {
    std::fprintf(stderr, "ddp_schedule_sim: one trace file at most\n");
    return 2;
  }
  std::stringstream text;
  if (args.size() == 2 && std::string(args[1]) != "-") {
    std::ifstream file(args[1]);
    if (!file) {
      std::fprintf(stderr, "ddp_schedule_sim: cannot read %s\n", args[1]);
      return 2;
    }
    text << file.rdbuf();
  } else {
    text << std::cin.rdbuf();
  }
  auto policy = ddp::ParsePolicyName(absl::GetFlag(FLAGS_policy));
  if (!policy.ok()) {
    std::fprintf(stderr, "ddp_schedule_sim: %s\n", std::string(policy.status().message()).c_str());
    return 2;
  }
  auto trace = ddp::ParseTrace(text.str());
  if (!trace.ok()) {
    std::fprintf(stderr, "ddp_schedule_sim: %s\n", trace.status().ToString().c_str());
    return 2;
  }
  auto result = ddp::Simulate(*trace, *policy);
  if (!result.ok()) {
    std::fprintf(stderr, "ddp_schedule_sim: %s\n", result.status().ToString().c_str());
    return 1;
  }
  std::fputs(ddp::ResultToJson(*trace, *result, absl::GetFlag(FLAGS_segments)).c_str(), stdout);
  return 0;
}
