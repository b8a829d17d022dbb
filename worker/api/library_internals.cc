#include "worker/api/library_internals.h"

namespace ddp {

void AddReduction(const ReductionStats& stats, v1::ReductionStatus* status) {
  status->set_buckets_reduced(stats.buckets_reduced);
  status->set_buckets_total(stats.buckets_total);
  status->set_bytes(stats.bytes);
  status->set_allreduce_ms(stats.allreduce_ms);
  status->set_wait_ms(stats.wait_ms);
  status->set_unused_parameters(stats.unused);
  status->set_globally_unused_parameters(stats.globally_unused);
  for (const std::string& name : stats.newly_unused) status->add_newly_unused_parameter_names(name);
  status->clear_buckets();
  for (const BucketTiming& timing : stats.buckets) {
    v1::BucketReduction* bucket = status->add_buckets();
    bucket->set_allreduce_ms(timing.allreduce_ms);
    bucket->set_bytes(timing.bytes);
    bucket->set_ready_ms(timing.ready_ms);
    bucket->set_started_ms(timing.started_ms);
  }
}

std::unique_ptr<Session> LibraryInternals::SessionOver(Communicator* comm, StepDriver driver) {
  auto impl = std::make_unique<Session::Impl>();
  impl->rank = comm->rank();
  impl->world_size = comm->world_size();
  impl->options.rank = impl->rank;
  impl->options.world_size = impl->world_size;
  impl->UseCommunicator(comm);
  impl->driver = std::move(driver);
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<DistributedDataParallel>> LibraryInternals::DataParallelOver(
    Session& session, std::vector<std::pair<std::string, torch::Tensor>> params,
    std::vector<std::pair<std::string, torch::Tensor>> buffers,
    const DistributedDataParallel::Options& options) {
  try {
    return std::unique_ptr<DistributedDataParallel>(
        new DistributedDataParallel(session, std::move(params), std::move(buffers), options));
  } catch (const StatusError& e) {
    return e.status();
  } catch (const Error& e) {
    return absl::InvalidArgumentError(e.what());
  }
}

}  // namespace ddp
