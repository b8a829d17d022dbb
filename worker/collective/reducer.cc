#include "worker/collective/reducer.h"

#include <cmath>
#include <cstring>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>

#include <c10/core/StreamGuard.h>

#include <limits>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/collective/device_sync.h"

namespace ddp {
namespace {

// The step token and the leave vote.
constexpr int64_t kControlWords = 2;

// In the communication thread's queue: the step's agreement, not a bucket.
constexpr size_t kAgreeOnStep = std::numeric_limits<size_t>::max();

}  // namespace

absl::StatusOr<std::unique_ptr<Reducer>> Reducer::Create(std::vector<NamedTensor> params,
                                                         Communicator* comm, Options options) {
  if (params.empty()) return absl::InvalidArgumentError("the model has no trainable parameters");
  const c10::Device device = params.front().second.device();
  for (const auto& [name, t] : params) {
    if (t.scalar_type() != at::kFloat || !t.is_contiguous() || !t.requires_grad()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", name, " is ", std::string(t.dtype().name()), " on ", t.device().str(),
          "; the reducer takes contiguous float32 parameters that require grad"));
    }
    if (t.device() != device) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", params.front().first, " is on ", device.str(), " and ", name,
                       " on ", t.device().str(), "; the reducer takes parameters on one device"));
    }
  }
  const c10::Device stream_device = options.stream_device.value_or(device);
  if (stream_device != device && !device.is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat("the parameters are on ", device.str(),
                                                   ", their work can't be ordered on ",
                                                   stream_device.str(), "'s streams"));
  }
  absl::StatusOr<std::unique_ptr<StepStreams>> streams = StepStreams::Create(stream_device);
  if (!streams.ok()) return streams.status();
  if (options.powersgd) {
    if (options.compression) {
      return absl::InvalidArgumentError("PowerSGD replaces fp16/bf16 compression: choose one");
    }
    if (absl::Status s = CheckPowerSgdOptions(*options.powersgd); !s.ok()) return s;
  }
  std::unique_ptr<Reducer> reducer(new Reducer(std::move(params), comm, options));
  reducer->streams_ = std::move(*streams);
  // PowerSGD's state and numbers stay on the host, as on CPU.
  reducer->stage_ = options.staging == HostStaging::kAlways ||
                    (!device.is_cpu() && (!comm->takes_device_memory() || options.powersgd));
  reducer->BuildBuckets(ReverseOrder(reducer->params_.size()));
  reducer->InstallHooks();
  reducer->comm_thread_ = std::thread([r = reducer.get()] { r->CommLoop(); });
  return reducer;
}

Reducer::Reducer(std::vector<NamedTensor> params, Communicator* comm, Options options)
    : comm_(comm), options_(options) {
  if (options_.powersgd) powersgd_ = std::make_unique<PowerSgd>(*options_.powersgd);
  for (auto& [name, tensor] : params) params_.push_back(Param{name, tensor, {}, {}, 0, 0});
  reported_unused_.assign(params_.size(), false);
  had_grad_.assign(params_.size(), false);
  absl::MutexLock lock(&mu_);
  used_.assign(params_.size(), false);
  marked_.assign(params_.size(), false);
}

Reducer::~Reducer() {
  if (implicit_.finished) UnwatchBackward();
  for (auto& [node, key] : hooks_) node->del_post_hook(key);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  comm_thread_.join();
}

void Reducer::InstallHooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    // The post hook of the parameter's AccumulateGrad node runs once its
    // gradient has been added into .grad, i.e. into the bucket.
    std::shared_ptr<torch::autograd::Node> acc =
        torch::autograd::impl::grad_accumulator(params_[i].tensor);
    const uintptr_t key =
        acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [this, i](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list& /*inputs*/) {
              MarkReady(i);
              return outputs;
            }));
    hooks_.emplace_back(std::move(acc), key);
  }
}

