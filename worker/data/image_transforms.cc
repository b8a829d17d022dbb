#include "worker/data/image_transforms.h"

#include <algorithm>
#include <cstddef>

namespace ddp {
namespace {

// int(round(d / 2.0)) in Python: halves go to the even neighbour.
int HalfRoundedEven(int d) {
  if (d % 2 == 0) return d / 2;
  const int down = (d - 1) / 2;
  return down % 2 == 0 ? down : down + 1;
}

}  // namespace

RgbImage CenterCrop(const RgbImage& image, int height, int width) {
  RgbImage src = image;
  if (width > src.width || height > src.height) {
    // torchvision pads with zeros first: left/top get the smaller half.
    const int left = width > src.width ? (width - src.width) / 2 : 0;
    const int top = height > src.height ? (height - src.height) / 2 : 0;
    const int right = width > src.width ? (width - src.width + 1) / 2 : 0;
    const int bottom = height > src.height ? (height - src.height + 1) / 2 : 0;
    RgbImage padded;
    padded.width = src.width + left + right;
    padded.height = src.height + top + bottom;
    padded.pixels.assign(static_cast<size_t>(padded.width) * padded.height * 3, 0);
    for (int y = 0; y < src.height; ++y) {
      std::copy_n(
          src.pixels.begin() + static_cast<ptrdiff_t>(y) * src.width * 3, src.width * 3,
          padded.pixels.begin() + (static_cast<ptrdiff_t>(y + top) * padded.width + left) * 3);
    }
    src = std::move(padded);
    if (src.width == width && src.height == height) return src;
  }
  const int top = HalfRoundedEven(src.height - height);
  const int left = HalfRoundedEven(src.width - width);
  RgbImage out;
  out.width = width;
  out.height = height;
  out.pixels.resize(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    std::copy_n(src.pixels.begin() + (static_cast<ptrdiff_t>(y + top) * src.width + left) * 3,
                width * 3, out.pixels.begin() + static_cast<ptrdiff_t>(y) * width * 3);
  }
  return out;
}

std::vector<float> ToTensorChw(const RgbImage& image,
                               const std::optional<Normalization>& normalize) {
  const size_t plane = static_cast<size_t>(image.width) * image.height;
  std::vector<float> out(plane * 3);
  for (int c = 0; c < 3; ++c) {
    float* dst = out.data() + c * plane;
    for (size_t i = 0; i < plane; ++i) {
      // ToTensor divides by 255 in float; Normalize subtracts, then divides.
      float v = static_cast<float>(image.pixels[i * 3 + c]) / 255.0f;
      if (normalize) v = (v - normalize->mean[c]) / normalize->std[c];
      dst[i] = v;
    }
  }
  return out;
}

}  // namespace ddp
