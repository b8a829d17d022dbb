// Gradient all-reduce with DDP's semantics, split into a bucket plan
// (bucket_plan.h), readiness tracking (autograd hooks), and a communicator.
//
// Each parameter's .grad aliases its place in a flat bucket buffer, so
// backward writes gradients where the all-reduce reads them, and nothing is
// copied.
// A bucket is all-reduced on the communication thread as soon as its last
// gradient is ready, overlapping the rest of backward; buckets are launched
// in plan order on every rank, so collectives always match.
//
// Step commit: the last bucket also carries two control words, summed (not
// averaged) with it: every rank's token for the step it is completing, so a
// rank can tell that all ranks completed the same step before it applies
// it, and a vote to leave the generation after this step, so that all ranks
// leave at the same step boundary.
//
// Unused parameters: each bucket carries one "used" flag per parameter,
// all-reduced with the gradients: set when the parameter got a gradient in
// any backward of the accumulation group on this rank (the synchronized
// one or an earlier no_sync micro-batch). A parameter some rank used is
// averaged over the world, each rank contributing what its .grad holds
// (zeros once zeroed, or what its micro-batches accumulated); one no rank
// used (flag sum 0) keeps .grad as it was before the group: one that had
// no gradient stays without, so the optimizer skips it. Nothing waits for
// a gradient that will never come, and no extra collective is needed.
//
// The one difference from PyTorch's numbers (1.13, find_unused_parameters):
// a parameter that got a gradient only in no_sync micro-batches, on some
// ranks, and in the synchronized backward on none. PyTorch counts only the
// synchronized backward, so it leaves each rank's own un-averaged .grad
// (and none on a rank that had none), and its replicas drift apart. Here it
// is averaged like any other, so replicas stay bit-identical.
//
// Devices: buckets live on the parameters' device. On an accelerator the
// communication thread works on a stream of its own, ordered against the
// compute stream by events (device_sync.h: a bucket's collective waits for
// its gradients, the step's end waits for the collectives). A communicator
// that takes host memory (Communicator::takes_device_memory false: shm,
// Gloo) gets each bucket staged: copied to a host buffer (pinned on CUDA)
// on the communication stream, the collective run there, the result copied
// back. fp16/bf16 compression runs where the collective's memory is (on
// the device with a device communicator, else on the host copy); PowerSGD
// always runs on the host copy, with the same numbers as on CPU.
//
// Not thread-safe: one trainer thread calls every method; the autograd
// hooks run on the thread that calls backward.
#ifndef DDP_WORKER_COLLECTIVE_REDUCER_H_
#define DDP_WORKER_COLLECTIVE_REDUCER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/collective/bucket_plan.h"
#include "worker/collective/collective_check.h"
#include "worker/collective/communicator.h"
#include "worker/collective/named_tensor.h"
#include "worker/collective/power_sgd.h"

namespace torch::autograd {
struct Node;
}

