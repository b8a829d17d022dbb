#include "ddp/distributed_data_parallel.h"

#include <torch/script.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ddp/error.h"
#include "ddp/session.h"
#include "worker/api/library_internals.h"
#include "worker/api/session_impl.h"
#include "worker/collective/bucket_plan.h"
#include "worker/collective/collective_check.h"
#include "worker/collective/communicator.h"
#include "worker/collective/reducer.h"
#include "worker/elastic/replica_check.h"
#include "worker/elastic/tensor_digest.h"

namespace ddp {
namespace {

using Named = std::vector<std::pair<std::string, torch::Tensor>>;

void Check(const absl::Status& s, const std::string& what) {
  if (!s.ok()) throw StatusError(s, what);
}

// Copies `tensors` from rank `root` to every rank in one broadcast, packed
// into `scratch` (host memory: a GPU's tensors are staged through it),
// whatever their dtypes.
absl::Status BroadcastPacked(Communicator& comm, Named& tensors, int root,
                             std::vector<char>& scratch) {
  size_t total = 0;
  for (const auto& [name, t] : tensors) total += t.nbytes();
  if (total == 0) return absl::OkStatus();
  scratch.resize(total);
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const at::Tensor host = t.is_cpu() ? t.contiguous() : t.to(at::kCPU).contiguous();
    std::memcpy(scratch.data() + offset, host.data_ptr(), t.nbytes());
    offset += t.nbytes();
  }
  if (absl::Status s = comm.Broadcast(scratch.data(), total, root); !s.ok()) return s;
  torch::NoGradGuard no_grad;
  offset = 0;
  for (auto& [name, t] : tensors) {
    if (t.is_cpu() && t.is_contiguous()) {
      std::memcpy(t.data_ptr(), scratch.data() + offset, t.nbytes());
    } else {
      t.copy_(torch::from_blob(scratch.data() + offset, t.sizes(), t.options().device(at::kCPU)));
    }
    offset += t.nbytes();
  }
  return absl::OkStatus();
}

// For tests: DDP_TEST_FAIL_STEP="R:K" makes step K's synchronized backward,
// once it completed on every rank, read as failed on rank R (once a
// process): a collective that completed on some ranks only, as a fault
// between a ring's last transfers leaves it, forced rather than hoped for
// (tests/py/library_parity_test.py).
// Read when the first synchronized backward ends (a test program sets it
// before then), not at every step.
bool InjectedFailure(int rank, uint64_t step) {
  struct Plan {
    int rank = -1;
    uint64_t step = 0;
  };
  static const Plan plan = [] {
    Plan p;
    const char* text = std::getenv("DDP_TEST_FAIL_STEP");
    std::vector<std::string> parts = absl::StrSplit(text == nullptr ? "" : text, ':');
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &p.rank) ||
        !absl::SimpleAtoi(parts[1], &p.step)) {
      p.rank = -1;
    }
    return p;
  }();
  static std::atomic<bool> fired{false};
  if (plan.rank != rank || plan.step != step) return false;
  return !fired.exchange(true);
}

}  // namespace

struct DistributedDataParallel::Impl {
  // At the end of each backward (the autograd engine's final callback).
  void Finished(bool sync, absl::StatusOr<ReductionStats> stats) {
    if (!sync) return;
    Session::Impl& s = *session->impl_;
    absl::Status buffers_copied = absl::OkStatus();
    if (stats.ok()) {
      Record(*stats, s);
      if (broadcast_buffers) {
        buffers_copied = BroadcastPacked(*s.comm, buffers, root, scratch);
      }
      if (!s.driver && InjectedFailure(s.rank, s.committed.step + 1)) {
        stats = absl::UnavailableError("DDP_TEST_FAIL_STEP: failed here after it completed");
      }
    }
    if (s.driver) {
      // The daemon's trainer decides what a failure means, by its code.
      if (!buffers_copied.ok()) stats = buffers_copied;
      s.driver->reduced(std::move(stats));
      return;
    }
    if (!stats.ok()) {
      if (s.VoidStep(stats.status())) return;  // elastic: undone at the next step boundary
      throw Error(s.Explain(stats.status(), "all-reducing the gradients failed"));
    }
    if (!buffers_copied.ok()) {
      if (s.VoidStep(buffers_copied)) return;
      throw Error(
          s.Explain(buffers_copied, "copying the buffers from rank " + std::to_string(root)));
    }
    s.OnCommitted();
    // Every rank completed this step, and one was asked to end the
    // generation here: all leave now, keeping it.
    if (stats->leave_votes > 0 && s.joined) {
      s.joined->LeaveAtStepBoundary();
      s.saw_end = true;
    }
  }

