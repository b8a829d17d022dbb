// Metrics and index logs hold whole lines whatever happens to the writer.
#include "common/line_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string TempPath(const char* name) {
  return testing::TempDir() + "/" + name + "-" + std::to_string(::getpid());
}

TEST(LineFile, Append_EachLineWholeAndEnded) {
  const std::string path = TempPath("lines");
  ::unlink(path.c_str());
  {
    auto file = LineFile::Open(path);
    ASSERT_THAT(file, IsOk());
    file->Append(R"({"step": 1})");
    file->Append(R"({"step": 2})");
    // Visible at once, before the file is closed: nothing waits in a buffer.
    EXPECT_EQ(Read(path), "{\"step\": 1}\n{\"step\": 2}\n");
  }
  ::unlink(path.c_str());
}

TEST(LineFile, Open_AfterAWriterCutMidLine_NextRecordStartsOnItsOwnLine) {
  const std::string path = TempPath("cut");
  {
    std::ofstream old(path, std::ios::trunc);
    old << "{\"step\": 1}\n{\"step\": 2, \"lo";  // killed mid-line
  }
  {
    auto file = LineFile::Open(path);
    ASSERT_THAT(file, IsOk());
    file->Append("{\"step\": 3}");
  }
  EXPECT_EQ(Read(path), "{\"step\": 1}\n{\"step\": 2, \"lo\n{\"step\": 3}\n");
  ::unlink(path.c_str());
}

TEST(LineFile, WriterKilled_EveryLineItWroteIsWhole) {
  const std::string path = TempPath("killed");
  ::unlink(path.c_str());
  constexpr int kMaxLines = 5000;  // bounded (5 MB) even if nobody kills it
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the test
    auto file = LineFile::Open(path);
    if (!file.ok()) ::_exit(1);
    const std::string payload(1000, 'x');
    for (int i = 0; i < kMaxLines; ++i) {
      file->Append("{\"i\": " + std::to_string(i) + ", \"p\": \"" + payload + "\"}");
    }
    ::_exit(0);
  }
  // Killed without warning once it has written a while.
  for (int i = 0; i < 200 && Read(path).size() < 100000; ++i) ::usleep(5000);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  std::string text = Read(path);
  ASSERT_FALSE(text.empty());
  // A kill while a write copies its line may cut that one line (Linux stops
  // a write between pages on SIGKILL; seen once in many runs): every line
  // before it is whole.
  if (text.back() != '\n') text.erase(text.rfind('\n') + 1);
  std::stringstream lines(text);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    EXPECT_EQ(line.front(), '{');
    EXPECT_EQ(line.back(), '}');
    ++n;
  }
  EXPECT_GT(n, 0);
  ::unlink(path.c_str());
}

TEST(LineFile, Open_UnwritableFolder_SaysWhichFile) {
  EXPECT_THAT(LineFile::Open("/proc/no-such-dir/metrics.jsonl"),
              StatusIs(absl::StatusCode::kFailedPrecondition, testing::HasSubstr("metrics.jsonl")));
}

}  // namespace
}  // namespace ddp
