// Decompression bombs: a small file that claims a huge image is refused
// from its header, naming the file, and the decoded bytes in flight stay
// within the process's budget however many loader threads decode at once.
#include "worker/data/image_decode.h"

#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

void Chunk(std::string* png, const char* type, const std::string& data) {
  auto be32 = [png](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) png->push_back(static_cast<char>((v >> s) & 0xff));
  };
  be32(static_cast<uint32_t>(data.size()));
  const std::string body = std::string(type, 4) + data;
  png->append(body);
  be32(static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size()))));
}

// A grey 8-bit PNG of `width` x `height` zeros: a few KB per 10 M pixels.
std::string BlackPng(uint32_t width, uint32_t height, bool with_pixels = true) {
  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  for (uint32_t v : {width, height}) {
    for (int s = 24; s >= 0; s -= 8) ihdr.push_back(static_cast<char>((v >> s) & 0xff));
  }
  ihdr += std::string("\x08\x00\x00\x00\x00", 5);  // depth 8, grey, no interlace
  Chunk(&png, "IHDR", ihdr);
  if (with_pixels) {
    const std::string raw(static_cast<size_t>(width + 1) * height, '\0');  // filter 0, zeros
    uLongf size = compressBound(raw.size());
    std::string z(size, '\0');
    compress2(reinterpret_cast<Bytef*>(z.data()), &size, reinterpret_cast<const Bytef*>(raw.data()),
              raw.size(), 9);
    z.resize(size);
    Chunk(&png, "IDAT", z);
  }
  Chunk(&png, "IEND", "");
  return png;
}

// A "VmRSS:"-like line of /proc/self/status, in bytes.
uint64_t StatusBytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(key.size())) * 1024;
  }
  return 0;
}

TEST(ImageDecode, ClaimsOverTwicePilsBound_RefusedFromTheHeaderNamingTheFile) {
  const uint64_t peak = ImageDecodeBudget().peak();
  // 20,000 x 10,000: 200 M pixels, over 2 x 89,478,485; the file is a few
  // dozen bytes (no pixel data at all: nothing is read past the header).
  EXPECT_THAT(
      DecodeImage(BlackPng(20000, 10000, /*with_pixels=*/false), "bomb.png"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("bomb.png"), HasSubstr("20000x10000"), HasSubstr("178956970"))));
  // The largest a header can claim: no overflow on the way to the answer
  // (the fuzzer found one).
  EXPECT_THAT(DecodeImage(BlackPng(0xffffffff, 0xffffffff, /*with_pixels=*/false), "huge.png"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("huge.png")));
  EXPECT_EQ(ImageDecodeBudget().peak(), peak);  // nothing held for it
}

// What a job's check reads of an image sample: the header. An image that
// claims 48 M pixels (under the bound, so the loader would decode it)
// passes without a byte of it decoded; one over the bound, or not an
// image, is refused naming the file, as DecodeImage would.
TEST(ImageDecode, TheChecksHeaderOnlyRead_DecodesNothingAndRefusesWhatDecodeWould) {
  const uint64_t peak = ImageDecodeBudget().peak();
  const std::string dir = testing::TempDir() + "/header-check-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/large.png", std::ios::binary) << BlackPng(8000, 6000);
  std::ofstream(dir + "/bomb.png", std::ios::binary)
      << BlackPng(20000, 10000, /*with_pixels=*/false);
  std::ofstream(dir + "/text.png") << "not an image";
  EXPECT_TRUE(CheckImageFile(dir + "/large.png").ok());
  EXPECT_THAT(CheckImageFile(dir + "/bomb.png"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("bomb.png"), HasSubstr("20000x10000"))));
  EXPECT_THAT(CheckImageFile(dir + "/text.png"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("text.png")));
  EXPECT_EQ(ImageDecodeBudget().peak(), peak) << "nothing decoded";
  std::filesystem::remove_all(dir);
}

TEST(ImageDecode, ManyThreadsDecodingLargeImages_HeldBytesWithinTheBudget) {
  // In a child: its peak memory is its own.
  const std::string dir = testing::TempDir() + "/decode-budget-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/large.png";
  {
    // 8,000 x 6,000: 48 M pixels, 144 MB as RGB; 64 at once would be 9 GB.
    std::ofstream(path, std::ios::binary) << BlackPng(8000, 6000);
  }
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The peak from here on (it starts with what it inherited).
    std::ofstream("/proc/self/clear_refs") << "5";
    const uint64_t start = StatusBytes("VmRSS:");
    std::atomic<int> failed{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 64; ++t) {
      threads.emplace_back([&] {
        absl::StatusOr<RgbImage> image = ReadImage(path);
        if (!image.ok() || image->width != 8000 || image->pixels[12345] != 0) ++failed;
      });
    }
    for (std::thread& t : threads) t.join();
    // The budget, and the threads' stacks and files beside it.
    const uint64_t grew = StatusBytes("VmHWM:") - start;
    const bool bounded = ImageDecodeBudget().peak() <= kDecodeBudgetBytes &&
                         grew < kDecodeBudgetBytes + (uint64_t{300} << 20);
    ::_exit(failed.load() != 0 ? 2 : bounded ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: an image did not decode; 3: memory went past the budget";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddp
