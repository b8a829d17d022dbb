// A job's inputs are pinned at submission: what the check read is what a
// worker reads, or the worker refuses the file, naming it (issue 20, item
// 2). The check's recording side and a worker's verifying side, on real
// files: rewritten, replaced by a symbolic link, re-pointed, grown.
#include "worker/input_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using testing::AllOf;
using testing::HasSubstr;
namespace fs = std::filesystem;

void ExpectReads(const absl::StatusOr<std::string>& read, const std::string& bytes) {
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(*read, bytes);
}

class InputFilesTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) /
           ("input-files-" + std::to_string(::getpid()) + "-" +
            testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Write("model.pt", "the checked model");
    Write("other.pt", "another model");
    fs::create_symlink(dir_ / "model.pt", dir_ / "link.pt");
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ / name, std::ios::binary | std::ios::trunc) << bytes;
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // What a worker holds: the pins of a check that read `name`.
  InputFiles Pinned(const std::string& name) {
    InputFiles check;
    EXPECT_THAT(check.Read("model.path", Path(name)), IsOk());
    v1::JobSpec spec;
    for (const v1::InputFile& pin : check.Recorded()) *spec.add_input_files() = pin;
    return InputFiles(spec.input_files());
  }

  fs::path dir_;
};

TEST_F(InputFilesTest, Check_RecordsRealPathSizeAndSha256) {
  InputFiles check;
  absl::StatusOr<std::string> bytes = check.Read("model.path", Path("link.pt"));
  ASSERT_THAT(bytes, IsOk());
  EXPECT_EQ(*bytes, "the checked model");
  ASSERT_EQ(check.Recorded().size(), 1u);
  const v1::InputFile pin = check.Recorded()[0];
  EXPECT_EQ(pin.path(), Path("link.pt"));
  EXPECT_EQ(pin.real_path(), fs::canonical(Path("model.pt")).string());
  EXPECT_EQ(pin.size(), 17u);
  // sha256("the checked model"), as `sha256sum` says.
  EXPECT_EQ(pin.sha256(), Sha256Hex("the checked model"));
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST_F(InputFilesTest, FolderListing_PinnedByCountAndDigest) {
  InputFiles check;
  ASSERT_THAT(check.PinListing("dataset.path", dir_.string(), 3, std::string(64, 'a')), IsOk());
  v1::JobSpec spec;
  for (const v1::InputFile& pin : check.Recorded()) *spec.add_input_files() = pin;
  ASSERT_EQ(spec.input_files_size(), 1);
  EXPECT_EQ(spec.input_files(0).real_path(), fs::canonical(dir_).string());
  EXPECT_EQ(spec.input_files(0).size(), 3u);
  InputFiles worker(spec.input_files());
  EXPECT_THAT(worker.PinListing("dataset.path", dir_.string(), 3, std::string(64, 'a')), IsOk());
  EXPECT_THAT(
      worker.PinListing("dataset.path", dir_.string(), 3, std::string(64, 'b')),
      StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr(dir_.string()),
                                                         HasSubstr("changed since the job was "
                                                                   "checked: 3 images now, 3 then"),
                                                         HasSubstr("ddp-pack manifest"))));
  // A folder its check did not pin (an older coordinator's job): read as it is.
  EXPECT_THAT(worker.PinListing("dataset.test_path", "/elsewhere", 3, std::string(64, 'a')),
              IsOk());
}

TEST_F(InputFilesTest, Worker_SameFile_ReadsIt) {
  InputFiles worker = Pinned("link.pt");
  ExpectReads(worker.Read("model.path", Path("link.pt")), "the checked model");
}

TEST_F(InputFilesTest, Worker_FileRewrittenSameSize_RefusedNamingIt) {
  InputFiles worker = Pinned("model.pt");
  Write("model.pt", "THE CHECKED MODEL");
  EXPECT_THAT(worker.Read("model.path", Path("model.pt")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.path"), HasSubstr(Path("model.pt")),
                             HasSubstr("rewritten since"))));
}

TEST_F(InputFilesTest, Worker_FileGrown_RefusedBeforeReading) {
  InputFiles worker = Pinned("model.pt");
  Write("model.pt", "the checked model, and more");
  EXPECT_THAT(worker.Read("model.path", Path("model.pt")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not the 17")));
}

TEST_F(InputFilesTest, Worker_LinkRepointedAfterTheCheck_ReadsWhatWasChecked) {
  InputFiles worker = Pinned("link.pt");
  fs::remove(dir_ / "link.pt");
  fs::create_symlink(dir_ / "other.pt", dir_ / "link.pt");
  // The pinned real path, not where the link leads now.
  ExpectReads(worker.Read("model.path", Path("link.pt")), "the checked model");
}

TEST_F(InputFilesTest, Worker_FileReplacedByALink_Refused) {
  InputFiles worker = Pinned("model.pt");
  fs::remove(dir_ / "model.pt");
  fs::create_symlink(dir_ / "other.pt", dir_ / "model.pt");
  EXPECT_THAT(worker.Read("model.path", Path("model.pt")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("now a symbolic link")));
}

TEST_F(InputFilesTest, Worker_FileReplacedByAFifo_RefusedWithoutBlocking) {
  InputFiles worker = Pinned("model.pt");
  fs::remove(dir_ / "model.pt");
  ASSERT_EQ(::mkfifo(Path("model.pt").c_str(), 0600), 0);
  EXPECT_THAT(worker.Read("model.path", Path("model.pt")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a FIFO")));
}

TEST_F(InputFilesTest, Worker_AFileTheCheckDidNotRead_Refused) {
  InputFiles worker = Pinned("model.pt");
  EXPECT_THAT(worker.Read("dataset.path", Path("other.pt")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not among the files")));
}

TEST_F(InputFilesTest, Check_DeviceOrTooLarge_Refused) {
  InputFiles check;
  EXPECT_THAT(check.Read("dataset.path", "/dev/zero"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a device")));
  EXPECT_THAT(check.Read("model.path", Path("model.pt"), 10),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the limit is 10")));
}

}  // namespace
}  // namespace ddp
