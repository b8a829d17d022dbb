// libFuzzer: image files as a dataset may hold them, anything at all. The
// decoders must never crash, hang or read out of bounds; an image they
// accept has width x height x 3 bytes, and crops and converts.
#include <cstddef>
#include <cstdint>
#include <string>

#include "worker/data/image_decode.h"
#include "worker/data/image_transforms.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ddp::RgbImage> image = ddp::DecodeImage(input, "fuzz");
  if (!image.ok()) return 0;
  if (image->width <= 0 || image->height <= 0 ||
      image->pixels.size() != static_cast<size_t>(image->width) * image->height * 3) {
    __builtin_trap();
  }
  const ddp::RgbImage cropped = ddp::CenterCrop(*image, 5, 7);
  if (ddp::ToTensorChw(cropped).size() != 5 * 7 * 3) __builtin_trap();
  return 0;
}