void Reducer::BuildBuckets(const std::vector<size_t>& order) {
  std::vector<size_t> bytes(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    bytes[i] = params_[i].tensor.numel() * sizeof(float);
  }
  std::vector<std::vector<size_t>> plan =
      PlanBuckets(bytes, order, options_.first_bucket_cap_bytes, options_.bucket_cap_bytes,
                  options_.split_tail);
  buckets_.clear();
  if (streams_) streams_->ResetBuckets(plan.size());
  for (size_t b = 0; b < plan.size(); ++b) {
    Bucket bucket;
    bucket.params = std::move(plan[b]);
    for (size_t p : bucket.params) {
      bucket.grad_elements += params_[p].tensor.numel();
      bucket.shapes.push_back(params_[p].tensor.sizes().vec());
    }
    bucket.control_words = b + 1 == plan.size() ? kControlWords : 0;
    bucket.buffer = torch::zeros(
        {bucket.grad_elements + static_cast<int64_t>(bucket.params.size()) + bucket.control_words},
        torch::TensorOptions().dtype(torch::kFloat32).device(params_.front().tensor.device()));
    if (streams_) streams_->UsedOnComm(bucket.buffer);
    int64_t offset = 0;
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      Param& param = params_[bucket.params[j]];
      param.bucket = b;
      param.index_in_bucket = j;
      // An alias of the bucket's memory, not an autograd view: the
      // optimizers' zero_grad detaches gradients in place, which a view
      // refuses. The deleter keeps the bucket's buffer alive.
      param.view = torch::from_blob(
          bucket.buffer.data_ptr<float>() + offset, param.tensor.sizes(),
          [keep = bucket.buffer](void*) mutable { keep.reset(); }, bucket.buffer.options());
      offset += param.tensor.numel();
    }
    buckets_.push_back(std::move(bucket));
  }
}

std::vector<std::vector<size_t>> Reducer::plan() const {
  std::vector<std::vector<size_t>> plan;
  for (const auto& b : buckets_) plan.push_back(b.params);
  return plan;
}

absl::Status Reducer::RebuildIfDue() {
  if (first_sync_done_ && !rebuilt_ && options_.rebuild_after_first_step) {
    rebuilt_ = true;
    std::vector<size_t> observed;
    {
      absl::MutexLock lock(&mu_);
      observed = ready_order_;
    }
    // Every rank must plan the same buckets: take rank 0's order.
    std::vector<int64_t> order(params_.size());
    const std::vector<size_t> mine = CompleteReadyOrder(observed, params_.size());
    for (size_t i = 0; i < mine.size(); ++i) order[i] = static_cast<int64_t>(mine[i]);
    if (options_.check != nullptr) {
      absl::Status agreed =
          options_.check->Agree(Collective{CollectiveKind::kBucketOrder, params_.size(), 0, 0});
      if (!agreed.ok()) return agreed;
    }
    absl::Status s = comm_->Broadcast(order.data(), order.size() * sizeof(int64_t), 0);
    if (!s.ok()) return s;
    std::vector<size_t> agreed(order.begin(), order.end());
    BuildBuckets(agreed);
  }
  return absl::OkStatus();
}

absl::Status Reducer::StartGroup() {
  if (absl::Status s = RebuildIfDue(); !s.ok()) return s;
  for (Bucket& b : buckets_) b.buffer.zero_();
  for (size_t i = 0; i < params_.size(); ++i) had_grad_[i] = params_[i].tensor.grad().defined();
  for (Param& p : params_) {
    if (!p.tensor.grad().defined() || !p.tensor.grad().is_same(p.view)) {
      p.tensor.mutable_grad() = p.view;
    }
  }
  absl::MutexLock lock(&mu_);
  used_.assign(params_.size(), false);
  return error_;
}

