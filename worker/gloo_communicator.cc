#include "worker/gloo_communicator.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "gloo/allreduce.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"

namespace ddp {

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    gloo::rendezvous::Store& store, const Options& options) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
    context->setTimeout(absl::ToChronoMilliseconds(options.timeout));
    context->connectFullMesh(store, device);
    return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(std::move(context), options));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo rendezvous of rank ", options.rank, " of ",
                                               options.world_size, " at ", options.host,
                                               " failed: ", e.what()));
  }
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<gloo::Context> context,
                                   const Options& options)
    : context_(std::move(context)),
      rank_(options.rank),
      world_size_(options.world_size),
      timeout_(options.timeout) {}

GlooCommunicator::~GlooCommunicator() = default;

absl::Status GlooCommunicator::Failed(const char* op, const std::exception& e) const {
  if (aborted_) return absl::AbortedError(absl::StrCat("gloo ", op, " aborted"));
  const std::string what = e.what();
  if (what.find("Timed out") != std::string::npos || what.find("timed out") != std::string::npos) {
    return absl::DeadlineExceededError(
        absl::StrCat("gloo ", op, " on rank ", rank_, " timed out after ",
                     absl::FormatDuration(timeout_), ": ", what));
  }
  return absl::UnavailableError(
      absl::StrCat("gloo ", op, " on rank ", rank_, " failed (a peer left?): ", what));
}

absl::Status GlooCommunicator::AllReduceSum(float* data, size_t count) {
  if (aborted_) return absl::AbortedError("communicator aborted");
  if (world_size_ == 1 || count == 0) return absl::OkStatus();
  try {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, count);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(next_tag_++);
    opts.setTimeout(absl::ToChronoMilliseconds(timeout_));
    gloo::allreduce(opts);
  } catch (const std::exception& e) {
    return Failed("all-reduce", e);
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::Broadcast(void* data, size_t bytes, int root) {
  if (aborted_) return absl::AbortedError("communicator aborted");
  if (world_size_ == 1 || bytes == 0) return absl::OkStatus();
  try {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<uint8_t*>(data), bytes);
    opts.setRoot(root);
    opts.setTag(next_tag_++);
    opts.setTimeout(absl::ToChronoMilliseconds(timeout_));
    gloo::broadcast(opts);
  } catch (const std::exception& e) {
    return Failed("broadcast", e);
  }
  return absl::OkStatus();
}

void GlooCommunicator::Abort() {
  aborted_ = true;
  // Closing every pair fails pending sends and receives at once.
  context_->closeConnections();
}

}  // namespace ddp
