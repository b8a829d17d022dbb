#include "deploy/launcher/progress_printer.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

TEST(ProgressPrinter, FormatSeconds_Table) {
  EXPECT_EQ(FormatSeconds(0), "0s");
  EXPECT_EQ(FormatSeconds(59.4), "59s");
  EXPECT_EQ(FormatSeconds(125), "2m05s");
  EXPECT_EQ(FormatSeconds(3723), "1h02m03s");
  EXPECT_EQ(FormatSeconds(-3), "0s");
}

TEST(ProgressPrinter, Update_ProgressLineAtMostEveryInterval_EpochLinesOnce) {
  ProgressPrinter printer(absl::Seconds(2));
  v1::JobStatus s;
  s.set_job_id("j");
  s.set_state(v1::JOB_STATE_RUNNING);
  s.set_generation(1);
  s.set_world_size(2);
  s.set_epochs(2);
  s.set_global_step(10);
  s.set_total_steps(100);
  s.set_loss(0.5);
  s.set_samples_per_sec(1000);
  s.set_eta_seconds(90);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto lines = printer.Update(s, t0);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[0], HasSubstr("generation 1 formed with 2 worker(s)"));
  EXPECT_THAT(lines[1], HasSubstr("step 10/100 (10.0%)"));
  EXPECT_THAT(lines[1], HasSubstr("loss 0.5000"));
  EXPECT_THAT(lines[1], HasSubstr("ETA 1m30s"));
  EXPECT_TRUE(printer.Update(s, t0 + absl::Seconds(1)).empty());
  s.add_epoch_results()->set_test_accuracy(0.9);
  lines = printer.Update(s, t0 + absl::Seconds(1));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("epoch 1/2 done"));
  EXPECT_THAT(lines[0], HasSubstr("test accuracy 0.9000"));
  EXPECT_EQ(printer.Update(s, t0 + absl::Seconds(2)).size(), 1u);  // progress only
  // Training that waits on data says so, as the status page does.
  s.set_data_wait_fraction(0.7);
  s.set_data_wait_rank(1);
  lines = printer.Update(s, t0 + absl::Seconds(4));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("waiting on data 70% (rank 1)"));
}

TEST(ProgressPrinter, Update_BeforeTraining_SaysWhatItWaitsForEveryInterval) {
  ProgressPrinter printer(absl::Seconds(2));
  v1::JobStatus s;
  s.set_job_id("j");
  s.set_state(v1::JOB_STATE_WAITING);
  s.mutable_spec()->set_min_workers(2);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto lines = printer.Update(s, t0);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("waiting for workers (0 attached, 2 needed)"));
  EXPECT_TRUE(printer.Update(s, t0 + absl::Seconds(1)).empty());
  s.set_attached_workers(1);  // a worker attaching is news at once
  lines = printer.Update(s, t0 + absl::Seconds(1.5));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("(1 attached, 2 needed)"));
  EXPECT_TRUE(printer.Update(s, t0 + absl::Seconds(3)).empty());
  EXPECT_EQ(printer.Update(s, t0 + absl::Seconds(3.5)).size(), 1u);  // 2 s without a line
  // Formed, but no step yet (loading data, the first broadcast): said once,
  // then again each interval in other words.
  s.set_state(v1::JOB_STATE_RUNNING);
  s.set_generation(1);
  s.set_world_size(2);
  s.set_attached_workers(2);
  lines = printer.Update(s, t0 + absl::Seconds(4));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("generation 1 formed with 2 worker(s)"));
  lines = printer.Update(s, t0 + absl::Seconds(6));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("generation 1 starting on 2 worker(s)"));
  // Training: step lines only, and a worker attaching is no state line.
  s.set_global_step(3);
  s.set_total_steps(100);
  s.set_attached_workers(3);
  lines = printer.Update(s, t0 + absl::Seconds(7));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("step 3/100"));
}

TEST(ProgressPrinter, Summary_SaysHowItEnded) {
  v1::JobStatus s;
  s.set_job_id("j");
  s.set_state(v1::JOB_STATE_FAILED);
  s.set_message("rank 1 lost");
  EXPECT_THAT(ProgressPrinter::Summary(s), HasSubstr("job j FAILED"));
  EXPECT_THAT(ProgressPrinter::Summary(s), HasSubstr("rank 1 lost"));
}

}  // namespace
}  // namespace ddp