void Reducer::PrepareBackward(bool sync, ControlWords control) {
  absl::MutexLock lock(&mu_);
  sync_ = sync;
  control_ = control;
  marked_.assign(params_.size(), false);
  if (!sync) return;
  for (Bucket& b : buckets_) {
    b.pending = b.params.size();
    b.ready = false;
  }
  next_launch_ = 0;
  queue_.clear();
  queue_head_ = 0;
  // Every rank must be at the same step, with the same buckets, before any
  // gradient is summed: agreed on the communication thread while backward
  // runs, ahead of the first bucket, so that its round trip hides behind
  // backward's compute.
  if (options_.check != nullptr && comm_->world_size() > 1) queue_.push_back(kAgreeOnStep);
  done_ = 0;
  allreduce_ms_ = 0;
  backward_start_ = absl::Now();
  timings_.assign(buckets_.size(), BucketTiming{});
  if (!first_sync_done_) ready_order_.clear();
}

void Reducer::EnableImplicit(ImplicitHooks hooks) {
  implicit_ = std::move(hooks);
  WatchForBackward();
}

void Reducer::ArmImplicit() {
  armed_ = true;
  UnwatchBackward();  // armed by a gradient hook first: the watch is moot
  const std::optional<ControlWords> words = implicit_.sync();
  const bool sync = words.has_value();
  if (!group_open_) {
    group_open_ = true;
    absl::Status s = RebuildIfDue();
    // The gradients the user left (zeroed, or accumulated on purpose) go
    // into the buckets; an unset one counts as zero. The first hook's own
    // gradient is already in its .grad.
    for (size_t i = 0; i < params_.size(); ++i) {
      Param& p = params_[i];
      const at::Tensor& grad = p.tensor.grad();
      had_grad_[i] = grad.defined();
      if (grad.defined() && grad.is_same(p.view)) continue;
      if (grad.defined()) {
        p.view.copy_(grad);
      } else {
        p.view.zero_();
      }
      p.tensor.mutable_grad() = p.view;
    }
    absl::MutexLock lock(&mu_);
    used_.assign(params_.size(), false);
    if (!s.ok() && error_.ok()) error_ = s;
  }
  PrepareBackward(sync, words.value_or(ControlWords{}));
  // A backward that throws part-way drops its final callbacks unrun. Then
  // this guard, going with the callback, disarms the reducer: the buckets in
  // flight finish (so every rank's collectives still match) and the next
  // backward starts a new group, instead of finding the reducer armed.
  struct Disarm {
    Reducer* reducer = nullptr;
    bool sync = false;
    bool ran = false;
    ~Disarm() {
      if (ran) return;
      reducer->armed_ = false;
      reducer->group_open_ = false;
      if (sync) reducer->FinishBackward().IgnoreError();
      reducer->WatchForBackward();
    }
  };
  // Made in place: a temporary Disarm would run its destructor now.
  auto disarm = std::make_shared<Disarm>();
  disarm->reducer = this;
  disarm->sync = sync;
  torch::autograd::Engine::get_default_engine().queue_callback([this, sync, disarm] {
    disarm->ran = true;
    armed_ = false;
    WatchForBackward();  // first: `finished` may throw
    if (!sync) {
      implicit_.finished(false, ReductionStats{});
      return;
    }
    group_open_ = false;
    if (implicit_.waiting) implicit_.waiting();
    implicit_.finished(true, FinishBackward());
  });
}

void Reducer::MarkReady(size_t param) {
  if (implicit_.finished && !armed_) ArmImplicit();
  absl::MutexLock lock(&mu_);
  used_[param] = true;
  if (marked_[param]) return;  // reentrant backward: already counted
  marked_[param] = true;
  if (!sync_) return;
  if (!first_sync_done_) ready_order_.push_back(param);
  Bucket& bucket = buckets_[params_[param].bucket];
  if (--bucket.pending == 0) CompleteBucketLocked(params_[param].bucket, /*from_backward=*/true);
}

