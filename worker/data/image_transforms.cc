#include "worker/data/image_transforms.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

// The rows of a box within an image, `stride` bytes apart; `end` is where
// the image's buffer ends (the SIMD pass reads a few bytes past a pixel).
struct View {
  const uint8_t* data;
  size_t stride;
  int width;
  int height;
  const uint8_t* end;
};

View WholeImage(const RgbImage& image) {
  return {image.pixels.data(), static_cast<size_t>(image.width) * 3, image.width, image.height,
          image.pixels.data() + image.pixels.size()};
}

// Where a resize's rows go, one at a time, top to bottom: into an image,
// or straight on into a tensor.
class RowSink {
 public:
  virtual ~RowSink() = default;
  // Room for row y: width x 3 bytes.
  virtual uint8_t* Row(int y) = 0;
  // Row y is written.
  virtual void Done(int y) = 0;
};

class ImageRows : public RowSink {
 public:
  ImageRows(int height, int width) {
    image_.height = height;
    image_.width = width;
    image_.pixels.resize(static_cast<size_t>(height) * width * 3);
  }
  uint8_t* Row(int y) override { return image_.pixels.data() + y * image_.width * size_t{3}; }
  void Done(int) override {}
  RgbImage Take() { return std::move(image_); }

 private:
  RgbImage image_;
};

// One output pixel of the horizontal pass, its three channels summed
// together.
void HorizontalPixel(const uint8_t* in, const int32_t* k, int taps, uint8_t* out) {
  int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
  for (int x = 0; x < taps; ++x) {
    s0 += in[x * 3] * k[x];
    s1 += in[x * 3 + 1] * k[x];
    s2 += in[x * 3 + 2] * k[x];
  }
  out[0] = Clip8(s0);
  out[1] = Clip8(s1);
  out[2] = Clip8(s2);
}

// Bytes [from, to) of one output row of the vertical pass, each a weighted
// sum of the same byte of `taps` source rows.
void VerticalBytes(const uint8_t* const* rows, const int32_t* k, int taps, size_t from, size_t to,
                   uint8_t* out) {
  for (size_t i = from; i < to; ++i) {
    int32_t s = 1 << (kPrecisionBits - 1);
    for (int y = 0; y < taps; ++y) s += rows[y][i] * k[y];
    out[i] = Clip8(s);
  }
}

#if defined(__SSE2__)
// SSE2 has no 32-bit multiply, only pmaddwd (two 16 x 16-bit products
// added into 32 bits). A weight in [0, 2^22] is split as high * 2^14 +
// low, each half fitting a signed 16-bit lane; pixel * low and
// pixel * high are summed apart and put together as sum_low +
// (sum_high << 14): Pillow's 32-bit sum, to the bit.
constexpr int kLowBits = 14;
// More taps could overflow the sum of the low halves (255 * 2^14 each).
constexpr int kMaxSimdTaps = 512;

int32_t LowHalves(int32_t w0, int32_t w1) {
  return (w0 & ((1 << kLowBits) - 1)) | (w1 & ((1 << kLowBits) - 1)) << 16;
}

int32_t HighHalves(int32_t w0, int32_t w1) {
  return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(w0 >> kLowBits)) |
                              static_cast<uint32_t>(static_cast<uint16_t>(w1 >> kLowBits)) << 16);
}

// The pmaddwd operands of one output's `pairs` tap pairs, from its `n`
// weights `k` (any past them weigh 0): per pair, four copies of its
// (low, low) halves, then four of (high, high).
void PairLanes(const int32_t* k, int n, int pairs, int32_t* lanes) {
  for (int p = 0; p < pairs; ++p, lanes += 8) {
    const int32_t w0 = 2 * p < n ? k[2 * p] : 0, w1 = 2 * p + 1 < n ? k[2 * p + 1] : 0;
    std::fill(lanes, lanes + 4, LowHalves(w0, w1));
    std::fill(lanes + 4, lanes + 8, HighHalves(w0, w1));
  }
}

