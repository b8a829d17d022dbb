#include "worker/collective/device_sync.h"

#include <utility>

#include <c10/util/Exception.h>

#include "absl/strings/str_cat.h"

namespace ddp {

absl::StatusOr<std::unique_ptr<StepStreams>> StepStreams::Create(c10::Device device) {
  if (device.is_cpu()) return std::unique_ptr<StepStreams>();
  if (!c10::impl::hasDeviceGuardImpl(device.type())) {
    return absl::InvalidArgumentError(
        absl::StrCat("this LibTorch has no streams for ", device.str(), " (no device guard)"));
  }
  if (!device.has_index()) device = c10::Device(device.type(), 0);
  try {
    c10::impl::VirtualGuardImpl impl(device.type());
    // A pool stream, not the default one: collectives then overlap with
    // backward's kernels instead of queueing behind them.
    c10::Stream comm = impl.getStreamFromGlobalPool(device);
    return std::unique_ptr<StepStreams>(new StepStreams(device, comm));
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("no communication stream on ", device.str(),
                                                   ": ", e.what_without_backtrace()));
  }
}

StepStreams::StepStreams(c10::Device device, c10::Stream comm)
    : device_(device), impl_(device.type()), comm_(comm), done_(device.type()) {}

void StepStreams::ResetBuckets(size_t count) {
  absl::MutexLock lock(&mu_);
  ready_.clear();
  for (size_t b = 0; b < count; ++b) ready_.push_back(std::make_unique<c10::Event>(device_.type()));
}

void StepStreams::UsedOnComm(const at::Tensor& memory) const {
  impl_.recordDataPtrOnStream(memory.storage().data_ptr(), comm_);
}

void StepStreams::BucketReady(size_t bucket) {
  absl::MutexLock lock(&mu_);
  ready_[bucket]->record(impl_.getStream(device_));
}

void StepStreams::BeforeCollective(size_t bucket) {
  absl::MutexLock lock(&mu_);
  ready_[bucket]->block(comm_);
}

void StepStreams::SynchronizeComm() const { comm_.synchronize(); }

void StepStreams::CollectivesDone() {
  absl::MutexLock lock(&mu_);
  done_.record(comm_);
  done_recorded_ = true;
}

void StepStreams::StepEnd() {
  absl::MutexLock lock(&mu_);
  if (!done_recorded_) return;
  done_recorded_ = false;
  done_.block(impl_.getStream(device_));
}

}  // namespace ddp
