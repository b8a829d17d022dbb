#include "worker/collective/transport_choice.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

constexpr Device kCpu{Device::Kind::kCpu, 0};
constexpr Device kGpu{Device::Kind::kCuda, 0};
const char* const kShared =
    "ranks 0 and 1 share cuda:0 on m1 (NCCL refuses two ranks on one device)";

struct Row {
  const char* name;
  const char* backend;
  Device device;
  bool own_gpus;
  const char* why_not;
  bool single_machine;
  uint32_t world, machines, max_local;
  Transport want;
  const char* why;  // a piece of the log line
};

v1::Assignment Make(const Row& row) {
  v1::Assignment a;
  a.mutable_spec()->set_backend(row.backend);
  a.set_own_gpus(row.own_gpus);
  a.set_own_gpus_why_not(row.why_not);
  a.set_single_machine(row.single_machine);
  a.set_world_size(row.world);
  a.set_machines(row.machines);
  a.set_max_local_size(row.max_local);
  return a;
}

TEST(TransportChoice, ChooseTransport_Table) {
  const Row rows[] = {
      {"auto, own GPUs", "auto", kGpu, true, "", false, 4, 4, 1, Transport::kNccl,
       "auto: nccl, every rank has its own GPU"},
      {"auto, own GPUs on one machine", "auto", kGpu, true, "", true, 2, 1, 2, Transport::kNccl,
       "auto: nccl"},
      {"auto, shared GPU on one machine", "auto", kGpu, false, kShared, true, 2, 1, 2,
       Transport::kShm, "auto: shm, ranks 0 and 1 share cuda:0"},
      {"auto, a CPU rank among GPUs, two machines", "auto", kGpu, false,
       "rank 1 is on cpu:0 (NCCL needs a GPU on every rank)", false, 2, 2, 1, Transport::kGloo,
       "auto: gloo, rank 1 is on cpu:0"},
      {"auto, shared GPUs, several ranks a machine", "auto", kGpu, false, kShared, false, 4, 2, 2,
       Transport::kHierarchical, "share cuda:0"},
      {"auto, an older coordinator says nothing", "auto", kGpu, false, "", true, 2, 1, 2,
       Transport::kShm, "did not say"},
      {"auto, CPU, one machine", "auto", kCpu, false, "rank 0 is on cpu:0", true, 3, 1, 3,
       Transport::kShm, "auto: shm, every rank is on one machine"},
      {"auto, CPU, one rank a machine", "auto", kCpu, false, "rank 0 is on cpu:0", false, 3, 3, 1,
       Transport::kGloo, "auto: gloo, ranks on several machines"},
      {"auto, CPU, too many for shm", "auto", kCpu, false, "", true, 1000, 1, 1000,
       Transport::kGloo, "more ranks than shared memory takes"},
      {"nccl asked for, shared GPU", "nccl", kGpu, false, kShared, true, 2, 1, 2, Transport::kNccl,
       "the job's backend is nccl"},
      {"gloo asked for, own GPUs", "gloo", kGpu, true, "", false, 2, 2, 1, Transport::kGloo,
       "the job's backend is gloo"},
      {"shm asked for", "shm", kCpu, false, "", true, 2, 1, 2, Transport::kShm,
       "the job's backend is shm"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    const TransportChoice choice = ChooseTransport(Make(row), row.device);
    EXPECT_EQ(choice.transport, row.want) << TransportName(choice.transport);
    EXPECT_THAT(choice.why, HasSubstr(row.why));
  }
}

TEST(TransportChoice, ChooseTransport_CpuRank_SaysNothingOfGpus) {
  Row row{"", "auto", kCpu, false, "rank 0 is on cpu:0", true, 2, 1, 2, Transport::kShm, ""};
  EXPECT_EQ(ChooseTransport(Make(row), kCpu).why, "auto: shm, every rank is on one machine");
}

}  // namespace
}  // namespace ddp
