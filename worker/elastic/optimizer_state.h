// The optimizer's part of a training state (worker/elastic/state_codec.h has the
// layout): SGD's momentum, Adam's and AdamW's moments, or none, captured as
// records and read back against this rank's own optimizer. Internal to the
// codec.
//
// Optimizer state travels by parameter position (LibTorch keys it by the
// address of each parameter's TensorImpl, which means nothing on another
// rank): the i-th parameter of the optimizer's param_groups() takes the i-th
// entry, and must have the shape and dtype of the model's i-th parameter.
#ifndef DDP_WORKER_ELASTIC_OPTIMIZER_STATE_H_
#define DDP_WORKER_ELASTIC_OPTIMIZER_STATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

#include "absl/status/statusor.h"
#include "worker/elastic/state_records.h"

namespace ddp::state_records {

// What a state names an optimizer: "SGD", "Adam", "AdamW", or "none" for a
// null one; another kind's own name otherwise.
std::string KindName(const torch::optim::Optimizer* optimizer);
// FAILED_PRECONDITION naming the kind unless a state can carry it.
absl::Status CheckOptimizerCarried(const torch::optim::Optimizer* optimizer);

// One parameter's state, its records made.
struct OptimizerEntry {
  bool present = false;  // false: no state yet (no step taken)
  int64_t step = 0;      // Adam's and AdamW's
  bool amsgrad = false;
  std::vector<Record> records;
};
struct CapturedOptimizer {
  std::string kind;
  std::vector<OptimizerEntry> entries;  // in param_groups() order
};
absl::StatusOr<CapturedOptimizer> CaptureOptimizer(const torch::optim::Optimizer* optimizer);
// The bytes PutOptimizer writes.
size_t OptimizerSize(const CapturedOptimizer& captured);
void PutOptimizer(std::string* out, const CapturedOptimizer& captured);

using ParamStates = std::vector<std::unique_ptr<torch::optim::OptimizerParamState>>;
using StateMap =
    std::remove_reference_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;

// Reads the optimizer's part, checked against `params` (the model's, in
// order) and `optimizer` (may be null) before any data; one entry per
// parameter (null: no state yet). Nothing is applied.
absl::Status ReadOptimizer(Reader& r, const std::vector<std::pair<std::string, at::Tensor>>& params,
                           const torch::optim::Optimizer* optimizer, ParamStates* staged);
// `staged` keyed by `optimizer`'s own parameters: its new state map.
StateMap KeyedStates(const torch::optim::Optimizer& optimizer, ParamStates staged);

}  // namespace ddp::state_records

#endif  // DDP_WORKER_ELASTIC_OPTIMIZER_STATE_H_
