#include "worker/data/image_transforms.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace ddp {
namespace {

// int(round(d / 2.0)) in Python: halves go to the even neighbour.
int HalfRoundedEven(int d) {
  if (d % 2 == 0) return d / 2;
  const int down = (d - 1) / 2;
  return down % 2 == 0 ? down : down + 1;
}

// Pillow's Resample.c, for 8-bit images and its bilinear filter: each pass
// weights the source pixels under a triangle stretched by the downscale
// factor (the antialias), the weights normalised and turned to fixed point
// with 22 fractional bits, each sum rounded and clipped to a byte.
constexpr int kPrecisionBits = 32 - 8 - 2;

double Bilinear(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

// For each output position its first source index and count (bounds) and
// ksize fixed-point weights (precompute_coeffs, normalize_coeffs_8bpc).
struct Coefficients {
  int ksize = 0;
  std::vector<int> bounds;
  std::vector<int32_t> weights;
};

Coefficients Precompute(int in_size, int out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;
  Coefficients c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(static_cast<size_t>(out_size) * 2);
  c.weights.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> k(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      k[x] = Bilinear((x + xmin - center + 0.5) * ss);
      ww += k[x];
    }
    for (int x = 0; x < c.ksize; ++x) {
      const double w = x < xmax ? (ww != 0.0 ? k[x] / ww : k[x]) : 0.0;
      c.weights[static_cast<size_t>(xx) * c.ksize + x] =
          w < 0 ? static_cast<int32_t>(-0.5 + w * (1 << kPrecisionBits))
                : static_cast<int32_t>(0.5 + w * (1 << kPrecisionBits));
    }
    c.bounds[xx * 2] = xmin;
    c.bounds[xx * 2 + 1] = xmax;
  }
  return c;
}

uint8_t Clip8(int32_t v) {
  if (v >= (1 << kPrecisionBits << 8)) return 255;
  if (v <= 0) return 0;
  return static_cast<uint8_t>(v >> kPrecisionBits);
}

}  // namespace

RgbImage Resize(const RgbImage& image, int height, int width) {
  if (image.width == width && image.height == height) return image;
  const RgbImage* src = &image;
  RgbImage horizontal;
  if (width != image.width) {
    // Horizontal pass over every row (the box is the whole image, so every
    // source row is used); the three channels of a pixel summed together.
    const Coefficients c = Precompute(image.width, width);
    horizontal.width = width;
    horizontal.height = image.height;
    horizontal.pixels.resize(static_cast<size_t>(width) * image.height * 3);
    for (int y = 0; y < image.height; ++y) {
      const uint8_t* row = image.pixels.data() + static_cast<size_t>(y) * image.width * 3;
      uint8_t* out = horizontal.pixels.data() + static_cast<size_t>(y) * width * 3;
      for (int xx = 0; xx < width; ++xx) {
        const int xmin = c.bounds[xx * 2], xmax = c.bounds[xx * 2 + 1];
        const int32_t* k = &c.weights[static_cast<size_t>(xx) * c.ksize];
        const uint8_t* in = row + xmin * 3;
        int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
        for (int x = 0; x < xmax; ++x) {
          s0 += in[x * 3] * k[x];
          s1 += in[x * 3 + 1] * k[x];
          s2 += in[x * 3 + 2] * k[x];
        }
        out[xx * 3] = Clip8(s0);
        out[xx * 3 + 1] = Clip8(s1);
        out[xx * 3 + 2] = Clip8(s2);
      }
    }
    src = &horizontal;
  }
  if (height == image.height) return src == &image ? image : horizontal;
  // Vertical pass, a row at a time: each output row is a weighted sum of
  // whole source rows (the same sums in another order: integers, exact).
  const Coefficients c = Precompute(image.height, height);
  const size_t row_bytes = static_cast<size_t>(src->width) * 3;
  RgbImage out;
  out.width = src->width;
  out.height = height;
  out.pixels.resize(row_bytes * height);
  std::vector<int32_t> acc(row_bytes);
  for (int yy = 0; yy < height; ++yy) {
    const int ymin = c.bounds[yy * 2], ymax = c.bounds[yy * 2 + 1];
    const int32_t* k = &c.weights[static_cast<size_t>(yy) * c.ksize];
    std::fill(acc.begin(), acc.end(), 1 << (kPrecisionBits - 1));
    for (int y = 0; y < ymax; ++y) {
      const uint8_t* in = src->pixels.data() + static_cast<size_t>(y + ymin) * row_bytes;
      const int32_t w = k[y];
      for (size_t i = 0; i < row_bytes; ++i) acc[i] += in[i] * w;
    }
    uint8_t* dst = out.pixels.data() + static_cast<size_t>(yy) * row_bytes;
    for (size_t i = 0; i < row_bytes; ++i) dst[i] = Clip8(acc[i]);
  }
  return out;
}

RgbImage ResizeShorter(const RgbImage& image, int size) {
  const int w = image.width, h = image.height;
  const int shorter = std::min(w, h), longer = std::max(w, h);
  // int(size * long / short) in Python: a float product, truncated.
  const int new_long = static_cast<int>(static_cast<double>(size) * longer / shorter);
  if (shorter == size) return image;
  return w <= h ? Resize(image, new_long, size) : Resize(image, size, new_long);
}

RgbImage Crop(const RgbImage& image, int top, int left, int height, int width) {
  RgbImage out;
  out.width = width;
  out.height = height;
  out.pixels.assign(static_cast<size_t>(width) * height * 3, 0);
  // The part of each row inside the image; the rest stays zero.
  const int x0 = std::max(0, -left), x1 = std::min(width, image.width - left);
  for (int y = std::max(0, -top); y < std::min(height, image.height - top) && x0 < x1; ++y) {
    std::copy_n(
        image.pixels.begin() + (static_cast<ptrdiff_t>(top + y) * image.width + left + x0) * 3,
        (x1 - x0) * 3, out.pixels.begin() + (static_cast<ptrdiff_t>(y) * width + x0) * 3);
  }
  return out;
}

RgbImage HorizontalFlip(const RgbImage& image) {
  RgbImage out;
  out.width = image.width;
  out.height = image.height;
  out.pixels.resize(image.pixels.size());
  for (int y = 0; y < image.height; ++y) {
    for (int x = 0; x < image.width; ++x) {
      std::copy_n(
          image.pixels.begin() + (static_cast<ptrdiff_t>(y) * image.width + x) * 3, 3,
          out.pixels.begin() + (static_cast<ptrdiff_t>(y) * image.width + image.width - 1 - x) * 3);
    }
  }
  return out;
}

RgbImage CenterCrop(const RgbImage& image, int height, int width) {
  // torchvision pads a smaller image with zeros first (left and top get the
  // smaller half), then crops the centre: the same as a crop reaching
  // outside the image, where Crop gives zeros.
  const int pad_w = std::max(0, width - image.width);
  const int pad_h = std::max(0, height - image.height);
  const int left = HalfRoundedEven(image.width + pad_w - width) - pad_w / 2;
  const int top = HalfRoundedEven(image.height + pad_h - height) - pad_h / 2;
  return Crop(image, top, left, height, width);
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
