// What a worker does with each answer to its register, and the log limiter
// that keeps a long outage from flooding its log.
#include "worker/link/refusal.h"

#include "common/log_limiter.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

TEST(ClassifyRegisterFailure, Table) {
  using C = grpc::StatusCode;
  struct Case {
    C code;
    RegisterFailure want;
  };
  for (const Case& c : {Case{C::INVALID_ARGUMENT, RegisterFailure::kFatal},
                        Case{C::PERMISSION_DENIED, RegisterFailure::kFatal},
                        Case{C::UNAUTHENTICATED, RegisterFailure::kFatal},
                        Case{C::FAILED_PRECONDITION, RegisterFailure::kFatal},
                        Case{C::ALREADY_EXISTS, RegisterFailure::kRefusedForNow},
                        Case{C::UNAVAILABLE, RegisterFailure::kUnreachable},
                        Case{C::DEADLINE_EXCEEDED, RegisterFailure::kUnreachable},
                        Case{C::CANCELLED, RegisterFailure::kUnreachable},
                        Case{C::RESOURCE_EXHAUSTED, RegisterFailure::kRefusedForNow},
                        Case{C::UNIMPLEMENTED, RegisterFailure::kUnreachable},
                        Case{C::INTERNAL, RegisterFailure::kUnreachable},
                        Case{C::OK, RegisterFailure::kUnreachable}}) {
    EXPECT_EQ(ClassifyRegisterFailure(c.code), c.want) << StatusCodeName(c.code);
  }
}

TEST(RegisterFailureHint, PointsAtTheFlag) {
  EXPECT_THAT(RegisterFailureHint(grpc::StatusCode::UNAUTHENTICATED), HasSubstr("--token_file"));
  EXPECT_THAT(RegisterFailureHint(grpc::StatusCode::PERMISSION_DENIED), HasSubstr("worker"));
  EXPECT_THAT(RegisterFailureHint(grpc::StatusCode::UNAVAILABLE), HasSubstr("TLS"));
  EXPECT_EQ(StatusCodeName(grpc::StatusCode::PERMISSION_DENIED), "PERMISSION_DENIED");
}

TEST(LogLimiter, FirstThenOncePerInterval_CountingHeldBack) {
  LogLimiter limiter(absl::Minutes(1));
  absl::Time t = absl::UnixEpoch();
  uint64_t held = 99;
  EXPECT_TRUE(limiter.ShouldLog(14, t, &held));
  EXPECT_EQ(held, 0u);
  for (int i = 1; i <= 59; ++i) EXPECT_FALSE(limiter.ShouldLog(14, t + absl::Seconds(i), &held));
  EXPECT_TRUE(limiter.ShouldLog(14, t + absl::Seconds(60), &held));
  EXPECT_EQ(held, 59u);
}

TEST(LogLimiter, NewKind_LoggedAtOnce_ResetStartsOver) {
  LogLimiter limiter(absl::Minutes(1));
  absl::Time t = absl::UnixEpoch();
  uint64_t held = 0;
  EXPECT_TRUE(limiter.ShouldLog(14, t, &held));
  EXPECT_TRUE(limiter.ShouldLog(6, t + absl::Seconds(1), &held));
  EXPECT_FALSE(limiter.ShouldLog(6, t + absl::Seconds(2), &held));
  limiter.Reset();
  EXPECT_TRUE(limiter.ShouldLog(6, t + absl::Seconds(3), &held));
  EXPECT_EQ(held, 0u);
}

}  // namespace
}  // namespace ddp
