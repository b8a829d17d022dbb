#include "common/process.h"

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"

namespace ddp {

void ParseFlagsOrExit(int argc, char** argv, const char* usage) {
  absl::SetProgramUsageMessage(usage);
  // absl spells flags with underscores; people type dashes.
  std::vector<std::string> normalized(argv, argv + argc);
  for (size_t i = 1; i < normalized.size(); ++i) {
    std::string& arg = normalized[i];
    if (arg == "--") break;
    if (!absl::StartsWith(arg, "--")) continue;
    const size_t end = std::min(arg.find('='), arg.size());
    for (size_t c = 2; c < end; ++c) {
      if (arg[c] == '-') arg[c] = '_';
    }
  }
  std::vector<char*> args;
  for (auto& a : normalized) args.push_back(a.data());
  std::vector<char*> rest = absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (rest.size() > 1) {
    std::fprintf(stderr, "%s: unexpected argument \"%s\"; see --help\n", argv[0], rest[1]);
    std::exit(2);
  }
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForTermination(absl::Duration timeout) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  const timespec ts = absl::ToTimespec(timeout);
  const int sig = sigtimedwait(&set, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

}  // namespace ddp
