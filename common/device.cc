#include "common/device.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace ddp {

std::string Device::ToString() const {
  return absl::StrCat(kind == Kind::kCuda ? "cuda:" : "cpu:", index);
}

absl::StatusOr<Device> ParseDevice(absl::string_view text) {
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown device \"", text,
                     "\": expected \"cpu\", \"cpu:N\" or \"cuda:N\" with N a device index "
                     "from 0 to 1023"));
  };
  Device device;
  absl::string_view rest = text;
  if (absl::ConsumePrefix(&rest, "cuda:")) {
    device.kind = Device::Kind::kCuda;
  } else if (rest == "cpu") {
    return device;
  } else if (!absl::ConsumePrefix(&rest, "cpu:")) {
    return bad();
  }
  int index = -1;
  if (rest.empty() || !absl::SimpleAtoi(rest, &index) || index < 0 || index > 1023 ||
      absl::StrCat(index) != rest) {
    return bad();
  }
  device.index = index;
  return device;
}

}  // namespace ddp
