// The network a worker trains: a built-in one (mlp, cnn) or a TorchScript
// module from a file, behind one small interface.
#ifndef DDP_WORKER_MODEL_H_
#define DDP_WORKER_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "ddp/v1/job.pb.h"
#include "worker/collective/named_tensor.h"
#include "worker/input_files.h"

namespace ddp {

// Not thread-safe: owned and used by one trainer thread.
class Model {
 public:
  virtual ~Model() = default;
  // Logits [B, classes] (or log-probabilities, for the "nll" loss).
  virtual at::Tensor Forward(const at::Tensor& x) = 0;
  // Parameters that require gradients, in registration order, with their
  // qualified names ("fc1.weight").
  virtual std::vector<NamedTensor> Parameters() = 0;
  // Buffers (running statistics and the like), in registration order.
  virtual std::vector<NamedTensor> Buffers() = 0;
  virtual void SetTraining(bool training) = 0;
  // Moves parameters and buffers to `device`, in place (the same tensors:
  // an optimizer or a reducer made afterwards sees them there).
  virtual void To(const at::Device& device) = 0;
  // Writes the model: TorchScript as TorchScript, built-in models as a
  // state dict torch.load reads.
  virtual absl::Status Save(const std::string& path) = 0;
};

// Builds the model `spec` names for samples of `sample_shape` and
// `num_classes` classes; built-in models are initialized from `seed`.
// INVALID_ARGUMENT names the field: a missing or corrupt TorchScript file,
// a shape the model can't take. A TorchScript file is read through `inputs`
// (the job's pins; null: unpinned).
absl::StatusOr<std::unique_ptr<Model>> MakeModel(const v1::ModelSpec& spec,
                                                 const std::vector<int64_t>& sample_shape,
                                                 int64_t num_classes, uint64_t seed,
                                                 InputFiles* inputs = nullptr);

// Where `model`'s parameters live (CPU for a model without any).
at::Device DeviceOf(Model& model);

// Writes `model` as the job's output (output_path): to a temporary file
// beside `path`, then renamed into place, so no one sees half a file and a
// symlink at `path` is replaced, not followed. Without `overwrite`, a file
// that is already at `path` (one made during training: the coordinator
// refuses one that was there at submission) is left alone:
// FAILED_PRECONDITION.
absl::Status SaveOutput(Model& model, const std::string& path, bool overwrite);

// Runs forward on a batch of `batch` zero samples and checks the output is
// floating [batch, C] logits with C >= num_classes. INVALID_ARGUMENT says
// what did not fit, never echoing a size the model computed (a model could
// encode a file's bytes in its output's shape).
absl::Status CheckModelFits(Model& model, const v1::ModelSpec& spec,
                            const std::vector<int64_t>& sample_shape, int64_t num_classes,
                            int64_t batch = 2);

}  // namespace ddp

#endif  // DDP_WORKER_MODEL_H_
