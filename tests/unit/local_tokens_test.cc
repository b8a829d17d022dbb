// No anonymous admin on loopback: a coordinator without --tokens_file makes
// its user's own tokens, in files no other user may read, where that user's
// workers and clients find them by port (common/local_tokens.h).
#include "common/local_tokens.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;
using testing::HasSubstr;

class LocalTokensTest : public testing::Test {
 protected:
  void SetUp() override {
    runtime_ = fs::path(testing::TempDir()) / ("local-tokens-" + std::to_string(::getpid()));
    fs::remove_all(runtime_);
    fs::create_directories(runtime_);
    const char* old = std::getenv("XDG_RUNTIME_DIR");
    if (old != nullptr) saved_ = old;
    ::setenv("XDG_RUNTIME_DIR", runtime_.c_str(), 1);
  }
  void TearDown() override {
    if (saved_.empty()) {
      ::unsetenv("XDG_RUNTIME_DIR");
    } else {
      ::setenv("XDG_RUNTIME_DIR", saved_.c_str(), 1);
    }
    fs::remove_all(runtime_);
  }
  static fs::perms Mode(const std::string& path) {
    return fs::status(path).permissions() & fs::perms::all;
  }
  fs::path runtime_;
  std::string saved_;
};

TEST_F(LocalTokensTest, Written_PrivateFilesInAPrivateFolder_FoundByPort) {
  const std::vector<TokenEntry> tokens = NewLocalTokens();
  ASSERT_EQ(tokens.size(), 2u);
  EXPECT_NE(tokens[0].token, tokens[1].token);
  ASSERT_THAT(WriteLocalTokens(29555, tokens), IsOk());
  EXPECT_EQ(LocalTokenDir(), (runtime_ / "ddp").string());
  EXPECT_EQ(Mode(LocalTokenDir()), fs::perms(0700));
  const std::string admin = LocalTokenPath(29555, Role::kAdmin);
  EXPECT_EQ(Mode(admin), fs::perms(0600));
  EXPECT_EQ(Mode(LocalTokenPath(29555, Role::kWorker)), fs::perms(0600));
  EXPECT_EQ(FindLocalTokenFile("127.0.0.1:29555", Role::kAdmin), admin);
  EXPECT_EQ(FindLocalTokenFile("localhost:29555", Role::kWorker),
            LocalTokenPath(29555, Role::kWorker));
  // Another port's coordinator, or one on another machine: none.
  EXPECT_EQ(FindLocalTokenFile("127.0.0.1:29556", Role::kAdmin), "");
  EXPECT_EQ(FindLocalTokenFile("10.0.0.1:29555", Role::kAdmin), "");
}

TEST_F(LocalTokensTest, ARestartOnTheSamePort_KeepsTheTokens) {
  const std::vector<TokenEntry> first = NewLocalTokens();
  ASSERT_THAT(WriteLocalTokens(29555, first), IsOk());
  const std::vector<TokenEntry> again = ReadLocalTokens(29555);
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].token, first[0].token);
  EXPECT_EQ(again[1].token, first[1].token);
  EXPECT_TRUE(ReadLocalTokens(29556).empty());
}

TEST_F(LocalTokensTest, AFolderOthersMayEnter_Refused) {
  fs::create_directories(runtime_ / "ddp");
  fs::permissions(runtime_ / "ddp", fs::perms(0777));
  EXPECT_THAT(WriteLocalTokens(29555, NewLocalTokens()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not a private folder")));
  EXPECT_FALSE(fs::exists(LocalTokenPath(29555, Role::kAdmin)));
}

TEST_F(LocalTokensTest, AFolderThatIsALink_Refused) {
  fs::create_directories(runtime_ / "elsewhere");
  fs::permissions(runtime_ / "elsewhere", fs::perms(0700));
  fs::create_directory_symlink(runtime_ / "elsewhere", runtime_ / "ddp");
  EXPECT_THAT(WriteLocalTokens(29555, NewLocalTokens()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not a link")));
}

TEST_F(LocalTokensTest, LocalSecret_MadeOncePrivateAndKept) {
  absl::StatusOr<std::string> first = LocalSecret("state.key", 32);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->size(), 64u);
  struct stat st;
  ASSERT_EQ(::stat(LocalSecretPath("state.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  absl::StatusOr<std::string> again = LocalSecret("state.key", 32);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *first);
}

}  // namespace
}  // namespace ddp
