#include "coordinator/job_validator.h"

#include <atomic>
#include <optional>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using testing::HasSubstr;

v1::JobSpec Named(const std::string& name) {
  v1::JobSpec spec;
  spec.set_name(name);
  return spec;
}

JobValidator::Options Limits(int concurrency, int max_waiting) {
  JobValidator::Options options;
  options.concurrency = concurrency;
  options.max_waiting = max_waiting;
  return options;
}

// What one submission was answered, and when.
struct Answer {
  absl::Notification done;
  absl::Status status;
  JobValidator::Done Callback() {
    return [this](absl::Status s) {
      status = std::move(s);
      done.Notify();
    };
  }
  bool Wait() { return done.WaitForNotificationWithTimeout(absl::Seconds(30)); }
};

TEST(JobValidator, Validate_CheckRuns_DoneWithItsStatus) {
  JobValidator validator({}, [](const v1::JobSpec& spec, const std::atomic<bool>&) {
    return absl::InvalidArgumentError("bad " + spec.name());
  });
  Answer answer;
  validator.Validate(Named("j"), answer.Callback());
  ASSERT_TRUE(answer.Wait());
  EXPECT_THAT(answer.status, StatusIs(absl::StatusCode::kInvalidArgument, "bad j"));
}

TEST(JobValidator, Validate_ChecksRunConcurrently_UpToTheLimit) {
  // Each check waits for the other to start: only two at once pass.
  absl::Notification a_started, b_started;
  JobValidator validator(Limits(2, 4), [&](const v1::JobSpec& spec, const std::atomic<bool>&) {
    (spec.name() == "a" ? a_started : b_started).Notify();
    const bool other = (spec.name() == "a" ? b_started : a_started)
                           .WaitForNotificationWithTimeout(absl::Seconds(30));
    return other ? absl::OkStatus() : absl::InternalError("ran alone");
  });
  Answer a, b;
  validator.Validate(Named("a"), a.Callback());
  validator.Validate(Named("b"), b.Callback());
  ASSERT_TRUE(a.Wait() && b.Wait());
  EXPECT_THAT(a.status, IsOk());
  EXPECT_THAT(b.status, IsOk());
}

TEST(JobValidator, Validate_BeyondRunningAndWaiting_ResourceExhaustedAtOnce) {
  absl::Notification started, release;
  JobValidator validator(Limits(1, 1), [&](const v1::JobSpec& spec, const std::atomic<bool>&) {
    if (spec.name() == "running") started.Notify();
    release.WaitForNotification();
    return absl::OkStatus();
  });
  Answer running, waiting, refused;
  validator.Validate(Named("running"), running.Callback());
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(30)));
  validator.Validate(Named("waiting"), waiting.Callback());
  validator.Validate(Named("refused"), refused.Callback());
  // Answered on this thread, before Validate returned.
  ASSERT_TRUE(refused.done.HasBeenNotified());
  EXPECT_THAT(refused.status,
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--validate_queue")));
  EXPECT_FALSE(waiting.done.HasBeenNotified());
  release.Notify();
  ASSERT_TRUE(running.Wait() && waiting.Wait());
  EXPECT_THAT(running.status, IsOk());
  EXPECT_THAT(waiting.status, IsOk());
}

// Submissions that arrive together, before the idle threads wake to take
// them, are not "waiting": each idle thread takes one, and only the queue
// beyond them is bounded (a second one was refused here once, on a busy
// machine).
TEST(JobValidator, Validate_BurstBeforeThreadsWake_IdleThreadsStillTakeOneEach) {
  absl::Notification release;
  std::atomic<int> started{0};
  JobValidator validator(Limits(2, 1), [&](const v1::JobSpec&, const std::atomic<bool>&) {
    ++started;
    release.WaitForNotification();
    return absl::OkStatus();
  });
  Answer a, b, c, refused;
  validator.Validate(Named("a"), a.Callback());
  validator.Validate(Named("b"), b.Callback());
  validator.Validate(Named("c"), c.Callback());
  validator.Validate(Named("refused"), refused.Callback());
  EXPECT_FALSE(a.done.HasBeenNotified());
  EXPECT_FALSE(b.done.HasBeenNotified());
  EXPECT_FALSE(c.done.HasBeenNotified());
  ASSERT_TRUE(refused.done.HasBeenNotified());
  EXPECT_THAT(refused.status, StatusIs(absl::StatusCode::kResourceExhausted));
  // Whenever the threads wake, two run and one waits.
  for (int i = 0; i < 3000 && started.load() < 2; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(started.load(), 2);
  release.Notify();
  ASSERT_TRUE(a.Wait() && b.Wait() && c.Wait());
  EXPECT_THAT(c.status, IsOk());
}

TEST(JobValidator, Shutdown_StopsRunningFailsWaitingRefusesNew) {
  absl::Notification started;
  JobValidator validator(Limits(1, 2), [&](const v1::JobSpec& spec, const std::atomic<bool>& stop) {
    if (spec.name() == "running") started.Notify();
    while (!stop) absl::SleepFor(absl::Milliseconds(1));
    return absl::CancelledError("stopped");
  });
  Answer running, waiting, late;
  validator.Validate(Named("running"), running.Callback());
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(30)));
  validator.Validate(Named("waiting"), waiting.Callback());
  validator.Shutdown();
  ASSERT_TRUE(running.done.HasBeenNotified() && waiting.done.HasBeenNotified());
  EXPECT_THAT(running.status, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(waiting.status, StatusIs(absl::StatusCode::kUnavailable));
  validator.Validate(Named("late"), late.Callback());
  EXPECT_THAT(late.status, StatusIs(absl::StatusCode::kUnavailable));
}

}  // namespace
}  // namespace ddp
