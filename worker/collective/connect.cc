#include "worker/collective/connect.h"

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job_kinds.h"
#include "common/logging.h"
#include "worker/collective/gloo_communicator.h"
#include "worker/collective/gloo_store.h"
#include "worker/collective/hierarchical_communicator.h"
#include "worker/collective/nccl_communicator.h"
#include "worker/collective/shm_communicator.h"
#include "worker/collective/transport_choice.h"

namespace ddp {
namespace {

absl::StatusOr<std::shared_ptr<Communicator>> ConnectHierarchical(const v1::Assignment& a,
                                                                  const std::string& host,
                                                                  absl::Duration timeout,
                                                                  gloo::rendezvous::Store& store) {
  HierarchicalCommunicator::Options options;
  options.rank = static_cast<int>(a.rank());
  options.world_size = static_cast<int>(a.world_size());
  options.local_rank = static_cast<int>(a.local_rank());
  options.local_size = static_cast<int>(a.local_size());
  options.machine = static_cast<int>(a.machine());
  options.machines = static_cast<int>(a.machines());
  options.host = host;
  options.timeout = timeout;
  auto created = HierarchicalCommunicator::Create(store, options);
  if (!created.ok()) return created.status();
  return std::shared_ptr<Communicator>(std::move(*created));
}

absl::StatusOr<std::shared_ptr<Communicator>> ConnectNccl(const v1::Assignment& a,
                                                          const Device& device,
                                                          absl::Duration timeout,
                                                          StoreClient* store) {
  NcclCommunicator::Options options;
  options.rank = static_cast<int>(a.rank());
  options.world_size = static_cast<int>(a.world_size());
  options.device = device.index;
  options.timeout = timeout;
  auto created = NcclCommunicator::Create(store, options);
  if (!created.ok()) return created.status();
  return std::shared_ptr<Communicator>(std::move(*created));
}

absl::StatusOr<std::shared_ptr<Communicator>> ConnectGloo(const v1::Assignment& a,
                                                          const std::string& host,
                                                          absl::Duration timeout,
                                                          gloo::rendezvous::Store& store) {
  GlooCommunicator::Options options;
  options.rank = static_cast<int>(a.rank());
  options.world_size = static_cast<int>(a.world_size());
  options.host = host;
  options.timeout = timeout;
  auto created = GlooCommunicator::Create(store, options);
  if (!created.ok()) return created.status();
  return std::shared_ptr<Communicator>(std::move(*created));
}

}  // namespace

absl::StatusOr<std::shared_ptr<Communicator>> ConnectForAssignment(const v1::Assignment& a,
                                                                   const Device& device,
                                                                   const std::string& host,
                                                                   StoreClient* store) {
  const absl::Duration timeout = absl::Seconds(a.spec().collective_timeout_seconds());
  CoordinatorGlooStore gloo_store(store, timeout);
  const TransportChoice choice = ChooseTransport(a, device);
  DDP_LOG(Info) << "generation " << a.generation() << ": " << choice.why;
  switch (choice.transport) {
    case Transport::kShm: {
      ShmCommunicator::Options options;
      options.rank = static_cast<int>(a.rank());
      options.world_size = static_cast<int>(a.world_size());
      options.timeout = timeout;
      auto created = ShmCommunicator::Create(gloo_store, options);
      if (created.ok()) return std::shared_ptr<Communicator>(std::move(*created));
      // Every rank learns the same outcome, so "auto" falls back together.
      if (BackendOf(a.spec()) == v1::BACKEND_SHM || !absl::IsFailedPrecondition(created.status())) {
        return created.status();
      }
      DDP_LOG(Warning) << "shared memory is not usable (" << created.status().message()
                       << "); using gloo over TCP";
      return ConnectGloo(a, host, timeout, gloo_store);
    }
    case Transport::kHierarchical:
      return ConnectHierarchical(a, host, timeout, gloo_store);
    case Transport::kNccl:
      return ConnectNccl(a, device, timeout, store);
    case Transport::kGloo:
      return ConnectGloo(a, host, timeout, gloo_store);
  }
  return absl::InternalError("no transport");
}

absl::StatusOr<v1::ProbeResult> ProveRing(Communicator& comm) {
  const absl::Time start = absl::Now();
  float value = static_cast<float>(comm.rank() + 1);
  if (absl::Status s = comm.AllReduceSum(&value, 1); !s.ok()) return s;
  v1::ProbeResult probe;
  probe.set_expected(comm.world_size() * (comm.world_size() + 1) / 2.0);
  probe.set_observed(value);
  probe.set_latency_ms(absl::ToDoubleMilliseconds(absl::Now() - start));
  probe.set_backend(comm.backend());
  if (probe.observed() != probe.expected()) {
    return absl::DataLossError(
        absl::StrFormat("the probe all-reduce summed to %g instead of %g: the ring is broken",
                        probe.observed(), probe.expected()));
  }
  DDP_LOG(Info) << absl::StrFormat("%s ring of %d proven: probe all-reduce = %g in %.2f ms",
                                   comm.backend(), comm.world_size(), probe.observed(),
                                   probe.latency_ms());
  return probe;
}

}  // namespace ddp
