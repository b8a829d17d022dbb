// Reading a job's data files without trusting them. A data file comes from
// whoever wrote the job spec: it may be a FIFO, a device, a folder, a gzip
// bomb, or a header that claims 10^12 elements. Everything a file declares
// is checked against a named limit before anything is allocated for it, and
// every refusal is INVALID_ARGUMENT naming the field, the file and the limit.
#ifndef DDP_WORKER_DATA_FILES_H_
#define DDP_WORKER_DATA_FILES_H_

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/input_files.h"

namespace ddp {

// Largest data file read (on disk), and largest idx payload (uncompressed).
inline constexpr uint64_t kMaxDataFileBytes = uint64_t{8} << 30;
// Most elements one data tensor may hold (x or y; 2^32 float32 is 16 GiB).
inline constexpr int64_t kMaxDataElements = int64_t{1} << 32;
// Most classes labels may name (the model's last layer grows with it).
inline constexpr int64_t kMaxClasses = 100000;

// OK when `path` is a regular file of at most kMaxDataFileBytes; else
// INVALID_ARGUMENT "<field>: <path> is a FIFO, not a regular file" and the
// like. Follows symlinks.
absl::Status CheckDataFile(const std::string& field, const std::string& path);

// Reads one idx file (gzip or plain): uint8 data with its dimensions. The
// header's dimensions are checked (with overflow checks) before the payload
// is allocated, and the payload is read to exactly that size: trailing or
// missing bytes are refused.
absl::StatusOr<at::Tensor> ReadIdxFile(const std::string& path, InputFiles* inputs = nullptr);

// Checks that a loaded (x, y) pair is usable before anything is converted:
// x [N, ...] and integer y [N], each at most kMaxDataElements, labels in
// [0, kMaxClasses).
absl::Status CheckTensorPair(const std::string& field, const std::string& path, const at::Tensor& x,
                             const at::Tensor& y);

}  // namespace ddp

#endif  // DDP_WORKER_DATA_FILES_H_
