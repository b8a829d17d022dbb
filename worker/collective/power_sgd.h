// PowerSGD gradient compression with the semantics of PyTorch 1.13's
// powerSGD_hook (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py),
// so that a job compressed here trains as PyTorch DDP with that hook
// registered:
//
// - the first `start_iter` steps all-reduce buckets as usual;
// - then, per bucket: the rank's previous compression error is added to its
//   gradients (error feedback); each gradient viewed as an n x m matrix
//   (first dimension by the rest) is compressed to rank r when
//   (n + m) r * min_compression_rate < n m, the rest (biases, small
//   layers) is all-reduced as is; for a compressed M, P = M Q is summed
//   over the ranks and orthogonalized, Q = M^T P is summed and divided by
//   the world, and M becomes P Q^T; the new error is what the bucket held
//   before minus what it holds after;
// - Q starts random (a seed drawn from numpy's RandomState(seed) legacy
//   generator, then torch.randn) and is reused from the step before (warm
//   start).
//
// The state (errors, P and Q) lives as long as this object: one reducer,
// i.e. one generation. A re-formed generation starts over with `start_iter`
// plain steps, on every rank alike. Alone (one rank) it still approximates,
// as the hook does. The numbers depend on the bucket plan (a seed per
// bucket, shapes grouped within one), so the reducer plans as PyTorch.
#ifndef DDP_WORKER_COLLECTIVE_POWER_SGD_H_
#define DDP_WORKER_COLLECTIVE_POWER_SGD_H_

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "worker/collective/communicator.h"

namespace ddp {

struct PowerSgdOptions {
  // PyTorch's matrix_approximation_rank.
  int rank = 1;
  // PyTorch's start_powerSGD_iter: plain all-reduce before this step
  // (at least 2, as PyTorch requires with error feedback and warm start).
  int64_t start_iter = 1000;
  double min_compression_rate = 2;
  uint32_t seed = 0;
};

// INVALID_ARGUMENT unless rank >= 1 and start_iter >= 2.
absl::Status CheckPowerSgdOptions(const PowerSgdOptions& options);

// numpy.random.RandomState(seed).randint(1_000_000_000), draw after draw:
// the seeds PyTorch's hook gives torch.manual_seed before drawing Q.
class LegacyNumpySeeds {
 public:
  explicit LegacyNumpySeeds(uint32_t seed) : mt_(seed) {}
  uint32_t Next();

 private:
  std::mt19937 mt_;  // numpy's legacy MT19937 with init_genrand seeding
};

class PowerSgd {
 public:
  explicit PowerSgd(PowerSgdOptions options) : options_(options), seeds_(options.seed) {}

  // Whether this step's buckets are compressed (else: plain all-reduce).
  bool active() const { return iter_ >= options_.start_iter; }

  // Compresses and all-reduces bucket `index`'s gradients in place:
  // `grads` is the bucket's flat float32 gradient memory, `shapes` its
  // parameters' shapes in bucket order. The average (approximated) is left
  // in `grads`. Float32 bytes this rank sent into all-reduces in `*wire`.
  absl::Status Reduce(size_t index, const at::Tensor& grads,
                      const std::vector<std::vector<int64_t>>& shapes, Communicator& comm,
                      float world, uint64_t* wire);

  // After the step's last bucket: one more step done.
  void StepDone() { ++iter_; }

  // One gradient compressed in a bucket: its matrix view (1 x n x m) and
  // its rank.
  struct Compressed {
    at::Tensor matrix;
    int64_t rank = 0;
  };

 private:
  struct BucketState {
    at::Tensor error;
    at::Tensor p;
    at::Tensor q;
  };
  // The bucket's P and Q factors, one view per compressed gradient; made
  // (random, alike on every rank) on the bucket's first compressed step,
  // kept after (warm start). Q is orthogonalized.
  void PlaceFactors(BucketState& state, const std::vector<Compressed>& compressed,
                    const at::TensorOptions& options, std::vector<at::Tensor>* ps,
                    std::vector<at::Tensor>* qs);

  const PowerSgdOptions options_;
  LegacyNumpySeeds seeds_;
  int64_t iter_ = 0;
  std::map<size_t, BucketState> buckets_;
};

// Orthogonalizes each (n x r) matrix of a (batch, n, r) tensor in place, as
// PyTorch's hook: Gram-Schmidt for r <= 2, else QR.
void OrthogonalizeColumns(at::Tensor& matrices);

}  // namespace ddp

#endif  // DDP_WORKER_COLLECTIVE_POWER_SGD_H_