  // What last_reduction() and the next report_step say.
  void Record(const ReductionStats& stats, Session::Impl& s) {
    last.buckets = stats.buckets_reduced;
    last.bytes = stats.bytes;
    last.allreduce_ms = stats.allreduce_ms;
    last.wait_ms = stats.wait_ms;
    last.unused_parameters = stats.unused;
    last.globally_unused_parameters = stats.globally_unused;
    if (s.driver) return;  // the trainer reports for itself
    AddReduction(stats, &s.last_reduction);
  }

  // Construction's collectives on the session's communicator: every rank
  // has the same parameters, takes `from`'s parameters and buffers, and
  // gets a reducer over it.
  void Attach(int from) {
    Session::Impl& s = *session->impl_;
    Communicator& comm = *s.comm;
    root = from;
    Check(s.check->Agree(Collective{CollectiveKind::kModel, 0, 0, root}),
          "constructing the DistributedDataParallel");
    // Every rank must train the same parameters (and hold the same
    // buffers, which are copied in one piece).
    if (absl::Status same = CheckSameModel(comm, params, buffers, root);
        absl::IsInvalidArgument(same)) {
      throw Error(std::string(same.message()));
    } else {
      Check(same, "comparing the ranks' parameters");
    }
    std::vector<char> bytes;  // once: not kept, unlike the buffers' scratch
    Check(BroadcastPacked(comm, params, root, bytes),
          "copying the parameters from rank " + std::to_string(root));
    Check(BroadcastPacked(comm, buffers, root, scratch),
          "copying the buffers from rank " + std::to_string(root));
    AlignGradients(comm);
    // Every step of a program is agreed on first, with the buffers that
    // follow it: a program's ranks may go different ways between steps.
    // The worker daemon's trainer runs one loop alike on every rank and
    // checks each step's token itself (worker/trainer.cc), so it spares
    // the round trip a step (on a 3 ms step over TCP, a fifth of it).
    reducer_options.check = s.driver ? nullptr : s.check.get();
    reducer_options.bytes_after_step = 0;
    if (broadcast_buffers) {
      for (const auto& [name, t] : buffers) reducer_options.bytes_after_step += t.nbytes();
    }
    reducer_options.bytes_after_step_root = root;
    auto created = Reducer::Create(trainable, &comm, reducer_options);
    Check(created.status(), "ddp::DistributedDataParallel");
    reducer = std::move(*created);
    Reducer::ImplicitHooks hooks;
    hooks.sync = [this]() -> std::optional<ControlWords> {
      if (no_sync) return std::nullopt;
      if (session->impl_->driver) return session->impl_->driver->control();
      // A joined program votes to leave when the coordinator asks it to.
      const CoordinatorSession* joined = session->impl_->joined.get();
      return ControlWords{0, joined ? joined->leave_vote() : nullptr};
    };
    if (session->impl_->driver) hooks.waiting = session->impl_->driver->waiting;
    hooks.finished = [this](bool sync, absl::StatusOr<ReductionStats> stats) {
      Finished(sync, std::move(stats));
    };
    reducer->EnableImplicit(std::move(hooks));
  }

  // Whether a parameter has a gradient tensor is state too: an optimizer
  // skips a parameter without one, but SGD's momentum (or weight decay)
  // moves one whose gradient is zero, as after zero_grad(). A rank that
  // joins has none where the others, having used the parameter, keep zeros;
  // at a step that leaves the parameter unused on every rank the replicas
  // would part. Every rank takes rank `root`'s pattern: zeros, or none.
  void AlignGradients(Communicator& comm) {
    if (trainable.empty()) return;
    std::vector<uint8_t> has(trainable.size());
    for (size_t i = 0; i < trainable.size(); ++i) has[i] = trainable[i].second.grad().defined();
    Check(comm.Broadcast(has.data(), has.size(), root),
          "agreeing on the gradients with rank " + std::to_string(root));
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < trainable.size(); ++i) {
      torch::Tensor& t = trainable[i].second;
      if (has[i] && !t.grad().defined()) t.mutable_grad() = torch::zeros_like(t);
      if (!has[i] && t.grad().defined()) t.mutable_grad() = torch::Tensor();
    }
  }

  void ZeroGrads() {
    torch::NoGradGuard no_grad;
    for (auto& [name, t] : trainable) {
      if (t.grad().defined()) t.mutable_grad().zero_();
    }
  }

  Session* session = nullptr;
  std::vector<std::string> names;
  Named params;
  Named buffers;
  std::vector<NamedTensor> trainable;
  Reducer::Options reducer_options;
  std::unique_ptr<Reducer> reducer;
  bool no_sync = false;
  Reduction last;
  // Buffers are taken from `root` after each synchronized backward.
  bool broadcast_buffers = true;
  int root = 0;
  std::vector<char> scratch;  // the packed buffers
};

