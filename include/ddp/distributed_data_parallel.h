// PyTorch's DistributedDataParallel for a C++ (or TorchScript) module: the
// same math, with nothing to call around the training step.
//
//   ddp::DistributedDataParallel ddp(*session, net.ptr());
//   for (auto& batch : *loader) {
//     optimizer.zero_grad();
//     torch::Tensor loss = torch::nll_loss(net->forward(batch.data), batch.target);
//     loss.backward();  // returns with every gradient averaged over the ranks
//     optimizer.step();
//   }
//
// Construction checks that every rank has the same parameters (names,
// shapes; a mismatch is a ddp::Error naming the parameter, on every rank)
// and copies the parameters and buffers of rank 0 to all; buffers again
// after each synchronized backward (Options::broadcast_buffers). Gradients are
// all-reduced in buckets (about bucket_cap_mb each, launched as backward
// fills them, in the order gradients became ready after the first step),
// averaged as PyTorch does (divide by the world size, then sum). A parameter
// that gets no gradient on some rank needs no flag and no graph walk: each
// bucket carries one "used" mark per parameter, and one that no rank used is
// left without a gradient, as PyTorch leaves it. "Used" counts every
// micro-batch of a no_sync() accumulation: a parameter that only earlier
// micro-batches reached, on some ranks, is averaged too, where PyTorch 1.13
// leaves each rank's own gradient and its replicas drift (the one place the
// numbers differ from PyTorch's).
//
// Every backward on the training thread is a step, whether or not its loss
// reaches a parameter: a rank whose loss reaches none takes part with zero
// gradients. Before each step's collectives the ranks check that they are at
// the same step: ranks whose programs went different ways fail together.
//
// The module stays the caller's: call its forward directly. backward()
// throws ddp::Error (through LibTorch) if a collective fails or the ranks'
// collectives are misaligned.
//
// Thread rules: one thread trains; backward runs the hooks on that thread.
#ifndef DDP_INCLUDE_DDP_DISTRIBUTED_DATA_PARALLEL_H_
#define DDP_INCLUDE_DDP_DISTRIBUTED_DATA_PARALLEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

namespace torch::jit {
struct Module;
}

namespace ddp {

class Session;
struct LibraryInternals;

class DistributedDataParallel {
 public:
  struct Options {
    // Gradient bytes per bucket, in MiB (PyTorch's bucket_cap_mb); the
    // first bucket is 1 MiB, as in PyTorch.
    double bucket_cap_mb = 25;
    // The rank whose parameters and buffers everyone starts from.
    int broadcast_from = 0;
    // PyTorch's broadcast_buffers: after each synchronized backward, every
    // rank takes that rank's buffers (BatchNorm's running statistics), so
    // the next forward sees what PyTorch's would.
    bool broadcast_buffers = true;
    // Gradients cross the wire as 16-bit floats, with the semantics of
    // PyTorch's fp16_compress_hook / bf16_compress_hook: each bucket cast,
    // divided by the world size, summed in that type, and cast back. Half
    // the bytes, for a little precision.
    // kPowerSGD: PyTorch's powerSGD_hook (error feedback and warm start on):
    // plain all-reduce for the first powersgd_start_step steps, then each
    // large enough gradient matrix sent as two rank-powersgd_rank factors.
    // Its state lasts one generation: a re-formed job starts over.
    enum class Compression { kNone, kFloat16, kBFloat16, kPowerSGD };
    Compression compression = Compression::kNone;
    int powersgd_rank = 1;
    int64_t powersgd_start_step = 1000;
  };

  // What the last synchronized backward did.
  struct Reduction {
    uint32_t buckets = 0;
    uint64_t bytes = 0;
    // All-reduce time on the communication thread, and the time backward's
    // end waited for it, in milliseconds.
    double allreduce_ms = 0;
    double wait_ms = 0;
    // Parameters without a gradient on this rank, and on every rank.
    uint32_t unused_parameters = 0;
    uint32_t globally_unused_parameters = 0;
  };

  // `session` and `module` outlive this. Float32 CPU parameters. Collective:
  // every rank constructs it at the same point.
  DistributedDataParallel(Session& session, std::shared_ptr<torch::nn::Module> module,
                          Options options);
  DistributedDataParallel(Session& session, std::shared_ptr<torch::nn::Module> module)
      : DistributedDataParallel(session, std::move(module), Options{}) {}
  DistributedDataParallel(Session& session, torch::jit::Module& module, Options options);
  DistributedDataParallel(Session& session, torch::jit::Module& module)
      : DistributedDataParallel(session, module, Options{}) {}
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Gradient accumulation: while the guard lives, backward only accumulates
  // locally; the first backward after it ends all-reduces the sum. Guards
  // don't nest; a ddp::Error if one is made while another lives.
  class [[nodiscard]] NoSync {
   public:
    ~NoSync();
    NoSync(NoSync&& other) noexcept;
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;

   private:
    friend class DistributedDataParallel;
    explicit NoSync(DistributedDataParallel* owner) : owner_(owner) {}
    DistributedDataParallel* owner_;
  };
  NoSync no_sync();

  const Reduction& last_reduction() const;
  // Parameter names in the order the library sees them.
  std::vector<std::string> parameter_names() const;

 private:
  friend struct LibraryInternals;  // the worker daemon's trainer
  struct Impl;
  DistributedDataParallel(Session& session,
                          std::vector<std::pair<std::string, torch::Tensor>> params,
                          std::vector<std::pair<std::string, torch::Tensor>> buffers,
                          const Options& options);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp

#endif  // DDP_INCLUDE_DDP_DISTRIBUTED_DATA_PARALLEL_H_
