// The stream ordering of one reducer's steps on an accelerator, through
// c10's device-generic streams and events (so it builds against a CPU-only
// LibTorch, and any device with a registered guard works).
//
// Backward writes gradients on the device's current (compute) stream; the
// reducer's communication thread works on a stream of its own, so that
// buckets reduce while backward goes on. Per step:
//   1. a bucket is ready: an event is recorded on the compute stream;
//   2. before the bucket's collective the communication stream waits on it;
//   3. after the step's last collective an event is recorded on the
//      communication stream;
//   4. at the step's end the compute stream waits on that event, so that
//      the optimizer reads reduced gradients.
// A CPU reducer has no StepStreams at all (Create returns null): its hot
// path pays nothing.
//
// Thread rules: BucketReady on backward's thread (or the trainer's, for a
// bucket the step's end completes); BeforeCollective, SynchronizeComm and
// CollectivesDone on the communication thread; StepEnd on the thread that
// ends the step. Any thread may call the others.
#ifndef DDP_WORKER_COLLECTIVE_DEVICE_SYNC_H_
#define DDP_WORKER_COLLECTIVE_DEVICE_SYNC_H_

#include <cstddef>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ddp {

class StepStreams {
 public:
  // Null for a CPU device (nothing to order). INVALID_ARGUMENT when no
  // guard is registered for the device's type or it lends no stream.
  static absl::StatusOr<std::unique_ptr<StepStreams>> Create(c10::Device device);

  // The stream the communication thread makes current.
  c10::Stream comm_stream() const { return comm_; }

  // The buckets were (re)built: `count` of them. Between steps only.
  void ResetBuckets(size_t count);
  // `memory` (a bucket buffer, made on the compute stream) is also used on
  // the communication stream: the caching allocator must not hand it out
  // again before that stream is done with it.
  void UsedOnComm(const at::Tensor& memory) const;

  void BucketReady(size_t bucket);
  void BeforeCollective(size_t bucket);
  // Waits, on this thread, for what the communication stream has queued
  // (a copy to host memory, before a host collective reads it).
  void SynchronizeComm() const;
  void CollectivesDone();
  // Makes the calling thread's current stream wait on the step's last
  // collective; nothing if the step had none.
  void StepEnd();

 private:
  StepStreams(c10::Device device, c10::Stream comm);

  const c10::Device device_;
  const c10::impl::VirtualGuardImpl impl_;
  const c10::Stream comm_;

  absl::Mutex mu_;
  // One per bucket: its gradients are complete on the compute stream.
  std::vector<std::unique_ptr<c10::Event>> ready_ ABSL_GUARDED_BY(mu_);
  // The step's collectives are complete on the communication stream.
  c10::Event done_ ABSL_GUARDED_BY(mu_);
  bool done_recorded_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ddp

#endif  // DDP_WORKER_COLLECTIVE_DEVICE_SYNC_H_
