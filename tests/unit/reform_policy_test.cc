// The coordinator's decisions as tables: when to form, wait, fail or admit
// joiners; who the members are; whose state a generation starts from; the lr
// and the assignment each member gets; who is hung; whether a failure is a
// fault and whether the fault budget is spent; whether a restarted
// coordinator adopts its generation.
#include "coordinator/reform_policy.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "coordinator/generation_manager.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const absl::Time kNow = absl::FromUnixSeconds(1700000000);

// min 2, max 4, settle 3s, rejoin 30s, re-form interval 10s.
FormationInput Base(v1::JobState state) {
  FormationInput in;
  in.job_state = state;
  in.min_workers = 2;
  in.max_workers = 4;
  in.settle = absl::Seconds(3);
  in.rejoin_timeout = absl::Seconds(30);
  in.reform_min_interval = absl::Seconds(10);
  in.now = kNow;
  return in;
}

const char* Name(Formation f) {
  switch (f) {
    case Formation::kWait:
      return "wait";
    case Formation::kForm:
      return "form";
    case Formation::kAdmitJoiners:
      return "admit";
    case Formation::kFail:
      return "fail";
  }
  return "?";
}

// ---- DecideFormation -------------------------------------------------------

TEST(ReformPolicy, DecideFormation_Waiting_FormsAtMaxOrOnceSettled) {
  struct Row {
    uint32_t free;
    // How long min_workers have been free; negative: not yet.
    double quorum_for_s;
    double settle_s;
    Formation want;
  } rows[] = {
      {0, -1, 3, Formation::kWait},  {1, -1, 3, Formation::kWait}, {2, 0, 3, Formation::kWait},
      {2, 2.9, 3, Formation::kWait}, {2, 3, 3, Formation::kForm},  {3, 10, 3, Formation::kForm},
      {4, 0, 3, Formation::kForm},   {5, -1, 3, Formation::kForm}, {2, -1, 0, Formation::kForm},
      {2, -1, 3, Formation::kWait},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(absl::StrCat("free ", row.free, ", quorum for ", row.quorum_for_s, "s, settle ",
                              row.settle_s, "s"));
    FormationInput in = Base(v1::JOB_STATE_WAITING);
    in.free_workers = row.free;
    in.settle = absl::Seconds(row.settle_s);
    if (row.quorum_for_s >= 0) in.quorum_since = kNow - absl::Seconds(row.quorum_for_s);
    EXPECT_STREQ(Name(DecideFormation(in).what), Name(row.want));
  }
}

TEST(ReformPolicy, DecideFormation_WaitingBelowMin_SaysHowManyAreMissing) {
  FormationInput in = Base(v1::JOB_STATE_WAITING);
  in.free_workers = 1;
  EXPECT_THAT(DecideFormation(in).why, HasSubstr("waiting for 2 workers (1 attached)"));
  in.free_workers = 2;
  in.quorum_since = kNow - absl::Seconds(1);
  EXPECT_THAT(DecideFormation(in).why, AllOf(HasSubstr("2 of up to 4"), HasSubstr("2.0s")));
}

TEST(ReformPolicy, DecideFormation_Running_AdmitsJoinersOnlyBelowMaxAndAfterInterval) {
  struct Row {
    bool generation_running;
    uint32_t world;
    uint32_t free;
    // Seconds since the latest generation formed.
    double formed_ago_s;
    Formation want;
  } rows[] = {
      {true, 2, 1, 10, Formation::kAdmitJoiners},
      {true, 2, 1, 60, Formation::kAdmitJoiners},
      {true, 3, 2, 60, Formation::kAdmitJoiners},
      {true, 2, 1, 9.9, Formation::kWait},  // rate limit
      {true, 2, 1, 0, Formation::kWait},
      {true, 4, 1, 60, Formation::kWait},  // world is at max_workers
      {true, 2, 0, 60, Formation::kWait},  // nobody to admit
      {false, 0, 3, 60, Formation::kWait},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(absl::StrCat("world ", row.world, ", free ", row.free, ", formed ",
                              row.formed_ago_s, "s ago"));
    FormationInput in = Base(v1::JOB_STATE_RUNNING);
    in.generation_running = row.generation_running;
    in.world_size = row.world;
    in.free_workers = row.free;
    in.last_formed_at = kNow - absl::Seconds(row.formed_ago_s);
    EXPECT_STREQ(Name(DecideFormation(in).what), Name(row.want));
  }
}

