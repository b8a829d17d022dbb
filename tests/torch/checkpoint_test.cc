// Checkpoint files: the background writer (atomic writes, pruning, failures
// reported, never blocking) and finding the newest usable one.
#include "worker/checkpoint.h"

#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/torch/state_util.h"

namespace ddp {
namespace {

// Larger than any state these tests write.
constexpr uint64_t kMaxBytes = uint64_t{1} << 30;

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// Folders MakeTempDir made, removed when the tests end.
std::vector<std::string>& MadeDirs() {
  static auto* dirs = new std::vector<std::string>();
  return *dirs;
}
class RemoveMadeDirs : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    for (const std::string& dir : MadeDirs()) fs::remove_all(dir, ec);
  }
};
[[maybe_unused]] ::testing::Environment* const kRemoveMadeDirs =
    ::testing::AddGlobalTestEnvironment(new RemoveMadeDirs);

// A fresh folder per test.
std::string MakeTempDir() {
  std::string dir = ::testing::TempDir() + "/ddp-ckpt-XXXXXX";
  EXPECT_NE(mkdtemp(dir.data()), nullptr) << std::strerror(errno);
  MadeDirs().push_back(dir);
  return dir;
}

std::vector<std::string> ListNames(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename());
  }
  std::sort(names.begin(), names.end());
  return names;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A small encoded state of `job_id` at `step`.
std::string State(uint64_t step, const std::string& job_id = "job-a") {
  auto model = BuildModel("mlp", step);
  auto optimizer = BuildOptimizer("sgd", *model);
  absl::StatusOr<std::string> bytes =
      EncodeTrainingState(TestHeader(job_id, step), *model, *optimizer);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : "";
}

// Collects on_done's results; waits for them without sleeping.
class Results {
 public:
  std::function<void(const v1::CheckpointResult&)> Callback() {
    return [this](const v1::CheckpointResult& r) {
      absl::MutexLock lock(&mu_);
      results_.push_back(r);
    };
  }
  std::vector<v1::CheckpointResult> WaitFor(size_t n) {
    absl::MutexLock lock(&mu_);
    auto done = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return results_.size() >= n; };
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(60)));
    return results_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::CheckpointResult> results_ ABSL_GUARDED_BY(mu_);
};

TEST(CheckpointWriter, Submit_FiveSteps_KeepsNewestThreeNoTempFiles) {
  const std::string dir = MakeTempDir() + "/nested/ckpt";  // created with parents
  const mode_t mask = umask(0);  // the most permissive: modes are set, not masked
  Results results;
  auto writer = CheckpointWriter::Create({dir, 3, results.Callback()});
  ASSERT_THAT(writer, IsOk());
  // Earlier crashed writes' temporary files go; files that aren't ours stay.
  fs::create_directories(dir);
  WriteFile(dir + "/.ckpt-00000000000000000001.ddpstate.tmp.a1B2c3", "partial");
  WriteFile(dir + "/notes.txt", "mine");
  WriteFile(dir + "/ckpt-7.ddpstate", "not our pattern");
  for (uint64_t step = 1; step <= 5; ++step) {
    ASSERT_TRUE((*writer)->Submit(/*generation=*/2, step * 10, /*epoch=*/0, State(step * 10)));
    results.WaitFor(step);
  }
  std::vector<v1::CheckpointResult> r = results.WaitFor(5);
  EXPECT_THAT(
      ListNames(dir),
      ElementsAre("ckpt-00000000000000000030.ddpstate", "ckpt-00000000000000000040.ddpstate",
                  "ckpt-00000000000000000050.ddpstate", "ckpt-7.ddpstate", "notes.txt"));
  EXPECT_EQ(r.back().error(), "");
  EXPECT_EQ(r.back().path(), dir + "/ckpt-00000000000000000050.ddpstate");
  EXPECT_EQ(r.back().step(), 50u);
  EXPECT_EQ(r.back().generation(), 2u);
  EXPECT_EQ(r.back().bytes(), fs::file_size(r.back().path()));
  EXPECT_GE(r.back().seconds(), 0.0);
  // 0640 and 0750 whatever the umask: the job's group may read, others not.
  EXPECT_EQ(fs::status(r.back().path()).permissions(), static_cast<fs::perms>(0640));
  EXPECT_EQ(fs::status(dir).permissions(), static_cast<fs::perms>(0750));
  EXPECT_EQ((*writer)->refused(), 0u);
  umask(mask);
}

// A writer whose step-1 write is done and whose on_done then holds the
// writer thread until `release`: a step submitted next waits, so one after
// it finds the writer busy.
struct HeldWriter {
  absl::Notification entered, release;
  absl::StatusOr<std::unique_ptr<CheckpointWriter>> writer;

  explicit HeldWriter(const std::string& dir)
      : writer(CheckpointWriter::Create({dir, 3, [this](const v1::CheckpointResult& r) {
                                           if (r.step() != 1) return;
                                           entered.Notify();
                                           release.WaitForNotification();
                                         }})) {}
  // Steps 1 (held in its on_done) and 2 (waiting behind it) submitted.
  void HoldWithOneWaiting() {
    ASSERT_THAT(writer, IsOk());
    ASSERT_TRUE((*writer)->Submit(1, 1, 0, State(1)));
    entered.WaitForNotification();
    ASSERT_TRUE((*writer)->Submit(1, 2, 0, State(2)));
  }
};

