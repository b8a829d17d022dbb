// One absl::Status as one line of text: how the validation helper
// (ddp-validate) answers the coordinator on its stdout.
//
//   <code as a number> <message>\n      e.g. "3 model.path: ... does not exist"
//
// The message is bounded (kMaxStatusMessage bytes) and has no control
// characters, on both sides: the decoder trusts nothing the helper, which
// runs a job's own code, writes.
#ifndef DDP_COMMON_STATUS_LINE_H_
#define DDP_COMMON_STATUS_LINE_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ddp {

inline constexpr size_t kMaxStatusMessage = 600;
// Longest line EncodeStatusLine writes (a message of escapes counts 4x).
inline constexpr size_t kMaxStatusLine = 4 * kMaxStatusMessage + 64;

std::string EncodeStatusLine(const absl::Status& status);

// The status a line says, or nothing when it is not exactly one
// well-formed line (the helper's fault, for the caller to report).
std::optional<absl::Status> DecodeStatusLine(absl::string_view line);

}  // namespace ddp

#endif  // DDP_COMMON_STATUS_LINE_H_
