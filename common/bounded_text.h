// Text from clients and files, quoted in errors and logs: bounded, so a
// multi-megabyte string never becomes the reply, and without control
// characters, so it can't forge log lines.
#ifndef DDP_COMMON_BOUNDED_TEXT_H_
#define DDP_COMMON_BOUNDED_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace ddp {

// At most `max_bytes` of `text` (cut at a UTF-8 character boundary), with
// control characters escaped (\n, \x01), and "... (N bytes)" appended when
// it was cut.
std::string Bounded(absl::string_view text, size_t max_bytes = 100);

}  // namespace ddp

#endif  // DDP_COMMON_BOUNDED_TEXT_H_