void Reducer::CompleteBucketLocked(size_t b, bool from_backward) {
  Bucket& bucket = buckets_[b];
  // On a device the flags and words are written on the host, then copied
  // in on the compute stream, ahead of the bucket's ready event.
  const int64_t tail_size = bucket.buffer.numel() - bucket.grad_elements;
  const bool on_host = bucket.buffer.is_cpu();
  if (!on_host && !bucket.host_tail.defined()) {
    bucket.host_tail = at::empty(
        {tail_size}, at::TensorOptions().dtype(at::kFloat).pinned_memory(bucket.buffer.is_cuda()));
  }
  float* flags = on_host ? bucket.buffer.data_ptr<float>() + bucket.grad_elements
                         : bucket.host_tail.data_ptr<float>();
  for (size_t j = 0; j < bucket.params.size(); ++j) {
    // Used in any backward of the group, no_sync micro-batches included
    // (PyTorch counts only the synchronized one, and leaves a gradient that
    // only earlier micro-batches produced un-averaged, so replicas drift).
    const size_t p = bucket.params[j];
    const bool used = from_backward || used_[p];
    flags[j] = used ? 1.0f : 0.0f;
    // Kept in case no rank used it: then .grad stays what this rank had
    // before the group.
    if (!used) params_[p].local = params_[p].view.clone();
  }
  if (bucket.control_words > 0) {
    float* control = flags + bucket.params.size();
    control[0] = static_cast<float>(control_.token);
    control[1] = control_.leave != nullptr && control_.leave->load() ? 1.0f : 0.0f;
  }
  if (!on_host) {
    // Without blocking backward (pinned memory). Rewriting host_tail next
    // step is safe: FinishBackward's blocking read of the tails drained the
    // compute stream, this copy included.
    bucket.buffer.narrow(0, bucket.grad_elements, tail_size)
        .copy_(bucket.host_tail, /*non_blocking=*/true);
  }
  if (streams_) streams_->BucketReady(b);
  bucket.ready = true;
  if (b < timings_.size()) timings_[b].ready_ms = SinceBackwardStartLocked(absl::Now());
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].ready) {
    // Alone in the world there is nothing to average: no hand-off at all
    // (but PowerSGD approximates even alone, as PyTorch's hook does).
    if (comm_->world_size() == 1 && !powersgd_) {
      if (next_launch_ < timings_.size()) {
        timings_[next_launch_].started_ms = timings_[next_launch_].ready_ms;
      }
      ++next_launch_;
      ++done_;
      continue;
    }
    queue_.push_back(next_launch_++);
  }
}

double Reducer::SinceBackwardStartLocked(absl::Time t) const {
  return absl::ToDoubleMilliseconds(t - backward_start_);
}

void Reducer::CommLoop() {
  const float world = static_cast<float>(comm_->world_size());
  // This thread's tensor work (averaging, staging copies) goes on the
  // communication stream.
  std::optional<c10::StreamGuard> on_comm_stream;
  if (streams_) on_comm_stream.emplace(streams_->comm_stream());
  while (true) {
    size_t b;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Reducer* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) {
            return r->stopping_ || r->queue_head_ < r->queue_.size();
          },
          this));
      if (queue_head_ >= queue_.size()) return;  // stopping, nothing queued
      b = queue_[queue_head_++];
      if (!error_.ok()) {
        if (b == kAgreeOnStep) continue;
        // Still the step's end: what the stream queued before is awaited.
        if (streams_ && b + 1 == buckets_.size()) streams_->CollectivesDone();
        ++done_;
        continue;
      }
    }
    const absl::Time start = absl::Now();
    if (b == kAgreeOnStep) {
      absl::Status agreed = AgreeOnStep();
      absl::MutexLock lock(&mu_);
      if (!agreed.ok() && error_.ok()) error_ = agreed;
      allreduce_ms_ += absl::ToDoubleMilliseconds(absl::Now() - start);
      continue;  // not a bucket: FinishBackward counts buckets
    }
    uint64_t wire = 0;
    absl::Status s;
    try {
      s = ReduceBucket(b, world, &wire);
    } catch (const c10::Error& e) {
      s = absl::InternalError(
          absl::StrCat("reducing bucket ", b, ": ", e.what_without_backtrace()));
    }
    // Every rank counts the same steps: a failed one ends the generation,
    // and with it this reducer.
    if (powersgd_ && b + 1 == buckets_.size()) powersgd_->StepDone();
    // Before done_ counts it: FinishBackward then waits on this event.
    if (streams_ && b + 1 == buckets_.size()) streams_->CollectivesDone();
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    absl::MutexLock lock(&mu_);
    if (!s.ok() && error_.ok()) error_ = s;
    allreduce_ms_ += ms;
    if (b < timings_.size()) {
      timings_[b].started_ms = SinceBackwardStartLocked(start);
      timings_[b].allreduce_ms = ms;
      timings_[b].bytes = wire;  // 0: FinishBackward counts the buffer
    }
    ++done_;
  }
}

