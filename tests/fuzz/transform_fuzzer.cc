// libFuzzer: the image transforms (Pillow's resize as SSE2 integer sums, the
// crop resized straight into the tensor) on any image and output size the
// input bytes choose, up to 300 pixels a side (a 300-to-1 resize takes
// over 512 taps: the scalar path too): under AddressSanitizer a pass that
// reads or writes a byte outside its rows fails here. Each output has the
// size asked, and the fused path equals the steps run one by one.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "worker/data/image_transforms.h"

namespace {

int Side(const uint8_t* b) { return 1 + (b[0] | (b[1] << 8)) % 300; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 14) return 0;
  ddp::RgbImage image;
  image.width = Side(data);
  image.height = Side(data + 2);
  const int out_w = Side(data + 4), out_h = Side(data + 6);
  // A crop inside the image.
  const int crop_w = 1 + data[8] % image.width, crop_h = 1 + data[9] % image.height;
  const int left = data[10] % (image.width - crop_w + 1);
  const int top = data[11] % (image.height - crop_h + 1);
  const bool flipped = data[12] & 1;
  image.pixels.resize(static_cast<size_t>(image.width) * image.height * 3);
  for (size_t i = 0; i < image.pixels.size(); ++i) image.pixels[i] = data[13 + i % (size - 13)];

  const ddp::RgbImage resized = ddp::Resize(image, out_h, out_w);
  if (resized.width != out_w || resized.height != out_h ||
      resized.pixels.size() != static_cast<size_t>(out_w) * out_h * 3) {
    __builtin_trap();
  }
  // Exactly the floats asked for: a write past them is ASan's to find.
  std::vector<float> fused(static_cast<size_t>(out_w) * out_h * 3);
  ddp::ResizedCropToTensor(image, top, left, crop_h, crop_w, out_h, out_w, std::nullopt, flipped,
                           fused.data());
  std::vector<float> stepwise(fused.size());
  ddp::ToTensorChwInto(ddp::ResizedCrop(image, top, left, crop_h, crop_w, out_h, out_w),
                       std::nullopt, flipped, stepwise.data());
  if (std::memcmp(fused.data(), stepwise.data(), fused.size() * sizeof(float)) != 0) {
    __builtin_trap();
  }
  return 0;
}
