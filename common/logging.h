// Timestamped log lines on stderr that name the process and, once it has one,
// the worker's rank:
//   2026-11-30 02:50:31.123 I worker w0 rank 1] joined generation 2
// Every entry is one line: control characters in it (newlines included) are
// escaped as \n, \x1b, and an entry longer than kMaxLogLineBytes is cut.
#ifndef DDP_COMMON_LOGGING_H_
#define DDP_COMMON_LOGGING_H_

#include <cstddef>
#include <sstream>
#include <string>

namespace ddp {

inline constexpr size_t kMaxLogLineBytes = 64 * 1024;

enum class LogSeverity { kInfo, kWarning, kError };

// Sets the identity every following line carries ("coordinator",
// "worker w0 rank 1"). Thread-safe.
void SetLogIdentity(const std::string& identity);

// Writes one line when destroyed. Thread-safe: lines never interleave.
class LogMessage {
 public:
  explicit LogMessage(LogSeverity severity) : severity_(severity) {}
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogSeverity severity_;
  std::ostringstream stream_;
};

}  // namespace ddp

#define DDP_LOG(severity) ::ddp::LogMessage(::ddp::LogSeverity::k##severity).stream()

#endif  // DDP_COMMON_LOGGING_H_