__m128i Load(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// Sums shifted down and clipped to bytes as Clip8 does (the saturating
// packs clip below 0 and above 255), sixteen of them in order.
__m128i ClipToBytes(__m128i a, __m128i b, __m128i c, __m128i d) {
  return _mm_packus_epi16(
      _mm_packs_epi32(_mm_srai_epi32(a, kPrecisionBits), _mm_srai_epi32(b, kPrecisionBits)),
      _mm_packs_epi32(_mm_srai_epi32(c, kPrecisionBits), _mm_srai_epi32(d, kPrecisionBits)));
}

// low += px * (its weights' low halves); high += px * (their high halves).
inline void MultiplyAdd(__m128i px, __m128i weights_low, __m128i weights_high, __m128i& low,
                        __m128i& high) {
  low = _mm_add_epi32(low, _mm_madd_epi16(px, weights_low));
  high = _mm_add_epi32(high, _mm_madd_epi16(px, weights_high));
}

// HorizontalPixel on pmaddwd, two taps at a time, `pairs` of them (the
// pass's widest pixel's; taps past a pixel's own weigh 0), their weights
// as PairLanes lays them out. Reads 8 bytes per pair, 2 past the pair's
// pixels. Returns the pixel's three bytes and a fourth that means nothing.
inline uint32_t HorizontalPixelSse2(const uint8_t* in, const int32_t* lanes, int pairs) {
  const __m128i zero = _mm_setzero_si128();
  __m128i low = _mm_set1_epi32(1 << (kPrecisionBits - 1)), high = zero;
  for (int p = 0; p < pairs; ++p, in += 6, lanes += 8) {
    // [r0 g0 b0 r1 g1 b1 . .] to [r0 r1 g0 g1 b0 b1 . .]: each channel's
    // two taps side by side, as pmaddwd adds them.
    const __m128i px =
        _mm_unpacklo_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in)), zero);
    MultiplyAdd(_mm_unpacklo_epi16(px, _mm_srli_si128(px, 6)), Load(lanes), Load(lanes + 4), low,
                high);
  }
  const __m128i sum = _mm_add_epi32(low, _mm_slli_epi32(high, kLowBits));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(ClipToBytes(sum, sum, sum, sum)));
}

// VerticalBytes sixteen bytes at a time, `pairs` pairs of source rows
// (kPairs when known: then the weights load once per row): two rows per
// pmaddwd, their bytes interleaved; the eight sums stay in registers
// across the taps. `lanes` from PairLanes.
template <int kPairs>
void VerticalRowSse2(const uint8_t* const* rows, const int32_t* lanes, int pairs, size_t bytes,
                     uint8_t* out) {
  if (kPairs > 0) pairs = kPairs;
  const __m128i zero = _mm_setzero_si128();
  for (size_t i = 0; i < bytes; i += 16) {
    __m128i low0 = _mm_set1_epi32(1 << (kPrecisionBits - 1)), low1 = low0, low2 = low0, low3 = low0;
    __m128i high0 = zero, high1 = zero, high2 = zero, high3 = zero;
    for (int p = 0; p < pairs; ++p) {
      const __m128i wl = Load(lanes + p * 8), wh = Load(lanes + p * 8 + 4);
      const __m128i a = Load(rows[2 * p] + i), b = Load(rows[2 * p + 1] + i);
      const __m128i ab_lo = _mm_unpacklo_epi8(a, b), ab_hi = _mm_unpackhi_epi8(a, b);
      MultiplyAdd(_mm_unpacklo_epi8(ab_lo, zero), wl, wh, low0, high0);
      MultiplyAdd(_mm_unpackhi_epi8(ab_lo, zero), wl, wh, low1, high1);
      MultiplyAdd(_mm_unpacklo_epi8(ab_hi, zero), wl, wh, low2, high2);
      MultiplyAdd(_mm_unpackhi_epi8(ab_hi, zero), wl, wh, low3, high3);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     ClipToBytes(_mm_add_epi32(low0, _mm_slli_epi32(high0, kLowBits)),
                                 _mm_add_epi32(low1, _mm_slli_epi32(high1, kLowBits)),
                                 _mm_add_epi32(low2, _mm_slli_epi32(high2, kLowBits)),
                                 _mm_add_epi32(low3, _mm_slli_epi32(high3, kLowBits))));
  }
}

// One output row of the vertical pass: `rows` has an even count of
// pointers (an odd last tap is paired with itself at weight 0).
void VerticalRow(const uint8_t* const* rows, const int32_t* k, int taps, size_t row_bytes,
                 uint8_t* out) {
  const int pairs = (taps + 1) / 2;
  if (taps > kMaxSimdTaps) return VerticalBytes(rows, k, taps, 0, row_bytes, out);
  int32_t lanes[(kMaxSimdTaps / 2) * 8];
  PairLanes(k, taps, pairs, lanes);
  const size_t simd_bytes = row_bytes / 16 * 16;
  if (pairs == 1) {
    VerticalRowSse2<1>(rows, lanes, pairs, simd_bytes, out);
  } else {
    VerticalRowSse2<0>(rows, lanes, pairs, simd_bytes, out);
  }
  VerticalBytes(rows, k, taps, simd_bytes, row_bytes, out);
}
#else
void VerticalRow(const uint8_t* const* rows, const int32_t* k, int taps, size_t row_bytes,
                 uint8_t* out) {
  VerticalBytes(rows, k, taps, 0, row_bytes, out);
}
#endif  // __SSE2__

