#include "common/logging.h"

#include <cstdio>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/quote.h"

namespace ddp {
namespace {

absl::Mutex g_log_mu;
std::string* g_identity ABSL_GUARDED_BY(g_log_mu) = nullptr;

char SeverityLetter(LogSeverity s) {
  switch (s) {
    case LogSeverity::kInfo:
      return 'I';
    case LogSeverity::kWarning:
      return 'W';
    case LogSeverity::kError:
      return 'E';
  }
  return '?';
}

}  // namespace

void SetLogIdentity(const std::string& identity) {
  absl::MutexLock lock(&g_log_mu);
  if (g_identity == nullptr) g_identity = new std::string();
  *g_identity = identity;
}

LogMessage::~LogMessage() {
  // One entry, one line: a newline a client put in a host name or a detail
  // can't start a forged line, and nothing floods the log.
  const std::string text = EscapeControl(Truncated(stream_.str(), kMaxLogLineBytes));
  const std::string when =
      absl::FormatTime("%Y-%m-%d %H:%M:%E3S", absl::Now(), absl::LocalTimeZone());
  absl::MutexLock lock(&g_log_mu);
  std::fprintf(stderr, "%s %c %s] %s\n", when.c_str(), SeverityLetter(severity_),
               g_identity ? g_identity->c_str() : "ddp", text.c_str());
  std::fflush(stderr);
}

}  // namespace ddp