TEST(ReformPolicy, DecideFormation_RunningRateLimited_SaysWhenJoinersAreAdmitted) {
  FormationInput in = Base(v1::JOB_STATE_RUNNING);
  in.generation_running = true;
  in.world_size = 2;
  in.free_workers = 1;
  in.last_formed_at = kNow - absl::Seconds(4);
  EXPECT_THAT(DecideFormation(in).why, AllOf(HasSubstr("1 worker waiting"), HasSubstr("6.0s")));
}

TEST(ReformPolicy, DecideFormation_RecoveringWithMin_FormsAtOnceOnceNobodyIsLeaving) {
  struct Row {
    uint32_t free;
    uint32_t leaving;
    Formation want;
  } rows[] = {
      {2, 0, Formation::kForm}, {4, 0, Formation::kForm},
      {6, 0, Formation::kForm}, {2, 1, Formation::kWait},  // a member still finishing its abort
      {4, 3, Formation::kWait},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(absl::StrCat("free ", row.free, ", leaving ", row.leaving));
    FormationInput in = Base(v1::JOB_STATE_RECOVERING);
    in.free_workers = row.free;
    in.leaving_members = row.leaving;
    in.recovering_since = kNow;  // no settle window: survivors go on at once
    EXPECT_STREQ(Name(DecideFormation(in).what), Name(row.want));
  }
}

TEST(ReformPolicy, DecideFormation_RecoveringBelowMin_WaitsThenFailsAtRejoinTimeout) {
  struct Row {
    uint32_t free;
    uint32_t leaving;
    double recovering_for_s;
    Formation want;
  } rows[] =
      {
          {1, 0, 0, Formation::kWait},  {1, 0, 29.9, Formation::kWait},
          {1, 0, 30, Formation::kFail}, {0, 0, 31, Formation::kFail},
          {1, 1, 60, Formation::kWait},  // still leaving: nothing to count yet
          {2, 0, 60, Formation::kForm},
      };
  for (const Row& row : rows) {
    SCOPED_TRACE(absl::StrCat("free ", row.free, ", leaving ", row.leaving, ", for ",
                              row.recovering_for_s, "s"));
    FormationInput in = Base(v1::JOB_STATE_RECOVERING);
    in.free_workers = row.free;
    in.leaving_members = row.leaving;
    in.recovering_since = kNow - absl::Seconds(row.recovering_for_s);
    EXPECT_STREQ(Name(DecideFormation(in).what), Name(row.want));
  }
}

TEST(ReformPolicy, DecideFormation_RecoveringBelowMin_MessagesNameTheCounts) {
  FormationInput in = Base(v1::JOB_STATE_RECOVERING);
  in.free_workers = 1;
  in.recovering_since = kNow - absl::Seconds(10);
  EXPECT_THAT(DecideFormation(in).why,
              AllOf(HasSubstr("1 more worker"), HasSubstr("1 of min_workers 2"), HasSubstr("20s")));
  in.recovering_since = kNow - absl::Seconds(30);
  const FormationDecision fail = DecideFormation(in);
  ASSERT_EQ(fail.what, Formation::kFail);
  EXPECT_THAT(fail.why, AllOf(HasSubstr("only 1 of the 2 workers"), HasSubstr("min_workers"),
                              HasSubstr("rejoin_timeout_seconds 30")));
}

