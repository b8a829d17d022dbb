// Matchers for absl::Status in tests.
#ifndef DDP_TESTS_TEST_UTIL_H_
#define DDP_TESTS_TEST_UTIL_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace ddp {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER_P(StatusIs, code, "") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code;
}

MATCHER_P2(StatusIs, code, message_matcher, "") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code &&
         testing::ExplainMatchResult(message_matcher, std::string(s.message()), result_listener);
}

MATCHER(IsOk, "") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.ok();
}

}  // namespace ddp

#endif  // DDP_TESTS_TEST_UTIL_H_
