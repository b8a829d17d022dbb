// A worker's training state as bytes: what the source rank broadcasts when a
// generation starts, and what a checkpoint file holds.
//
// Layout (integers little-endian):
//
//   offset   size  field
//   0        8     magic "DDPSTATE"
//   8        4     u32 layout version (kStateFormatVersion)
//   12       8     u64 H, the length of the header
//   20       H     v1::TrainingStateHeader, protobuf binary
//   20+H     8     u64 P, the length of the payload
//   28+H     P     payload: a torch::serialize::OutputArchive (the zip that
//                  torch::save writes) holding
//                    "param/<name>"   every Model::Parameters() tensor
//                    "buffer/<name>"  every Model::Buffers() tensor
//                    "meta/params", "meta/buffers"  the names, in order
//                    "meta/optimizer" the optimizer's kind ("SGD", "Adam")
//                    "optimizer"      Optimizer::save's nested archive
//   28+H+P   4     u32 CRC-32 (zlib) of bytes [0, 28+H+P)
//
// The header is outside the archive so that a reader (the checkpoint
// finder) can check a file and say whose state it is without LibTorch
// parsing anything. The RNG state (LibTorch's default CPU generator) travels
// in the header's rng_state.
//
// Optimizer state travels by parameter position: LibTorch's Optimizer::load
// maps the i-th parameter of each saved group onto the i-th parameter of the
// destination's group. Both sides must build the optimizer from
// Model::Parameters() in order; DecodeTrainingState checks that the names
// agree in that order.
//
// Not thread-safe with respect to `model` and `optimizer` (the trainer
// thread calls these); the functions keep no state of their own.
#ifndef DDP_WORKER_STATE_CODEC_H_
#define DDP_WORKER_STATE_CODEC_H_

#include <cstdint>
#include <string>

#include <torch/optim/optimizer.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ddp/v1/checkpoint.pb.h"
#include "worker/model.h"

namespace ddp {

inline constexpr uint32_t kStateFormatVersion = 1;

// Whose state a reader expects: another job's bytes are refused.
struct StateIdentity {
  std::string job_id;
  std::string spec_digest;
};

// OK when `header` is `expected`'s state; FAILED_PRECONDITION naming both
// job ids and spec digests otherwise.
absl::Status CheckStateIdentity(const v1::TrainingStateHeader& header,
                                const StateIdentity& expected);

// The parameters and buffers of `model`, the optimizer's state and the RNG
// state, after `header`; fills in header's format_version, rng_state and
// parameter_digest (the caller sets everything else). INTERNAL when
// LibTorch fails to serialize.
absl::StatusOr<std::string> EncodeTrainingState(v1::TrainingStateHeader header, Model& model,
                                                torch::optim::Optimizer& optimizer);

// Checks the framing without applying anything: magic, layout version,
// lengths and CRC. DATA_LOSS says what is wrong (not a training state, a
// newer version, truncated, corrupt). Does not check the identity.
absl::StatusOr<v1::TrainingStateHeader> ReadTrainingStateHeader(absl::string_view bytes);

// Checks everything first, then applies. Returns the header.
//   DATA_LOSS           bad framing (as ReadTrainingStateHeader), an archive
//                       LibTorch can't read, parameters whose digest differs
//                       from the header's.
//   FAILED_PRECONDITION another job's state (names both ids and digests); a
//                       model whose parameters or buffers differ in name,
//                       order, shape or dtype (names the first); another
//                       optimizer kind, or one over other parameters.
//   INTERNAL            LibTorch failed while applying (should not happen).
// On any error before the apply step nothing is changed: not the model, the
// optimizer nor the RNG. Tensors are copied in place under NoGradGuard, so
// the optimizer's references and gradient views (the reducer's buckets)
// stay valid.
absl::StatusOr<v1::TrainingStateHeader> DecodeTrainingState(absl::string_view bytes,
                                                            const StateIdentity& expected,
                                                            Model& model,
                                                            torch::optim::Optimizer& optimizer);

}  // namespace ddp

#endif  // DDP_WORKER_STATE_CODEC_H_
