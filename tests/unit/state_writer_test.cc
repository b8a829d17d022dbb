#include "coordinator/state_writer.h"

#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/unit/gated_store.h"

namespace ddp {
namespace {

// Records one callback's answer.
struct Answer {
  absl::Notification done;
  absl::Status status;
  StateWriter::Durable Callback() {
    return [this](absl::Status s) {
      status = std::move(s);
      done.Notify();
    };
  }
};

TEST(StateWriter, Post_AnswersOnlyOnceSaved) {
  GatedStore store(/*open=*/false);
  StateWriter writer(&store);
  Answer answer;
  writer.Post(1, v1::DurableState(), {answer.Callback()});
  store.AwaitSaves(1);
  EXPECT_FALSE(answer.done.HasBeenNotified()) << "answered before the save returned";
  store.Open();
  ASSERT_TRUE(answer.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_THAT(answer.status, IsOk());
}

TEST(StateWriter, Post_SaveFails_AnswersUnavailableSayingWhy) {
  GatedStore store;
  store.Fail();
  StateWriter writer(&store);
  Answer answer;
  writer.Post(1, v1::DurableState(), {answer.Callback()});
  ASSERT_TRUE(answer.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_THAT(answer.status, StatusIs(absl::StatusCode::kUnavailable,
                                      ::testing::AllOf(::testing::HasSubstr("the gated store"),
                                                       ::testing::HasSubstr("disk full"))));
}

TEST(StateWriter, Post_ConcurrentChanges_SavedTogetherInOneWrite) {
  GatedStore store(/*open=*/false);
  StateWriter writer(&store);
  Answer first, second, third;
  writer.Post(1, v1::DurableState(), {first.Callback()});
  store.AwaitSaves(1);  // 1 is being written: 2 and 3 queue behind it
  writer.Post(2, v1::DurableState(), {second.Callback()});
  writer.Post(3, v1::DurableState(), {third.Callback()});
  store.Open();
  for (Answer* a : {&first, &second, &third}) {
    ASSERT_TRUE(a->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_THAT(a->status, IsOk());
  }
  writer.Flush();
  EXPECT_EQ(store.saved(), (std::vector<uint64_t>{1, 3}));
}

TEST(StateWriter, Post_OlderThanSaved_AnsweredAtOnce) {
  GatedStore store;
  StateWriter writer(&store);
  writer.Post(5, v1::DurableState());
  writer.Flush();
  Answer late;
  writer.Post(4, v1::DurableState(), {late.Callback()});  // 5 held it already
  ASSERT_TRUE(late.done.HasBeenNotified());
  EXPECT_THAT(late.status, IsOk());
  EXPECT_EQ(store.saved(), (std::vector<uint64_t>{5}));
}

}  // namespace
}  // namespace ddp
