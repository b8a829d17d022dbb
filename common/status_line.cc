#include "common/status_line.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/quote.h"

namespace ddp {

std::string EncodeStatusLine(const absl::Status& status) {
  return absl::StrCat(static_cast<int>(status.code()), " ",
                      Bounded(status.message(), kMaxStatusMessage), "\n");
}

std::optional<absl::Status> DecodeStatusLine(absl::string_view line) {
  if (line.size() > kMaxStatusLine || !absl::ConsumeSuffix(&line, "\n") ||
      line.find('\n') != absl::string_view::npos) {
    return std::nullopt;
  }
  const size_t space = line.find(' ');
  int code = 0;
  if (space == absl::string_view::npos || !absl::SimpleAtoi(line.substr(0, space), &code) ||
      code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return std::nullopt;
  }
  const std::string message = Bounded(line.substr(space + 1), kMaxStatusMessage);
  if (code == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

}  // namespace ddp
