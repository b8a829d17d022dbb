#include "coordinator/status_summary.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ddp {
namespace {

using ::testing::ElementsAre;

// n members training at step 100 (rank r is "w<r>", 0.1 s a step), plus
// whatever the test changes.
v1::JobStatus Training(int n) {
  v1::JobStatus status;
  for (int r = 0; r < n; ++r) {
    v1::WorkerStatus* w = status.add_workers();
    w->set_worker_id(absl::StrCat("w", r));
    w->set_host(absl::StrCat("host-", r / 8));
    w->set_rank(r);
    w->set_state(v1::WORKER_STATE_TRAINING);
    w->set_step(100);
    w->set_step_seconds(0.1);
  }
  return status;
}

v1::WorkerStatus* Worker(v1::JobStatus* status, int rank) { return status->mutable_workers(rank); }

std::vector<std::string> Ids(const google::protobuf::RepeatedPtrField<v1::WorkerStatus>& ws) {
  std::vector<std::string> ids;
  for (const auto& w : ws) ids.push_back(w.worker_id());
  return ids;
}

std::vector<std::string> Ids(const google::protobuf::RepeatedPtrField<v1::WorkerBrief>& ws) {
  std::vector<std::string> ids;
  for (const auto& w : ws) ids.push_back(w.worker_id());
  return ids;
}

TEST(StatusSummary, FewWorkers_AllListedInTheSnapshotsOrder) {
  v1::JobStatus full = Training(3);
  full.mutable_workers()->SwapElements(0, 2);
  v1::JobStatus view;
  BoundStatusView(full, 100, &view);
  EXPECT_THAT(Ids(view.workers()), ElementsAre("w2", "w1", "w0"));
  EXPECT_EQ(view.summary().total(), 3u);
  EXPECT_EQ(view.summary().listed(), 3u);
  EXPECT_EQ(view.summary().members(), 3u);
}

TEST(StatusSummary, CountsEveryStateAndTheStepSpread) {
  v1::JobStatus full = Training(6);
  Worker(&full, 4)->set_state(v1::WORKER_STATE_LOST);
  Worker(&full, 5)->set_state(v1::WORKER_STATE_IDLE);
  Worker(&full, 5)->set_rank(-1);  // attached, not a member
  Worker(&full, 5)->set_step(0);
  Worker(&full, 1)->set_step(97);
  Worker(&full, 2)->set_step(101);
  v1::JobStatus view;
  BoundStatusView(full, 100, &view);
  const v1::WorkerSummary& s = view.summary();
  ASSERT_EQ(s.states_size(), 3);  // in enum order, none empty
  EXPECT_EQ(s.states(0).state(), v1::WORKER_STATE_IDLE);
  EXPECT_EQ(s.states(0).count(), 1u);
  EXPECT_EQ(s.states(1).state(), v1::WORKER_STATE_TRAINING);
  EXPECT_EQ(s.states(1).count(), 4u);
  EXPECT_EQ(s.states(2).state(), v1::WORKER_STATE_LOST);
  EXPECT_EQ(s.states(2).count(), 1u);
  EXPECT_EQ(s.members(), 5u);
  EXPECT_EQ(s.min_step(), 97u);  // the non-member's step 0 is not a member's
  EXPECT_EQ(s.max_step(), 101u);
  EXPECT_EQ(s.behind_count(), 4u);
  EXPECT_THAT(Ids(s.behind()), ElementsAre("w1", "w0", "w3", "w4"));
  EXPECT_EQ(s.behind(0).step(), 97u);
  EXPECT_EQ(s.behind(0).rank(), 1);
}

TEST(StatusSummary, SlowestAreTheLongestLastSteps_AtMostEight) {
  v1::JobStatus full = Training(20);
  Worker(&full, 7)->set_step_seconds(2.5);
  Worker(&full, 3)->set_step_seconds(0.9);
  Worker(&full, 0)->set_step_seconds(0);  // no step reported yet: not timed
  v1::JobStatus view;
  BoundStatusView(full, 100, &view);
  const v1::WorkerSummary& s = view.summary();
  ASSERT_EQ(s.slowest_size(), kSummaryBriefs);
  EXPECT_EQ(s.slowest(0).worker_id(), "w7");
  EXPECT_DOUBLE_EQ(s.slowest(0).step_seconds(), 2.5);
  EXPECT_EQ(s.slowest(1).worker_id(), "w3");
  EXPECT_EQ(s.slowest(2).worker_id(), "w1");  // ties by rank, w0 not timed
  EXPECT_EQ(s.behind_count(), 0u);
}

TEST(StatusSummary, ManyWorkers_BoundedList_TroubleThenBehindThenByRank) {
  v1::JobStatus full = Training(4096);
  Worker(&full, 4000)->set_state(v1::WORKER_STATE_FAILED);
  Worker(&full, 123)->set_state(v1::WORKER_STATE_LOST);
  Worker(&full, 2048)->set_step(90);
  Worker(&full, 17)->set_step(99);
  v1::JobStatus view;
  BoundStatusView(full, 6, &view);
  EXPECT_THAT(Ids(view.workers()), ElementsAre("w123", "w4000", "w2048", "w17", "w0", "w1"));
  EXPECT_EQ(view.summary().total(), 4096u);
  EXPECT_EQ(view.summary().listed(), 6u);
  EXPECT_EQ(view.summary().behind_count(), 2u);
  EXPECT_THAT(Ids(view.summary().behind()), ElementsAre("w2048", "w17"));
  // Bounded: the answer at 4,096 workers is about the size of 6 of them.
  EXPECT_LT(view.ByteSizeLong(), 6 * full.workers(0).ByteSizeLong() + 4096);
}

TEST(StatusSummary, ManyMembers_IdListsBounded_OmittedCounted) {
  v1::JobStatus full = Training(200);
  v1::GenerationChange* change = full.add_generation_changes();
  for (int r = 0; r < 200; ++r) {
    full.add_members(absl::StrCat("w", r));
    change->add_members(absl::StrCat("w", r));
    if (r < 40) change->add_joined(absl::StrCat("w", r));
  }
  change->add_left("gone");
  change->set_world_size(200);
  v1::JobStatus view = full;
  view.clear_workers();
  BoundStatusView(full, 50, &view);
  ASSERT_EQ(view.members_size(), 50);
  EXPECT_EQ(view.members(49), "w49");
  const v1::GenerationChange& bounded = view.generation_changes(0);
  EXPECT_EQ(bounded.members_size(), kChangeIds);
  EXPECT_EQ(bounded.joined_size(), kChangeIds);
  EXPECT_EQ(bounded.left_size(), 1);
  EXPECT_EQ(bounded.ids_omitted(), (200u - kChangeIds) + (40u - kChangeIds));
  EXPECT_EQ(bounded.world_size(), 200u);
}

TEST(StatusSummary, ZeroWorkersListed_SummaryStillCountsAll) {
  v1::JobStatus full = Training(10);
  v1::JobStatus view;
  BoundStatusView(full, 0, &view);
  EXPECT_EQ(view.workers_size(), 0);
  EXPECT_EQ(view.summary().total(), 10u);
  EXPECT_EQ(view.summary().listed(), 0u);
}

TEST(StatusSummary, NoWorkers_EmptySummary) {
  v1::JobStatus view;
  BoundStatusView(v1::JobStatus(), 100, &view);
  EXPECT_EQ(view.summary().total(), 0u);
  EXPECT_EQ(view.summary().members(), 0u);
  EXPECT_EQ(view.summary().states_size(), 0);
}

}  // namespace
}  // namespace ddp
