#include "worker/link/outbox.h"

#include "gtest/gtest.h"

namespace ddp {
namespace {

v1::StepReport Report(uint64_t step) {
  v1::StepReport r;
  r.set_step(step);
  return r;
}

v1::WorkerMessage State(v1::WorkerState state) {
  v1::WorkerMessage m;
  m.mutable_state()->set_state(state);
  return m;
}

class OutboxTest : public testing::Test {
 protected:
  Outbox Make(size_t max_reports) {
    return Outbox(&clock_, Outbox::Options{max_reports, absl::Milliseconds(100)});
  }
  FakeClock clock_;
};

TEST_F(OutboxTest, Take_ControlMessages_AtOnceInOrder) {
  Outbox outbox = Make(8);
  outbox.Push(State(v1::WORKER_STATE_RENDEZVOUS));
  outbox.Push(State(v1::WORKER_STATE_TRAINING));
  auto out = outbox.Take(clock_.Now());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].state().state(), v1::WORKER_STATE_RENDEZVOUS);
  EXPECT_EQ(out[1].state().state(), v1::WORKER_STATE_TRAINING);
}

TEST_F(OutboxTest, Take_Reports_BatchedOnceTheDelayPassed) {
  Outbox outbox = Make(8);
  outbox.PushReport(Report(1));
  outbox.PushReport(Report(2));
  EXPECT_TRUE(outbox.Take(clock_.Now()).empty());  // not due yet
  clock_.Advance(absl::Milliseconds(100));
  auto out = outbox.Take(clock_.Now());
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].reports().reports_size(), 2);
  EXPECT_EQ(out[0].reports().reports(1).step(), 2u);
  EXPECT_EQ(out[0].reports().dropped(), 0u);
}

TEST_F(OutboxTest, PushReport_Full_DropsOldestAndCountsWithoutBlocking) {
  Outbox outbox = Make(3);
  for (uint64_t s = 1; s <= 5; ++s) outbox.PushReport(Report(s));
  outbox.Push(State(v1::WORKER_STATE_DONE));  // control is never dropped
  clock_.Advance(absl::Seconds(1));
  auto out = outbox.Take(clock_.Now());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].state().state(), v1::WORKER_STATE_DONE);
  const auto& batch = out[0].reports();
  ASSERT_EQ(batch.reports_size(), 3);
  EXPECT_EQ(batch.reports(0).step(), 3u);
  EXPECT_EQ(batch.dropped(), 2u);
  EXPECT_EQ(outbox.dropped_total(), 2u);
}

TEST_F(OutboxTest, Push_ReportsQueuedBefore_GoFirstSoDoneNeverOvertakesThem) {
  Outbox outbox = Make(8);
  outbox.PushReport(Report(9));
  outbox.Push(State(v1::WORKER_STATE_DONE));
  auto out = outbox.Take(clock_.Now());  // due at once: a control message is queued
  ASSERT_EQ(out.size(), 2u);
  ASSERT_EQ(out[0].reports().reports_size(), 1);
  EXPECT_EQ(out[0].reports().reports(0).step(), 9u);
  EXPECT_EQ(out[1].state().state(), v1::WORKER_STATE_DONE);
}

TEST_F(OutboxTest, Clear_DropsEverythingQueued) {
  Outbox outbox = Make(3);
  outbox.Push(State(v1::WORKER_STATE_DONE));
  outbox.PushReport(Report(1));
  outbox.Clear();
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(outbox.Take(clock_.Now()).empty());
}

}  // namespace
}  // namespace ddp