TEST(ReformPolicy, DecideFormation_EndedOrNoJob_Waits) {
  for (v1::JobState state : {v1::JOB_STATE_UNSPECIFIED, v1::JOB_STATE_SUCCEEDED,
                             v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    FormationInput in = Base(state);
    in.free_workers = 4;
    EXPECT_EQ(DecideFormation(in).what, Formation::kWait) << v1::JobState_Name(state);
  }
}

// ---- ChooseMembers ---------------------------------------------------------

// A candidate holding the job's state at `held_step`, trained in generation
// 1; none without a step.
Candidate Cand(int index, std::optional<uint64_t> held_step = std::nullopt) {
  Candidate c;
  c.slot = RankCandidate{absl::StrCat("w", index), "h", Device{Device::Kind::kCpu, index}, ""};
  if (held_step) {
    v1::HeldState held;
    held.set_job_id("j");
    held.set_step(*held_step);
    held.set_generation(1);
    c.held = held;
  }
  return c;
}

// A candidate that built the job's state fresh and never trained it
// (v1::Prepare): generation 0.
Candidate Prepared(int index) {
  Candidate c = Cand(index, 0);
  c.held->set_generation(0);
  return c;
}

std::vector<std::string> Ids(const std::vector<Candidate>& members) {
  std::vector<std::string> ids;
  for (const Candidate& c : members) ids.push_back(c.slot.worker_id);
  return ids;
}

TEST(ReformPolicy, ChooseMembers_Table_StateHoldersFirstThenRankOrder) {
  using Ids_ = std::vector<std::string>;
  struct Row {
    const char* name;
    std::vector<Candidate> candidates;
    uint32_t max;
    Ids_ want;
  } rows[] = {
      {"all fit, input order ignored", {Cand(2), Cand(0), Cand(1)}, 4, Ids_{"w0", "w1", "w2"}},
      {"more than max, no state", {Cand(3), Cand(1), Cand(0), Cand(2)}, 2, Ids_{"w0", "w1"}},
      {"holder beyond max is kept",
       {Cand(0, 5), Cand(1), Cand(2), Cand(3, 10)},
       2,
       Ids_{"w0", "w3"}},
      {"holders before stateless joiners",
       {Cand(0), Cand(1, 10), Cand(2, 3), Cand(3)},
       2,
       Ids_{"w1", "w2"}},
      {"more holders than max: the most advanced",
       {Cand(0, 2), Cand(1, 10), Cand(2, 3), Cand(3)},
       2,
       Ids_{"w1", "w2"}},
      {"equal holders: first in rank order",
       {Cand(0), Cand(1, 7), Cand(2, 7), Cand(3, 7)},
       2,
       Ids_{"w1", "w2"}},
      {"max one", {Cand(0, 1), Cand(1), Cand(2, 9)}, 1, Ids_{"w2"}},
      {"exactly max", {Cand(1, 4), Cand(0)}, 2, Ids_{"w0", "w1"}},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    EXPECT_EQ(Ids(ChooseMembers(row.candidates, row.max)), row.want);
  }
}

TEST(ReformPolicy, ChooseMembers_KeepsHeldStateWithItsCandidate) {
  const std::vector<Candidate> members = ChooseMembers({Cand(1, 8), Cand(0)}, 2);
  ASSERT_EQ(members.size(), 2u);
  EXPECT_FALSE(members[0].held.has_value());
  ASSERT_TRUE(members[1].held.has_value());
  EXPECT_EQ(members[1].held->step(), 8u);
}

// ---- ChooseSource ----------------------------------------------------------

Candidate Holder(int index, uint64_t step, uint64_t epoch, uint64_t cursor) {
  Candidate c = Cand(index, step);
  c.held->set_epoch(epoch);
  c.held->set_cursor(cursor);
  return c;
}

TEST(ReformPolicy, ChooseSource_Table_MostAdvancedStateWins) {
  struct Row {
    const char* name;
    std::vector<Candidate> members;
    std::optional<uint64_t> checkpoint;
    uint64_t committed;
    v1::StateSource source;
    uint32_t rank;
    uint64_t step;
    uint64_t steps_lost;
  } rows[] = {
      {"nothing: fresh", {Cand(0), Cand(1)}, std::nullopt, 0, v1::STATE_SOURCE_FRESH, 0, 0, 0},
      {"fresh after progress", {Cand(0)}, std::nullopt, 40, v1::STATE_SOURCE_FRESH, 0, 0, 40},
      {"highest held step",
       {Cand(0, 7), Cand(1, 9), Cand(2, 8)},
       std::nullopt,
       9,
       v1::STATE_SOURCE_MEMORY,
       1,
       9,
       0},
      {"ties to the lowest rank",
       {Cand(0), Cand(1, 9), Cand(2, 9)},
       std::nullopt,
       9,
       v1::STATE_SOURCE_MEMORY,
       1,
       9,
       0},
      {"checkpoint further along",
       {Cand(0), Cand(1, 9)},
       12,
       12,
       v1::STATE_SOURCE_CHECKPOINT,
       0,
       12,
       0},
      {"checkpoint level with memory",
       {Cand(0), Cand(1, 9)},
       9,
       9,
       v1::STATE_SOURCE_MEMORY,
       1,
       9,
       0},
      {"checkpoint behind memory", {Cand(0, 9)}, 5, 9, v1::STATE_SOURCE_MEMORY, 0, 9, 0},
      {"checkpoint only", {Cand(0), Cand(1)}, 5, 9, v1::STATE_SOURCE_CHECKPOINT, 0, 5, 4},
      {"prepared states only: fresh",
       {Prepared(0), Prepared(1)},
       std::nullopt,
       0,
       v1::STATE_SOURCE_FRESH,
       0,
       0,
       0},
      {"prepared states and a checkpoint",
       {Prepared(0), Prepared(1)},
       5,
       5,
       v1::STATE_SOURCE_CHECKPOINT,
       0,
       5,
       0},
      {"a trained state beats prepared ones",
       {Prepared(0), Cand(1, 0)},
       std::nullopt,
       0,
       v1::STATE_SOURCE_MEMORY,
       1,
       0,
       0},
      {"memory behind committed", {Cand(0, 6)}, std::nullopt, 9, v1::STATE_SOURCE_MEMORY, 0, 6, 3},
      {"committed below chosen", {Cand(0, 9)}, std::nullopt, 2, v1::STATE_SOURCE_MEMORY, 0, 9, 0},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    SourceInput in;
    in.members = &row.members;
    in.checkpoint_step = row.checkpoint;
    in.checkpoint_generation = 1;  // as the members' states
    in.committed_step = row.committed;
    const SourceChoice got = ChooseSource(in);
    EXPECT_EQ(v1::StateSource_Name(got.source), v1::StateSource_Name(row.source));
    EXPECT_EQ(got.rank, row.rank);
    EXPECT_EQ(got.step, row.step);
    EXPECT_EQ(got.steps_lost, row.steps_lost);
  }
}

Candidate InGeneration(Candidate c, uint64_t generation) {
  c.held->set_generation(generation);
  return c;
}

// A worker cut off from the job may have gone on alone on a branch the job
// has left: the newest generation's state wins, whatever the steps.
TEST(ReformPolicy, ChooseSource_NewerGenerationWinsOverMoreSteps) {
  const std::vector<Candidate> members = {InGeneration(Cand(0, 314), 1),
                                          InGeneration(Cand(1, 313), 2)};
  SourceInput in;
  in.members = &members;
  SourceChoice got = ChooseSource(in);
  EXPECT_EQ(got.source, v1::STATE_SOURCE_MEMORY);
  EXPECT_EQ(got.rank, 1u);
  EXPECT_EQ(got.step, 313u);
  // A checkpoint written by a later generation than the members' states.
  in.checkpoint_step = 300;
  in.checkpoint_generation = 3;
  got = ChooseSource(in);
  EXPECT_EQ(got.source, v1::STATE_SOURCE_CHECKPOINT);
  EXPECT_EQ(got.step, 300u);
  // The same checkpoint against a member that trained in a later one.
  const std::vector<Candidate> newer = {InGeneration(Cand(0, 290), 4)};
  in.members = &newer;
  EXPECT_EQ(ChooseSource(in).source, v1::STATE_SOURCE_MEMORY);
}

TEST(ReformPolicy, ChooseMembers_MoreThanMax_NewestGenerationsHeldFirst) {
  const std::vector<Candidate> members =
      ChooseMembers({InGeneration(Cand(0, 500), 1), InGeneration(Cand(1, 20), 3), Cand(2),
                     InGeneration(Cand(3, 21), 3)},
                    2);
  EXPECT_EQ(Ids(members), (std::vector<std::string>{"w1", "w3"}));
}

TEST(ReformPolicy, ChooseSource_Memory_CarriesEpochAndCursor) {
  const std::vector<Candidate> members = {Cand(0), Holder(1, 30, 2, 640)};
  SourceInput in;
  in.members = &members;
  const SourceChoice got = ChooseSource(in);
  EXPECT_EQ(got.source, v1::STATE_SOURCE_MEMORY);
  EXPECT_EQ(got.rank, 1u);
  EXPECT_EQ(got.epoch, 2u);
  EXPECT_EQ(got.cursor, 640u);
}

// ---- HangThreshold and FindHungMembers ------------------------------------

TEST(ReformPolicy, HangThreshold_Table_LargerOfTimeoutAndTenMedianSteps) {
  struct Row {
    double timeout_s, median_s, want_s;
  } rows[] = {{60, 0, 60}, {60, 1, 60}, {60, 6, 60}, {60, 7, 70}, {5, 0.25, 5}, {1, 30, 300}};
  for (const Row& row : rows) {
    EXPECT_EQ(HangThreshold(absl::Seconds(row.timeout_s), absl::Seconds(row.median_s)),
              absl::Seconds(row.want_s))
        << row.timeout_s << "s, median " << row.median_s << "s";
  }
}

MemberActivity Member(int rank, uint64_t step, double stuck_s, v1::StepPhase phase) {
  return MemberActivity{absl::StrCat("w", rank), rank, step, kNow - absl::Seconds(stuck_s), phase};
}

// Evaluating its share (or waiting for the others'), with a bound of its own.
MemberActivity Evaluating(int rank, uint64_t step, double stuck_s, double bound_s,
                          v1::StepPhase phase = v1::STEP_PHASE_EVALUATE) {
  MemberActivity m = Member(rank, step, stuck_s, phase);
  m.phase_bound = absl::Seconds(bound_s);
  return m;
}

TEST(ReformPolicy, FindHungMembers_Table_CulpritIsStuckAndFurthestBehind) {
  constexpr auto kFwd = v1::STEP_PHASE_FORWARD;
  constexpr auto kWait = v1::STEP_PHASE_ALLREDUCE_WAIT;
  constexpr auto kBwd = v1::STEP_PHASE_BACKWARD;
  constexpr auto kOpt = v1::STEP_PHASE_OPTIMIZER;
  constexpr auto kEvalWait = v1::STEP_PHASE_EVALUATE_WAIT;
  using Ids_ = std::vector<std::string>;
  struct Row {
    const char* name;
    std::vector<MemberActivity> members;
    Ids_ evict;
    bool reform_all;
  } rows[] = {
      {"nobody stuck", {Member(0, 5, 1, kFwd), Member(1, 5, 29, kWait)}, Ids_{}, false},
      {"exactly at the threshold", {Member(0, 5, 30, kFwd), Member(1, 5, 1, kWait)}, Ids_{}, false},
      {"one computing, the others wait for it",
       {Member(0, 5, 40, kWait), Member(1, 5, 40, kFwd), Member(2, 5, 40, kWait)},
       Ids_{"w1"},
       false},
      {"the one waited for, its own last step a moment later",
       {Member(0, 5, 31, kWait), Member(1, 5, 29, v1::STEP_PHASE_DATA), Member(2, 5, 29, kWait)},
       Ids_{"w1"},
       false},
      {"one behind, all in collectives",
       {Member(0, 6, 40, kWait), Member(1, 6, 40, kWait), Member(2, 5, 40, kBwd)},
       Ids_{"w2"},
       false},
      {"behind beats computing ahead",
       {Member(0, 6, 40, kOpt), Member(1, 5, 40, kWait), Member(2, 6, 40, kWait)},
       Ids_{"w1"},
       false},
      {"one stuck in a collective, the rest advance",
       {Member(0, 9, 1, kFwd), Member(1, 5, 40, kWait)},
       Ids_{"w1"},
       false},
      {"two computing, in rank order",
       {Member(2, 5, 40, kFwd), Member(0, 5, 40, kOpt), Member(1, 5, 40, kWait)},
       Ids_{"w0", "w2"},
       false},
      {"all in collectives at one step",
       {Member(0, 5, 40, kWait), Member(1, 5, 40, kBwd), Member(2, 5, 40, v1::STEP_PHASE_SYNC)},
       Ids_{},
       true},
      {"evaluating within its bound, the others wait for it",
       {Member(0, 5, 40, kWait), Evaluating(1, 5, 40, 100), Member(2, 5, 40, kWait)},
       Ids_{},
       false},
      {"every rank evaluating within its bound",
       {Evaluating(0, 5, 40, 100), Evaluating(1, 5, 40, 100, kEvalWait)},
       Ids_{},
       false},
      {"evaluating past its bound",
       {Member(0, 5, 101, kWait), Evaluating(1, 5, 101, 100)},
       Ids_{"w1"},
       false},
      {"a share stuck past the bound, the others wait for it",
       {Evaluating(0, 5, 101, 100, kEvalWait), Evaluating(1, 5, 101, 100),
        Evaluating(2, 5, 101, 100, kEvalWait)},
       Ids_{"w1"},
       false},
      {"a bound shorter than the threshold changes nothing",
       {Member(0, 5, 40, kWait), Evaluating(1, 5, 40, 10)},
       Ids_{"w1"},
       false},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    const HangVerdict verdict = FindHungMembers(row.members, absl::Seconds(30), kNow);
    EXPECT_EQ(verdict.evict, row.evict);
    EXPECT_EQ(verdict.reform_all, row.reform_all);
    EXPECT_EQ(verdict.reason.empty(), row.evict.empty() && !row.reform_all);
  }
}

TEST(ReformPolicy, FindHungMembers_Culprit_ReasonNamesRankPhaseStepAndTime) {
  const HangVerdict verdict = FindHungMembers(
      {Member(0, 5, 42, v1::STEP_PHASE_ALLREDUCE_WAIT), Member(1, 5, 42, v1::STEP_PHASE_FORWARD)},
      absl::Seconds(30), kNow);
  EXPECT_THAT(verdict.reason,
              AllOf(HasSubstr("rank 1 (w1)"), HasSubstr("step 5"), HasSubstr("phase forward"),
                    HasSubstr("42.0s"), HasSubstr("threshold 30.0s")));
}

TEST(ReformPolicy, FindHungMembers_EvaluationPastItsBound_ReasonGivesTheBound) {
  const HangVerdict verdict =
      FindHungMembers({Member(0, 5, 130, v1::STEP_PHASE_EVALUATE_WAIT), Evaluating(1, 5, 130, 120)},
                      absl::Seconds(30), kNow);
  EXPECT_THAT(verdict.reason, AllOf(HasSubstr("rank 1 (w1)"), HasSubstr("phase evaluate"),
                                    HasSubstr("threshold 120.0s")));
}

TEST(ReformPolicy, FindHungMembers_AllInCollectives_ReasonSaysReformingWithSameWorkers) {
  const HangVerdict verdict =
      FindHungMembers({Member(0, 5, 42, v1::STEP_PHASE_ALLREDUCE_WAIT)}, absl::Seconds(30), kNow);
  EXPECT_TRUE(verdict.reform_all);
  EXPECT_THAT(verdict.evict, IsEmpty());
  EXPECT_THAT(verdict.reason, AllOf(HasSubstr("every rank is stuck"), HasSubstr("allreduce_wait")));
}

// ---- DecideAdoption --------------------------------------------------------

TEST(ReformPolicy, DecideAdoption_Table_AdoptWhenAllBackGiveUpPastGraceOrOnALeaver) {
  struct Row {
    uint32_t returned, returned_idle;
    double before_deadline_s;  // negative: past it
    Adoption want;
  } rows[] = {
      {3, 0, 5, Adoption::kAdopt},    {3, 0, -5, Adoption::kAdopt}, {2, 0, 5, Adoption::kWait},
      {0, 0, 0.001, Adoption::kWait}, {2, 0, 0, Adoption::kGiveUp}, {2, 0, -1, Adoption::kGiveUp},
      {2, 1, 5, Adoption::kGiveUp},   {3, 1, 5, Adoption::kGiveUp},
  };
  for (const Row& row : rows) {
    AdoptionInput in;
    in.members = 3;
    in.returned = row.returned;
    in.returned_idle = row.returned_idle;
    in.now = kNow;
    in.deadline = kNow + absl::Seconds(row.before_deadline_s);
    EXPECT_EQ(static_cast<int>(DecideAdoption(in)), static_cast<int>(row.want))
        << row.returned << " back, " << row.returned_idle << " idle, " << row.before_deadline_s
        << "s before the deadline";
  }
}

// ---- ScaledLr ---------------------------------------------------------------

TEST(ReformPolicy, ScaledLr_Table_KeepIsTheSpecsLinearFollowsTheWorld) {
  struct Row {
    v1::LrScaling scaling;
    uint32_t world, max_workers;
    double lr;
  };
  const Row rows[] = {
      {v1::LR_SCALING_KEEP, 2, 8, 0.1},    // keep: whatever the world
      {v1::LR_SCALING_KEEP, 8, 8, 0.1},    //
      {v1::LR_SCALING_LINEAR, 8, 8, 0.1},  // linear at max_workers: the spec's lr
      {v1::LR_SCALING_LINEAR, 2, 8, 0.025}, {v1::LR_SCALING_LINEAR, 1, 4, 0.025},
      {v1::LR_SCALING_LINEAR, 3, 0, 0.3},  // max_workers 0 (unset) counts as 1
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(
        absl::StrCat(v1::LrScaling_Name(row.scaling), " ", row.world, "/", row.max_workers));
    EXPECT_DOUBLE_EQ(ScaledLr(0.1, row.scaling, row.world, row.max_workers), row.lr);
  }
}

// ---- BuildAssignment --------------------------------------------------------

TEST(ReformPolicy, BuildAssignment_GpuMembers_OwnGpusOnlyWhenNoneShared) {
  FakeClock clock;
  GenerationManager generations(&clock);
  v1::JobSpec spec;
  const AssignmentJob job{"job", &spec, 0};
  const Device gpu0{Device::Kind::kCuda, 0};
  const Device gpu1{Device::Kind::kCuda, 1};
  const Generation& own = generations.Form(
      {RankCandidate{"a", "h1", gpu0, "m1"}, RankCandidate{"b", "h1", gpu1, "m1"}}, {}, 0.1);
  EXPECT_TRUE(BuildAssignment(own, 1, job).own_gpus());
  EXPECT_EQ(BuildAssignment(own, 1, job).own_gpus_why_not(), "");
  // Two addresses of one machine, one GPU.
  const Generation& shared = generations.Form(
      {RankCandidate{"a", "h1", gpu0, "m1"}, RankCandidate{"b", "h2", gpu0, "m1"}}, {}, 0.1);
  const v1::Assignment a = BuildAssignment(shared, 0, job);
  EXPECT_FALSE(a.own_gpus());
  EXPECT_THAT(a.own_gpus_why_not(), HasSubstr("ranks 0 and 1 share cuda:0"));
}

TEST(ReformPolicy, BuildAssignment_Table_EachRankGetsItsPlaceStateAndToken) {
  FakeClock clock;
  GenerationManager generations(&clock);
  generations.RestoreLatest(6);
  SourceChoice source;
  source.rank = 2;
  source.source = v1::STATE_SOURCE_MEMORY;
  source.step = 120;
  source.epoch = 3;
  source.cursor = 64;
  // Machine m1 holds ranks 0-1, m2 ranks 2-4.
  const Generation& g =
      generations.Form({RankCandidate{"a", "h1", Device{Device::Kind::kCpu, 0}, "m1"},
                        RankCandidate{"b", "h1", Device{Device::Kind::kCpu, 1}, "m1"},
                        RankCandidate{"c", "h2", Device{Device::Kind::kCpu, 0}, "m2"},
                        RankCandidate{"d", "h2", Device{Device::Kind::kCpu, 1}, "m2"},
                        RankCandidate{"e", "h2", Device{Device::Kind::kCpu, 2}, "m2"}},
                       source, 0.05);
  v1::JobSpec spec;
  spec.set_name("job");
  spec.set_seed(42);
  const AssignmentJob job{"job", &spec, 2};
  struct Row {
    uint32_t rank;
    const char* worker_id;
    uint32_t machine, local_rank, local_size;
  };
  const Row rows[] = {
      {0, "a", 0, 0, 2}, {1, "b", 0, 1, 2}, {2, "c", 1, 0, 3}, {3, "d", 1, 1, 3}, {4, "e", 1, 2, 3},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.worker_id);
    const v1::Assignment a = BuildAssignment(g, row.rank, job);
    EXPECT_EQ(a.worker_id(), row.worker_id);
    EXPECT_EQ(a.rank(), row.rank);
    EXPECT_EQ(a.machine(), row.machine);
    EXPECT_EQ(a.local_rank(), row.local_rank);
    EXPECT_EQ(a.local_size(), row.local_size);
    EXPECT_EQ(a.store_token(), g.store_tokens[row.rank]);  // its own, no other's
    // The same for every rank:
    EXPECT_EQ(a.job_id(), "job");
    EXPECT_EQ(a.generation(), 7u);
    EXPECT_EQ(a.world_size(), 5u);
    EXPECT_EQ(a.machines(), 2u);
    EXPECT_EQ(a.max_local_size(), 3u);
    EXPECT_FALSE(a.single_machine());
    EXPECT_FALSE(a.own_gpus());  // CPU members: "auto" keeps off NCCL
    EXPECT_THAT(a.own_gpus_why_not(), HasSubstr("rank 0 is on cpu:0"));
    EXPECT_EQ(a.start_epoch(), 3u);
    EXPECT_EQ(a.start_step(), 120u);
    EXPECT_EQ(a.start_cursor(), 64u);
    EXPECT_EQ(a.source_rank(), 2u);
    EXPECT_EQ(a.state_source(), v1::STATE_SOURCE_MEMORY);
    EXPECT_EQ(a.sampler_seed(), 42u);
    EXPECT_DOUBLE_EQ(a.lr(), 0.05);
    EXPECT_EQ(a.evaluated_epochs(), 2u);
    EXPECT_EQ(a.spec().name(), "job");
  }
}

