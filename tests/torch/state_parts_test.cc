// A training state of the library's shape (state_codec.h's StateParts):
// AdamW's moments, no optimizer, the program's own bytes, the RNG left to
// the program; and the one transfer that moves any state between ranks
// (state_transfer.h), against a source that lies about its size; and the
// one replica check before it (replica_check.h).
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/torch/ranks.h"
#include "tests/torch/state_util.h"
#include "worker/digest.h"
#include "worker/elastic/replica_check.h"
#include "worker/elastic/state_codec.h"
#include "worker/elastic/state_transfer.h"
#include "worker/model_state.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::unique_ptr<torch::optim::AdamW> AdamW(Model& model) {
  std::vector<at::Tensor> params;
  for (const auto& [name, t] : model.Parameters()) params.push_back(t);
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-3));
}

TEST(StateParts, AdamW_MomentsTravelAndNextStepEqual) {
  auto source = BuildModel("mlp", 1);
  auto source_opt = AdamW(*source);
  for (int i = 0; i < 3; ++i) TrainStep(*source, *source_opt, i);
  absl::StatusOr<std::string> bytes = EncodeTrainingState(TestHeader(), *source, *source_opt);
  ASSERT_THAT(bytes, IsOk());
  auto dest = BuildModel("mlp", 2);
  auto dest_opt = AdamW(*dest);
  ASSERT_THAT(DecodeTrainingState(*bytes, TestIdentity(), *dest, *dest_opt), IsOk());
  TrainStep(*source, *source_opt, 50);
  TrainStep(*dest, *dest_opt, 50);
  EXPECT_EQ(ParameterDigest(*source), ParameterDigest(*dest));

  // Adam is another optimizer, even with the same moments.
  auto adam_model = BuildModel("mlp", 3);
  auto adam = BuildOptimizer("adam", *adam_model);
  EXPECT_THAT(DecodeTrainingState(*bytes, TestIdentity(), *adam_model, *adam),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("AdamW")));
}

TEST(StateParts, NoOptimizerNoRng_ProgramStateTravelsAndRngStaysTheReceivers) {
  auto source = BuildModel("mlp", 1);
  StateParts source_parts{source->Parameters(), source->Buffers(), nullptr, /*rng=*/false};
  v1::TrainingStateHeader header = TestHeader();
  header.set_program_state(std::string("scheduler step 17\0and a zero", 28));
  absl::StatusOr<std::string> bytes = EncodeTrainingState(header, source_parts);
  ASSERT_THAT(bytes, IsOk());
  absl::StatusOr<v1::TrainingStateHeader> read = ReadTrainingStateHeader(*bytes);
  ASSERT_THAT(read, IsOk());
  EXPECT_TRUE(read->rng_state().empty());

  auto dest = BuildModel("mlp", 2);
  torch::manual_seed(8);
  const at::Tensor expected = torch::rand({16});
  torch::manual_seed(8);
  absl::StatusOr<v1::TrainingStateHeader> decoded = DecodeTrainingState(
      *bytes, TestIdentity(), StateParts{dest->Parameters(), dest->Buffers(), nullptr, false});
  ASSERT_THAT(decoded, IsOk());
  EXPECT_EQ(decoded->program_state(), header.program_state());
  EXPECT_EQ(ParameterDigest(*dest), ParameterDigest(*source));
  EXPECT_TRUE(torch::equal(torch::rand({16}), expected)) << "the receiver's RNG was touched";

  // A receiver with an optimizer wants that optimizer's state.
  auto with_opt = BuildModel("mlp", 3);
  auto sgd = BuildOptimizer("sgd", *with_opt);
  EXPECT_THAT(DecodeTrainingState(*bytes, TestIdentity(), *with_opt, *sgd),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("none")));
}

TEST(StateParts, ProgramStateOverTheCap_RefusedAtEncode) {
  auto model = BuildModel("mlp", 1);
  v1::TrainingStateHeader header = TestHeader();
  header.set_program_state(std::string(kMaxProgramStateBytes + 1, 'x'));
  EXPECT_THAT(EncodeTrainingState(
                  header, StateParts{model->Parameters(), model->Buffers(), nullptr, false}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most")));
}

TEST(StateTransfer, SourcesBytesReachEveryRank) {
  std::vector<absl::StatusOr<std::string>> got(3, absl::UnknownError("not run"));
  RunRanks(3, [&](int rank, Communicator* comm) {
    absl::StatusOr<std::string> mine = absl::UnavailableError("not the source");
    if (rank == 1) mine = std::string("the state");
    got[rank] = BroadcastState(*comm, 1, std::move(mine), 100);
  });
  for (const auto& g : got) {
    ASSERT_THAT(g, IsOk());
    EXPECT_EQ(*g, "the state");
  }
}

TEST(StateTransfer, SourceWithoutState_ItsErrorThereUnavailableElsewhere) {
  std::vector<absl::Status> got(2);
  RunRanks(2, [&](int rank, Communicator* comm) {
    absl::StatusOr<std::string> mine = absl::FailedPreconditionError("no checkpoint");
    got[rank] = BroadcastState(*comm, 0, std::move(mine), 100).status();
  });
  EXPECT_THAT(got[0], StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no checkpoint")));
  EXPECT_THAT(got[1], StatusIs(absl::StatusCode::kUnavailable,
                               HasSubstr("rank 0 could not provide the state")));
}

TEST(StateTransfer, AnnouncedSizeOverTheBound_EveryRankRefusesBeforeAllocating) {
  std::vector<absl::Status> got(2);
  RunRanks(2, [&](int rank, Communicator* comm) {
    absl::StatusOr<std::string> mine = std::string(101, 's');
    got[rank] = BroadcastState(*comm, 0, std::move(mine), 100).status();
  });
  for (const absl::Status& s : got) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss,
                            HasSubstr("rank 0 announced a state of 101 bytes")));
  }
}

TEST(ReplicaCheck, ModelsDiffer_EveryRankFailsNamingWhereEachDiffers) {
  auto mlp = BuildModel("mlp", 1);
  auto wide = BuildModel("mlp", 1, /*classes=*/12);
  std::vector<absl::Status> got(3);
  RunRanks(3, [&](int rank, Communicator* comm) {
    Model& m = rank == 2 ? *wide : *mlp;
    got[rank] = CheckSameModel(*comm, m.Parameters(), m.Buffers(), 0);
  });
  for (const absl::Status& s : got) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                            AllOf(HasSubstr("the ranks' models differ: rank 2 at parameter #"),
                                  HasSubstr("Every rank must build the same model"))));
  }
  EXPECT_THAT(got[2], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("This rank (2)")));
  RunRanks(2, [&](int rank, Communicator* comm) {
    got[rank] = CheckSameModel(*comm, mlp->Parameters(), mlp->Buffers(), 1);
  });
  EXPECT_THAT(got[0], IsOk());
  EXPECT_THAT(got[1], IsOk());
}

TEST(ReplicaCheck, RootAnnouncesAHugeList_RefusedBeforeAllocating) {
  auto mlp = BuildModel("mlp", 1);
  absl::Status got;
  RunRanks(2, [&](int rank, Communicator* comm) {
    if (rank == 0) {
      uint64_t size = uint64_t{1} << 60;
      ASSERT_THAT(comm->Broadcast(&size, sizeof(size), 0), IsOk());
      return;
    }
    got = CheckSameModel(*comm, mlp->Parameters(), mlp->Buffers(), 0);
  });
  EXPECT_THAT(got, StatusIs(absl::StatusCode::kDataLoss,
                            HasSubstr("announced a parameter list of 1152921504606846976")));
}

}  // namespace
}  // namespace ddp
