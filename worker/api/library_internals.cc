#include "worker/api/library_internals.h"

namespace ddp {

std::unique_ptr<Session> LibraryInternals::SessionOver(Communicator* comm, StepDriver driver) {
  auto impl = std::make_unique<Session::Impl>();
  impl->rank = comm->rank();
  impl->world_size = comm->world_size();
  impl->options.rank = impl->rank;
  impl->options.world_size = impl->world_size;
  impl->comm = comm;
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