// ---- ClassifyFailure and DecideFault ---------------------------------------

TEST(ReformPolicy, ClassifyFailure_Table_PeerAndNetworkFailuresAreFaultsTheRestFatal) {
  struct Row {
    absl::StatusCode code;
    FailureKind kind;
  };
  const Row rows[] = {
      // A peer or the network: the next generation can do without it.
      {absl::StatusCode::kUnavailable, FailureKind::kFault},
      {absl::StatusCode::kAborted, FailureKind::kFault},
      {absl::StatusCode::kDeadlineExceeded, FailureKind::kFault},
      {absl::StatusCode::kCancelled, FailureKind::kFault},
      // The job itself (its model, data or replicas): it would fail again.
      {absl::StatusCode::kInvalidArgument, FailureKind::kFatal},
      {absl::StatusCode::kFailedPrecondition, FailureKind::kFatal},
      {absl::StatusCode::kDataLoss, FailureKind::kFatal},
      {absl::StatusCode::kInternal, FailureKind::kFatal},
      {absl::StatusCode::kResourceExhausted, FailureKind::kFatal},
      {absl::StatusCode::kUnknown, FailureKind::kFatal},
      {absl::StatusCode::kOk, FailureKind::kFatal},  // a FAILED without a code
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(absl::StatusCodeToString(row.code));
    EXPECT_EQ(ClassifyFailure(row.code), row.kind);
  }
}

TEST(ReformPolicy, DecideFault_Table_ReformsWithinBudgetFailsPastIt) {
  struct Row {
    uint32_t faults, budget;
    bool fail_job;
  };
  const Row rows[] = {
      {1, 3, false},
      {3, 3, false},  // the budget's last fault still re-forms
      {4, 3, true},
      {1, 0, true},  // a budget of 0: the first fault fails the job
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(absl::StrCat(row.faults, " of ", row.budget));
    const FaultOutcome outcome = DecideFault(row.faults, row.budget, "rank 1 lost");
    EXPECT_EQ(outcome.fail_job, row.fail_job);
    EXPECT_EQ(outcome.reason, row.fail_job ? absl::StrCat("rank 1 lost; the job's fault budget (",
                                                          row.budget, ") is spent")
                                           : "rank 1 lost");
  }
}

}  // namespace
}  // namespace ddp