namespace ddp {

class StepStreams;

// One bucket's all-reduce in one synchronized step. Times are milliseconds
// from PrepareBackward, so a bucket launched late (started well after
// ready) or a link left idle between buckets shows in one step's record.
struct BucketTiming {
  // Its last gradient arrived (or FinishBackward completed it).
  double ready_ms = 0;
  // The communication thread began its all-reduce.
  double started_ms = 0;
  // Time inside its all-reduce.
  double allreduce_ms = 0;
  // What crossed the wire (compressed gradients, counts in float).
  uint64_t bytes = 0;
};

// What one synchronized step's reduction did.
struct ReductionStats {
  uint32_t buckets_reduced = 0;
  uint32_t buckets_total = 0;
  uint64_t bytes = 0;
  // Communication-thread time in all-reduce (milliseconds).
  double allreduce_ms = 0;
  // Trainer-thread time waiting after backward (milliseconds).
  double wait_ms = 0;
  uint32_t unused = 0;
  uint32_t globally_unused = 0;
  // Parameters seen unused on this rank for the first time.
  std::vector<std::string> newly_unused;
  // Per bucket, in launch order.
  std::vector<BucketTiming> buckets;
  // Sums over the ranks of the step's control words (see ControlWords).
  uint64_t token_sum = 0;
  uint32_t leave_votes = 0;
};

// What this rank puts in the step's control words.
struct ControlWords {
  // Identifies the step being completed; every rank must put the same one.
  // Small (under 2^10), so that its sum over 2^14 ranks is exact in float.
  uint32_t token = 0;
  // Read when the last bucket is packed: whether this rank wants to leave
  // after this step. May be null.
  const std::atomic<bool>* leave = nullptr;
};

// The token for completing `step`: small, and different for neighbours.
inline uint32_t StepToken(uint64_t step) { return static_cast<uint32_t>(step % 1024) + 1; }

// Whether bucket buffers are copied to host memory for the collective.
enum class HostStaging {
  // Device buffers with a host-memory communicator, or PowerSGD.
  kWhenNeeded,
  kAlways,
};

class Reducer {
 public:
  struct Options {
    size_t bucket_cap_bytes = kDefaultBucketBytes;
    size_t first_bucket_cap_bytes = kDefaultFirstBucketBytes;
    // Rebuild buckets in the gradients' real ready order after the first
    // step (rank 0's order, so every rank agrees).
    bool rebuild_after_first_step = true;
    // Gradients cross the wire in this 16-bit type (PyTorch's fp16/bf16
    // compress hooks); none: float32.
    std::optional<HalfType> compression;
    // PowerSGD instead (PyTorch's powerSGD_hook); not with `compression`.
    std::optional<PowerSgdOptions> powersgd;
    // Split the last bucket again at first_bucket_cap_bytes (see
    // PlanBuckets); off for PyTorch's plan exactly.
    bool split_tail = true;
    // Where each synchronized step, and the buckets' rebuild, are agreed
    // on with the other ranks before their collectives (not owned; null:
    // no check). The owner uses it for its own collectives too.
    CollectiveCheck* check = nullptr;
    // What the owner broadcasts after each synchronized step (the
    // buffers, from `bytes_after_step_root`), agreed on with the step.
    uint64_t bytes_after_step = 0;
    int bytes_after_step_root = 0;
    // The device whose streams order the work; none: the parameters'.
    // Only the parameters' own device, or any with CPU parameters (which
    // lets a test watch the ordering with CPU tensors and fake streams).
    std::optional<c10::Device> stream_device;
    // kAlways stages buckets through host buffers even when the
    // communicator could take them as they are (CPU too: the same path).
    HostStaging staging = HostStaging::kWhenNeeded;
  };

