#include "common/process.h"

#include <algorithm>

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

#include "common/version.h"

namespace ddp {

namespace {

// absl's ParseCommandLine, but --help (and --helpfull, --helpshort,
// --help=SUBSTRING) exits 0, as a person asking for help expects; absl's
// own exits 1. What is left of the command line (the program name and the
// arguments that are not flags) is returned.
std::vector<char*> ParseHelpExitsZero(int argc, char** argv) {
  std::vector<char*> rest = absl::flags_internal::ParseCommandLineImpl(
      argc, argv, absl::flags_internal::ArgvListAction::kRemoveParsedArgs,
      absl::flags_internal::UsageFlagsAction::kIgnoreUsage,
      absl::flags_internal::OnUndefinedFlag::kAbortIfUndefined);
  const int exit_code =
      absl::flags_internal::HandleUsageFlags(std::cout, absl::ProgramUsageMessage());
  if (exit_code != -1) {
    std::cout.flush();
    std::exit(exit_code == 1 ? 0 : exit_code);
  }
  return rest;
}

}  // namespace

std::vector<std::string> ParseFlagsOrExit(int argc, char** argv, const char* usage,
                                          bool program_allowed) {
  std::vector<std::string> program;
  std::vector<std::string> rest =
      ParseFlagsAndArgumentsOrExit(argc, argv, usage, program_allowed ? &program : nullptr);
  if (!rest.empty()) {
    std::fprintf(stderr, "%s: unexpected argument \"%s\"; see --help\n", argv[0], rest[0].c_str());
    std::exit(2);
  }
  return program;
}

std::vector<std::string> ParseFlagsAndArgumentsOrExit(int argc, char** argv, const char* usage,
                                                      std::vector<std::string>* program) {
  // Debian's Abseil checks every lock for deadlock cycles by default: a
  // graph update on each Lock, a few percent of a busy coordinator's CPU.
  // The daemons run without it; the tests (and TSan, and clang's lock
  // annotations) keep checking.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // A crash prints where it happened before the process dies.
  absl::InitializeSymbolizer(argv[0]);
  absl::InstallFailureSignalHandler(absl::FailureSignalHandlerOptions());
  // It also claims SIGTERM: ours asks for a clean stop instead.
  CatchTerminationSignals();
  std::string name = argv[0];
  name = name.substr(name.rfind('/') + 1);
  // absl prints "NAME: " before the usage; ours start with the binary's
  // name too (they read better in the source), which --help would double.
  absl::string_view text = usage;
  absl::ConsumePrefix(&text, absl::StrCat(name, ": "));
  absl::SetProgramUsageMessage(text);
  // --help lists the flags of the binary's main.cc (absl's default looks for
  // a file named like the program, and ours are called main.cc), under the
  // program's name rather than the path it was built from.
  absl::FlagsUsageConfig config;
  // (ddp-pack's is pack_main.cc.)
  const auto is_main = [](absl::string_view file) {
    return absl::EndsWith(file, "/main.cc") || absl::EndsWith(file, "_main.cc");
  };
  config.normalize_filename = [name, is_main](absl::string_view file) {
    return is_main(file) ? name : std::string(file);
  };
  config.contains_help_flags = [name, is_main](absl::string_view file) {
    return file == name || is_main(file);
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  config.version_string = [name] { return absl::StrCat(name, " ", kVersion, "\n"); };
  absl::SetFlagsUsageConfig(config);
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
  // "-- PROGRAM ARGS...": not ours to parse.
  if (program != nullptr) {
    const auto dashes = std::find(normalized.begin() + 1, normalized.end(), "--");
    if (dashes != normalized.end()) {
      program->assign(dashes + 1, normalized.end());
      normalized.erase(dashes, normalized.end());
    }
  }
  std::vector<char*> args;
  for (auto& a : normalized) args.push_back(a.data());
  std::vector<char*> rest = ParseHelpExitsZero(static_cast<int>(args.size()), args.data());
  return std::vector<std::string>(rest.begin() + std::min<size_t>(1, rest.size()), rest.end());
}

namespace {

std::atomic<int> g_signal{0};

extern "C" void OnTerminationSignal(int sig) { g_signal.store(sig); }

}  // namespace

void CatchTerminationSignals() {
  struct sigaction action = {};
  action.sa_handler = OnTerminationSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

int WaitForTermination(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (const int sig = g_signal.exchange(0); sig != 0) return sig;
    if (absl::Now() >= deadline) return 0;
    absl::SleepFor(std::min(absl::Milliseconds(10), deadline - absl::Now()));
  }
}

}  // namespace ddp
