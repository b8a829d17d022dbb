#include "worker/collective/transport_choice.h"

#include "absl/strings/str_cat.h"
#include "common/job_kinds.h"
#include "worker/collective/shm_communicator.h"

namespace ddp {
namespace {

// Several machines, and one of them with several ranks: only the
// machines' leaders need the network.
bool Hierarchical(const v1::Assignment& a) {
  return a.machines() > 1 && a.world_size() > a.machines() &&
         a.max_local_size() <= static_cast<uint32_t>(ShmCommunicator::kMaxRanks);
}

TransportChoice Auto(Transport t, const std::string& why) {
  return TransportChoice{t, absl::StrCat("auto: ", TransportName(t), ", ", why)};
}

}  // namespace

const char* TransportName(Transport t) {
  switch (t) {
    case Transport::kShm:
      return "shm";
    case Transport::kHierarchical:
      return "shm within machines, gloo among them";
    case Transport::kNccl:
      return "nccl";
    case Transport::kGloo:
      return "gloo";
  }
  return "unknown";
}

TransportChoice ChooseTransport(const v1::Assignment& a, const Device& device) {
  switch (BackendOf(a.spec())) {
    case v1::BACKEND_SHM:
      return {Transport::kShm, "the job's backend is shm"};
    case v1::BACKEND_NCCL:
      return {Transport::kNccl, "the job's backend is nccl"};
    case v1::BACKEND_GLOO:
    case v1::BACKEND_UNKNOWN:  // refused by the job's check
      return {Transport::kGloo, "the job's backend is gloo"};
    case v1::BACKEND_AUTO:
      break;
  }
  if (device.is_cuda() && a.own_gpus()) return Auto(Transport::kNccl, "every rank has its own GPU");
  // A CPU rank needs no word on GPUs; a CUDA one says why it stages
  // through host memory instead.
  const std::string gpus =
      device.is_cuda()
          ? (a.own_gpus_why_not().empty() ? std::string("the coordinator did not say every rank "
                                                        "has its own GPU")
                                          : a.own_gpus_why_not())
          : "";
  auto because = [&gpus](const std::string& why) {
    return gpus.empty() ? why : absl::StrCat(gpus, "; ", why);
  };
  if (a.single_machine() && a.world_size() <= ShmCommunicator::kMaxRanks) {
    return Auto(Transport::kShm, because("every rank is on one machine"));
  }
  if (Hierarchical(a)) return Auto(Transport::kHierarchical, because("several ranks a machine"));
  return Auto(Transport::kGloo, because(a.single_machine() ? "more ranks than shared memory takes"
                                                           : "ranks on several machines"));
}

}  // namespace ddp