absl::Status Reducer::AgreeOnStep() {
  uint64_t floats = 0;
  for (const Bucket& bucket : buckets_) floats += static_cast<uint64_t>(bucket.buffer.numel());
  return options_.check->Agree(Collective{CollectiveKind::kGradients, floats, buckets_.size(),
                                          static_cast<int32_t>(options_.bytes_after_step_root),
                                          options_.bytes_after_step});
}

absl::StatusOr<ReductionStats> Reducer::FinishBackward() {
  const absl::Time start = absl::Now();
  ReductionStats stats;
  stats.buckets_total = static_cast<uint32_t>(buckets_.size());
  {
    absl::MutexLock lock(&mu_);
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (!buckets_[b].ready) CompleteBucketLocked(b, /*from_backward=*/false);
    }
    mu_.Await(absl::Condition(
        +[](Reducer* r)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) { return r->done_ == r->buckets_.size(); },
        this));
    // The compute stream (the optimizer's) waits for the collectives.
    if (streams_) streams_->StepEnd();
    if (!error_.ok()) return error_;
    stats.allreduce_ms = allreduce_ms_;
    stats.buckets = timings_;
    for (size_t p = 0; p < params_.size(); ++p) {
      if (used_[p]) continue;
      ++stats.unused;
      if (!reported_unused_[p]) {
        reported_unused_[p] = true;
        stats.newly_unused.push_back(params_[p].name);
      }
    }
    first_sync_done_ = true;
  }
  // Device buffers: the flags and control words come to the host once,
  // ordered after the collectives by StepEnd.
  std::vector<at::Tensor> host_tails;
  if (!buckets_.front().buffer.is_cpu()) {
    for (const Bucket& b : buckets_) {
      host_tails.push_back(
          b.buffer.narrow(0, b.grad_elements, b.buffer.numel() - b.grad_elements).to(at::kCPU));
    }
  }
  auto tail = [&](size_t b) -> const float* {
    return host_tails.empty() ? buckets_[b].buffer.data_ptr<float>() + buckets_[b].grad_elements
                              : host_tails[b].data_ptr<float>();
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    const float flag = tail(p.bucket)[p.index_in_bucket];
    if (flag <= 0.0f) {
      ++stats.globally_unused;
      // No rank produced this gradient in the whole group: .grad stays as
      // this rank had it before the group (the same on every rank when the
      // program zeroes gradients), and one that had none stays without (the
      // optimizer skips it), as in PyTorch.
      if (had_grad_[i]) {
        if (p.local.defined()) p.view.copy_(p.local);
      } else {
        p.tensor.mutable_grad().reset();
      }
    }
    p.local.reset();
  }
  stats.buckets.resize(buckets_.size());
  for (size_t i = 0; i < buckets_.size(); ++i) {
    // What crossed the wire: compressed gradients, and the counts in float.
    const Bucket& b = buckets_[i];
    const int64_t narrow = options_.compression ? b.grad_elements : 0;
    if (stats.buckets[i].bytes == 0) {
      stats.buckets[i].bytes =
          (b.buffer.numel() - narrow) * sizeof(float) + narrow * sizeof(uint16_t);
    }
    stats.bytes += stats.buckets[i].bytes;
  }
  const float* control = tail(buckets_.size() - 1) + buckets_.back().params.size();
  stats.token_sum = static_cast<uint64_t>(std::lround(control[0]));
  stats.leave_votes = static_cast<uint32_t>(std::lround(control[1]));
  stats.buckets_reduced = stats.buckets_total;
  stats.wait_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  return stats;
}

}  // namespace ddp
