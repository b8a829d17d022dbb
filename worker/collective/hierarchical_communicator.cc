#include "worker/collective/hierarchical_communicator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gloo/rendezvous/prefix_store.h"
#include "worker/collective/gloo_communicator.h"
#include "worker/collective/shm_communicator.h"

namespace ddp {

absl::StatusOr<std::unique_ptr<HierarchicalCommunicator>> HierarchicalCommunicator::Create(
    gloo::rendezvous::Store& store, const Options& options) {
  const Options& o = options;
  if (o.local_size < 1 || o.local_rank < 0 || o.local_rank >= o.local_size || o.machines < 1 ||
      o.machine < 0 || o.machine >= o.machines || o.rank < o.local_rank || o.rank >= o.world_size ||
      o.world_size < o.machines || o.local_size > ShmCommunicator::kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hierarchical layout: rank ", o.rank, " of ", o.world_size, " as rank ", o.local_rank,
        " of ", o.local_size, " on machine ", o.machine, " of ", o.machines, " is not possible"));
  }
  std::unique_ptr<Communicator> local;
  if (o.local_size > 1) {
    gloo::rendezvous::PrefixStore machine_store(absl::StrCat("machine-", o.machine), store);
    ShmCommunicator::Options shm;
    shm.rank = o.local_rank;
    shm.world_size = o.local_size;
    shm.timeout = o.timeout;
    shm.slot_bytes = o.shm_slot_bytes;
    auto created = ShmCommunicator::Create(machine_store, shm);
    if (!created.ok()) return created.status();
    local = std::move(*created);
  }
  std::unique_ptr<Communicator> leaders;
  if (o.local_rank == 0 && o.machines > 1) {
    gloo::rendezvous::PrefixStore leader_store("leaders", store);
    GlooCommunicator::Options gloo;
    gloo.rank = o.machine;
    gloo.world_size = o.machines;
    gloo.host = o.host;
    gloo.timeout = o.timeout;
    auto created = GlooCommunicator::Create(leader_store, gloo);
    if (!created.ok()) return created.status();
    leaders = std::move(*created);
  }
  std::unique_ptr<HierarchicalCommunicator> comm(
      new HierarchicalCommunicator(options, std::move(local), std::move(leaders)));
  if (absl::Status s = comm->LearnLayout(); !s.ok()) return s;
  return comm;
}

HierarchicalCommunicator::HierarchicalCommunicator(const Options& options,
                                                   std::unique_ptr<Communicator> local,
                                                   std::unique_ptr<Communicator> leaders)
    : options_(options), local_(std::move(local)), leaders_(std::move(leaders)) {}

HierarchicalCommunicator::~HierarchicalCommunicator() = default;

absl::Status HierarchicalCommunicator::LearnLayout() {
  // Each leader puts its machine's rank count at its machine's place; the
  // sum over leaders is every machine's count (small integers: exact).
  std::vector<float> sizes(static_cast<size_t>(options_.machines), 0.0f);
  if (options_.local_rank == 0) sizes[static_cast<size_t>(options_.machine)] = options_.local_size;
  if (absl::Status s = AcrossMachines(
          sizes.data(), sizes.size() * sizeof(float),
          [&](Communicator& leaders) { return leaders.AllReduceSum(sizes.data(), sizes.size()); });
      !s.ok()) {
    return AbortOnFailure(s);
  }
  first_rank_.assign(1, 0);
  for (float size : sizes) first_rank_.push_back(first_rank_.back() + static_cast<int>(size));
  if (first_rank_.back() != options_.world_size ||
      first_rank_[static_cast<size_t>(options_.machine)] + options_.local_rank != options_.rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hierarchical layout: the machines hold ", first_rank_.back(), " ranks and rank ",
        options_.rank, " is not rank ", options_.local_rank, " of machine ", options_.machine,
        "'s; a machine's ranks must be consecutive"));
  }
  return absl::OkStatus();
}

template <typename ReduceLeaders>
absl::Status HierarchicalCommunicator::AcrossMachines(void* data, size_t bytes,
                                                      ReduceLeaders reduce) {
  if (leaders_) {
    if (absl::Status s = reduce(*leaders_); !s.ok()) return s;
  }
  if (local_ && options_.machines > 1) return local_->Broadcast(data, bytes, 0);
  return absl::OkStatus();
}

absl::Status HierarchicalCommunicator::AbortOnFailure(absl::Status status) {
  // A rank that fails one part skips the next, where its peers would wait
  // for it until the timeout: abort both parts, so that everyone, on this
  // machine and across machines, fails now.
  if (!status.ok()) Abort();
  return status;
}

absl::Status HierarchicalCommunicator::AllReduceSum(float* data, size_t count) {
  if (local_) {
    if (absl::Status s = local_->AllReduceSum(data, count); !s.ok()) return AbortOnFailure(s);
  }
  return AbortOnFailure(AcrossMachines(data, count * sizeof(float), [&](Communicator& leaders) {
    return leaders.AllReduceSum(data, count);
  }));
}

absl::Status HierarchicalCommunicator::AllReduceSumHalf(uint16_t* data, size_t count,
                                                        HalfType type) {
  if (local_) {
    if (absl::Status s = local_->AllReduceSumHalf(data, count, type); !s.ok()) {
      return AbortOnFailure(s);
    }
  }
  return AbortOnFailure(AcrossMachines(data, count * sizeof(uint16_t), [&](Communicator& leaders) {
    return leaders.AllReduceSumHalf(data, count, type);
  }));
}

absl::Status HierarchicalCommunicator::Broadcast(void* data, size_t bytes, int root) {
  return AbortOnFailure(BroadcastInParts(data, bytes, root));
}

absl::Status HierarchicalCommunicator::BroadcastInParts(void* data, size_t bytes, int root) {
  // The root's machine, and the root's place on it.
  const auto next = std::upper_bound(first_rank_.begin(), first_rank_.end(), root);
  const int root_machine = static_cast<int>(next - first_rank_.begin()) - 1;
  if (root < 0 || root >= options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank"));
  }
  const bool root_here = root_machine == options_.machine;
  // 1. Within the root's machine: everyone there, its leader included.
  if (root_here && local_) {
    const int local_root = root - first_rank_[static_cast<size_t>(root_machine)];
    if (absl::Status s = local_->Broadcast(data, bytes, local_root); !s.ok()) return s;
  }
  // 2. Among the leaders, from the root machine's.
  if (leaders_) {
    if (absl::Status s = leaders_->Broadcast(data, bytes, root_machine); !s.ok()) return s;
  }
  // 3. Within every other machine, from its leader.
  if (!root_here && local_) return local_->Broadcast(data, bytes, 0);
  return absl::OkStatus();
}

void HierarchicalCommunicator::Abort() {
  if (local_) local_->Abort();
  if (leaders_) leaders_->Abort();
}

}  // namespace ddp
