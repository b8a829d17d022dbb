// A training state as bytes: what the source rank broadcasts when a
// generation starts (the daemon's and the library's alike), and what a
// checkpoint file holds.
//
// Layout (integers little-endian):
//
//   offset   size  field
//   0        8     magic "DDPSTATE"
//   8        4     u32 layout version (kStateFormatVersion)
//   12       8     u64 H, the length of the header
//   20       H     v1::TrainingStateHeader, protobuf binary
//   20+H     8     u64 P, the length of the payload
//   28+H     P     payload, below
//   28+H+P   4     u32 CRC-32 (zlib) of bytes [0, 28+H+P)
//
// The payload is our own format, read by this file alone: no archive, no
// pickle, nothing LibTorch interprets, so no TorchScript code (a class's
// __setstate__, which torch::jit::load runs) can travel in it. Version 1
// payloads were torch::serialize archives and are refused. (A
// torch::pickle_save dict was the alternative: its unpickler has no class
// resolver, but it still builds tensors from the sizes, strides and storages
// the stream names; raw records keep every check in this file.)
//
//   payload  := tensors(parameters) tensors(buffers) optimizer
//   tensors  := u64 N, then N records, in Model::Parameters() / Buffers()
//               order
//   record   := u32 L, L bytes of name, u8 dtype code (DtypeCode in the
//               .cc), u8 D, D x i64 sizes, then the tensor's elements,
//               contiguous, in the host's (little-endian) byte order:
//               exactly numel x element size bytes, no length of its own
//   optimizer:= u32 L, L bytes of kind ("SGD", "Adam", "AdamW", or "none"
//               with K = 0), u64 K, then per parameter, in param_groups()
//               order, u8 0 (no state yet) or 1 and its state:
//                 SGD          record "momentum_buffer"
//                 Adam, AdamW  i64 step, u8 amsgrad, records "exp_avg",
//                              "exp_avg_sq", and "max_exp_avg_sq" when
//                              amsgrad
//
// The header is outside the payload so that a reader (the checkpoint
// finder) can check a file and say whose state it is without LibTorch
// parsing anything. The RNG state (LibTorch's default CPU generator) travels
// in the header's rng_state when StateParts::rng says so (the daemon's; a
// library program's RNG is its own), and a library program's own state
// (ElasticState::save) in its program_state, bytes this file never reads.
//
// Every length and count in the payload is untrusted: each record's name,
// dtype and sizes are compared with this rank's own tensor before its data
// is read, so the data's length, and every allocation, follows from this
// rank's model, never from the bytes. An element count the bytes cannot
// hold is "truncated", never a short or stride-0 tensor.
//
// Optimizer state travels by parameter position (LibTorch keys it by the
// address of each parameter's TensorImpl, which means nothing on another
// rank): the i-th parameter of the destination optimizer's param_groups()
// takes the i-th entry, and must have the shape and dtype of the model's
// i-th parameter. Both sides must build the optimizer from the model's
// parameters in order; DecodeTrainingState checks that the shapes agree in
// that order. Only SGD, Adam and AdamW state is understood; the
// param_groups' options (lr, betas, ...) do not travel: the job's spec sets
// them, and the trainer sets the learning rate after a decode.
//
// Not thread-safe with respect to the tensors and the optimizer (the
// training thread calls these); the functions keep no state of their own.
#ifndef DDP_WORKER_ELASTIC_STATE_CODEC_H_
#define DDP_WORKER_ELASTIC_STATE_CODEC_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ddp/v1/checkpoint.pb.h"
#include "worker/collective/named_tensor.h"

