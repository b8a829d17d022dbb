// The daemon's model and optimizer as the state codec's parts: what the
// trainer, its checkpoints and their tests encode and decode (the library
// builds its parts from a program's module instead).
#ifndef DDP_WORKER_MODEL_STATE_H_
#define DDP_WORKER_MODEL_STATE_H_

#include <string>
#include <utility>

#include <torch/optim/optimizer.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ddp/v1/checkpoint.pb.h"
#include "worker/elastic/state_codec.h"
#include "worker/model.h"

namespace ddp {

inline StateParts PartsOf(Model& model, torch::optim::Optimizer& optimizer) {
  return StateParts{model.Parameters(), model.Buffers(), &optimizer, true};
}

inline absl::StatusOr<std::string> EncodeTrainingState(v1::TrainingStateHeader header, Model& model,
                                                       torch::optim::Optimizer& optimizer) {
  return EncodeTrainingState(std::move(header), PartsOf(model, optimizer));
}

inline absl::StatusOr<v1::TrainingStateHeader> DecodeTrainingState(
    absl::string_view bytes, const StateIdentity& expected, Model& model,
    torch::optim::Optimizer& optimizer) {
  return DecodeTrainingState(bytes, expected, PartsOf(model, optimizer));
}

}  // namespace ddp

#endif  // DDP_WORKER_MODEL_STATE_H_