DistributedDataParallel::DistributedDataParallel(Session& session, Named params, Named buffers,
                                                 const Options& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->session = &session;
  Session::Impl& s = *session.impl_;
  if (options.broadcast_from < 0 || options.broadcast_from >= s.world_size) {
    throw Error(absl::StrCat("broadcast_from ", options.broadcast_from, " is not a rank"));
  }
  if (!(options.bucket_cap_mb > 0)) throw Error("bucket_cap_mb must be positive");
  impl_->params = std::move(params);
  impl_->buffers = std::move(buffers);
  // Buffers change in forward only, so taking the root's after a backward
  // gives the next forward the buffers PyTorch's pre-forward broadcast would.
  impl_->broadcast_buffers = options.broadcast_buffers;
  for (auto& [name, t] : impl_->params) {
    impl_->names.push_back(name);
    if (t.requires_grad()) impl_->trainable.emplace_back(name, t);
  }
  impl_->reducer_options.bucket_cap_bytes =
      static_cast<size_t>(options.bucket_cap_mb * 1024 * 1024);
  impl_->reducer_options.first_bucket_cap_bytes =
      std::min(impl_->reducer_options.bucket_cap_bytes, kDefaultFirstBucketBytes);
  switch (options.compression) {
    case Options::Compression::kFloat16:
      impl_->reducer_options.compression = HalfType::kFloat16;
      break;
    case Options::Compression::kBFloat16:
      impl_->reducer_options.compression = HalfType::kBFloat16;
      break;
    case Options::Compression::kPowerSGD:
      impl_->reducer_options.powersgd =
          PowerSgdOptions{options.powersgd_rank, options.powersgd_start_step};
      // Refused here, before any collective, rather than after the broadcasts.
      Check(CheckPowerSgdOptions(*impl_->reducer_options.powersgd), "ddp::DistributedDataParallel");
      // Its numbers depend on the buckets (a seed each; shapes grouped within
      // one), so PyTorch's plan exactly: a 1 MiB first bucket whatever the
      // cap, and no tail split again.
      impl_->reducer_options.first_bucket_cap_bytes = kDefaultFirstBucketBytes;
      impl_->reducer_options.split_tail = false;
      break;
    case Options::Compression::kNone:
      break;
  }
  // Started into a running job: the state comes from the rank the
  // coordinator names, as the others re-form from it.
  int root = options.broadcast_from;
  if (s.joined && s.joined->assignment().state_source() != v1::STATE_SOURCE_FRESH) {
    root = static_cast<int>(s.joined->assignment().source_rank());
  }
  impl_->Attach(root);
  Impl* impl = impl_.get();
  auto tensors = [impl] {
    std::vector<torch::Tensor> out;
    for (auto& [name, t] : impl->params) out.push_back(t);
    return out;
  };
  s.ddp =
      DdpLink{[impl] { impl->reducer.reset(); },
              [impl](int from) { impl->Attach(from); },
              [impl] { impl->ZeroGrads(); },
              [tensors] { return TensorDigest(tensors()); },
              [tensors] { return TensorDigests(tensors(), kParameterDigests); },
              [impl] {
                return DigestEntryNames(impl->names, kParameterDigests, kParameterDigestNameBytes);
              }};
}

namespace {
Named NamedOf(const torch::OrderedDict<std::string, torch::Tensor>& dict) {
  Named out;
  for (const auto& item : dict) out.emplace_back(item.key(), item.value());
  return out;
}
template <typename List>
Named NamedOfJit(const List& list) {
  Named out;
  for (const auto& item : list) out.emplace_back(item.name, item.value);
  return out;
}
}  // namespace

DistributedDataParallel::DistributedDataParallel(Session& session,
                                                 std::shared_ptr<torch::nn::Module> module,
                                                 Options options)
    : DistributedDataParallel(session, NamedOf(module->named_parameters(/*recurse=*/true)),
                              NamedOf(module->named_buffers(/*recurse=*/true)), options) {}

DistributedDataParallel::DistributedDataParallel(Session& session, torch::jit::Module& module,
                                                 Options options)
    : DistributedDataParallel(session, NamedOfJit(module.named_parameters(/*recurse=*/true)),
                              NamedOfJit(module.named_buffers(/*recurse=*/true)), options) {}

DistributedDataParallel::~DistributedDataParallel() {
  Session::Impl& s = *impl_->session->impl_;
  if (s.ddp) s.ddp.reset();
}

DistributedDataParallel::NoSync DistributedDataParallel::no_sync() {
  if (impl_->no_sync) {
    throw Error("no_sync() while another no_sync() guard lives: guards don't nest");
  }
  impl_->no_sync = true;
  return NoSync(this);
}

DistributedDataParallel::NoSync::~NoSync() {
  if (owner_ != nullptr) owner_->impl_->no_sync = false;
}

DistributedDataParallel::NoSync::NoSync(NoSync&& other) noexcept : owner_(other.owner_) {
  other.owner_ = nullptr;
}

const DistributedDataParallel::Reduction& DistributedDataParallel::last_reduction() const {
  return impl_->last;
}

std::vector<std::string> DistributedDataParallel::parameter_names() const { return impl_->names; }

}  // namespace ddp
