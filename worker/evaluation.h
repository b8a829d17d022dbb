// Test accuracy after an epoch, measured by every rank together: each
// evaluates its own contiguous share of the test set on the committed
// weights (the same on every replica), and the shares' sums meet in one
// all-reduce. Nobody idles in a collective while one rank evaluates the
// whole set, an evaluation takes 1/world of the time it would on one rank,
// and its phase has a bound of its own, so the coordinator can tell a long
// evaluation from a hang.
#ifndef DDP_WORKER_EVALUATION_H_
#define DDP_WORKER_EVALUATION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ddp/v1/job.pb.h"
#include "worker/collective/communicator.h"
#include "worker/data/sample_source.h"

namespace ddp {

class Model;

// The job's loss ("cross_entropy" or "nll"): the mean over the batch, or
// the sum with `sum`. Training and evaluation use the same.
at::Tensor JobLoss(const v1::JobSpec& spec, const at::Tensor& out, const at::Tensor& y,
                   bool sum = false);

// Rank `rank`'s share of `n` test samples among `world`: [begin, end).
std::pair<int64_t, int64_t> EvaluationShare(int64_t n, int rank, int world);

// How long one evaluation may take: the job's eval_timeout_seconds, else 10
// × the share's samples at the forward speed measured in training
// (`forward_seconds_per_sample`; 0 when none was measured: then the
// collective timeout).
absl::Duration EvaluationBound(const v1::JobSpec& spec, int64_t share,
                               double forward_seconds_per_sample);

// Which completed epoch a generation that starts from `epoch`/`cursor`
// (`finished`: the job's last step is done) must evaluate before it trains
// on, when the coordinator has results only for epochs before
// `evaluated_epochs`: the epoch just completed (at its end, or a partial
// last one at max_steps) if its result is missing; none otherwise.
std::optional<uint64_t> EpochToEvaluateFirst(uint64_t epoch, uint64_t cursor, bool finished,
                                             uint64_t evaluated_epochs);

struct EvaluationTotals {
  double test_accuracy = 0;
  double test_loss = 0;
  // Mean training loss over every rank's steps of the epoch (0: none).
  double train_loss = 0;
};

struct EvaluationInput {
  const v1::JobSpec* spec = nullptr;
  Model* model = nullptr;
  at::Tensor test_x;
  at::Tensor test_y;
  // Instead of the tensors: a test folder read in chunks on `loader_threads`.
  std::shared_ptr<const SampleSource> test_source;
  int loader_threads = 1;
  // This rank's training losses of the epoch: their sum and count.
  double train_loss_sum = 0;
  uint64_t train_steps = 0;
  // Polled between chunks: leave at once (ABORTED).
  std::function<bool()> aborted;
  // This rank's share is done; the all-reduce of the sums comes next.
  std::function<void()> share_done;
};

// Every rank calls it, in the same order as its other collectives.
// ABORTED when told to leave; the communicator's error when the sums'
// all-reduce failed; INTERNAL for a LibTorch error.
absl::StatusOr<EvaluationTotals> EvaluateTogether(const EvaluationInput& in, Communicator* comm);

}  // namespace ddp

#endif  // DDP_WORKER_EVALUATION_H_