// The horizontal pass from one box to `width` pixels a row, a row at a
// time.
class HorizontalPass {
 public:
  HorizontalPass(const View& src, int width)
      : src_(src), width_(width), c_(Precompute(src.width, width)) {
#if defined(__SSE2__)
    int max_taps = 0;
    for (int xx = 0; xx < width; ++xx) max_taps = std::max(max_taps, c_.bounds[xx * 2 + 1]);
    if (max_taps > kMaxSimdTaps) return;
    pairs_ = (max_taps + 1) / 2;
    lanes_.resize(static_cast<size_t>(width) * pairs_ * 8);
    for (int xx = 0; xx < width; ++xx) {
      PairLanes(&c_.weights[static_cast<size_t>(xx) * c_.ksize], c_.bounds[xx * 2 + 1], pairs_,
                &lanes_[static_cast<size_t>(xx) * pairs_ * 8]);
    }
#endif
  }

  void Row(int y, uint8_t* out) const {
    const uint8_t* row = src_.data + y * src_.stride;
    int xx = 0;
#if defined(__SSE2__)
    // The common kernels with their pair count known, so their loop unrolls.
    switch (pairs_) {
      case 0:
        break;
      case 1:
        xx = RowSse2<1>(row, out);
        break;
      case 2:
        xx = RowSse2<2>(row, out);
        break;
      default:
        xx = RowSse2<0>(row, out);
        break;
    }
#endif
    for (; xx < width_; ++xx) {
      HorizontalPixel(row + c_.bounds[xx * 2] * 3, &c_.weights[static_cast<size_t>(xx) * c_.ksize],
                      c_.bounds[xx * 2 + 1], out + xx * 3);
    }
  }

 private:
#if defined(__SSE2__)
  // Outputs [0, n) of a row on SSE2 (kPairs 0: pairs_ of them); returns n.
  template <int kPairs>
  int RowSse2(const uint8_t* row, uint8_t* out) const {
    const int pairs = kPairs > 0 ? kPairs : pairs_;
    // Each pixel stores 4 bytes, so the row's last is left to the scalar
    // loop, as is any whose read would pass the end of the buffer.
    int n = width_ - 1;
    while (n > 0 && row + c_.bounds[(n - 1) * 2] * 3 + pairs * 6 + 2 > src_.end) --n;
    const int32_t* lanes = lanes_.data();
    for (int xx = 0; xx < n; ++xx, lanes += pairs * 8) {
      const uint32_t rgb = HorizontalPixelSse2(row + c_.bounds[xx * 2] * 3, lanes, pairs);
      // The fourth byte lands on the next pixel, written after this one.
      std::memcpy(out + xx * 3, &rgb, 4);
    }
    return n;
  }
#endif

  View src_;
  int width_;
  Coefficients c_;
  // SSE2's weights (HorizontalPixelSse2), pairs_ per output; none when a
  // pixel has too many taps for it.
  int pairs_ = 0;
  std::vector<int32_t> lanes_;
};

// Pillow's resize of `src` to height x width, its rows handed to `sink` top
// to bottom: the horizontal pass, its rows rounded to bytes, then the
// vertical one, either left out when that side keeps its size. A
// horizontal row is made when the vertical pass first needs it and kept
// only while it does (a ring of ksize rows), so the image between the two
// passes is never whole.
void ResizeRows(const View& src, int height, int width, RowSink& sink) {
  const size_t row_bytes = static_cast<size_t>(width) * 3;
  if (height == src.height) {
    if (width == src.width) {
      for (int y = 0; y < height; ++y) {
        std::memcpy(sink.Row(y), src.data + y * src.stride, row_bytes);
        sink.Done(y);
      }
      return;
    }
    const HorizontalPass horizontal(src, width);
    for (int y = 0; y < height; ++y) {
      horizontal.Row(y, sink.Row(y));
      sink.Done(y);
    }
    return;
  }
  const Coefficients c = Precompute(src.height, height);
  // One more than ksize: an odd tap count's last row is repeated (at weight
  // 0) to make a pair.
  std::vector<const uint8_t*> rows(c.ksize + 1);
  std::optional<HorizontalPass> horizontal;
  std::vector<uint8_t> ring;
  if (width != src.width) {
    horizontal.emplace(src, width);
    ring.resize(row_bytes * c.ksize);
  }
  int made = 0;  // horizontal rows made so far
  for (int yy = 0; yy < height; ++yy) {
    const int ymin = c.bounds[yy * 2], taps = c.bounds[yy * 2 + 1];
    for (int t = 0; t < taps; ++t) {
      const int y = ymin + t;
      if (!horizontal) {
        rows[t] = src.data + y * src.stride;
        continue;
      }
      uint8_t* slot = ring.data() + (y % c.ksize) * row_bytes;
      // ymin never decreases: row y - ksize, which this slot held, is done.
      for (; made <= y; ++made) horizontal->Row(made, ring.data() + (made % c.ksize) * row_bytes);
      rows[t] = slot;
    }
    rows[taps] = rows[std::max(taps - 1, 0)];
    VerticalRow(rows.data(), &c.weights[static_cast<size_t>(yy) * c.ksize], taps, row_bytes,
                sink.Row(yy));
    sink.Done(yy);
  }
}

