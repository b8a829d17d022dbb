// Client-supplied text, made safe to repeat: in an error message (short,
// quoted, escaped) and in status or a log (bounded, one line).
#ifndef DDP_COMMON_QUOTE_H_
#define DDP_COMMON_QUOTE_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace ddp {

// The most of a client-supplied value an error message repeats, in bytes of
// the original.
inline constexpr size_t kMaxQuotedBytes = 100;

// `value` in double quotes, for an error message: control characters,
// quotes, backslashes and bytes outside printable ASCII escaped (\n, \x1b),
// and, when longer than kMaxQuotedBytes, cut there with "..." and the full
// length: "aaaa..." (2500000 bytes). Always valid UTF-8 and one line.
std::string Quote(absl::string_view value);

// `value` with control characters escaped (\n, \r, \x1b), so a log line
// stays one line whatever a client sent. Other bytes pass unchanged.
std::string EscapeControl(absl::string_view value);

// At most `max_bytes` of `text` (cut at a UTF-8 character boundary), with
// control characters escaped, and "... (N bytes)" appended when it was cut:
// text from clients and files inside a longer message or a log line.
std::string Bounded(absl::string_view text, size_t max_bytes = kMaxQuotedBytes);

// `value` cut to at most `max_bytes` at a UTF-8 character boundary, ending
// in "..." when cut; for text kept in status (a worker's detail, say).
std::string Truncated(absl::string_view value, size_t max_bytes);

}  // namespace ddp

#endif  // DDP_COMMON_QUOTE_H_
