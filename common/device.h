// Device strings: "cpu", "cpu:N" and "cuda:N".
#ifndef DDP_COMMON_DEVICE_H_
#define DDP_COMMON_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ddp {

struct Device {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;

  bool is_cuda() const { return kind == Kind::kCuda; }
  // Canonical form: "cpu:N" or "cuda:N".
  std::string ToString() const;
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
};

// Parses a device string. "cpu" means "cpu:0"; "cuda" without an index is
// refused because a worker owns exactly one GPU. INVALID_ARGUMENT names the
// accepted forms.
absl::StatusOr<Device> ParseDevice(absl::string_view text);

}  // namespace ddp

#endif  // DDP_COMMON_DEVICE_H_