namespace ddp {

inline constexpr uint32_t kStateFormatVersion = 2;
// The most bytes of a program's own state (the header's program_state).
inline constexpr uint64_t kMaxProgramStateBytes = uint64_t{64} << 20;

// Where a job stands after a step every rank committed: the daemon's
// trainer and the library's session keep this one record, and a state
// carries it in its header.
struct TrainingProgress {
  // Optimizer steps committed.
  uint64_t step = 0;
  // The epoch the next step belongs to, and the samples of its permutation
  // already trained.
  uint64_t epoch = 0;
  uint64_t cursor = 0;
};

inline TrainingProgress ProgressOf(const v1::TrainingStateHeader& header) {
  return TrainingProgress{header.step(), header.epoch(), header.cursor()};
}

// What a state is made of, and where a decoded one goes: the model's
// parameters and buffers (in a fixed order, the same on every rank), the
// optimizer over those parameters in order (null: none), and whether
// LibTorch's default CPU generator travels too.
struct StateParts {
  std::vector<NamedTensor> parameters;
  std::vector<NamedTensor> buffers;
  torch::optim::Optimizer* optimizer = nullptr;
  bool rng = true;
};

// The most bytes an encoded state of these parts can take: the parameters,
// an optimizer's state of up to three times them, the buffers, names,
// framing and a program state. A peer's or a checkpoint's length over it is
// refused before anything is allocated.
uint64_t MaxEncodedStateBytes(const StateParts& parts);

// Whose state a reader expects: another job's bytes are refused.
struct StateIdentity {
  std::string job_id;
  std::string spec_digest;
};

// The header of `identity`'s state at `progress`, taken now by generation
// `generation` of `world_size` ranks.
v1::TrainingStateHeader StateHeader(const StateIdentity& identity, const TrainingProgress& progress,
                                    uint64_t generation, uint32_t world_size);

// OK when `header` is `expected`'s state; FAILED_PRECONDITION naming both
// job ids and spec digests otherwise.
absl::Status CheckStateIdentity(const v1::TrainingStateHeader& header,
                                const StateIdentity& expected);

// `parts` after `header`; fills in header's format_version, rng_state and
// parameter_digest (the caller sets everything else, program_state
// included). FAILED_PRECONDITION for an optimizer other than SGD, Adam or
// AdamW; INVALID_ARGUMENT for a program_state over kMaxProgramStateBytes;
// INTERNAL when a tensor can't be encoded (a dtype the layout has no code
// for, LibTorch failing).
absl::StatusOr<std::string> EncodeTrainingState(v1::TrainingStateHeader header,
                                                const StateParts& parts);

// Checks the framing without applying anything: magic, layout version,
// lengths and CRC. DATA_LOSS says what is wrong (not a training state, a
// newer version, truncated, corrupt). Does not check the identity.
absl::StatusOr<v1::TrainingStateHeader> ReadTrainingStateHeader(absl::string_view bytes);

// Checks everything first, then applies. Returns the header.
//   DATA_LOSS           bad framing (as ReadTrainingStateHeader), a payload
//                       that is not in the layout above (truncated, bytes
//                       left over, an unknown dtype code, a bool that is not
//                       0 or 1, a negative Adam step), parameters whose
//                       digest differs from the header's, a program_state
//                       over kMaxProgramStateBytes.
//   FAILED_PRECONDITION another job's state (names both ids and digests); a
//                       model whose parameters or buffers differ in name,
//                       order, shape or dtype (names the first); another
//                       optimizer kind (or neither SGD nor Adam), one over
//                       other parameters, optimizer state of another shape,
//                       amsgrad on one side only.
//   INTERNAL            LibTorch failed while applying (should not happen).
// On any error before the apply step nothing is changed: not the tensors,
// the optimizer nor the RNG (left alone too when parts.rng is false). Tensors are copied in place
// under NoGradGuard, so the optimizer's references and gradient views (the reducer's buckets) stay
// valid; the optimizer's state map is replaced whole.
absl::StatusOr<v1::TrainingStateHeader> DecodeTrainingState(absl::string_view bytes,
                                                            const StateIdentity& expected,
                                                            const StateParts& parts);

}  // namespace ddp

#endif  // DDP_WORKER_ELASTIC_STATE_CODEC_H_
