#include "worker/elastic/torch_error.h"

#include <new>
#include <vector>

#include <c10/util/Exception.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/quote.h"

namespace ddp {
namespace {

constexpr size_t kMaxCause = 300;
constexpr absl::string_view kInterpreterError =
    "The following operation failed in the TorchScript interpreter";

// The message without LibTorch's C++ backtrace, when it keeps one apart.
std::string MessageOf(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

bool OutOfMemory(const std::exception& e, absl::string_view cause) {
  return dynamic_cast<const std::bad_alloc*>(&e) != nullptr ||
         dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
         absl::StrContains(cause, "not enough memory") ||
         absl::StrContains(cause, "can't allocate memory");
}

}  // namespace

std::string TorchErrorCause(const std::exception& e) {
  const std::string message = MessageOf(e);
  std::vector<absl::string_view> lines;
  for (absl::string_view line : absl::StrSplit(message, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty()) lines.push_back(line);
  }
  if (lines.empty()) return "(no message)";
  absl::string_view cause =
      absl::StartsWith(lines.front(), kInterpreterError) ? lines.back() : lines.front();
  absl::ConsumePrefix(&cause, "builtins.");
  return Bounded(cause, kMaxCause);
}

absl::Status TorchErrorStatus(absl::StatusCode code, absl::string_view context,
                              const std::exception& e) {
  const std::string cause = TorchErrorCause(e);
  if (OutOfMemory(e, cause)) code = absl::StatusCode::kResourceExhausted;
  return absl::Status(code, absl::StrCat(context, ": ", cause));
}

}  // namespace ddp
