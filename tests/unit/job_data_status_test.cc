// What a job's status says of its data: which member waits on data and for
// how much of its step, and (dataset.skip_bad_samples) how many samples were
// replaced and which files were bad, every rank's together and bounded.
#include "coordinator/job_progress.h"
#include "coordinator/report_checks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::StepReport Step(uint64_t step, double seconds, double data_ms, uint64_t skipped = 0,
                    std::vector<std::string> bad = {}) {
  v1::StepReport r;
  r.set_generation(1);
  r.set_step(step);
  r.set_step_seconds(seconds);
  r.mutable_timings()->set_data_ms(data_ms);
  r.set_samples_skipped(skipped);
  for (const std::string& b : bad) r.add_newly_bad_samples(b);
  return r;
}

JobProgress Running(FakeClock* clock) {
  JobProgress job(clock);
  v1::JobSpec spec;
  spec.set_name("j");
  EXPECT_THAT(job.Submit(spec, clock->Now()), IsOk());
  job.OnGenerationStarted(2, 0, 0.1);
  return job;
}

TEST(JobDataStatus, TheMemberWaitingMostOnDataIsNamed) {
  FakeClock clock;
  JobProgress job = Running(&clock);
  job.OnStepReport(0, Step(1, 0.1, 5));
  job.OnStepReport(1, Step(1, 0.1, 40));
  v1::JobStatus status;
  job.FillStatus(&status);
  EXPECT_NEAR(status.data_wait_fraction(), 0.4, 1e-9);
  EXPECT_EQ(status.data_wait_rank(), 1u);
  // Averaged over recent steps: one fed step does not clear it (no flicker)...
  job.OnStepReport(1, Step(2, 0.1, 0));
  status.Clear();
  job.FillStatus(&status);
  EXPECT_NEAR(status.data_wait_fraction(), 0.32, 1e-9);
  EXPECT_EQ(status.data_wait_rank(), 1u);
  // ...but rank 1 fed for a while is no longer named.
  for (uint64_t step = 3; step < 20; ++step) job.OnStepReport(1, Step(step, 0.1, 0));
  status.Clear();
  job.FillStatus(&status);
  EXPECT_NEAR(status.data_wait_fraction(), 0.05, 1e-9);
  EXPECT_EQ(status.data_wait_rank(), 0u);
}

TEST(JobDataStatus, SkippedSamplesAreSummedAndBadFilesNamedOnce) {
  FakeClock clock;
  JobProgress job = Running(&clock);
  job.OnStepReport(0, Step(1, 0.1, 0, 2, {"a.jpg: truncated"}));
  job.OnStepReport(1, Step(1, 0.1, 0, 1, {"a.jpg: truncated", "b.png: CRC-32"}));
  job.OnStepReport(0, Step(2, 0.1, 0, 1));
  v1::JobStatus status;
  job.FillStatus(&status);
  EXPECT_EQ(status.samples_skipped(), 4u);
  EXPECT_THAT(status.bad_samples(), ElementsAre("a.jpg: truncated", "b.png: CRC-32"));
  for (int i = 0; i < 100; ++i) job.OnStepReport(0, Step(3, 0.1, 0, 0, {std::to_string(i)}));
  status.Clear();
  job.FillStatus(&status);
  EXPECT_EQ(status.bad_samples_size(), 32);
}

TEST(JobDataStatus, SkippedSamplesOutliveACoordinatorRestart) {
  FakeClock clock;
  JobProgress job = Running(&clock);
  job.OnStepReport(0, Step(1, 0.1, 0, 3, {"a.jpg: truncated", "b.png: CRC-32"}));
  v1::DurableState saved;
  job.FillDurable(&saved);
  JobProgress restarted(&clock);
  restarted.Restore(saved);
  restarted.OnGenerationStarted(2, 1, 0.1);
  restarted.OnStepReport(1, Step(2, 0.1, 0, 1, {"a.jpg: truncated", "c.jpg: vanished"}));
  v1::JobStatus status;
  restarted.FillStatus(&status);
  EXPECT_EQ(status.samples_skipped(), 4u);
  EXPECT_THAT(status.bad_samples(),
              ElementsAre("a.jpg: truncated", "b.png: CRC-32", "c.jpg: vanished"));
}

TEST(JobDataStatus, ReportChecks_BoundWhatAReportSaysOfBadSamples) {
  v1::StepReportBatch batch;
  *batch.add_reports() = Step(1, 0.1, 0, 1, std::vector<std::string>(9, "x"));
  EXPECT_THAT(CheckReportBatch(batch, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("9 newly bad samples")));
  batch.Clear();
  *batch.add_reports() = Step(1, 0.1, 0, 1, {std::string(2000, 'x')});
  EXPECT_THAT(CheckReportBatch(batch, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2000 bytes")));
  batch.Clear();
  *batch.add_reports() = Step(1, 0.1, 0, uint64_t{1} << 40);
  EXPECT_THAT(CheckReportBatch(batch, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("samples_skipped")));
  batch.Clear();
  *batch.add_reports() = Step(1, 0.1, 0, 3, {"a.jpg: bad"});
  EXPECT_THAT(CheckReportBatch(batch, 0), IsOk());
}

}  // namespace
}  // namespace ddp