  // `params`: contiguous float32 tensors that require grad, all on one
  // device. `comm` outlives this. INVALID_ARGUMENT for other parameters
  // (naming them), for parameters on several devices, and for a stream
  // device without streams.
  static absl::StatusOr<std::unique_ptr<Reducer>> Create(std::vector<NamedTensor> params,
                                                         Communicator* comm, Options options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Starts a gradient-accumulation group: zeroes the gradients and points
  // every .grad at its bucket view. After the first synchronized step it
  // first rebuilds the buckets in the observed ready order.
  absl::Status StartGroup();
  // Before each backward; `sync` on the group's last micro-batch, whose
  // backward all-reduces (with `control` in its last bucket). Earlier
  // micro-batches only accumulate locally.
  void PrepareBackward(bool sync, ControlWords control = {});
  // After the synchronized backward: reduces the buckets backward did not
  // complete, waits for all, and leaves the .grad of parameters no rank
  // used in the group as it was before the group. The communicator's error
  // (ABORTED, UNAVAILABLE, ...) if a collective failed.
  absl::StatusOr<ReductionStats> FinishBackward();

  // Parameter indices per bucket, in launch order.
  std::vector<std::vector<size_t>> plan() const;

  // The implicit protocol (ddp::DistributedDataParallel): nothing is called
  // around backward. Every backward on the training thread arms the
  // reducer, whether or not it reaches a parameter (its first node does,
  // seen through a RecordFunction callback on backward functions, present
  // only between backwards; the first gradient hook does if that is not
  // seen): a new group adopts what each .grad holds (the user zeroes
  // gradients, as in PyTorch), then PrepareBackward with what `sync` says
  // (no value: only accumulate); and a callback is queued on the autograd
  // engine, which runs on the backward's thread once backward is done:
  // `waiting` (may be empty), then `finished` with FinishBackward's result
  // for a synchronized backward (an OK, empty one otherwise). So a rank
  // whose loss reached no parameter still takes part in the step, with
  // zero gradients, and its collectives stay aligned with its peers'.
  // `finished` may throw: backward then rethrows. Call once, before the
  // first backward, on the training thread.
  using FinishedCallback = std::function<void(bool sync, absl::StatusOr<ReductionStats>)>;
  struct ImplicitHooks {
    // Whether this backward synchronizes, and with which control words.
    std::function<std::optional<ControlWords>()> sync;
    // Backward is done; its end now waits for the buckets in flight.
    std::function<void()> waiting;
    FinishedCallback finished;
  };
  void EnableImplicit(ImplicitHooks hooks);

 private:
  struct Param {
    std::string name;
    at::Tensor tensor;
    at::Tensor view;  // its gradient: an alias of its place in the bucket buffer
    // This rank's gradient before the all-reduce, when this backward didn't
    // produce one (restored if no rank did).
    at::Tensor local;
    size_t bucket = 0;
    size_t index_in_bucket = 0;
  };
  struct Bucket {
    std::vector<size_t> params;
    at::Tensor buffer;  // gradients, one used-flag per parameter, control words
    int64_t grad_elements = 0;
    // Control words at the end (the last bucket only).
    int64_t control_words = 0;
    size_t pending = 0;
    bool ready = false;
    // The gradients in the compression type (made on first use).
    at::Tensor compressed;
    // Its parameters' shapes, in bucket order (PowerSGD's matrices).
    std::vector<std::vector<int64_t>> shapes;
    // The buffer's host copy when staged (communication thread; made on
    // first use).
    at::Tensor staged;
    // Device buffers: the flags and control words as written on the host
    // (under mu_; made on first use).
    at::Tensor host_tail;
  };

  Reducer(std::vector<NamedTensor> params, Communicator* comm, Options options);
  void InstallHooks();
  void BuildBuckets(const std::vector<size_t>& order);
  // After the first synchronized step: buckets in the observed ready order
  // (rank 0's). A collective.
  absl::Status RebuildIfDue();
  // Implicit protocol: arms the reducer from the first node or gradient
  // hook of a backward.
  void ArmImplicit();
  // Between backwards: the next backward node run on this thread arms it.
  void WatchForBackward();
  void UnwatchBackward();
  friend struct BackwardWatch;
  void MarkReady(size_t param);
  // Marks a bucket complete and queues every complete bucket whose
  // predecessors are queued, in plan order.
  void CompleteBucketLocked(size_t bucket, bool from_backward) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CommLoop();
  double SinceBackwardStartLocked(absl::Time t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One bucket's all-reduce (communication thread), through a host copy
  // when staged; the float32 bytes PowerSGD sent in `*wire`.
  absl::Status ReduceBucket(size_t index, float world, uint64_t* wire);
  // On `buffer`: the bucket's own, or its host copy. In float32 or
  // compressed.
  absl::Status Reduce(const at::Tensor& buffer, Bucket& bucket, float world);
  absl::Status ReduceCompressed(const at::Tensor& buffer, Bucket& bucket, float world);
  // PowerSGD's, once it has started.
  absl::Status ReducePowerSgd(const at::Tensor& buffer, Bucket& bucket, size_t index, float world,
                              uint64_t* wire);
  // Before the step's first bucket: all ranks are at the same step with
  // the same buckets (Options::check).
  absl::Status AgreeOnStep();
  // Before a collective on device memory: see reduce_bucket.cc.
  void DeviceBufferReady();
  // The flags and control words after the gradients, exactly: flags
  // averaged, control words summed.
  absl::Status ReduceTail(const at::Tensor& buffer, const Bucket& bucket, float world);

  Communicator* comm_;
  const Options options_;
  // Null on CPU: no stream ordering at all.
  std::unique_ptr<StepStreams> streams_;
  // Buckets go through host copies (set at Create).
  bool stage_ = false;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks_;
  std::vector<bool> reported_unused_;
  // Per parameter: .grad was set when the group started (trainer thread).
  std::vector<bool> had_grad_;
  bool rebuilt_ = false;
  bool first_sync_done_ = false;
  // Implicit protocol (backward's thread only).
  ImplicitHooks implicit_;
  bool armed_ = false;
  bool group_open_ = false;
  std::thread comm_thread_;
  // Communication thread only (PowerSGD's state: errors, P, Q, its step).
  std::unique_ptr<PowerSgd> powersgd_;

  absl::Mutex mu_;
  bool sync_ ABSL_GUARDED_BY(mu_) = false;
  ControlWords control_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Per parameter: got a gradient in this group / in this backward.
  std::vector<bool> used_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> marked_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> ready_order_ ABSL_GUARDED_BY(mu_);
  size_t next_launch_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<size_t> queue_ ABSL_GUARDED_BY(mu_);
  size_t queue_head_ ABSL_GUARDED_BY(mu_) = 0;
  size_t done_ ABSL_GUARDED_BY(mu_) = 0;
  double allreduce_ms_ ABSL_GUARDED_BY(mu_) = 0;
  // This step's: when PrepareBackward ran, and each bucket's times and, for
  // PowerSGD, its bytes (otherwise FinishBackward counts the buffer).
  absl::Time backward_start_ ABSL_GUARDED_BY(mu_);
  std::vector<BucketTiming> timings_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_WORKER_COLLECTIVE_REDUCER_H_
