#include "worker/evaluation.h"

#include <algorithm>
#include <array>
#include <vector>

#include <torch/torch.h>

#include "common/job_kinds.h"
#include "common/job_spec.h"
#include "worker/elastic/torch_error.h"
#include "worker/model.h"
#include "worker/sample_batches.h"

namespace ddp {

at::Tensor JobLoss(const v1::JobSpec& spec, const at::Tensor& out, const at::Tensor& y, bool sum) {
  const auto reduction = sum ? at::Reduction::Sum : at::Reduction::Mean;
  switch (LossKindOf(spec)) {
    case v1::LOSS_KIND_NLL:
      return torch::nll_loss(out, y, {}, reduction);
    case v1::LOSS_KIND_CROSS_ENTROPY:
    case v1::LOSS_KIND_UNKNOWN:  // refused by the job's check
      break;
  }
  return torch::cross_entropy_loss(out, y, {}, reduction);
}

std::pair<int64_t, int64_t> EvaluationShare(int64_t n, int rank, int world) {
  return {n * rank / world, n * (rank + 1) / world};
}

absl::Duration EvaluationBound(const v1::JobSpec& spec, int64_t share,
                               double forward_seconds_per_sample) {
  if (spec.has_eval_timeout_seconds()) return absl::Seconds(spec.eval_timeout_seconds());
  if (forward_seconds_per_sample <= 0) return absl::Seconds(spec.collective_timeout_seconds());
  // Training's forward keeps autograd's records; evaluation's doesn't, so
  // this errs long, and 10x more for a busy machine.
  const double expected = static_cast<double>(share) * forward_seconds_per_sample;
  return absl::Seconds(std::min(10 * expected, 86400.0));
}

std::optional<uint64_t> EpochToEvaluateFirst(uint64_t epoch, uint64_t cursor, bool finished,
                                             uint64_t evaluated_epochs) {
  std::optional<uint64_t> completed;
  if (cursor == 0 && epoch > 0) completed = epoch - 1;  // at an epoch's end
  if (cursor > 0 && finished) completed = epoch;        // max_steps ended it part-way
  if (!completed || *completed < evaluated_epochs) return std::nullopt;
  return completed;
}

absl::StatusOr<EvaluationTotals> EvaluateTogether(const EvaluationInput& in, Communicator* comm) {
  // Correct answers, summed test loss, samples; training loss and steps.
  std::array<float, 5> sums{};
  try {
    torch::NoGradGuard no_grad;
    const int64_t n =
        in.test_source ? static_cast<int64_t>(in.test_source->size()) : in.test_x.size(0);
    const auto [begin, end] = EvaluationShare(n, comm->rank(), comm->world_size());
    in.model->SetTraining(false);
    const int64_t chunk = EvaluationBatchSize(*in.spec);
    // On the model's device; the test set stays in host memory.
    const c10::Device device = DeviceOf(*in.model);
    int64_t correct = 0;
    double loss = 0;
    for (int64_t at = begin; at < end; at += chunk) {
      if (in.aborted && in.aborted()) {
        in.model->SetTraining(true);
        return absl::AbortedError("aborted");
      }
      const int64_t len = std::min(chunk, end - at);
      at::Tensor x, y;
      if (in.test_source) {
        std::vector<int64_t> indices(len);
        for (int64_t i = 0; i < len; ++i) indices[i] = at + i;
        absl::StatusOr<Batch> read =
            ReadSampleBatch(*in.test_source, indices, /*epoch=*/0, in.loader_threads);
        if (!read.ok()) {
          in.model->SetTraining(true);
          return read.status();
        }
        x = read->x.to(device);
        y = read->y.to(device);
      } else {
        x = in.test_x.narrow(0, at, len).to(device);
        y = in.test_y.narrow(0, at, len).to(device);
      }
      at::Tensor out = in.model->Forward(x);
      correct += out.argmax(1).eq(y).sum().item<int64_t>();
      loss += JobLoss(*in.spec, out, y, /*sum=*/true).item<double>();
    }
    in.model->SetTraining(true);
    sums = {static_cast<float>(correct), static_cast<float>(loss), static_cast<float>(end - begin),
            static_cast<float>(in.train_loss_sum), static_cast<float>(in.train_steps)};
  } catch (const std::exception& e) {
    return TorchErrorStatus(absl::StatusCode::kInternal, "evaluation failed", e);
  }
  if (in.share_done) in.share_done();
  if (absl::Status s = comm->AllReduceSum(sums.data(), sums.size()); !s.ok()) return s;
  EvaluationTotals totals;
  // Counts below 2^24 are exact in float.
  if (sums[2] > 0) {
    totals.test_accuracy = static_cast<double>(sums[0]) / sums[2];
    totals.test_loss = static_cast<double>(sums[1]) / sums[2];
  }
  if (sums[4] > 0) totals.train_loss = static_cast<double>(sums[3]) / sums[4];
  return totals;
}

}  // namespace ddp