// ToTensor's and Normalize's float for each byte value of each channel,
// made by the same float operations as torchvision's: a lookup per pixel
// gives the float the arithmetic would.
using ChannelTables = std::array<std::array<float, 256>, 3>;

ChannelTables TensorTables(const std::optional<Normalization>& normalize) {
  ChannelTables tables;
  for (int c = 0; c < 3; ++c) {
    for (int b = 0; b < 256; ++b) {
      // ToTensor divides by 255 in float; Normalize subtracts, then divides.
      float v = static_cast<float>(b) / 255.0f;
      if (normalize) v = (v - normalize->mean[c]) / normalize->std[c];
      tables[c][b] = v;
    }
  }
  return tables;
}

// Rows of bytes to rows of the three float planes of a tensor.
class TensorRows : public RowSink {
 public:
  TensorRows(int height, int width, const std::optional<Normalization>& normalize, bool flipped,
             float* out)
      : tables_(TensorTables(normalize)),
        width_(width),
        plane_(static_cast<size_t>(width) * height),
        flipped_(flipped),
        out_(out),
        row_(static_cast<size_t>(width) * 3) {}

  uint8_t* Row(int) override { return row_.data(); }
  void Done(int y) override { Write(row_.data(), y); }

  // Row y of the image from `in`, mirrored when flipped.
  void Write(const uint8_t* in, int y) const {
    float* r = out_ + static_cast<size_t>(y) * width_;
    float* g = r + plane_;
    float* b = g + plane_;
    const int step = flipped_ ? -3 : 3;
    const uint8_t* px = flipped_ ? in + (width_ - 1) * 3 : in;
    for (int x = 0; x < width_; ++x, px += step) {
      r[x] = tables_[0][px[0]];
      g[x] = tables_[1][px[1]];
      b[x] = tables_[2][px[2]];
    }
  }

 private:
  const ChannelTables tables_;
  const int width_;
  const size_t plane_;
  const bool flipped_;
  float* const out_;
  std::vector<uint8_t> row_;
};

// The box of a crop within the image (the caller checks it is).
View Box(const RgbImage& image, int top, int left, int height, int width) {
  const View whole = WholeImage(image);
  return {whole.data + top * whole.stride + left * 3, whole.stride, width, height, whole.end};
}

bool Inside(const RgbImage& image, int top, int left, int height, int width) {
  return top >= 0 && left >= 0 && top + height <= image.height && left + width <= image.width;
}

}  // namespace

RgbImage Resize(const RgbImage& image, int height, int width) {
  if (image.width == width && image.height == height) return image;
  ImageRows out(height, width);
  ResizeRows(WholeImage(image), height, width, out);
  return out.Take();
}

RgbImage ResizedCrop(const RgbImage& image, int top, int left, int crop_height, int crop_width,
                     int height, int width) {
  if (!Inside(image, top, left, crop_height, crop_width)) {
    return Resize(Crop(image, top, left, crop_height, crop_width), height, width);
  }
  // The crop's coefficients clip at its own edges, so resizing it in place
  // is resizing its copy.
  ImageRows out(height, width);
  ResizeRows(Box(image, top, left, crop_height, crop_width), height, width, out);
  return out.Take();
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

void ToTensorChwInto(const RgbImage& image, const std::optional<Normalization>& normalize,
                     bool flipped, float* out) {
  const TensorRows rows(image.height, image.width, normalize, flipped, out);
  for (int y = 0; y < image.height; ++y) {
    rows.Write(image.pixels.data() + static_cast<size_t>(y) * image.width * 3, y);
  }
}

void ResizedCropToTensor(const RgbImage& image, int top, int left, int crop_height, int crop_width,
                         int height, int width, const std::optional<Normalization>& normalize,
                         bool flipped, float* out) {
  TensorRows rows(height, width, normalize, flipped, out);
  if (!Inside(image, top, left, crop_height, crop_width)) {
    const RgbImage resized = ResizedCrop(image, top, left, crop_height, crop_width, height, width);
    for (int y = 0; y < height; ++y) rows.Write(resized.pixels.data() + y * width * size_t{3}, y);
    return;
  }
  ResizeRows(Box(image, top, left, crop_height, crop_width), height, width, rows);
}

std::vector<float> ToTensorChw(const RgbImage& image,
                               const std::optional<Normalization>& normalize) {
  std::vector<float> out(static_cast<size_t>(image.width) * image.height * 3);
  ToTensorChwInto(image, normalize, /*flipped=*/false, out.data());
  return out;
}

}  // namespace ddp