TEST(CheckpointWriter, Submit_WhileBusy_ReturnsFalseAndCounts) {
  const std::string dir = MakeTempDir();
  HeldWriter held(dir);
  ASSERT_NO_FATAL_FAILURE(held.HoldWithOneWaiting());
  auto& writer = held.writer;
  auto& release = held.release;
  EXPECT_FALSE((*writer)->Submit(1, 3, 0, State(3)));
  EXPECT_EQ((*writer)->refused(), 1u);
  release.Notify();
  writer->reset();  // finishes step 2, then stops
  EXPECT_THAT(ListNames(dir), ElementsAre("ckpt-00000000000000000001.ddpstate",
                                          "ckpt-00000000000000000002.ddpstate"));
}

// A preempted job's checkpoint must be written: it waits for the write in
// progress instead of being refused.
TEST(CheckpointWriter, SubmitWhenIdle_WhileBusy_WaitsThenWrites) {
  const std::string dir = MakeTempDir();
  HeldWriter held(dir);
  ASSERT_NO_FATAL_FAILURE(held.HoldWithOneWaiting());  // busy until 2 is written
  auto& writer = held.writer;
  auto& release = held.release;
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(50));
    release.Notify();
  });
  EXPECT_TRUE((*writer)->SubmitWhenIdle(1, 3, 0, State(3)));
  releaser.join();
  EXPECT_EQ((*writer)->refused(), 0u);
  writer->reset();
  EXPECT_THAT(ListNames(dir), ElementsAre("ckpt-00000000000000000001.ddpstate",
                                          "ckpt-00000000000000000002.ddpstate",
                                          "ckpt-00000000000000000003.ddpstate"));
}

TEST(CheckpointWriter, Destructor_FinishesTheWriteInProgress) {
  const std::string dir = MakeTempDir();
  auto writer = CheckpointWriter::Create({dir, 3, nullptr});
  ASSERT_THAT(writer, IsOk());
  ASSERT_TRUE((*writer)->Submit(1, 9, 0, State(9)));
  writer->reset();
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(dir, TestIdentity(), kMaxBytes);
  ASSERT_THAT(loaded, IsOk());
  EXPECT_EQ(loaded->header.step(), 9u);
}

TEST(CheckpointWriter, Create_UnderARegularFile_FailedPreconditionNamingTheFolder) {
  const std::string file = MakeTempDir() + "/file";
  WriteFile(file, "x");
  EXPECT_THAT(CheckpointWriter::Create({file + "/sub", 3, nullptr}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(file + "/sub"), HasSubstr("Not a directory"))));
  EXPECT_THAT(CheckpointWriter::Create({file, 3, nullptr}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(file)));
  EXPECT_THAT(CheckpointWriter::Create({MakeTempDir(), 0, nullptr}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("keep")));
}

// Reports every failed write through on_done; leaves no partial file.
void ExpectFailedWriteLeavesNothing(const std::string& dir, CheckpointWriter& writer,
                                    Results& results, absl::string_view why) {
  ASSERT_TRUE(writer.Submit(1, 5, 0, State(5)));
  std::vector<v1::CheckpointResult> r = results.WaitFor(1);
  EXPECT_THAT(r[0].error(), AllOf(HasSubstr(dir + "/ckpt-00000000000000000005.ddpstate"),
                                  HasSubstr(std::string(why))));
  EXPECT_THAT(ListNames(dir), IsEmpty());
}

TEST(CheckpointWriter, Submit_DiskFull_ErrorThroughOnDoneNoPartialFile) {
  const std::string dir = MakeTempDir();
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=256k") != 0) {
    GTEST_SKIP() << "can't mount a 256 KiB tmpfs on " << dir
                 << " to fill: " << std::strerror(errno);
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { umount2(dir.c_str(), MNT_DETACH); }
  } unmount{dir};
  Results results;
  auto writer = CheckpointWriter::Create({dir, 3, results.Callback()});
  ASSERT_THAT(writer, IsOk());
  ASSERT_GT(State(5).size(), 256u * 1024);  // the mlp's state is about 1 MB
  ExpectFailedWriteLeavesNothing(dir, **writer, results, "No space left on device");
}

TEST(CheckpointWriter, Submit_FileSizeLimit_ErrorThroughOnDoneNoPartialFile) {
  // Runs without mount privileges: RLIMIT_FSIZE makes the write fail too.
  const std::string dir = MakeTempDir();
  Results results;
  auto writer = CheckpointWriter::Create({dir, 3, results.Callback()});
  ASSERT_THAT(writer, IsOk());
  const std::string state = State(5);
  rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  sighandler_t old_handler = signal(SIGXFSZ, SIG_IGN);
  rlimit limited = old;
  limited.rlim_cur = 64 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  ASSERT_TRUE((*writer)->Submit(1, 5, 0, state));
  std::vector<v1::CheckpointResult> r = results.WaitFor(1);
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);
  EXPECT_THAT(r[0].error(), AllOf(HasSubstr(dir + "/ckpt-00000000000000000005.ddpstate"),
                                  HasSubstr("File too large")));
  EXPECT_THAT(ListNames(dir), IsEmpty());
}

class LoadNewestCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    WriteFile(Path(10), State(10));
    WriteFile(Path(20), State(20));
  }
  std::string Path(uint64_t step) { return dir_ + "/" + CheckpointFileName(step); }
  void ExpectFallsBackTo20(absl::string_view why) {
    absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(dir_, TestIdentity(), kMaxBytes);
    ASSERT_THAT(loaded, IsOk());
    EXPECT_EQ(loaded->path, Path(20));
    EXPECT_EQ(loaded->header.step(), 20u);
    EXPECT_EQ(loaded->bytes.size(), fs::file_size(Path(20)));
    ASSERT_THAT(loaded->skipped, SizeIs(1));
    EXPECT_THAT(loaded->skipped[0], AllOf(HasSubstr(Path(30) + ": "), HasSubstr(std::string(why))));
  }
  std::string dir_;
};

TEST_F(LoadNewestCheckpointTest, LoadNewestCheckpoint_AllGood_UsesNewest) {
  WriteFile(dir_ + "/ckpt-99.ddpstate", "not our pattern: never read");
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(dir_, TestIdentity(), kMaxBytes);
  ASSERT_THAT(loaded, IsOk());
  EXPECT_EQ(loaded->path, Path(20));
  EXPECT_THAT(loaded->skipped, IsEmpty());
}

TEST_F(LoadNewestCheckpointTest, LoadNewestCheckpoint_NewestTruncated_UsesPrevious) {
  const std::string state = State(30);
  WriteFile(Path(30), state.substr(0, state.size() / 2));
  ExpectFallsBackTo20("truncated");
}

TEST_F(LoadNewestCheckpointTest, LoadNewestCheckpoint_NewestCorrupt_UsesPrevious) {
  std::string state = State(30);
  state[state.size() / 2] ^= 0x01;
  WriteFile(Path(30), state);
  ExpectFallsBackTo20("CRC-32");
}

TEST_F(LoadNewestCheckpointTest, LoadNewestCheckpoint_NewestAnotherJobs_UsesPrevious) {
  WriteFile(Path(30), State(30, "job-b"));
  ExpectFallsBackTo20("\"job-b\"");
}

TEST_F(LoadNewestCheckpointTest, LoadNewestCheckpoint_NewestUnreadable_UsesPrevious) {
  fs::create_directory(Path(30));  // a folder with a checkpoint's name
  ExpectFallsBackTo20("not a regular file");
}

// Checkpoint files are untrusted input: none of these is read.
TEST_F(LoadNewestCheckpointTest, LoadNewestCheckpoint_NewestALinkToDevZero_UsesPrevious) {
  fs::create_symlink("/dev/zero", Path(30));
  ExpectFallsBackTo20("symbolic link");
}

TEST_F(LoadNewestCheckpointTest, LoadNewestCheckpoint_NewestAFifo_UsesPreviousWithoutBlocking) {
  ASSERT_EQ(mkfifo(Path(30).c_str(), 0600), 0);
  ExpectFallsBackTo20("not a regular file");
}

TEST_F(LoadNewestCheckpointTest, LoadNewestCheckpoint_NewestTooLarge_UsesPreviousUnread) {
  WriteFile(Path(30), State(30));
  const uint64_t bound = fs::file_size(Path(20)) + 1;
  WriteFile(Path(30), State(30) + std::string(bound, 'x'));
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(dir_, TestIdentity(), bound);
  ASSERT_THAT(loaded, IsOk());
  EXPECT_EQ(loaded->path, Path(20));
  ASSERT_THAT(loaded->skipped, SizeIs(1));
  EXPECT_THAT(loaded->skipped[0], HasSubstr("more than this job's state can be"));
}

TEST_F(LoadNewestCheckpointTest, LoadNewestCheckpoint_NoneUsable_NotFoundListingWhy) {
  WriteFile(Path(10), "garbage");
  WriteFile(Path(20), State(20, "job-b"));
  EXPECT_THAT(LoadNewestCheckpoint(dir_, TestIdentity(), kMaxBytes),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr(Path(10)), HasSubstr("not a training state"),
                             HasSubstr(Path(20)), HasSubstr("\"job-b\""))));
}

TEST(LoadNewestCheckpoint, LoadNewestCheckpoint_EmptyOrMissingFolder_NotFound) {
  const std::string dir = MakeTempDir();
  EXPECT_THAT(LoadNewestCheckpoint(dir, TestIdentity(), kMaxBytes),
              StatusIs(absl::StatusCode::kNotFound, AllOf(HasSubstr(dir), HasSubstr("holds no"))));
  EXPECT_THAT(LoadNewestCheckpoint(dir + "/missing", TestIdentity(), kMaxBytes),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr(dir + "/missing"), HasSubstr("No such file"))));
}

}  // namespace
}  // namespace ddp
