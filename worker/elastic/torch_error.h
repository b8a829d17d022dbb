// LibTorch's exceptions, turned into a Status a person can act on: one
// helper, used wherever the worker (or the validation helper) catches one.
//
// A TorchScript interpreter error reads
//   The following operation failed in the TorchScript interpreter.
//   Traceback of TorchScript (most recent call last):
//     File "model.py", line 12, in forward
//     ...
//   RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x784 and 3072x10)
// and its cause is the last line; any other error reads
//   PytorchStreamReader failed reading zip archive: failed finding central directory
//   Exception raised from ... (most recent call first):
//   frame #0: ...
// and its cause is the first.
#ifndef DDP_WORKER_ELASTIC_TORCH_ERROR_H_
#define DDP_WORKER_ELASTIC_TORCH_ERROR_H_

#include <exception>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ddp {

// The line of `e`'s message that says what went wrong, bounded (300 bytes)
// and with control characters escaped. "builtins.ValueError: x" (a `raise`
// in TorchScript) reads "ValueError: x".
std::string TorchErrorCause(const std::exception& e);

// "<context>: <cause>" with `code`, except RESOURCE_EXHAUSTED when memory
// ran out (std::bad_alloc, c10::OutOfMemoryError, LibTorch's CPU allocator
// failing, also inside a TorchScript forward).
absl::Status TorchErrorStatus(absl::StatusCode code, absl::string_view context,
                              const std::exception& e);

}  // namespace ddp

#endif  // DDP_WORKER_ELASTIC_TORCH_ERROR_H_
