// Data files as an attacker or a careless user would write them: each is
// refused with INVALID_ARGUMENT naming the file and the limit, before
// anything is allocated for what it claims, and without blocking.
#include "worker/data_files.h"

#include <sys/stat.h>
#include <torch/serialize.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "worker/dataset.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kFashion[] = "/usr/share/datasets/fashion-mnist";

class DataFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ddp-data-files-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // An idx file with the given header dimensions and `payload` bytes, gzipped.
  std::string WriteIdx(const std::string& name, const std::vector<uint32_t>& dims,
                       size_t payload) const {
    std::string bytes = {0, 0, 0x08, static_cast<char>(dims.size())};
    for (uint32_t d : dims) {
      for (int shift : {24, 16, 8, 0}) bytes.push_back(static_cast<char>(d >> shift));
    }
    bytes.append(payload, '\x07');
    const std::string path = Path(name);
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
    return path;
  }

  // An (x, y) pair saved as torch.save would.
  std::string WritePair(const std::string& name, const at::Tensor& x, const at::Tensor& y) const {
    const std::vector<char> bytes = torch::pickle_save(c10::ivalue::Tuple::create({x, y}));
    const std::string path = Path(name);
    std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
    return path;
  }

  absl::StatusOr<Dataset> LoadTensors(const std::string& path) const {
    v1::DatasetSpec spec;
    spec.set_kind("tensors");
    spec.set_path(path);
    return LoadDataset(spec, 0);
  }

  std::filesystem::path dir_;
};

TEST_F(DataFilesTest, ReadIdxFile_FashionMnist_ShapesOfTheRealData) {
  auto images = ReadIdxFile(std::string(kFashion) + "/t10k-images-idx3-ubyte.gz");
  ASSERT_THAT(images, IsOk());
  EXPECT_EQ(images->sizes().vec(), (std::vector<int64_t>{10000, 28, 28}));
  auto labels = ReadIdxFile(std::string(kFashion) + "/t10k-labels-idx1-ubyte.gz");
  ASSERT_THAT(labels, IsOk());
  EXPECT_EQ(labels->max().item<int>(), 9);
}

TEST_F(DataFilesTest, ReadIdxFile_NotIdx_InvalidArgumentNamingTheFile) {
  const std::string path = Path("not-idx.gz");
  std::ofstream(path) << "hello";
  EXPECT_THAT(ReadIdxFile(path), StatusIs(absl::StatusCode::kInvalidArgument,
                                          AllOf(HasSubstr("not-idx.gz"), HasSubstr("idx"))));
}

TEST_F(DataFilesTest, ReadIdxFile_DimensionsWhoseProductOverflows_RefusedNamingTheLimit) {
  const std::string path = WriteIdx("overflow.gz", {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 16}, 4);
  EXPECT_THAT(ReadIdxFile(path), StatusIs(absl::StatusCode::kInvalidArgument,
                                          AllOf(HasSubstr("declares shape [4294967295, 4294967295"),
                                                HasSubstr("limit of 8589934592 bytes"))));
}

TEST_F(DataFilesTest, ReadIdxFile_PayloadShortOrLong_RefusedWithTheCounts) {
  EXPECT_THAT(ReadIdxFile(WriteIdx("short.gz", {10, 4}, 39)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("holds 39 bytes of data, not 40 for shape [10, 4]")));
  // A small header over a long (gzip-bomb-like) payload: read to the
  // declared size plus one byte, not to the end.
  EXPECT_THAT(
      ReadIdxFile(WriteIdx("long.gz", {10, 4}, 50 << 20)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds more bytes of data, not 40")));
  auto exact = ReadIdxFile(WriteIdx("exact.gz", {10, 4}, 40));
  ASSERT_THAT(exact, IsOk());
  EXPECT_EQ(exact->sizes().vec(), (std::vector<int64_t>{10, 4}));
}

TEST_F(DataFilesTest, CheckDataFile_FolderFifoDevice_RefusedWithoutOpening) {
  const std::string fifo = Path("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // A FIFO with no writer would block an open() forever: it is never opened.
  EXPECT_THAT(ReadIdxFile(fifo), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("is a FIFO, not a regular file")));
  EXPECT_THAT(LoadTensors(fifo), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("is a FIFO, not a regular file")));
  EXPECT_THAT(LoadTensors("/dev/zero"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/dev/zero is a device")));
  EXPECT_THAT(LoadTensors(dir_.string()), StatusIs(absl::StatusCode::kInvalidArgument,
                                                   HasSubstr("is a folder, not a regular file")));
  EXPECT_THAT(LoadTensors(Path("missing.pt")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("can't read")));
}

TEST_F(DataFilesTest, Tensors_ViewClaiming10To12Elements_RefusedBeforeConversion) {
  // One stored element, expanded: converting it would need 4 TB.
  const at::Tensor x = torch::ones({1, 1}).expand({1000000000000, 1});
  const at::Tensor y = torch::zeros({1}, torch::kInt64).expand({1000000000000});
  EXPECT_THAT(
      LoadTensors(WritePair("huge.pt", x, y)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("1000000000000 elements in x"), HasSubstr("limit is 4294967296"))));
  // Within the element limit, still far larger than what was saved.
  const at::Tensor wide = torch::ones({1, 1}).expand({1000000, 1000});
  EXPECT_THAT(LoadTensors(WritePair("wide.pt", wide, torch::zeros({1000000}, torch::kInt64))),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("x is a view larger than the data saved for it")));
}

TEST_F(DataFilesTest, Tensors_LabelsOutOfRange_RefusedNamingTheRange) {
  const at::Tensor x = torch::zeros({3, 2});
  EXPECT_THAT(
      LoadTensors(
          WritePair("big-label.pt", x, torch::tensor({int64_t{0}, int64_t{1}, int64_t{1} << 40}))),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("labels from 0 to 1099511627776"), HasSubstr("from 0 to 99999"))));
  EXPECT_THAT(LoadTensors(WritePair("negative.pt", x, torch::tensor({0, -1, 2}))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("labels from -1 to 2")));
  EXPECT_THAT(LoadTensors(WritePair("float-labels.pt", x, torch::zeros({3}))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("integer labels")));
}

TEST_F(DataFilesTest, Tensors_GoodPair_LoadsAsFloatAndInt64) {
  const at::Tensor x = torch::arange(12, torch::kUInt8).reshape({3, 4});
  auto d = LoadTensors(WritePair("good.pt", x, torch::tensor({0, 4, 2}, torch::kInt32)));
  ASSERT_THAT(d, IsOk());
  EXPECT_EQ(d->train_x.scalar_type(), torch::kFloat32);
  EXPECT_EQ(d->train_y.scalar_type(), torch::kInt64);
  EXPECT_EQ(d->num_classes, 5);
  EXPECT_TRUE(torch::equal(d->train_x, x.to(torch::kFloat32)));
}

}  // namespace
}  // namespace ddp
