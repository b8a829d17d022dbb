// Replicas that diverge are named parameter by parameter, within bounds:
// JobProgress compares the ranks' per-parameter digests, and the report
// checks bound what a report may make the coordinator hold.
#include "coordinator/job_progress.h"
#include "coordinator/report_checks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

v1::StepReport Digests(uint64_t step, const std::string& digest, std::vector<uint64_t> per,
                       std::vector<std::string> names = {}, uint64_t generation = 1) {
  v1::StepReport r;
  r.set_generation(generation);
  r.set_step(step);
  r.set_parameter_digest(digest);
  for (uint64_t d : per) r.add_parameter_digests(d);
  for (const std::string& n : names) r.add_parameter_digest_names(n);
  return r;
}

TEST(ParameterDigests, SameOnEveryRank_Ok) {
  FakeClock clock;
  JobProgress job(&clock);
  EXPECT_THAT(job.OnParameterDigest(0, Digests(100, "aa", {1, 2}, {"w", "b"})), IsOk());
  EXPECT_THAT(job.OnParameterDigest(1, Digests(100, "aa", {1, 2})), IsOk());
}

TEST(ParameterDigests, OneParameterDiffers_DataLossNamingIt) {
  FakeClock clock;
  JobProgress job(&clock);
  // The names came with an earlier report; this step's don't repeat them.
  ASSERT_THAT(
      job.OnParameterDigest(0, Digests(100, "aa", {1, 2, 3}, {"fc.weight", "fc.bias", "aux.bias"})),
      IsOk());
  ASSERT_THAT(job.OnParameterDigest(0, Digests(200, "bb", {4, 5, 6})), IsOk());
  EXPECT_THAT(job.OnParameterDigest(1, Digests(200, "cc", {4, 5, 7})),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("replicas diverged: after step 200 rank 0 has parameter "
                                       "digest bb but rank 1 has cc"),
                             HasSubstr("the parameters that differ: aux.bias (1 of 3)"),
                             Not(HasSubstr("fc.")))));
}

TEST(ParameterDigests, NoNamesKnown_NamedByPosition) {
  FakeClock clock;
  JobProgress job(&clock);
  ASSERT_THAT(job.OnParameterDigest(2, Digests(100, "aa", {1, 2, 3})), IsOk());
  EXPECT_THAT(job.OnParameterDigest(0, Digests(100, "ab", {9, 2, 9})),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("differ: #0, #2 (2 of 3)")));
}

TEST(ParameterDigests, SameStepTrainedAgainByALaterGeneration_NotADivergence) {
  FakeClock clock;
  JobProgress job(&clock);
  // Generation 1's only member reported step 100 and was lost with the
  // state; generation 2 trains from fresh weights and reaches step 100
  // again, elsewhere.
  ASSERT_THAT(job.OnParameterDigest(0, Digests(100, "aa", {1, 2}, {}, 1)), IsOk());
  EXPECT_THAT(job.OnParameterDigest(0, Digests(100, "bb", {3, 4}, {}, 2)), IsOk());
  // Within generation 2 the ranks are still compared.
  EXPECT_THAT(job.OnParameterDigest(1, Digests(100, "cc", {3, 5}, {}, 2)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("rank 0 has parameter digest bb")));
}

TEST(ParameterDigests, ManyDiffer_FirstFewNamedAndTheRestCounted) {
  FakeClock clock;
  JobProgress job(&clock);
  std::vector<uint64_t> mine(20, 1), theirs(20, 2);
  ASSERT_THAT(job.OnParameterDigest(0, Digests(100, "aa", mine)), IsOk());
  EXPECT_THAT(job.OnParameterDigest(1, Digests(100, "bb", theirs)),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("#0, #1, #2, #3, #4, #5, #6, #7 and 12 more (20 of 20)")));
}

TEST(ParameterDigests, OnlyWholeDigests_DataLossNamingTheRanks) {
  FakeClock clock;
  JobProgress job(&clock);
  ASSERT_THAT(job.OnParameterDigest(0, Digests(100, "aa", {})), IsOk());
  EXPECT_THAT(job.OnParameterDigest(1, Digests(100, "bb", {})),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("rank 0 has parameter digest aa but rank 1 has bb"),
                             Not(HasSubstr("differ:")))));
}

TEST(ParameterDigests, ReportChecks_BoundCountsAndNames) {
  v1::StepReportBatch batch;
  *batch.add_reports() = Digests(1, "aa", std::vector<uint64_t>(kMaxParameterDigests, 7));
  EXPECT_THAT(CheckReportBatch(batch, 0), IsOk());
  batch.mutable_reports(0)->add_parameter_digests(7);
  EXPECT_THAT(CheckReportBatch(batch, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the limit is 4096")));

  batch.Clear();
  *batch.add_reports() = Digests(1, "aa", {1, 2}, {"w"});
  EXPECT_THAT(CheckReportBatch(batch, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 parameter digest names "
                                                                     "for 2 digests")));
  batch.Clear();
  *batch.add_reports() =
      Digests(1, "aa", {1}, {std::string(kMaxParameterDigestNameBytes + 1, 'x')});
  EXPECT_THAT(CheckReportBatch(batch, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("name is 257 bytes")));
}

}  // namespace
}  // namespace ddp
